"""transformers' GPT-2, Qwen3 and Gemma3 through tg.from_torch: logits match torch at two
sequence lengths with one plan, and the composites each model spells out by hand (GPT-2's
tanh-GELU formula, RMSNorm as pow/mean/rsqrt, rotate_half RoPE) land on fused kernels.

Models are built from configs with random weights (no downloads)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

TOL = 1e-4
LENGTHS = (9, 14)


class LogitsOnly(torch.nn.Module):
    """input ids -> logits, without a KV cache (what export traces)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids):
        return self.model(input_ids=ids, use_cache=False).logits


def _compile(model, vocab: int, max_len: int = 32, **options):
    torch.manual_seed(0)
    wrapped = LogitsOnly(model.eval())
    seq = torch.export.Dim("seq", max=max_len)
    ids = torch.randint(0, vocab, (1, LENGTHS[0]))
    prog = tg.from_torch(wrapped, (ids,), ({1: seq},), **options)
    for n in LENGTHS:
        ids = torch.randint(0, vocab, (1, n))
        with torch.no_grad():
            ref = wrapped(ids).double().numpy()
        got = np.asarray(prog(ids), dtype=np.float64)
        assert got.shape == ref.shape
        err = relative_error(got, ref)
        assert err <= TOL, (n, err)
    assert prog.program.stats["planner_runs"] == 1  # one plan serves every length
    return prog


def _kernels_by_root(prog) -> dict[str, Counter]:
    """For each op a step computes, how many steps ran each kernel."""
    out: dict[str, Counter] = {}
    for s in prog.plan.steps:
        out.setdefault(s.computes, Counter())[s.kernel.name] += 1
    return out


def _lands(by_root, op: str, kernel_part: str, count: int) -> None:
    """``count`` steps compute ``op`` whole, each on a kernel whose name has ``kernel_part``."""
    found = by_root.get(op, Counter())
    assert sum(found.values()) == count, (op, found)
    assert all(kernel_part in k for k in found), (op, found)


def _no_spelled_out(prog, ops=("pow", "rsqrt", "mean", "tanh", "sqrt", "reciprocal")):
    roots = {s.computes for s in prog.plan.steps}
    assert not roots & set(ops), sorted(roots & set(ops))
    assert not any("pow" in s.kernel.name for s in prog.plan.steps)


