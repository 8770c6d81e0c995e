"""What the verifier does not reach: the out= contract of GPU kernels, rows with nothing to
attend to, many decode splits, grouped tile order, out-of-range ids, and which graph nodes the
templates' patterns and constraints take. Runs where the templates are registered (a GPU, or
the simulated one: ``test_templates_child.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.devices import torch_device
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.torch.convert import dtype_of
from tensor_graphs.kernels.triton import templates

pytestmark = pytest.mark.skipif(not templates.REGISTERED,
                                reason="the templates need triton and a GPU (or the simulated "
                                       "one: test_templates_child.py runs this folder there)")

if templates.REGISTERED:
    import torch

    from tensor_graphs.kernels.triton.templates import attention, runtime

    DEVICE = torch_device("cuda")


def rand(*shape, dtype=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(*shape, generator=g, dtype=torch.float64)
    return t.to(dtype or torch.float32).to(DEVICE)


def rel(got, ref) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    return float((got - ref).norm() / ref.norm())


def reference_attention(q, k, v, mask=None, causal=False, scale=None):
    """softmax(q k^T * scale + mask) v in float64 on the host; empty rows give 0."""
    q, k, v = (t.double().cpu() for t in (q, k, v))
    g = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(g, -3), v.repeat_interleave(g, -3)
    s = q @ k.transpose(-1, -2) * (1 / math.sqrt(q.shape[-1]) if scale is None else scale)
    allowed = torch.ones(s.shape, dtype=torch.bool)
    if mask is not None:
        if mask.dtype == torch.bool:
            allowed = allowed & mask.cpu()
        else:
            s = s + mask.double().cpu()
    if causal:
        allowed = allowed & torch.ones(s.shape[-2:], dtype=torch.bool).tril()
    s = s.masked_fill(~allowed, float("-inf"))
    top = s.amax(-1, keepdim=True)
    e = torch.exp(s - torch.where(top == float("-inf"), 0.0, top))
    return (e / e.sum(-1, keepdim=True).clamp(min=1.0)) @ v


# ---------------------------------------------------------------------------- out=
def _calls():
    ids = torch.tensor([[3, 0, 7]], device=DEVICE)
    return [
        ("triton_linear_gelu_tanh_m16n64k128", (rand(5, 40), rand(24, 40, seed=1),
                                                rand(24, seed=2)), {}),
        ("triton_matmul_bias_add_m64n128k64", (rand(2, 3, 40), rand(40, 24, seed=1),
                                               rand(24, seed=2), rand(2, 3, 24, seed=3)), {}),
        ("triton_flash_attention_mask_m64n64",
         (rand(1, 4, 9, 16), rand(1, 2, 20, 16, seed=1), rand(1, 2, 20, 16, seed=2),
          rand(9, 20, seed=3) > 0), {"is_causal": True, "scale": None}),
        ("triton_decode_attention_n64s16", (rand(2, 4, 1, 16), rand(2, 2, 150, 16, seed=1),
                                            rand(2, 2, 150, 16, seed=2)),
         {"is_causal": False, "scale": 0.2}),
        ("triton_rotary_embedding_r4", (rand(1, 2, 5, 8), rand(5, 8, seed=1),
                                        rand(5, 8, seed=2)), {}),
        ("triton_embedding_r4d256", (ids, rand(9, 6, seed=1)), {}),
    ]


@pytest.mark.parametrize("index", range(6))
def test_out_is_written_and_returned(index):
    """A GPU kernel hands its result to the arena's view it was given: the very object, the
    same values as without out (the verifier checks this for host kernels only)."""
    name, args, attrs = _calls()[index]
    k = registry.get(name)
    assert k.constraint_failure([tuple(a.shape) for a in args],
                                [dtype_of(a) for a in args], attrs) is None
    want = k.fn(*args, **attrs)
    out = torch.full(tuple(want.shape), float("nan"), dtype=want.dtype, device=DEVICE)
    got = k.fn(*args, **attrs, out=out)
    assert got is out and torch.equal(got, want)
    if runtime.interpreted():  # the simulated GPU's arena may be host memory: numpy
        buf = np.full(tuple(want.shape), np.nan, want.cpu().numpy().dtype)
        assert k.fn(*args, **attrs, out=buf) is buf
        assert np.array_equal(buf, want.cpu().numpy())


def test_out_on_another_device_or_layout_gets_a_copy():
    """A non-contiguous out (not what the arena gives, but possible) is filled by a copy."""
    k = registry.get("triton_linear_nobias_m64n128k64")
    x, w = rand(6, 20), rand(12, 20, seed=1)
    out = torch.full((12, 6), float("nan"), device=DEVICE).t()
    assert k.fn(x, w, out=out) is out
    assert rel(out, x.double().cpu() @ w.double().cpu().t()) < 1e-6


# ---------------------------------------------------------------------------- attention
@pytest.mark.parametrize("kind", ["flash", "decode"])
def test_rows_with_nothing_to_attend_give_zero(kind):
    """A fully masked row is 0 (the reference's safe softmax), not NaN: the online softmax
    shifts an all -inf block by 0 and divides an empty row by 1."""
    sq = 1 if kind == "decode" else 6
    q, k, v = rand(2, 4, sq, 16), rand(2, 2, 40, 16, seed=1), rand(2, 2, 40, 16, seed=2)
    mask = rand(2, 4, sq, 40, seed=3) > 0
    mask[0, 1] = False  # head 1 of batch 0 attends nothing
    if kind == "flash":
        mask[1, :, 2] = False  # nor does query row 2 of batch 1
    name = ("triton_flash_attention_mask_m64n64" if kind == "flash"
            else "triton_decode_attention_mask_n64s16")
    got = registry.get(name).fn(q, k, v, mask, is_causal=False, scale=None)
    assert not torch.isnan(got).any()
    assert torch.equal(got[0, 1], torch.zeros_like(got[0, 1]))
    assert rel(got, reference_attention(q, k, v, mask)) < 1e-5


@pytest.mark.parametrize("combine", ["last split", "second kernel"])
@pytest.mark.parametrize("label", [c.label for c in attention.DECODE_CONFIGS]
                         if templates.REGISTERED else [])
def test_decode_combines_many_splits(label, combine, monkeypatch):
    """A long cache splits into up to the config's number of chunks, whose partial softmaxes
    combine to the one-pass result; grouped heads (G = 4) share each K/V block. The last
    split of a kv head to arrive combines its heads and sets its counter back to 0 for the
    next call; without counters (a capture that found too few) ``decode_combine`` does it."""
    cfg = next(c for c in attention.DECODE_CONFIGS if c.label == label)
    sk = 16 * cfg.block_n - 5
    splits, chunk = attention.splits_for(cfg, sk, 2)
    assert splits == min(cfg.max_splits, 16) and (splits - 1) * chunk < sk <= splits * chunk
    q, k, v = rand(1, 8, 1, 32), rand(1, 2, sk, 32, seed=1), rand(1, 2, sk, 32, seed=2)
    mask = rand(1, 1, 1, sk, seed=3) * 3  # a float mask, broadcast over heads
    counters = runtime.arrival_counters(torch.device(DEVICE), 2)
    if combine == "second kernel":
        monkeypatch.setattr(attention, "arrival_counters", lambda device, count: None)
    kernel = registry.get(f"triton_decode_attention_mask_{label}")
    want = reference_attention(q, k, v, mask)
    for _ in range(2):  # the second call finds the counters as the first left them
        got = kernel.fn(q, k, v, mask, is_causal=False, scale=None)
        assert rel(got, want) < 1e-5
        assert not counters.any()


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("label", [c.label for c in attention.DECODE_CONFIGS]
                         if templates.REGISTERED else [])
def test_decode_attention_appends_the_new_rows_as_it_reads_them(label, masked):
    """``appending(rows)``: the caches k, v as an append left them (rows ``rows`` not yet
    written), this step's k_new, v_new: the kernel attends over the caches with the new rows
    and writes them there, at a start inside a split of many (rows 70-71 of 150, grouped
    heads) and at the very end; the rows past the new ones stay as they were."""
    cfg = next(c for c in attention.DECODE_CONFIGS if c.label == label)
    fn = registry.get(f"triton_decode_attention{'_mask' if masked else ''}_{label}").fn
    for start, sk in ((70, 150), (148, 150)):
        q, kn, vn = rand(1, 8, 1, 16), rand(1, 2, 2, 16, seed=1), rand(1, 2, 2, 16, seed=2)
        k, v = rand(1, 2, sk, 16, seed=3), rand(1, 2, sk, 16, seed=4)
        want_k, want_v = k.clone(), v.clone()
        want_k[:, :, start:start + 2], want_v[:, :, start:start + 2] = kn, vn
        mask = (torch.arange(sk) < start + 2).to(DEVICE)  # (the padded rows past: masked)
        rows = torch.arange(start, start + 2).to(DEVICE)
        run = fn.appending(rows)
        got = run(q, k, v, mask, kn, vn, is_causal=False, scale=None) if masked else \
            run(q, k, v, kn, vn, is_causal=False, scale=None)
        assert torch.equal(k, want_k) and torch.equal(v, want_v)
        want = reference_attention(q, want_k, want_v, mask if masked else None)
        assert rel(got, want) < 1e-5, (start, rel(got, want))
        assert attention.splits_for(cfg, sk, 2)[0] > 1  # (the new rows in one split of many)


def test_causal_decode_attends_key_zero_only():
    """Top-left causal with one query row: key 0 alone (the reference's tril)."""
    q, k, v = rand(1, 4, 1, 8), rand(1, 2, 100, 8, seed=1), rand(1, 2, 100, 8, seed=2)
    got = registry.get("triton_decode_attention_n64s16").fn(q, k, v, is_causal=True, scale=None)
    want = v[:, :, :1].repeat_interleave(2, 1)
    assert rel(got, want) < 1e-6


def test_grouped_heads_beyond_sixteen():
    """G = 20 query heads per kv head: the decode tile pads its rows to 32."""
    q, k, v = rand(1, 20, 1, 16), rand(1, 1, 50, 16, seed=1), rand(1, 1, 50, 16, seed=2)
    got = registry.get("triton_decode_attention_n64s16").fn(q, k, v, is_causal=False,
                                                            scale=None)
    assert rel(got, reference_attention(q, k, v)) < 1e-5


# ---------------------------------------------------------------------------- GEMM, gather
def test_gemm_tiles_in_grouped_order():
    """More row tiles than GROUP_M (9 > 8) and several column tiles: every tile once."""
    x, w, r = rand(144, 70), rand(130, 70, seed=1), rand(144, 130, seed=2)
    got = registry.get("triton_linear_nobias_add_m16n64k128").fn(x, w, r)
    want = x.double().cpu() @ w.double().cpu().t() + r.double().cpu()
    assert rel(got, want) < 1e-6


def test_out_of_range_ids_give_nan_rows():
    """The reference raises; the GPU kernel cannot, so it reads nothing outside the table."""
    table = rand(5, 3)
    ids = torch.tensor([0, -1, 5, 4], device=DEVICE)
    got = registry.get("triton_embedding_r16d128").fn(ids, table)
    assert torch.isnan(got[1:3]).all()
    assert torch.equal(got[[0, 3]], table[[0, 4]])


# ---------------------------------------------------------------------------- argmax
@pytest.mark.parametrize("pick", ["last chunk", "second kernel", "one chunk"])
@pytest.mark.parametrize("label", [c.label for c in templates.argmax.CONFIGS]
                         if templates.REGISTERED else [])
def test_argmax_takes_the_first_maximum_across_chunks(label, pick, monkeypatch):
    """Rows of many chunks: a tie between chunks goes to the earlier one, a NaN anywhere wins
    (the first NaN, even in a later chunk than a larger value), a row of -inf answers 0; the
    counters are back at 0 for the next call, whether the last chunk picked or a second
    kernel did (a capture that found too few counters). In one chunk (a GPU full of rows
    already) a lane meets several values: a tie within a lane goes to the earlier too."""
    cfg = next(c for c in templates.argmax.CONFIGS if c.label == label)
    n = 6 * cfg.block + 7
    if pick == "one chunk":
        monkeypatch.setattr(templates.argmax, "PROGRAMS", 1)
    assert (templates.argmax.splits_for(cfg, 4, n)[0] == 1) == (pick == "one chunk")
    x = torch.zeros(4, n, dtype=torch.float32)
    x[0, [5, cfg.block + 3, cfg.block + 5, 5 * cfg.block + 5]] = 9.0  # ties: the first
    x[1, 2] = 7.0
    x[1, [4 * cfg.block + 1, n - 1]] = float("nan")  # the first NaN
    x[2] = float("-inf")
    x[3, n - 1] = 1.0  # in the last, partial chunk
    counters = runtime.arrival_counters(torch.device(DEVICE), 4)
    if pick == "second kernel":
        monkeypatch.setattr(templates.argmax, "arrival_counters", lambda device, count: None)
    kernel = registry.get(f"triton_argmax_{label}")
    for _ in range(2):
        got = kernel.fn(x.to(DEVICE), axis=-1, keepdims=False)
        assert got.dtype == torch.int64
        assert got.cpu().tolist() == [5, 4 * cfg.block + 1, 0, n - 1]
        assert not counters.any()


def test_argmax_writes_into_out_and_keeps_dims():
    x = rand(2, 3, 700, dtype=torch.float16)
    out = torch.full((2, 3, 1), -1, dtype=torch.int64, device=DEVICE)
    got = registry.get("triton_argmax_b4096s16").fn(x, axis=2, keepdims=True, out=out)
    assert got is out
    assert torch.equal(out.cpu(), x.float().cpu().argmax(-1, keepdim=True))


# ---------------------------------------------------------------------------- patterns
def _names(node) -> set[str]:
    return {k.name for k, _ in registry.matching(node, backends=["triton"])}


def test_patterns_take_model_shaped_nodes():
    x, w, b = tg.input("x", (4, 8, 64)), tg.input("w", (96, 64)), tg.input("b", (96,))
    found = _names(tg.gelu(tg.linear(x, w, b), approximate="tanh"))
    assert {n for n in found if n.startswith("triton_linear_gelu_tanh_")} == \
        {f"triton_linear_gelu_tanh_{c.label}" for c in templates.matmul.CONFIGS}
    r = tg.input("r", (4, 8, 96))
    assert "triton_linear_nobias_add_m64n128k64" in _names(tg.linear(x, w) + r)
    q16 = tg.input("q", (4, 64), "float16")
    w16 = tg.input("w16", (96, 64), "float16")
    found = _names(tg.linear(q16, w16))
    assert "triton_linear_nobias_m64n128k64" in found
    assert not any("tf32" in n for n in found)  # the TF32 configs take float32 only


def test_attention_kernels_by_query_rows():
    k, v = tg.input("k", (1, 2, 300, 64)), tg.input("v", (1, 2, 300, 64))
    decode = _names(tg.scaled_dot_product_attention(tg.input("q", (1, 8, 1, 64)), k, v))
    prefill = _names(tg.scaled_dot_product_attention(tg.input("q", (1, 8, 300, 64)), k, v,
                                                     is_causal=True))
    assert {n for n in decode if "decode" in n} and {n for n in decode if "flash" in n}
    assert prefill and not {n for n in prefill if "decode" in n}
    wide = (tg.input("q", (1, 2, 9, 256)), tg.input("k", (1, 2, 9, 256)),
            tg.input("v", (1, 2, 9, 256)))
    assert not _names(tg.scaled_dot_product_attention(*wide))  # head dim > 128


def test_tolerances_say_what_the_gpu_does():
    """TF32 products are declared at TF32's error, not the interpreter's (exact); a gather
    and an argmax move or pick values exactly."""
    for k in tg.kernels.all():
        if k.backend == "triton" and k.fn.__module__.startswith(templates.__name__):
            want = (runtime.TF32 if "_tf32_" in k.name else
                    runtime.EXACT if k.name.startswith(("triton_embedding", "triton_argmax"))
                    else
                    runtime.ELEMENTWISE if k.name.startswith("triton_rotary") else
                    runtime.REDUCTION)
            assert k.tolerance == want, k.name
