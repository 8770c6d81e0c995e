"""``chain.chain``: a decode block's attention and GEMVs as one persistent kernel, checked
against float64 stage by stage. In the interpreter each stage is a launch of its own (its
programs run one after another, so the GPU's barriers cannot run here: the sm_90 compile of
``targets._chain_targets`` covers them); the stage bodies are the GPU's. Runs where the
templates are registered (a GPU, or the simulated one: ``test_templates_child.py``)."""

from __future__ import annotations

import math

import pytest

from tensor_graphs.devices import torch_device
from tensor_graphs.kernels.triton import templates

pytestmark = pytest.mark.skipif(not templates.REGISTERED,
                                reason="the templates need triton and a GPU (or the simulated "
                                       "one: test_templates_child.py runs this folder there)")

if templates.REGISTERED:
    import torch
    import triton
    import triton.language as tl

    from tensor_graphs.kernels.torch import bound
    from tensor_graphs.kernels.triton.templates import attention, chain, matmul
    from tensor_graphs.kernels.triton.templates.runtime import jit

    DEVICE = torch_device("cuda")
    EPILOGUE = {e.label: e for e in matmul.EPILOGUES}
    _line_starts = jit(chain.JIT)._line_starts

    @triton.jit
    def _line_starts_of_each_program(out_ptr, span, per_line, programs, steps: tl.constexpr,
                                     block: tl.constexpr):
        """``_line_starts`` of each program (the grid) for ``steps`` blocks from its first."""
        pid = tl.program_id(0)
        for j in tl.static_range(steps):
            tl.store(out_ptr + (pid * steps + j) * block + tl.arange(0, block),
                     _line_starts(span, per_line, pid, programs, j * block, block))


def rand(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=torch.float64).float().to(DEVICE)


def rel(got, ref) -> float:
    got = got.double().cpu()
    return float((got - ref).norm() / ref.norm())


def _strings(value) -> list:
    """The strings in a nest of tuples and lists."""
    if isinstance(value, str):
        return [value]
    return [s for v in value for s in _strings(v)] if isinstance(value, (tuple, list)) else []


def block(rows: int, d: int, hidden: int, cfgs, bind: bool = True):
    """A GPT-2 block's GEMVs after attention, then the next block's q/k/v: (links, the
    float64 results). Sizes past one K step and one column block, so units split K, and
    more units than the interpreter's four programs, so a program deals several."""
    w = [rand(d, d, seed=1) / d ** 0.5, rand(d, hidden, seed=2) / d ** 0.5,
         rand(hidden, d, seed=3) / hidden ** 0.5, rand(3 * d, d, seed=4) / d ** 0.5]
    b = [rand(n, seed=5 + i) for i, n in enumerate((d, hidden, d, 3 * d))]
    ln = [(rand(d, seed=10) + 1, rand(d, seed=11)), (rand(d, seed=12) + 1, rand(d, seed=13))]
    if bind:
        for t in w:
            bound.mark(t)
    attn, x = rand(rows, d, seed=20), rand(rows, d, seed=21)
    outs = [torch.empty(rows, n, device=DEVICE) for n in (d, hidden, d, 3 * d)]
    links = [
        matmul.Link(cfgs[0], EPILOGUE["matmul_bias_add"], attn, w[0], b[0], x, outs[0]),
        matmul.Link(cfgs[1], EPILOGUE["ln_matmul_bias_gelu_tanh"], outs[0], w[1], b[1], None,
                    outs[1], ln[0]),
        matmul.Link(cfgs[2], EPILOGUE["matmul_bias_add"], outs[1], w[2], b[2], outs[0],
                    outs[2]),
        matmul.Link(cfgs[3], EPILOGUE["ln_linear"], outs[2], w[3], b[3], None, outs[3], ln[1]),
    ]
    f = [t.double().cpu() for t in w + b]
    norm = [tuple(t.double().cpu() for t in pair) for pair in ln]
    x1 = attn.double().cpu() @ f[0] + f[4] + x.double().cpu()
    h = torch.nn.functional.gelu(torch.nn.functional.layer_norm(x1, (d,), *norm[0], 1e-5)
                                 @ f[1] + f[5], approximate="tanh")
    x2 = h @ f[2] + f[6] + x1
    qkv = torch.nn.functional.layer_norm(x2, (d,), *norm[1], 1e-5) @ f[3].T + f[7]
    return links, [x1, h, x2, qkv]


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("order", [(0, 0, 1, 1), (1, 0, 1, 0)])
def test_a_chain_gives_each_links_product(rows, order):
    cfgs = [matmul.GEMV_CONFIGS[i] for i in order]
    links, refs = block(rows, 300, 520, cfgs)
    got = chain.chain(links)
    assert len(got) == 4
    for link, out, ref in zip(links, got, refs):
        assert out is link.out
        assert rel(out, ref) < 1e-5, (link.e.label, rel(out, ref))
    assert not chain.chain_failed(DEVICE)


