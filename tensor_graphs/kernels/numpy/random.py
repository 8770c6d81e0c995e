"""numpy kernels of the random ops (``random_bits``, ``dropout`` in one call) and the cases
every kernel of the family is verified on.

Both draw the words with the reference's own Philox (``ir/ops/random.py``): the words are the
op's definition, so there is nothing to approximate, and the C kernels are checked against
them bit for bit (a wrong word moves an element by its whole value, far above any tolerance).
"""

from __future__ import annotations

import numpy as np

from tensor_graphs.ir.ops.random import bits_reference, scale, threshold
from tensor_graphs.kernels.numpy._util import into, up
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.signatures import FLOATS, OpCase, S, generator

NONE = 1e-12  # integer words, and a select
ROUNDED = 1e-7  # x * (1 / (1 - p)): one rounding
SEEDS = 1 << 62  # keys drawn in [0, 2**62): both words of the seed and of the step vary
# (65, 1031): enough elements for the C kernels' threaded chunks
SHAPES = [(7,), (33,), (2, 3, 5), (1,), (1025,), (4, 257), (0,), (3, 0), (65, 1031)]


def _key_ok(shapes, dtypes, attrs):
    if dtypes[-1].name != "int64" or tuple(shapes[-1]) != (2,):
        return f"the key must be int64 (2,), got {tuple(shapes[-1])} {dtypes[-1].name}"
    return True


def _dropout_ok(shapes, dtypes, attrs):
    return _key_ok(shapes, dtypes, attrs) if dtypes[0].is_float else \
        f"x must be a float tensor, got {dtypes[0].name}"


@kernel("random_bits", backend="numpy", name="numpy_random_bits", where=_key_ok,
        tolerance=NONE, writes_out=True)
def numpy_random_bits(key, shape, stream, *, out=None):
    """The Philox words of (key, stream) in element order."""
    n = int(np.prod(shape, dtype=np.int64))
    return into(bits_reference(key, n, stream).reshape(shape), np.int64, out)


@kernel("dropout", backend="numpy", name="numpy_dropout", where=_dropout_ok, tolerance=ROUNDED,
        writes_out=True)
def numpy_dropout(x, key, p, stream, *, out=None):
    """x / (1 - p) where the element's word is at least p * 2**32, else 0."""
    a = up(x)
    dropped = bits_reference(key, a.size, stream).reshape(a.shape) < threshold(p)
    kept = a * a.dtype.type(scale(p))
    return into(np.where(dropped, a.dtype.type(0), kept), x.dtype, out)


@generator("random_bits", dtypes=("int64",))
def _random_bits(dt, arity):
    return [OpCase((S((2,), "int64", "index", SEEDS),), {"shape": s, "stream": k})
            for k, s in enumerate(SHAPES)]


@generator("dropout", dtypes=FLOATS)
def _dropout(dt, arity):
    ps = (0.5, 0.1, 0.9, 1 / 3, 0.0, 1.0)
    return [OpCase((S(s, dt), S((2,), "int64", "index", SEEDS)),
                   {"p": ps[k % len(ps)], "stream": 7 * k})
            for k, s in enumerate(SHAPES)]
