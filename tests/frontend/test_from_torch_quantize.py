"""tg.from_torch(..., quantize=SCHEME, skip=[...]): the imported graph's weights rewritten as
tg.quantize does, checked against the scheme computed by hand from the module's own weights
(int8: a scale per output channel, max |w| / 127, round half to even; bf16: torch's own
rounding to bfloat16)."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.errors import ArgumentError  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

OPTIONS = {"db": ":memory:", "profile": "never"}


def int8(w: np.ndarray) -> np.ndarray:
    """A linear's (N, K) weight as int8 per output channel, dequantized (float64)."""
    w = w.astype(np.float64)
    s = np.abs(w).max(axis=1, keepdims=True) / 127
    s[s == 0] = 1
    return np.clip(np.round(w / s), -127, 127) * s


def array(value) -> np.ndarray:
    return value.detach().numpy() if hasattr(value, "detach") else np.asarray(value)


def bf16(w: np.ndarray) -> np.ndarray:
    return torch.from_numpy(w).to(torch.bfloat16).double().numpy()


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 8)).eval()


def by_hand(mlp, x: np.ndarray, rounds) -> np.ndarray:
    h = x.astype(np.float64)
    for i, layer in enumerate(mlp):
        if isinstance(layer, torch.nn.Linear):
            w = layer.weight.detach().numpy()
            h = h @ rounds[i](w).T + layer.bias.detach().double().numpy()
        else:
            h = np.maximum(h, 0)
    return h


@pytest.mark.parametrize("scheme, rounding, kernel", [
    ("int8-weight", int8, "c_q8_matmul"), ("bf16-weight", bf16, "c_bf16_matmul")])
def test_an_mlp_imported_quantized_computes_the_scheme(mlp, scheme, rounding, kernel):
    x = np.random.default_rng(1).standard_normal((5, 32)).astype(np.float32)
    prog = tg.from_torch(mlp, (torch.from_numpy(x),), quantize=scheme, **OPTIONS)
    got = array(prog(torch.from_numpy(x)))
    want = by_hand(mlp, x, {0: rounding, 2: rounding})
    assert relative_error(got, want) < 1e-5
    plain = by_hand(mlp, x, {0: np.asarray, 2: np.asarray})
    assert relative_error(want, plain) > 1e-4  # the scheme changed the numbers
    kernels = {s.kernel.name for s in prog.program.plan.steps if not s.static}
    assert any(k.startswith(kernel) for k in kernels), kernels


def test_skip_leaves_the_named_weights_float(mlp):
    x = np.random.default_rng(2).standard_normal((3, 32)).astype(np.float32)
    prog = tg.from_torch(mlp, (torch.from_numpy(x),), quantize="int8-weight", skip=["0.*"],
                         **OPTIONS)
    got = array(prog(torch.from_numpy(x)))
    assert relative_error(got, by_hand(mlp, x, {0: np.asarray, 2: int8})) < 1e-5
    assert relative_error(got, by_hand(mlp, x, {0: int8, 2: int8})) > 1e-4


def test_skip_without_quantize_is_refused(mlp):
    with pytest.raises(ArgumentError, match="quantize="):
        tg.from_torch(mlp, (torch.zeros(1, 32),), skip=["0.*"], **OPTIONS)
    with pytest.raises(ArgumentError, match="unknown scheme"):
        tg.from_torch(mlp, (torch.zeros(1, 32),), quantize="int3", **OPTIONS)


@pytest.mark.slow
def test_gpt2_tiny_imported_int8_matches_the_quantized_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=211,
                                  n_positions=64, bos_token_id=None, eos_token_id=None,
                                  use_cache=False)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, 211, (1, 12))
    f32 = tg.from_torch(lm, (ids,), **OPTIONS)
    q8 = tg.from_torch(lm, (ids,), quantize="int8-weight", **OPTIONS)
    skipped = tg.from_torch(lm, (ids,), quantize="int8-weight", skip=["transformer.h.0.*"],
                            **OPTIONS)

    def logits(prog):
        out = prog(ids)
        return array(out[0] if isinstance(out, (tuple, list)) else getattr(out, "logits", out))

    # the same model quantized by hand: every Conv1D weight (K, N), a scale per column
    ref = transformers.GPT2LMHeadModel(cfg).eval()
    ref.load_state_dict(lm.state_dict())
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if name.endswith(("attn.weight", "proj.weight", "fc.weight")):
                p.copy_(torch.from_numpy(int8(p.numpy().T).T.astype(np.float32)))
        head = torch.from_numpy(int8(lm.lm_head.weight.detach().numpy()).astype(np.float32))
        hidden = ref.transformer(ids).last_hidden_state
        want = (hidden @ head.T).numpy()
    plain = logits(f32)
    got = logits(q8)
    assert relative_error(got, want) < 1e-4
    assert relative_error(got, plain) > 1e-4
    # explain() marks each product reading an int8 weight, as c_q8_* or as a float GEMM on
    # the weight dequantized once per binding: 4 a layer and the tied LM head
    def products(prog):
        return sum("[int8-weight" in line for line in prog.explain().splitlines())

    assert products(q8) == 9 and products(skipped) == 5  # layer 0's four stay float
    assert products(f32) == 0
