"""Every template's launch fits CUDA's grid: at most 2**31 - 1 blocks on axis 0 and 65535 on
axes 1 and 2. A grid past them is a launch error on a GPU, which neither the interpreter (it
loops over any grid) nor the sm_90 compile (it sees no grid) can show, so the launchers run
here on torch "meta" tensors (shapes without memory) with a stand-in jit module that records
each grid. Where even axis 0 cannot hold a shape, the kernel's ``where`` refuses it, naming the
kernel, the shape and that torch's kernel covers it."""

from __future__ import annotations

import math

import pytest

from tensor_graphs.ir import dtypes
from tensor_graphs.kernels.triton.templates import (
    argmax,
    attention,
    gather,
    matmul,
    rope,
    runtime,
)

torch = pytest.importorskip("torch")

AXIS_0 = 2**31 - 1
OTHER_AXES = 65535


class Recorder:
    """A jit module whose kernels record their grids instead of launching."""

    def __init__(self) -> None:
        self.grids: list[tuple[str, tuple]] = []
        self.options: list[dict] = []  # each launch's keyword arguments (constexprs, options)

    def __getattr__(self, kernel: str):
        grids, options = self.grids, self.options

        class Launch:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    grids.append((kernel, tuple(grid)))
                    options.append(kwargs)
                return launch

        return Launch()


@pytest.fixture
def recorder(monkeypatch) -> Recorder:
    rec = Recorder()
    for module in (argmax, attention, gather, matmul, rope):
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


# ---------------------------------------------------------------------------- occupancy
# The cost model's estimate of an unmeasured template divides its work by the share of the
# GPU's SMs its grid keeps busy (``Occupancy``): the programs each declares must be the ones
# its launcher launches, or the estimate costs a grid that never runs.
LINEAR = next(e for e in matmul.EPILOGUES if e.label == "linear_add")
CONV1D = next(e for e in matmul.EPILOGUES if e.label == "matmul_bias_gelu_tanh")


def _gemm_args(e, m_shape, n, k):
    a = meta(*m_shape, k)
    b = meta(n, k) if e.linear else meta(k, n)
    args = [a, b] + ([meta(n)] if e.bias else []) + ([meta(*m_shape, n)] if e.residual else [])
    return args


@pytest.mark.parametrize("cfg", matmul.CONFIGS + matmul.GEMV_CONFIGS, ids=lambda c: c.label)
@pytest.mark.parametrize("e", (LINEAR, CONV1D), ids=lambda e: e.label)
@pytest.mark.parametrize("dims", [((1, 1), 768, 3072), ((1, 1), 2304, 768), ((2, 3), 70, 520),
                                  ((1,), 1, 1), ((1, 128), 768, 768)], ids=str)
