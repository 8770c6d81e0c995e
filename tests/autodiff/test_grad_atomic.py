"""The gradient rule of every atomic op, driven by the op table (tests/ops/optable.py): each
row's builder, torch function and cases (odd shapes, broadcasts, empty axes, strided and
reversed slices, batched and vector matmuls), with smooth float64 values drawn here, checked
against torch.autograd and a finite difference (tests/autodiff/gradcheck.py). A new atomic
op must get a rule or be declared non-differentiable, and every rule must have table rows.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.grad_rules import NON_DIFFERENTIABLE, VJP
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.atomic import ATOMIC_OPS
from tests.autodiff.gradcheck import check_case
from tests.ops import optable as ot

torch = pytest.importorskip("torch")


def _normal(rng, shape):
    return rng.standard_normal(shape)


def _positive(rng, shape):
    return rng.uniform(0.5, 2.0, shape)


def _unit(rng, shape):
    return rng.uniform(-1.0, 1.0, shape)


def _away(rng, shape):  # divisors: |b| in [0.5, 2]
    return rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)


def _wide(rng, shape):
    return rng.standard_normal(shape) * 3.0


#  op: the draw of each float input (the last repeats), where the standard normal will not do
SMOOTH = {
    "log": (_positive,),             # log(x > 0)
    "sqrt": (_positive,),            # away from the pole of 1 / sqrt at 0
    "reciprocal": (_positive,),      # away from 0
    "log2": (_positive,),
    "log10": (_positive,),
    "log1p": (_positive,),
    "pow": (_positive, _normal),     # a real power of a positive base
    "tan": (_unit,),                 # away from the poles at +-pi/2
    "fmod": (_wide, _away),          # a divisor away from 0
    "floor_divide": (_wide, _away),
}


def _torch_state_update(torch, s, v, offset, axis):
    n = max(s.shape[axis], offset + v.shape[axis])
    grow = list(s.shape)
    grow[axis] = n - s.shape[axis]
    full = torch.cat([s, torch.zeros(grow, dtype=s.dtype)], axis)
    return full.index_copy(axis, torch.arange(offset, offset + v.shape[axis]), v)


def _torch_cast(torch, x, dst):
    return x.to(getattr(torch, dst))


#  op: the torch function where the table's has no float64 case or no gradient
TORCH = {
    "cast": _torch_cast,                       # the table compares float -> float nowhere
    "copy_to": lambda torch, x: x.clone(),     # the same value
    "state_update": _torch_state_update,       # torch has no versioned state: cat + index_copy
    "floor_divide": None,                      # torch: "derivative not implemented" (zero a.e.)
}


def _cases():
    out = []
    for row in ot.rows("atomic"):
        if row.op not in VJP or "float64" not in row.dtypes:
            continue
        for spec in row.specs("float64"):
            kw = spec.kwargs
            if row.op == "cast" and kw["dst"] not in ("float32", "float64"):
                continue  # an int or bool result carries no gradient
            if row.op == "scatter" and kw["reduce"] == "prod":
                continue  # refused with an ArgumentError (test_scatter_prod_is_refused)
            out.append(pytest.param(row, spec, id=f"{row.name}-{spec}"))
    return out


def _arrays(row, spec):
    """The table's draw (indices, conditions, states' shapes) with every float input redrawn
    smooth: no nan, inf, ties or poles, so a finite difference is meaningful."""
    drawn = ot.draw(row, spec, "float64")
    rng = ot.rng_for("grad", row.name, str(spec))
    draws = SMOOTH.get(row.op, (_normal,))
    out, k = [], 0
    for a in drawn:
        if a is not None and a.dtype.kind == "f":
            a = draws[min(k, len(draws) - 1)](rng, a.shape)
            k += 1
        out.append(a)
    return out


@pytest.mark.parametrize("row,spec", _cases())
def test_atomic_gradient(row, spec):
    arrays = _arrays(row, spec)
    wrt = [i for i, a in enumerate(arrays) if a is not None and a.dtype.kind == "f"]
    torch_fn = TORCH[row.op] if row.op in TORCH else row.torch
    tol = 1e-6 if row.op == "cast" else 1e-9  # a float32 round trip
    check_case(lambda *n, **kw: ot.build(row, spec, "float64", n), arrays, {}, wrt,
               None if torch_fn is None else (lambda t, *ts: torch_fn(t, *ts, **spec.kwargs)),
               tol=tol, seed_key=ot.rng_for(row.name, str(spec)).integers(1 << 30),
               kinds=row.leaves, fd=row.op != "cast")


def test_every_atomic_op_has_a_rule_or_is_declared_non_differentiable():
    both = set(VJP) & set(NON_DIFFERENTIABLE)
    assert not both, f"ops both with a rule and declared non-differentiable: {both}"
    missing = [op for op in ATOMIC_OPS if op not in VJP and op not in NON_DIFFERENTIABLE]
    assert not missing, f"atomic ops with no gradient rule and not declared: {missing}"
    unknown = [op for op in (*VJP, *NON_DIFFERENTIABLE) if op not in OPS or OPS[op].is_leaf]
    assert not unknown, f"rules for ops that are not atomic ops: {unknown}"
    registered = [n for n, op in OPS.items() if op.kind == "atomic"]
    assert sorted(registered) == sorted(ATOMIC_OPS)


def test_every_rule_is_checked_by_table_rows():
    checked = {p.values[0].op for p in _cases()}
    assert sorted(set(VJP) - checked) == []


# ---------------------------------------------------------------------------- ties
def _tied(shape, seed):
    return np.round(np.random.default_rng(seed).standard_normal(shape))  # many equal values


@pytest.mark.parametrize("shape,axis,keepdims", [((7,), None, False), ((3, 7, 5), 1, True),
                                                 ((3, 7, 5), (0, 2), False), ((4, 1), -1, True)])
def test_max_ties_share_evenly_like_amax(shape, axis, keepdims):
    x = _tied(shape, 1)
    assert len(np.unique(x)) < x.size
    check_case(lambda a: tg.max(a, axis=axis, keepdims=keepdims), [x], {}, [0],
               lambda torch, t: torch.amax(t, dim=ot.reduced_axes(axis, t.ndim),
                                           keepdim=keepdims), fd=False)


def test_maximum_ties_give_half_to_each_side():
    a, b = _tied((5, 7), 2), _tied((7,), 3)
    assert (a == b).any()
    check_case(tg.maximum, [a, b], {}, [0, 1], lambda torch, x, y: torch.maximum(x, y),
               fd=False)
    x = tg.input("x", (3,), "float64")
    (g,) = tg.grad(tg.maximum(x, x).sum(), [x])
    assert np.array_equal(tg.evaluate(g, {"x": np.ones(3)}), np.ones(3))


def test_scatter_amax_ties_share_with_the_base():
    x = np.array([1.0, 2.0, 0.0])
    u = np.array([1.0, 5.0, 1.0, -1.0])
    idx = np.array([0, 1, 0, 2])
    check_case(lambda a, i, c: tg.scatter(a, i, c, 0, "amax"), [x, idx, u], {}, [0, 2],
               lambda torch, a, i, c: a.index_reduce(0, i, c, "amax", include_self=True),
               fd=False)


def test_scatter_prod_is_refused():
    x, u = tg.input("x", (4,), "float64"), tg.input("u", (3,), "float64")
    y = tg.scatter(x, tg.constant(np.array([0, 1, 1])), u, 0, "prod")
    with pytest.raises(tg.ArgumentError, match="scatter.*prod"):
        tg.grad(y.sum(), [u])


# ---------------------------------------------------------------------------- broadcasts
#  (shapes of a and b): the matmul rule's branches the op table's rows do not reach
MATMUL_BROADCASTS = [
    ((7, 5), (2, 3, 5, 4)),     # a 2-D against a batched b: the batch folded into contraction
    ((5,), (2, 5, 3)),          # a vector against a batched b
    ((2, 1, 3, 4), (5, 4, 2)),  # both batched, broadcast both ways
    ((2, 3, 4), (4,)),          # a batched a against a vector
    ((1, 3, 4), (2, 4, 6)),     # a batch axis of 1 summed back
]


@pytest.mark.parametrize("sa,sb", MATMUL_BROADCASTS)
def test_matmul_broadcast_gradients(sa, sb):
    rng = np.random.default_rng(len(sa) * 10 + len(sb))
    check_case(tg.matmul, [rng.standard_normal(sa), rng.standard_normal(sb)], {}, [0, 1],
               lambda torch, a, b: torch.matmul(a, b))


def test_symbolic_slices_and_pads():
    """Slices and pads with symbolic bounds put the cotangent back with symbolic pads."""
    x = tg.input("x", ("batch", "seq", 4), "float64")
    y = tg.pad(x[:, 1:, ::2], (1, 1)) * tg.concat([x, x[:, :1]], axis=1)[:, 2:]
    (g,) = tg.grad(y.sum(), [x])
    assert g.shape == x.shape
    X = np.random.default_rng(6).standard_normal((2, 5, 4))
    t = torch.tensor(X, requires_grad=True)
    ref = torch.nn.functional.pad(t[:, 1:, ::2], (1, 1)) * torch.cat([t, t[:, :1]], 1)[:, 2:]
    (r,) = torch.autograd.grad(ref.sum(), [t])
    assert np.allclose(tg.evaluate(g, {"x": X}), r.numpy(), rtol=1e-14, atol=0)


@pytest.mark.parametrize("n", [6, 7])
def test_strided_slice_of_a_symbolic_axis(n):
    """x[1::3] on a symbolic axis: the cotangent spread by a pad and cut to the length."""
    x = tg.input("x", ("n", 2), "float64")
    (g,) = tg.grad((x[1::3] * x[1::3]).sum(), [x])
    X = np.random.default_rng(n).standard_normal((n, 2))
    ref = np.zeros_like(X)
    ref[1::3] = 2 * X[1::3]
    assert np.array_equal(tg.evaluate(g, {"x": X}), ref)
