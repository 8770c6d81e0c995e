"""tg.nn's GPT-2 and Llama/Qwen3 against transformers with the same (random) weights.

The weights go through a safetensors file written from the transformers model's state dict and
are bound by name with ``prog.bind_safetensors``. Initialisation is wide (std 0.3) so greedy
tokens change from step to step and a wrong cache or position shows in the tokens.
"""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import nn  # noqa: E402

VOCAB = 97
TOL = 1e-4


def _gpt2():
    cfg = transformers.GPT2Config(n_embd=32, n_layer=2, n_head=4, vocab_size=VOCAB,
                                  n_positions=64, initializer_range=0.3, bos_token_id=None,
                                  eos_token_id=None)
    hf = transformers.GPT2LMHeadModel(cfg)
    return hf, nn.GPT2(nn.GPT2Config.from_hf(hf.config))


def _qwen3():  # GQA (4 query heads, 2 kv heads), RoPE, q/k norms, SwiGLU, untied head
    cfg = transformers.Qwen3Config(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                   vocab_size=VOCAB, initializer_range=0.3)
    hf = transformers.Qwen3ForCausalLM(cfg)
    return hf, nn.Llama(nn.LlamaConfig.from_hf(hf.config))


def _llama():  # GQA with head_dim = hidden / heads, no q/k norms
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, initializer_range=0.3, rope_theta=500.0)
    hf = transformers.LlamaForCausalLM(cfg)
    return hf, nn.Llama(nn.LlamaConfig.from_hf(hf.config))


MODELS = {"gpt2": _gpt2, "qwen3": _qwen3, "llama": _llama}


@pytest.fixture(scope="module", params=sorted(MODELS))
def pair(request, tmp_path_factory):
    torch.manual_seed(0)
    hf, ours = MODELS[request.param]()
    hf.eval()
    path = tmp_path_factory.mktemp(request.param) / "model.safetensors"
    # clone: GPT-2's lm_head shares wte's storage, which save_file refuses
    save_file({k: v.detach().clone().contiguous() for k, v in hf.state_dict().items()}, path)
    return request.param, hf, ours, path


def _hf_logits(hf, ids):
    with torch.no_grad():
        return hf(torch.tensor(ids)).logits.numpy()


def test_prefill_two_lengths_one_symbolic_plan(pair):
    name, hf, model, path = pair
    prog = tg.compile(model(), db=":memory:", bounds={"batch": 2, "seq": 16})
    prog.bind_safetensors(path)
    rng = np.random.default_rng(1)
    for seq in (5, 13):
        ids = rng.integers(0, VOCAB, (2, seq))
        got = prog(input_ids=ids)
        assert got.shape == (2, seq, VOCAB)
        assert tg.numerics.relative_error(got, _hf_logits(hf, ids)) <= TOL, (name, seq)
    assert prog.stats["planner_runs"] == 1


def test_kv_cache_decode_matches_greedy_generate(pair):
    name, hf, model, path = pair
    cache = nn.KVCache(max_len=24)
    logits = model(cache=cache)
    prog = tg.compile([logits, *cache.updates], db=":memory:",
                      bounds=cache.bounds(batch=1, seq=8))
    prog.bind(**cache.empty(batch=1)).bind_safetensors(path)
    prompt = np.random.default_rng(2).integers(0, VOCAB, (1, 6))
    new_tokens = 10
    with torch.no_grad():
        expected = hf.generate(torch.tensor(prompt), max_new_tokens=new_tokens, do_sample=False,
                               attention_mask=torch.ones_like(torch.tensor(prompt)),
                               pad_token_id=0).numpy()[0, prompt.shape[1]:]
    steps, feed = [], prompt
    for _ in range(new_tokens):
        out = prog(input_ids=feed)[0]
        steps.append(out[0, -1])
        feed = np.array([[int(out[0, -1].argmax())]])
    tokens = np.array([int(s.argmax()) for s in steps])
    np.testing.assert_array_equal(tokens, expected)
    assert len(set(tokens.tolist())) > 2, "weights too weak: greedy tokens barely change"
    # each step's logits against transformers' full-sequence forward at that position
    full = _hf_logits(hf, np.concatenate([prompt, tokens[None, :-1]], axis=1))[0]
    ref = full[prompt.shape[1] - 1:]
    assert tg.numerics.relative_error(np.stack(steps), ref) <= TOL, name
    k0 = cache.names()[0]
    assert prog.state(k0).shape[2] == prompt.shape[1] + new_tokens - 1  # tokens fed so far
    assert prog.stats["planner_runs"] == 1 and prog.stats["plans"] == 1
    # a new generation: bind empty caches again, same program, same answers
    prog.bind(**cache.empty(batch=1))
    np.testing.assert_allclose(prog(input_ids=prompt)[0][0, -1], steps[0], rtol=1e-6, atol=1e-6)


def test_cache_overflow_raises_before_running(pair):
    _, _, model, path = pair
    cache = nn.KVCache(max_len=8)
    logits = model(cache=cache)
    prog = tg.compile([logits, *cache.updates], db=":memory:",
                      bounds=cache.bounds(batch=1, seq=4))
    prog.bind(**cache.empty(batch=1)).bind_safetensors(path)
    with pytest.raises(tg.ShapeError):  # a prompt longer than the bound
        prog(input_ids=np.zeros((1, 5), np.int64))
    prog(input_ids=np.zeros((1, 4), np.int64))
    for _ in range(4):
        prog(input_ids=np.zeros((1, 1), np.int64))
    before = np.array(prog.state(cache.names()[0]))
    with pytest.raises(tg.ShapeError):  # the cache holds max_len tokens
        prog(input_ids=np.zeros((1, 1), np.int64))
    np.testing.assert_array_equal(prog.state(cache.names()[0]), before)