def test_matmul_occupancy_is_the_grid_launched(recorder, cfg, e, dims):
    m_shape, n, k = dims
    m = math.prod(m_shape)
    gemv = isinstance(cfg, matmul.Gemv)
    if gemv and m > matmul.GEMV_ROWS:
        return  # the GEMV's where refuses it (test_gemv_where_takes_a_few_known_rows)
    args = _gemm_args(e, m_shape, n, k)
    (matmul.gemv if gemv else matmul.gemm)(cfg, e, *args)
    _fits_cuda(recorder.grids)
    first = recorder.grids[0][1]
    declared = matmul.occupancy(cfg, e)([tuple(a.shape) for a in args])
    assert declared.programs == math.prod(first)
    if gemv:  # plain FMAs, no padded rows; the last split to arrive adds the parts
        assert declared.useful == 1.0
        assert recorder.grids[1:] == []
    else:  # a 16-row tile on one row does 16 rows' arithmetic
        rows, cols = -(-m // cfg.block_m) * cfg.block_m, -(-n // cfg.block_n) * cfg.block_n
        assert declared.useful == pytest.approx(m * n / (rows * cols))


def test_a_gemv_without_arrival_counters_finishes_in_a_second_kernel(recorder, monkeypatch):
    """Inside a CUDA graph's capture no counters can be made (the memory would be the
    graph's): the parts are then added by ``gemv_combine``, one program per 256 columns."""
    monkeypatch.setattr(matmul, "arrival_counters", lambda device, count: None)
    cfg = matmul.GEMV_CONFIGS[0]
    matmul.gemv(cfg, LINEAR, *_gemm_args(LINEAR, (1, 1), 768, 3072))
    assert recorder.grids[0][1][1] > 1  # K was split
    assert [g for _, g in recorder.grids[1:]] == [(-(-768 // matmul.COMBINE_BLOCK),)]


def test_decode_attention_combines_in_its_last_split(recorder, monkeypatch):
    """One launch where arrival counters can be made; inside a capture that found too few,
    ``decode_combine`` after it, one program per (batch, query head)."""
    cfg = attention.DECODE_CONFIGS[0]
    q, kv = meta(2, 12, 1, 64), meta(2, 4, 900, 64)
    attention.decode(cfg, q, kv, kv, None, is_causal=False, scale=None)
    assert [k for k, _ in recorder.grids] == ["decode_split"]
    assert recorder.grids[0][1][1] > 1  # the keys were split
    recorder.grids.clear()
    monkeypatch.setattr(attention, "arrival_counters", lambda device, count: None)
    attention.decode(cfg, q, kv, kv, None, is_causal=False, scale=None)
    assert recorder.grids[1:] == [("decode_combine", (2 * 12,))]


def test_argmax_splits_a_vocabulary_row_and_picks_in_its_last_chunk(recorder, monkeypatch):
    """GPT-2's logits row: split over many programs, one launch; without counters (inside a
    capture that found too few) ``argmax_combine`` picks, one program per row. A row of one
    chunk finishes in its only program."""
    cfg = argmax.CONFIGS[0]
    argmax.argmax(cfg, meta(1, 50257), -1, False)
    assert [k for k, _ in recorder.grids] == ["argmax_split"]
    splits = recorder.grids[0][1][1]
    assert splits > 16
    assert argmax.occupancy(cfg)([(1, 50257)]).programs == splits
    recorder.grids.clear()
    monkeypatch.setattr(argmax, "arrival_counters", lambda device, count: None)
    argmax.argmax(cfg, meta(3, 50257), -1, False)
    assert recorder.grids[1:] == [("argmax_combine", (3,))]
    recorder.grids.clear()
    argmax.argmax(cfg, meta(300, 64), -1, False)
    assert recorder.grids == [("argmax_split", (300, 1))]


def test_argmax_where_takes_the_last_axis_only():
    fits = argmax.constraint(("float32",), "k", argmax.CONFIGS[0])
    f32 = [dtypes.float32]
    assert fits([(2, 9)], f32, {"axis": 1, "keepdims": False}) is True
    assert fits([(9,)], f32, {"axis": None, "keepdims": False}) is True
    for shape, axis in (((2, 9), 0), ((2, 9), None), ((), None)):
        assert isinstance(fits([shape], f32, {"axis": axis, "keepdims": False}), str)
    assert "int64" in fits([(2, 9)], [dtypes.int64], {"axis": 1, "keepdims": False})


def test_gemvs_launch_dependent_on_a_hopper_only(monkeypatch):
    """Programmatic dependent launch where the GPU (compute capability 9.0 on) and Triton
    have it; never in the interpreter, on an older GPU, or with ``runtime.PDL`` off."""
    monkeypatch.setattr(runtime, "interpreted", lambda: False)
    monkeypatch.setattr(runtime, "_triton_has_pdl", lambda: True)
    capability = {"major": 9}
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda index: (capability["major"], 0))
    gpu = torch.device("cuda", 0)
    for major, want in ((9, True), (8, False)):
        runtime._PDL_FOUND.clear()  # noqa: SLF001 - found once per GPU
        capability["major"] = major
        assert runtime.pdl(gpu) == ({"PDL": True, "launch_pdl": True} if want else
                                    {"PDL": False})
    runtime._PDL_FOUND.clear()  # noqa: SLF001
    capability["major"] = 9
    monkeypatch.setattr(runtime, "PDL", False)
    assert runtime.pdl(gpu) == {"PDL": False}
    monkeypatch.setattr(runtime, "PDL", True)
    assert runtime.pdl(torch.device("meta")) == {"PDL": False}
    monkeypatch.setattr(runtime, "interpreted", lambda: True)
    assert runtime.pdl(gpu) == {"PDL": False}
    runtime._PDL_FOUND.clear()  # noqa: SLF001


def test_a_gemv_reads_its_weight_before_its_wait_only_when_the_weight_is_bound(recorder,
                                                                              monkeypatch):
    """Launched with PDL, a GEMV starts while the kernels before it run: it loads its first
    weights before it waits for them (PREFETCH) only when b is a weight a program bound
    (``bound.mark``), never a tensor a kernel of the call may still be writing; a view of a
    bound weight (linear's transposed strides) is one too. Decode attention waits before it
    reads anything."""
    from tensor_graphs.kernels.torch import bound

    monkeypatch.setattr(matmul, "pdl", lambda device: {"PDL": True, "launch_pdl": True})
    monkeypatch.setattr(attention, "pdl", lambda device: {"PDL": True, "launch_pdl": True})
    cfg = matmul.GEMV_CONFIGS[0]
    plain = next(e for e in matmul.EPILOGUES if e.label == "matmul")
    x, weight, computed = torch.randn(1, 64), torch.randn(64, 32), torch.randn(64, 32)
    bound.mark(weight)
    for b, early in ((weight, True), (computed, False), (weight.t().contiguous(), False)):
        matmul.gemv(cfg, plain, x, b)
        assert recorder.options[-1]["PDL"] and recorder.options[-1]["launch_pdl"]
        assert recorder.options[-1]["PREFETCH"] is early
    linear = next(e for e in matmul.EPILOGUES if e.label == "linear")
    matmul.gemv(cfg, linear, x, weight.t())  # the (N, K) weight as linear takes it
    assert recorder.options[-1]["PREFETCH"] is True
    monkeypatch.setattr(matmul, "pdl", lambda device: {"PDL": False})
    matmul.gemv(cfg, plain, x, weight)
    assert recorder.options[-1]["PREFETCH"] is False
    q, kv = meta(1, 12, 1, 64), meta(1, 12, 40, 64)
    attention.decode(attention.DECODE_CONFIGS[0], q, kv, kv, None, False, None)
    assert recorder.options[-1]["PDL"] and recorder.options[-1]["launch_pdl"]


def test_a_bound_weight_is_known_by_its_storage_while_it_lives():
    from tensor_graphs.kernels.torch import bound

    w = torch.randn(8, 4)
    view, other = w.t()[1:], torch.randn(8, 4)
    assert not bound.is_weight(w)
    bound.mark(w)
    assert bound.is_weight(w) and bound.is_weight(view) and not bound.is_weight(other)
    bound.mark(torch.empty(0))  # no storage to read: nothing marked
    assert not bound.is_weight(torch.empty(0))
    key = w.untyped_storage().data_ptr()
    # the same weight held by another program (a tensor of its own on the same storage),
    # marked since: the first one's end leaves its mark (its weak reference went unheard)
    again = torch.empty(0).set_(w.untyped_storage(), 0, w.shape, w.stride())
    bound.mark(again)
    del w, view  # (a view holds its base: both go)
    assert bound.is_weight(again)
    del again
    assert key not in bound._marked  # noqa: SLF001 - the mark went with the tensor


def test_gemv_splits_cover_k_once_and_fill_the_gpu():
    """Every split holds a whole number of K blocks and none is empty; a column-poor product
    (GPT-2's 3072 -> 768 on one row) is split until it has ~two waves of programs."""
    for cfg in matmul.GEMV_CONFIGS:
        for m, n, k in ((1, 768, 3072), (1, 2304, 768), (3, 17, 520), (1, 1, 1), (8, 50257, 768)):
            splits, chunk = matmul.gemv_splits(cfg, m, n, k)
            assert chunk % cfg.block_k == 0 and 1 <= splits <= cfg.max_splits
            assert (splits - 1) * chunk < k <= splits * chunk  # the last split is not empty
        splits, _ = matmul.gemv_splits(cfg, 1, 768, 3072)
        assert splits > 1 and -(-768 // cfg.block_n) * splits >= 132
        assert matmul.gemv_splits(cfg, 8, 50257, 768)[0] == 1  # columns enough: one kernel


def test_gemv_where_takes_a_few_known_rows():
    fits = matmul.constraint(LINEAR, few_rows=True)
    f32 = [dtypes.float32] * 4
    assert fits([(1, 1, 64), (32, 64), (32,), (1, 1, 32)], f32, {}) is True
    many = (1, matmul.GEMV_ROWS + 1, 64)
    why = fits([many, (32, 64), (32,), many[:-1] + (32,)], f32, {})
    assert isinstance(why, str) and str(many[:-1]) in why and "GEMM" in why
    assert matmul.constraint(LINEAR)([many, (32, 64), (32,), many[:-1] + (32,)], f32, {}) \
        is True  # the GEMM configs take them


@pytest.mark.parametrize("cfg", attention.FLASH_CONFIGS + attention.DECODE_CONFIGS,
                         ids=lambda c: c.label)
def test_attention_occupancy_is_the_grid_launched(recorder, cfg):
    flash = isinstance(cfg, attention.Flash)
    q = meta(2, 12, 1 if not flash else 70, 64)
    kv = meta(2, 4, 300, 64)
    (attention.flash if flash else attention.decode)(cfg, q, kv, kv, None, is_causal=False,
                                                     scale=None)
    first = recorder.grids[0][1]
    declared = attention.occupancy(cfg)([tuple(q.shape), tuple(kv.shape), tuple(kv.shape)])
    assert declared.programs == math.prod(first)
    # flash: 70 query rows in blocks of block_m; decode: 3 query heads a kv head in 16 rows
    assert declared.useful == pytest.approx(70 / (-(-70 // cfg.block_m) * cfg.block_m)
                                            if flash else 3 / 16)