def llama_mlp(d: int, hidden: int, eps: float):
    """A Llama block's MLP from RMSNorm's input: gate and up as one GEMV normalizing as it
    loads (``rms*_linear_nobias``, the sibling-fused form), then down (of gate's columns
    here, an elementwise step apart in a model) plus the residual: (links, float64 results)."""
    x, w_ln = rand(1, d, seed=40) * 3 + 1, rand(d, seed=41) + 1
    w_gu, w_down = rand(2 * hidden, d, seed=42) / d ** 0.5, rand(d, hidden, seed=43) / hidden ** 0.5
    for w in (w_gu, w_down):
        bound.mark(w)
    gu, out = torch.empty(1, 2 * hidden, device=DEVICE), torch.empty(1, d, device=DEVICE)
    norm = EPILOGUE[f"rms{round(-math.log10(eps))}_linear_nobias"]
    links = [matmul.Link(matmul.GEMV_CONFIGS[1], norm, x, w_gu, None, None, gu, (w_ln,)),
             matmul.Link(matmul.GEMV_CONFIGS[1], EPILOGUE["linear_nobias_add"],
                         gu[:, :hidden], w_down, None, x, out)]
    x64, w64 = x.double().cpu(), w_ln.double().cpu()
    normed = x64 * torch.rsqrt((x64 * x64).mean(-1, keepdim=True) + eps) * w64
    gu64 = normed @ w_gu.double().cpu().T
    return links, [gu64, gu64[:, :hidden] @ w_down.double().cpu().T + x64]


@pytest.mark.parametrize("eps", matmul.RMS_EPS if templates.REGISTERED else [])
def test_a_chain_normalizes_by_rmsnorm_as_it_loads(eps):
    """RMSNorm's statistics (no mean taken out, no bias) with the pattern's eps, in a chain
    stage as in a GEMV alone."""
    links, refs = llama_mlp(40, 72, eps)
    got = chain.chain(links)
    for link, out, ref in zip(links, got, refs):
        assert rel(out, ref) < 1e-5, (link.e.label, rel(out, ref))
    alone = links[0].alone()
    assert rel(alone, refs[0]) < 1e-5


def test_a_chain_of_computed_weights_and_one_link():
    """A weight no ``bind`` marked is read after the barrier (no prefetch): the results are
    the same; a chain of one GEMV is that GEMV."""
    cfgs = [matmul.GEMV_CONFIGS[0]] * 4
    links, refs = block(1, 70, 130, cfgs, bind=False)
    for out, ref in zip(chain.chain(links), refs):
        assert rel(out, ref) < 1e-5
    one = chain.chain(links[:1])[0]
    assert rel(one, refs[0]) < 1e-5


def test_a_chain_with_more_programs_than_units_runs_them_idle():
    """Programs past a stage's units only pass its barriers (a GPU's chain has a program
    per SM whatever the GEMVs' sizes)."""
    links, refs = block(1, 24, 40, [matmul.GEMV_CONFIGS[1]] * 4)
    for out, ref in zip(chain.chain(links, programs=64), refs):
        assert rel(out, ref) < 1e-5


@pytest.mark.parametrize("span, per_line, programs", [
    (1, 32, 4), (31, 32, 4), (32, 32, 4), (33, 32, 4), (1000, 32, 3), (5003, 16, 7),
    (10, 32, 16), (40, 1, 5)])
