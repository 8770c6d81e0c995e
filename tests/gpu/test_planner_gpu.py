"""The planner with the real GPU kernels (torch CUDA, Triton, the copies): what a compile for
"cuda" places where, with nothing measured and under rows that favour each choice.

Runs on a real GPU, and in CI on the simulated one (see conftest). Main-process tests of the
same rules with a simulated second device: tests/planner/test_cross_device.py."""

from __future__ import annotations

import pytest

import tensor_graphs as tg
from tensor_graphs.db.store import open_db
from tensor_graphs.demo import gpt2_style
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.ir.node import expand_composite
from tensor_graphs.kernels import generated, registry
from tests.planner import rows

HEAVY = {"matmul", "linear", "scaled_dot_product_attention", "layer_norm"}


def _expand(n):
    return expand_composite(n.op, n.inputs, n.attrs)


def test_generators_render_for_the_device_their_row_names():
    from tensor_graphs.kernels.triton import generate

    if not generate.usable():
        pytest.skip("triton is not installed")
    x = tg.input("x", (8, 32))
    root = tg.exp(x * 2.0) * tg.sum(x, axis=-1, keepdims=True)
    uses = use_counts([root])
    on = {kind: generated.candidates(root, uses, _expand, kind) for kind in ("cpu", "cuda")}
    assert on["cpu"] and on["cuda"]
    for kind, found in on.items():
        assert {c.device for c in found} == {kind}
    assert {c.backend for c in on["cuda"]} == {"triton"}
    kinds = {name: kind for name, kind, _ in generated.generators()}
    assert {c.generator for c in on["cuda"]} <= {n for n, k in kinds.items() if k == "cuda"}


@pytest.mark.parametrize("shape", [(2, 768, 12, 2048, 128), (3, 256, 4, 512, 16)],
                         ids=["gpt2-124m-widths", "width-256"])
def test_an_unmeasured_gpu_compile_of_gpt2_runs_its_layers_on_the_gpu(shape):
    """Nothing measured, the per-device defaults of db/cost.py decide: the matmuls, attention
    and norms run on the GPU (torch CUDA or Triton), every value is made once (a repeated
    block's input was made on the host and copied up: the embedding sum on both devices),
    and the only copies are the ids up and the logits down. GPT-2 124M's widths with two
    layers (a repeated block) and a small vocabulary; and a width of 256, where value by
    value the host's C calls beat launches and the DP's own plan copied around every linear
    (13 copies a call; the single-device plan is predicted faster)."""
    layers, width, heads, vocab, seq = shape
    y = gpt2_style(layers, d_model=width, heads=heads, vocab=vocab, n_ctx=max(seq, 32))
    prog = tg.compile(y, device="cuda", db=":memory:", bounds={"batch": 1, "seq": seq})
    plan = prog.plan
    text = prog.explain()
    computing = [s for s in plan.steps if not s.is_copy]
    heavy = [s for s in computing if s.computes in HEAVY
             or any(n.op.name in HEAVY for n in s.nodes)]
    assert len(heavy) >= layers * 7, text  # a layer: 2 norms, 4 linear, attention
    assert all(s.device == "cuda" and s.kernel.backend in ("torch", "triton")
               for s in heavy), text
    for s in computing:  # the host keeps only what no GPU kernel computes
        if s.device == "cpu":
            assert not [k for k, _ in registry.matching(s.node, use_counts([y]))
                        if k.device == "cuda"], (s, text)
    made = [s.node for s in computing]
    assert len(made) == len(set(made)), text  # nothing made twice
    assert [s.device for s in plan.steps if s.is_copy] == ["cuda", "cpu"], text
    assert "devices: cuda:0" in text and "copies: 1 cpu -> cuda:0 per call; 1 cuda:0 -> cpu " \
        "per call" in text


SEED = {  # rows under which each choice wins, for tanh on a (4, 16) float32 value on the GPU
    "cuda kernel": {"torch_cuda_tanh": 1e-4, "numpy_tanh": 1e-6,
                    "copy_cuda_to_host": 6e-5, "copy_host_to_cuda": 6e-5},
    "host round trip": {"torch_cuda_tanh": 1e-2, "numpy_tanh": 1e-6,
                        "copy_cuda_to_host": 1e-6, "copy_host_to_cuda": 1e-6},
    "decomposed": {"torch_cuda_tanh": 1e-2, "numpy_tanh": 1e-2,
                   "copy_cuda_to_host": 1e-6, "copy_host_to_cuda": 1e-6},
}


@pytest.mark.parametrize("winner", list(SEED))
def test_the_seeds_tanh_with_the_gpus_own_kernels(winner):
    """The seed's example on the real kernels: torch's CUDA tanh, the host round trip through
    the copy kernels, or tanh's decomposition into torch CUDA kernels."""
    x = tg.state("x", (4, 16))
    y = tg.tanh(x)
    times = dict(SEED[winner])
    if winner == "decomposed":
        times.update({k.name: 1e-7 for k in tg.kernels.all()
                      if k.device == "cuda" and k.backend == "torch" and k.name not in times})
    plan = rows.plan(open_db(":memory:"), [y], times, output_device="cuda")
    names = [s.kernel.name for s in plan.steps]
    if winner == "cuda kernel":
        assert names == ["torch_cuda_tanh"]
    elif winner == "host round trip":
        assert names == ["copy_cuda_to_host", "numpy_tanh", "copy_host_to_cuda"]
    else:
        assert len(names) > 3 and "torch_cuda_tanh" not in names
        assert all(s.device == "cuda" and s.kernel.backend == "torch" for s in plan.steps)


@pytest.mark.slow  # ~20 s on the simulated GPU: its first steps run the Triton interpreter
def test_a_pre_norm_decode_step_normalizes_inside_its_gemvs(slow_host):
    """GPT-2's decode step: each layer's two LayerNorms are the prologues of the GEMVs that
    read them (``ln_`` epilogues: c_attn, and c_fc with its gelu), so the only norm launched
    on its own is the final one, before the LM head; the tokens stay transformers'."""
    import numpy as np

    from tensor_graphs.nn import Generator
    from tests.gpu import tiny

    lm = tiny.gpt2(n_layer=2, n_embd=64)
    layers = lm.config.n_layer
    gen = Generator.from_transformers(lm, max_len=16, max_prompt=8, db=slow_host,
                                      device="cuda")
    names = [s.kernel.name for s in gen.decode.plan.steps if not s.is_copy]
    fused = [n for n in names if n.startswith("triton_ln_")]
    assert len(fused) == 2 * layers, names
    assert sum("gelu_tanh" in n for n in fused) == layers, names
    assert [n for n in names if "layer_norm" in n] == ["torch_cuda_layer_norm"], names
    prompt = np.random.default_rng(3).integers(0, 211, (1, 8))
    expected = tiny.greedy(lm, prompt, 6)
    np.testing.assert_array_equal(gen(prompt, 6), expected)