def _gpt2(n_layer: int, n_embd: int, n_head: int, vocab: int, positions: int):
    cfg = transformers.GPT2Config(n_layer=n_layer, n_embd=n_embd, n_head=n_head,
                                  vocab_size=vocab, n_positions=positions,
                                  bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(cfg)


def _check_gpt2(prog, n_layer: int) -> None:
    by_root = _kernels_by_root(prog)
    _lands(by_root, "gelu", "gelu_tanh", n_layer)  # NewGELUActivation's formula, one kernel
    gelus = [s.node for s in prog.plan.steps if s.node.op.name == "gelu"]
    assert all(g.inputs[0].op.name != "reshape" for g in gelus)  # it reads the GEMM: fusable
    # or one generated row kernel (GPT-2 has no other row reduction outside attention), which
    # may also store the residual stream it reads (the first ln_1, the embeddings' sum)
    rows = [s for s in prog.plan.steps if s.kernel.name.startswith("c_row_")]
    assert all(s.kernel.name.startswith("c_row_") for s in prog.plan.steps if s.also), rows
    _lands(by_root, "layer_norm", "layer_norm", 2 * n_layer + 1 - len(rows))
    _lands(by_root, "scaled_dot_product_attention", "attention", n_layer)
    _no_spelled_out(prog)
    text = prog.explain()
    assert "gelu_tanh" in text and "layer_norm" in text and "attention" in text


def test_gpt2_two_layers():
    torch.manual_seed(0)
    prog = _compile(_gpt2(2, 64, 4, 1000, 64), 1000)
    _check_gpt2(prog, 2)


def test_gpt2_small_twelve_layers():
    torch.manual_seed(0)
    # the real GPT-2 small config (124M parameters), random weights
    prog = _compile(_gpt2(12, 768, 12, 50257, 1024), 50257)
    _check_gpt2(prog, 12)


def test_qwen3_rmsnorm_swiglu_rope_attention_land_on_fused_kernels():
    torch.manual_seed(0)
    layers = 2
    cfg = transformers.Qwen3Config(num_hidden_layers=layers, vocab_size=1000, hidden_size=64,
                                   intermediate_size=128, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16)
    # the hand kernels (generated ones take residual adds with their norms: both are checked
    # against torch in _compile; test_generated_kernels_take_what_hand_kernels_leave below)
    prog = _compile(transformers.Qwen3ForCausalLM(cfg), 1000, generate=False)
    by_root = _kernels_by_root(prog)
    # per layer: input and post-attention norms, q_norm and k_norm; plus the final norm
    _lands(by_root, "rms_norm", "rms_norm", 4 * layers + 1)
    _lands(by_root, "scaled_dot_product_attention", "attention", layers)
    _lands(by_root, "rotary_embedding", "rotary", 2 * layers)  # q and k
    swiglu = [s for s in prog.plan.steps if "swiglu" in s.kernel.name]
    assert len(swiglu) == layers, by_root
    _no_spelled_out(prog)
    assert "rms_norm" in prog.explain()


def test_generated_kernels_take_what_hand_kernels_leave():
    """With generation on (the default), a Qwen3-style model plans fewer steps than with the
    hand kernels alone, some of them generated, and still matches torch (checked in _compile)."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(num_hidden_layers=2, vocab_size=1000, hidden_size=64,
                                   intermediate_size=96, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16)  # planned nowhere else
    model = transformers.Qwen3ForCausalLM(cfg)
    hand = _compile(model, 1000, generate=False)
    both = _compile(model, 1000)
    assert any(getattr(s.kernel, "generated", False) for s in both.plan.steps)
    assert len(both.plan.steps) < len(hand.plan.steps)


def test_gemma3_270m_shapes_with_sliding_window():
    torch.manual_seed(0)
    layers = 2
    # Gemma3 270M's shapes, two layers: one sliding-window and one global attention layer. The
    # vocabulary (262144) is cut to 4096 and the window (512) to 8 so that it slides at these
    # lengths, keeping the test's memory and time small.
    cfg = transformers.Gemma3TextConfig(
        num_hidden_layers=layers, vocab_size=4096, hidden_size=640, intermediate_size=2048,
        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=2048,
        query_pre_attn_scalar=256)
    prog = _compile(transformers.Gemma3ForCausalLM(cfg), 4096, generate=False)
    by_root = _kernels_by_root(prog)
    # per layer: four norms around attention and MLP, q_norm and k_norm; plus the final norm
    _lands(by_root, "rms_norm", "rms_norm", 6 * layers + 1)
    _lands(by_root, "scaled_dot_product_attention", "attention", layers)
    _lands(by_root, "rotary_embedding", "rotary", 2 * layers)
    _lands(by_root, "gelu", "gelu_tanh", layers)  # gelu_pytorch_tanh in the gated MLP
    _no_spelled_out(prog)


@pytest.mark.parametrize("rope", [
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 8},
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8},
], ids=lambda rope: rope["rope_type"])
def test_llama_scaled_rope(rope):
    """A Llama with scaled RoPE (Llama 3's, linear, YaRN with its attention factor): export
    takes the scaled frequencies, so the logits match torch's at both lengths (past
    original_max_position_embeddings = 8). The types tg.nn refuses ('dynamic', 'longrope')
    do not import: they branch on, or write a buffer by, the run-time length."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(num_hidden_layers=2, vocab_size=1000, hidden_size=64,
                                   intermediate_size=96, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=32,
                                   rope_parameters={**rope, "rope_theta": 500.0})
    # a fresh database: the three graphs are one structure (the frequencies are a buffer
    # input), and _compile counts this one's planner run
    prog = _compile(transformers.LlamaForCausalLM(cfg), 1000, db=":memory:")
    _lands(_kernels_by_root(prog), "rotary_embedding", "rotary", 4)  # q and k, two layers
