"""torch kernels of the random ops (``random_bits``, ``dropout``): the Philox words drawn where
the tensors live, so a GPU plan's dropout never sends x or the key to the host.

Philox-4x32-10 in int64 tensor arithmetic: the 32x32-bit products are taken in 16-bit halves
(every partial product < 2**49), so nothing overflows int64 on any device, and the words are
the reference's (``ir/ops/random.py``) bit for bit. The key is read as 0-d tensors on its
device, never with ``.item()``. About 15 elementwise ops per round on a quarter of the
elements: slower than the fused C kernel on the host, but on the GPU it keeps the step there.
"""

from __future__ import annotations

from tensor_graphs.ir.dtypes import FLOATS
from tensor_graphs.ir.ops.random import PHILOX_M, PHILOX_W, ROUNDS, scale, threshold
from tensor_graphs.kernels.torch.base import EXACT, torch_kernel
from tensor_graphs.kernels.torch.convert import Lazy

torch = Lazy("torch", globals(), "torch")
_MASK = 0xFFFFFFFF
_HALF = 0xFFFF


def _mulhilo(a, m: int):
    """(hi, lo) words of a * m for a < 2**32 (int64 tensor) and a 32-bit constant m."""
    low, high = a & _HALF, a >> 16
    t1, t2 = low * m, high * m  # each < 2**48
    lo = (t1 + ((t2 & _HALF) << 16)) & _MASK
    hi = ((t2 + (t1 >> 16)) >> 16) & _MASK
    return hi, lo


def words(key, n: int, stream: int):
    """The n Philox words of (key = [seed, step], stream) in element order, int64."""
    seed, step = key[0], key[1]
    blocks = torch.arange(-(-n // 4), dtype=torch.int64, device=key.device)
    c0 = blocks & _MASK
    c1 = torch.full_like(blocks, stream)
    c2 = (step & _MASK).expand_as(blocks)
    c3 = ((step >> 32) & _MASK).expand_as(blocks)
    k0, k1 = seed & _MASK, (seed >> 32) & _MASK
    for _ in range(ROUNDS):
        hi0, lo0 = _mulhilo(c0, PHILOX_M[0])
        hi1, lo1 = _mulhilo(c2, PHILOX_M[1])
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W[0]) & _MASK, (k1 + PHILOX_W[1]) & _MASK
    return torch.stack((c0, c1, c2, c3), dim=-1).reshape(-1)[:n]


def _key_ok(shapes, dtypes, attrs):
    if dtypes[-1].name != "int64" or tuple(shapes[-1]) != (2,):
        return f"the key must be int64 (2,), got {tuple(shapes[-1])} {dtypes[-1].name}"
    return True


@torch_kernel("random_bits", dtypes=("int64",), where=_key_ok, tolerance=EXACT)
def random_bits(key, shape, stream):
    return words(key, int(torch.Size(shape).numel()), stream).reshape(tuple(shape))


@torch_kernel("dropout", dtypes=FLOATS, typed=1, where=_key_ok, tolerance=1e-7)
def dropout(x, key, p, stream):
    dropped = words(key, x.numel(), stream).reshape(x.shape) < threshold(p)
    return torch.where(dropped, torch.zeros((), dtype=x.dtype, device=x.device), x * scale(p))
