"""Every template's launch fits CUDA's grid: at most 2**31 - 1 blocks on axis 0 and 65535 on
axes 1 and 2. A grid past them is a launch error on a GPU, which neither the interpreter (it
loops over any grid) nor the sm_90 compile (it sees no grid) can show, so the launchers run
here on torch "meta" tensors (shapes without memory) with a stand-in jit module that records
each grid. Where even axis 0 cannot hold a shape, the kernel's ``where`` refuses it, naming the
kernel, the shape and that torch's kernel covers it."""

from __future__ import annotations

import pytest

from tensor_graphs.ir import dtypes
from tensor_graphs.kernels.triton.templates import attention, gather, matmul, rope, runtime

torch = pytest.importorskip("torch")

AXIS_0 = 2**31 - 1
OTHER_AXES = 65535


class Recorder:
    """A jit module whose kernels record their grids instead of launching."""

    def __init__(self) -> None:
        self.grids: list[tuple[str, tuple]] = []

    def __getattr__(self, kernel: str):
        grids = self.grids

        class Launch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    grids.append((kernel, tuple(grid)))
                return launch

        return Launch()


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    rec = Recorder()
    for module in (attention, gather, matmul, rope):
        monkeypatch.setattr(module, "jit", lambda name: rec)
    return rec


def meta(*shape, dtype=None):
    return torch.empty(shape, dtype=dtype or torch.float16, device="meta")


def _fits_cuda(grids) -> None:
    assert grids
    for kernel, grid in grids:
        assert grid[0] <= AXIS_0, (kernel, grid)
        assert all(g <= OTHER_AXES for g in grid[1:]), (kernel, grid)


# 300 x 256 (batch x heads) = 76800 > 65535
MANY_HEADS = (meta(300, 256, 3, 8), meta(300, 256, 3, 8), meta(300, 256, 3, 8))


@pytest.mark.parametrize("cfg", attention.FLASH_CONFIGS, ids=lambda c: c.label)
def test_flash_attention_with_more_heads_than_an_axis_holds(recorder, cfg):
    attention.flash(cfg, *MANY_HEADS, None, is_causal=True, scale=None)
    _fits_cuda(recorder.grids)
    assert sum(g[0] for _, g in recorder.grids) == 300 * 256  # one query block per head


@pytest.mark.parametrize("cfg", attention.DECODE_CONFIGS, ids=lambda c: c.label)
def test_decode_attention_with_more_heads_than_an_axis_holds(recorder, cfg):
    q = meta(300, 256, 1, 8)
    attention.decode(cfg, q, *MANY_HEADS[1:], None, is_causal=False, scale=None)
    _fits_cuda(recorder.grids)


@pytest.mark.parametrize("cfg", rope.CONFIGS, ids=lambda c: c.label)
def test_rope_past_262k_tokens(recorder, cfg):
    tokens = 4 * OTHER_AXES + 100  # more row blocks of 4 than axis 1 holds
    rope.rope(cfg, meta(1, 2, tokens, 8), meta(tokens, 8), meta(tokens, 8))
    _fits_cuda(recorder.grids)


@pytest.mark.parametrize("cfg", gather.CONFIGS, ids=lambda c: c.label)
def test_embedding_wider_than_an_axis_holds(recorder, cfg):
    d = (OTHER_AXES + 1) * 256  # more column blocks than axis 1 holds
    gather.embedding(cfg, meta(3, dtype=torch.int64), meta(2, d))
    _fits_cuda(recorder.grids)


@pytest.mark.parametrize("cfg", matmul.CONFIGS, ids=lambda c: c.label)
def test_gemm_with_more_row_tiles_than_an_axis_holds(recorder, cfg):
    """Past axis 0 the GEMM's output would be 2**41 elements: no ``where`` is needed."""
    e = matmul.EPILOGUES[0]
    matmul.gemm(cfg, e, meta((OTHER_AXES + 1) * 128, 16), meta(16, 16))
    _fits_cuda(recorder.grids)


def test_where_refuses_a_launch_past_axis_0():
    """(n, 1, 2) is n programs of one row each: past 2**31 - 1 no grid holds it."""
    n = AXIS_0 + 1
    shapes = [(n, 1, 2), (n, 1, 2), (n, 1, 2)]
    cfg = rope.CONFIGS[0]
    why = rope.fits_grid("triton_rotary_embedding_r4", cfg)(shapes, [dtypes.float16] * 3, {})
    assert isinstance(why, str)
    assert "triton_rotary_embedding_r4" in why and str((n, 1, 2)) in why and "torch" in why
    small = [(7, 1, 2)] * 3
    assert rope.fits_grid("r", cfg)(small, [dtypes.float16] * 3, {}) is True


def test_attention_where_counts_query_blocks():
    cfg = attention.FLASH_CONFIGS[0]
    fits = attention.constraint(False, ("float16",), "triton_flash_attention_x", cfg)
    q = (1 << 16, 1 << 8, cfg.block_m * (1 << 8), 8)  # 2**32 programs
    why = fits([q, q, q], [dtypes.float16] * 3, {"is_causal": False, "scale": None})
    assert isinstance(why, str) and "triton_flash_attention_x" in why
    small = (2, 4, 100, 8)
    assert fits([small] * 3, [dtypes.float16] * 3, {}) is True


def test_embedding_where_counts_blocks():
    cfg = gather.CONFIGS[0]
    fits = gather._fits(("float16",), "triton_embedding_x", cfg)
    why = fits([(1 << 20,), (10, 1 << 22)], [dtypes.int64, dtypes.float16], {})
    assert isinstance(why, str) and "triton_embedding_x" in why and "torch" in why
    assert fits([(5,), (10, 300)], [dtypes.int64, dtypes.float16], {}) is True
    assert runtime.grid_fits("k", AXIS_0, ()) is True
