"""c_matmul_strided (kernels/c/strided_matmul.c): a @ b over views, against the float64
reference (||got - ref|| / ||ref||), every layout a backward pass makes: transposes, row
slices, head permutations, broadcast and negative strides (packed), batch axes folded into the
rows, broadcast batches; the registry's own verification; and a compiled program running it in
the native loop without copying its views."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c.strided_matmul import _layout, c_matmul_strided
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
RNG = np.random.default_rng(5)


def rand(*shape, dtype=np.float32):
    return RNG.standard_normal(shape).astype(dtype)


def ref(a, b):
    return np.matmul(a.astype(np.float64), b.astype(np.float64))


VIEWS = {  # name -> (a, b) as a backward pass meets them
    "dense": lambda: (rand(7, 33), rand(33, 9)),
    "b transposed (g @ W^T)": lambda: (rand(8, 16, 32), rand(24, 32).T),
    "a transposed (x^T @ g)": lambda: (rand(96, 40).T, rand(96, 24)),
    "both transposed": lambda: (rand(33, 7).T, rand(9, 33).T),
    "row slice of a fused projection": lambda: (rand(4, 16, 96)[:, :, 32:64], rand(32, 32)),
    "head permutation": lambda: (rand(2, 16, 4, 8).transpose(0, 2, 1, 3),
                                 rand(2, 16, 4, 8).transpose(0, 2, 3, 1)),
    "probabilities @ permuted values": lambda: (rand(2, 4, 16, 16),
                                                rand(2, 16, 4, 8).transpose(0, 2, 1, 3)),
    "broadcast stride (packed)": lambda: (np.broadcast_to(rand(1, 12), (5, 12)), rand(12, 7)),
    "negative stride (packed)": lambda: (rand(6, 10)[::-1], rand(10, 4)[:, ::-1]),
    "every other column (packed)": lambda: (rand(5, 22)[:, ::2], rand(11, 3)),
    "broadcast batch": lambda: (rand(3, 1, 6, 7), rand(4, 7, 5)),
    "one row": lambda: (rand(1, 300), rand(300, 17)),
    "one column": lambda: (rand(40, 1), rand(1, 30).T.T),
    "empty contraction": lambda: (rand(6, 0), rand(0, 4)),
    "float64 transposed": lambda: (rand(20, 9, dtype=np.float64).T,
                                   rand(20, 11, dtype=np.float64)),
    "large (rows split among threads)": lambda: (rand(300, 1024).T, rand(300, 512)),
    "wide (columns split among threads)": lambda: (rand(700, 64).T, rand(700, 1500)),
    "packed and split": lambda: (rand(200, 600)[:, ::2], rand(300, 400)),
    "wide, b transposed and split": lambda: (rand(96, 128), rand(2000, 128).T),
    "many small (one per thread)": lambda: (rand(16, 32, 8, 24).transpose(0, 2, 1, 3),
                                            rand(16, 8, 24, 20)),
}


@pytest.mark.parametrize("name", sorted(VIEWS))
def test_matches_float64_reference(name):
    a, b = VIEWS[name]()
    want = ref(a, b)
    got = c_matmul_strided(a, b)
    assert got.shape == want.shape and got.dtype == a.dtype
    if want.size:
        assert relative_error(got, want) < (1e-6 if a.dtype == np.float32 else 1e-14)
    else:
        assert not got.size


def test_writes_into_out():
    a, b = rand(64, 48).T, rand(64, 40)
    out = np.full((48, 40), np.nan, np.float32)
    assert c_matmul_strided(a, b, out=out) is out
    assert relative_error(out, ref(a, b)) < 1e-6


def test_batch_axes_fold_into_rows():
    # (8, 128, 256) @ (256, 256), a the middle third of a (8, 128, 768) buffer: one GEMM of
    # 1024 rows at row stride 768, no batch loop
    a, b = rand(8, 128, 768)[:, :, 256:512], rand(256, 256)
    shape, args = _layout(a, b)
    assert shape == (8, 128, 256)
    assert args[:4] == (1024, 256, 256, 768) and args[7:10] == (1, 1, 1)
    # a head permutation does not fold: 8 x 4 batches of (128 x 64)
    q = rand(8, 128, 4, 64).transpose(0, 2, 1, 3)
    _, args = _layout(q, rand(8, 4, 64, 16))
    assert args[0] == 128 and args[7:10] == (1, 8, 4)


def test_registry_verification_passes():
    report = tg.kernels.verify(registry.get("c_matmul_strided"))
    assert report.ok and not report.rejected, report
    assert len(report.shapes) >= 7 and report.max_rel_error < 1e-6


def test_compiled_backward_products_run_natively_without_copies():
    x = tg.input("x", (64, 96), "float32")
    w = tg.weight("w", (48, 96), "float32")
    g = tg.input("g", (64, 48), "float32")
    # a linear layer's two backward products: g @ W (W read as (48, 96)) and g^T @ x
    prog = tg.compile([tg.matmul(g, w), tg.matmul(tg.permute(g, (1, 0)), x)],
                      backends=["c", "numpy"])
    names = {s.kernel.name for s in prog.plan.steps}
    assert "c_matmul_strided" in names, prog.explain()
    wv, xv, gv = rand(48, 96), rand(64, 96), rand(64, 48)
    prog.bind(w=wv)
    for _ in range(3):
        dx, dw = prog(x=xv, g=gv)
    assert relative_error(dx, ref(gv, wv)) < 1e-6
    assert relative_error(dw, ref(gv.T, xv)) < 1e-6
    assert prog.loop.startswith("native loop"), prog.loop