def test_the_l2_prefetch_asks_for_every_line_of_the_weights_and_none_past_them(
        span, per_line, programs):
    """The GPU's prefetch of a GEMV stage's weights (``chain_jit._prefetch_weights``, inline
    assembly the interpreter cannot run) asks for the lines of the elements
    ``_line_starts`` gives: they lie in the span, and a line apart at most from 0 to its
    last element, so every line of the span is asked for whatever its alignment."""
    block = 8
    share = -(-(-(-span // per_line) + 1) // programs)  # each program's lines
    steps = -(-share // block) + 1  # one block more: lanes past a share stay inside
    out = torch.full((programs, steps, block), -1, dtype=torch.int64, device=DEVICE)
    _line_starts_of_each_program[(programs,)](out, span, per_line, programs, steps, block)
    got = sorted(set(out.cpu().flatten().tolist()))
    assert got[0] == 0 and got[-1] == span - 1, got
    assert max((b - a for a, b in zip(got, got[1:])), default=0) <= per_line, got


def test_a_chain_refuses_what_it_cannot_run():
    links, _ = block(1, 24, 40, [matmul.GEMV_CONFIGS[0]] * 4)
    with pytest.raises(ValueError, match="1 to 5 stages, got 6"):
        chain.chain(links + links[:2])
    with pytest.raises(ValueError, match="1 to 5 stages, got 0"):
        chain.chain([])
    other = matmul.Link(links[1].cfg, links[1].e, rand(2, 24, seed=1), links[1].b,
                        links[1].bias, None, None, links[1].norm)
    with pytest.raises(ValueError, match=r"every GEMV of a chain has the same rows: got \[1, 2\]"):
        chain.chain([links[0], other])
    five, six = (llama_mlp(24, 16, eps)[0][0] for eps in (1e-5, 1e-6))
    with pytest.raises(ValueError, match=r"every norm of a chain has the same eps: got "
                                         r"\[1e-06, 1e-05\]"):
        chain.chain([five, six])
    empty = matmul.Link(links[0].cfg, links[0].e, links[0].a, rand(24, 0, seed=2), None)
    with pytest.raises(ValueError, match=r"an empty product \(1 x 0\) in matmul_bias_add"):
        chain.chain([links[0], empty])


def test_a_chain_from_a_decode_attention_appending_its_rows_on():
    """A block's decode step from its attention on: the attention (grouped heads, masked,
    writing this step's key and value rows into the caches at rows 70-71 of 150 as it reads
    them) and the block's GEMVs after it, one chain; the attention's result and the caches
    are those of the float64 reference, and each GEMV's from them."""
    d, heads, dim = 32, 4, 8
    q, kn, vn = rand(1, heads, 1, dim, seed=30), rand(1, 2, 2, dim, seed=31), \
        rand(1, 2, 2, dim, seed=32)
    k, v = rand(1, 2, 150, dim, seed=33), rand(1, 2, 150, dim, seed=34)
    want_k, want_v = k.clone(), v.clone()
    want_k[:, :, 70:72], want_v[:, :, 70:72] = kn, vn
    mask = (torch.arange(150) < 72).to(DEVICE)
    rows = torch.arange(70, 72).to(DEVICE)
    attended = torch.empty(1, heads, 1, dim, device=DEVICE)
    cfg = attention.DECODE_CONFIGS[0]
    first = attention.DecodeLink(cfg, q, k, v, mask.view(torch.uint8), False, None, attended,
                                 (kn, vn, rows))
    links, _ = block(1, d, 2 * d, [matmul.GEMV_CONFIGS[0]] * 4)
    x = links[0].res
    links[0] = matmul.Link(links[0].cfg, links[0].e, attended.view(1, d), links[0].b,
                           links[0].bias, x, links[0].out)
    got = chain.chain([first] + links)
    assert torch.equal(k, want_k) and torch.equal(v, want_v)
    consts = [link.prepare(True).constexprs for link in [first] + links]
    assert not _strings(consts), consts  # Triton 3.6 cannot index them (test_triton_36.py)
    g = heads // 2
    kk, vv = (t.double().cpu().repeat_interleave(g, 1) for t in (want_k, want_v))
    scores = (q.double().cpu() @ kk.transpose(-1, -2)) / dim ** 0.5
    scores = scores.masked_fill(~mask.cpu(), float("-inf"))
    ref = torch.softmax(scores, -1) @ vv
    assert got[0] is attended and rel(attended, ref) < 1e-5
    w0, b0 = (t.double().cpu() for t in (links[0].b, links[0].bias))
    x1 = ref.reshape(1, d) @ w0 + b0 + x.double().cpu()
    assert rel(got[1], x1) < 1e-5
