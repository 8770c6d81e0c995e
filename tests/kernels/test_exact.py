"""The numpy_exact_* kernels against the op table's independent numpy oracles.

An exact kernel evaluates its node with the reference interpreter in float64 and rounds once,
so checking it against that interpreter (``tg.kernels.verify``) passes whatever the interpreter
computes: a wrong decomposition is "exact" there. Here each row of tests/ops/optable.py (every
op, its variants, its edge cases, NaN and infinities in the inputs) runs through the exact
kernel the registry matches, called as the runtime calls it, and is compared with the row's
numpy oracle, which never calls tensor_graphs. Nothing here evaluates a graph.

The claim checked is the one the kernels make: a float result is the float64 value rounded
once to the node's dtype, so it is within one rounding of the float64 oracle rounded alike
(twice the dtype's unit roundoff, norm-wise, plus what the row allows the float64 oracle);
ints, bools and movement are exact.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tests.ops import optable as ot

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # nan/inf inputs on purpose

# unit roundoff of each float dtype: one rounding moves a value by at most this, relatively
ROUNDOFF = {"float64": 2.0 ** -53, "float32": 2.0 ** -24, "float16": 2.0 ** -11,
            "bfloat16": 2.0 ** -8}
# rows with no exact kernel to test, and why
SKIPPED = {"copy_to": "its cases copy to cuda:0; the exact copy_to computes in host memory"}
PARAMS = [pytest.param(r, d, id=f"{r.name}-{d}") for r in ot.TABLE for d in r.dtypes
          if r.name not in SKIPPED]


def exact_kernel(y: tg.Node):
    """The one numpy_exact_* kernel that covers ``y``, and its match."""
    found = [(k, m) for k, m in tg.kernels.matching(y) if k.name.startswith("numpy_exact_")]
    assert len(found) == 1, f"{y.op.name}: exact kernels {[k.name for k, _ in found]}"
    return found[0]


def value(node: tg.Node, feeds: dict) -> np.ndarray:
    """What a node the builder put in front of the op (a slice before a pad, a cast before a
    sum of bools) computes, through the plain numpy kernels as the runtime would run them."""
    if node.op.name in ("input", "state"):
        return feeds[node.name]
    if node.op.name == "constant":
        return node.attrs["value"].array
    kernel, match = next((k, m) for k, m in tg.kernels.matching(node)
                         if k.name == f"numpy_{node.op.name}")
    return kernel(*[value(n, feeds) for n in kernel.arguments(match)], **node.attrs)


@pytest.mark.parametrize("row,dtype", PARAMS)
def test_exact_kernel_matches_the_oracle(row, dtype):
    ran = 0
    for spec in row.specs(dtype):
        what = f"{row.name} {dtype} {spec}"
        arrays = ot.draw(row, spec, dtype)
        nodes, feeds = ot.leaves(dtype, arrays, None, row.leaves)  # concrete shapes
        y = ot.build(row, spec, dtype, nodes)
        if y.op.is_leaf:  # the builder handed back its input (a no-op cast, a full slice)
            continue
        kernel, match = exact_kernel(y)
        args = [value(n, feeds) for n in kernel.arguments(match)]
        got = np.asarray(kernel(*args, **y.attrs))
        assert got.dtype == y.dtype.np_dtype and got.shape == tuple(y.shape), what
        kw = ot.kwargs(row, spec, dtype)
        if row.check == "exact":  # movement and selection: every bit, in the input's dtype
            ot.check_exact(got, np.asarray(row.oracle(*arrays, **kw)), what, row.zero_sign)
        else:
            ref = np.asarray(row.oracle(*[ot.lift(a) for a in arrays], **kw))
            if ref.dtype.kind in "biu":
                ot.check_exact(got, ref.astype(got.dtype), what)
            else:
                tol = 2 * ROUNDOFF[y.dtype.name] + (row.tol64 if row.check == "float" else 1e-12)
                ot.check_close(got, ref.astype(got.dtype), tol, what)
        ran += 1
    assert ran, f"{row.name} {dtype}: every case folded away in the builder"
