"""``Generator.from_safetensors`` on what transformers' ``save_pretrained`` writes: the folder
itself, a sharded checkpoint (its ``model.safetensors.index.json``), bfloat16 and float16
weights; each decodes transformers' greedy tokens. A missing or truncated shard, an index that
lacks a weight and a folder without a checkpoint are refused naming the file, before anything
is compiled."""

import json
import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402

VOCAB, PROMPT, NEW = 211, 6, 10
INDEX = "model.safetensors.index.json"


def _llama():
    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   vocab_size=VOCAB, initializer_range=0.3, bos_token_id=None,
                                   eos_token_id=None, pad_token_id=None)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _expected(lm, prompt):
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        return lm.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids)).numpy()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    """(the model, a folder save_pretrained wrote it to in shards of at most 20 KB)."""
    lm = _llama()
    folder = tmp_path_factory.mktemp("sharded")
    lm.save_pretrained(folder, max_shard_size="20KB")
    assert (folder / INDEX).exists() and len(list(folder.glob("*.safetensors"))) > 2
    return lm, folder


@pytest.fixture
def no_compile(monkeypatch):
    """Makes any compile fail the test: a refusal must come before that work."""
    from tensor_graphs import compiler

    def refuse(*args, **kwargs):
        raise AssertionError("compiled before the checkpoint was refused")

    monkeypatch.setattr(compiler, "compile", refuse)


def _generate(path, config, prompt):
    gen = Generator.from_safetensors(path, config, max_len=PROMPT + NEW, batch=len(prompt),
                                     db=":memory:")
    return gen(prompt, NEW)


def test_a_sharded_checkpoint_loads_from_its_folder_or_its_index(sharded):
    lm, folder = sharded
    prompt = np.random.default_rng(1).integers(0, VOCAB, (1, PROMPT))
    expected = _expected(lm, prompt)
    np.testing.assert_array_equal(_generate(folder, lm.config, prompt), expected)
    np.testing.assert_array_equal(_generate(str(folder / INDEX), lm.config, prompt), expected)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_a_save_pretrained_folder_loads_in_any_float_dtype(tmp_path, dtype):
    lm = _llama().to(getattr(torch, dtype))
    lm.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    prompt = np.random.default_rng(2).integers(0, VOCAB, (2, PROMPT))
    config = transformers.AutoConfig.from_pretrained(tmp_path)
    # the file's values widened to float32, as the generator reads them
    np.testing.assert_array_equal(_generate(tmp_path, config, prompt),
                                  _expected(lm.float(), prompt))


def _copy(folder, to):
    to.mkdir()
    for f in folder.iterdir():
        (to / f.name).write_bytes(f.read_bytes())
    return to


def test_a_missing_or_truncated_shard_is_refused_naming_it(sharded, tmp_path, no_compile):
    lm, folder = sharded
    shards = json.loads((folder / INDEX).read_text())["weight_map"]
    name, shard = sorted(shards.items())[-1]

    gone = _copy(folder, tmp_path / "gone")
    (gone / shard).unlink()
    with pytest.raises(tg.SerializationError, match=rf"names shard\(s\) {shard} that .*gone "
                       "lacks"):
        Generator.from_safetensors(gone, lm.config, max_len=16)

    cut = _copy(folder, tmp_path / "cut")
    data = (cut / shard).read_bytes()
    (cut / shard).write_bytes(data[:-64])
    with pytest.raises(tg.SerializationError, match=rf"{shard} is not a safetensors file or is "
                       "damaged"):
        Generator.from_safetensors(cut, lm.config, max_len=16)

    lacking = _copy(folder, tmp_path / "lacking")
    index = json.loads((lacking / INDEX).read_text())
    del index["weight_map"][name]
    (lacking / INDEX).write_text(json.dumps(index))
    with pytest.raises(tg.FeedError, match=rf"maps no shard to 1 weight\(s\): '{name}'"):
        Generator.from_safetensors(lacking, lm.config, max_len=16)

    (lacking / INDEX).write_text('{"metadata": {}}')
    with pytest.raises(tg.SerializationError, match='no "weight_map"'):
        Generator.from_safetensors(lacking, lm.config, max_len=16)

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(tg.SerializationError, match=f"holding neither model.safetensors nor "
                       f"{INDEX}"):
        Generator.from_safetensors(empty, lm.config, max_len=16)


def test_the_saved_generation_config_stops_at_its_eos_as_transformers(tmp_path):
    """A model saved with an eos token (its generation_config.json, or only its config) stops
    there in transformers' generate, padding the finished row; read from the checkpoint with
    no eos given, ours ran on past it. A call's eos still replaces the saved one."""
    lm = _llama()
    prompt = np.random.default_rng(4).integers(0, VOCAB, (2, PROMPT))
    free = _expected(lm, prompt)[:, PROMPT:]
    eos = int(free[0, 2])  # the first row's third new token: it stops there
    lm.config.eos_token_id = lm.generation_config.eos_token_id = eos
    lm.config.pad_token_id = lm.generation_config.pad_token_id = 0
    lm.save_pretrained(tmp_path / "saved")
    with torch.no_grad():
        ids = torch.from_numpy(prompt)
        want = lm.generate(ids, max_new_tokens=NEW, do_sample=False,
                           attention_mask=torch.ones_like(ids)).numpy()
    assert want.shape[1] < PROMPT + NEW or (want[0, PROMPT + 3:] == 0).all()  # it stopped
    config = transformers.AutoConfig.from_pretrained(tmp_path / "saved")
    got = _generate(tmp_path / "saved", config, prompt)
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    assert (got[0, want.shape[1]:] == 0).all()  # past transformers' end: only padding
    # without generation_config.json the config's tokens are transformers' defaults too
    (tmp_path / "saved" / "generation_config.json").unlink()
    got = _generate(tmp_path / "saved", config, prompt)
    np.testing.assert_array_equal(got[:, :want.shape[1]], want)
    # the call's own eos (none of the new tokens) replaces the saved one: no row stops
    other = next(t for t in range(VOCAB) if t not in free)
    gen = Generator.from_safetensors(tmp_path / "saved", config, max_len=PROMPT + NEW, batch=2,
                                     db=":memory:", eos_token_id=other)
    np.testing.assert_array_equal(gen(prompt, NEW)[:, PROMPT:], free)
