"""``tg.from_torch(weights=...)`` and an imported program's ``bind_safetensors`` on what
transformers' ``save_pretrained`` writes: a tied parameter saved once (GPT-2's LM head is in
the file only as ``transformer.wte.weight``, while ``torch.export`` names the graph's weight
``lm_head.weight``), a model's folder, and a sharded checkpoint's index. Before, the first
was refused as "not this model's checkpoint" by ``from_torch`` and, by ``bind_safetensors``,
left the old head bound (logits 137% off, silently); the others were refused as truncated
safetensors files."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
safetensors = pytest.importorskip("safetensors")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

INDEX = "model.safetensors.index.json"
NO_CACHE = {"use_cache": False}


def _gpt2(seed: int):
    cfg = transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=211,
                                  n_positions=32, bos_token_id=None, eos_token_id=None)
    torch.manual_seed(seed)
    return transformers.GPT2LMHeadModel(cfg).eval()


def _ids():
    return torch.from_numpy(np.random.default_rng(0).integers(0, 211, (1, 8)))


def _logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(ids, use_cache=False).logits.numpy()


def test_a_tied_weight_saved_once_is_read_under_its_other_name(tmp_path):
    saved = _gpt2(0)
    saved.save_pretrained(tmp_path)
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys() and "transformer.wte.weight" in f.keys()
    ids = _ids()
    want = _logits(saved, ids)
    loaded = tg.from_torch(_gpt2(1), (ids,), kwargs=NO_CACHE, db=":memory:",
                           weights=tmp_path)  # (a model's folder: its model.safetensors)
    assert relative_error(loaded(ids).logits, want) < 1e-5
    assert loaded.program.aliases == {"transformer.wte.weight": "lm_head.weight"}
    other = tg.from_torch(_gpt2(2), (ids,), kwargs=NO_CACHE, db=":memory:")
    assert relative_error(other(ids).logits, want) > 0.5  # (its own weights, before)
    other.program.bind_safetensors(tmp_path / "model.safetensors", strict=True)
    assert relative_error(other(ids).logits, want) < 1e-5


def test_a_tied_weight_saved_under_both_names_is_read_once(tmp_path):
    """A file holding both names of the tied tensor (a plain state dict saved): the graph's
    own name is read, the other skipped, also with ``strict``."""
    saved = _gpt2(0)
    state = {k: v.contiguous() for k, v in saved.state_dict().items()}
    assert "lm_head.weight" in state and "transformer.wte.weight" in state
    safetensors.torch.save_file({k: v.clone() for k, v in state.items()},
                                str(tmp_path / "both.safetensors"))
    ids = _ids()
    prog = tg.from_torch(_gpt2(1), (ids,), kwargs=NO_CACHE, db=":memory:")
    prog.program.bind_safetensors(tmp_path / "both.safetensors", strict=True)
    assert relative_error(prog(ids).logits, _logits(saved, ids)) < 1e-5
    from_dict = tg.from_torch(_gpt2(1), (ids,), kwargs=NO_CACHE, db=":memory:",
                              weights={k: v for k, v in state.items() if k != "lm_head.weight"})
    assert relative_error(from_dict(ids).logits, _logits(saved, ids)) < 1e-5


def test_a_sharded_checkpoint_feeds_from_torch_by_its_folder_or_its_index(tmp_path):
    saved = _gpt2(0)
    saved.save_pretrained(tmp_path, max_shard_size="20KB")
    assert (tmp_path / INDEX).exists()
    ids = _ids()
    want = _logits(saved, ids)
    for path in (tmp_path, tmp_path / INDEX):
        prog = tg.from_torch(_gpt2(1), (ids,), kwargs=NO_CACHE, db=":memory:", weights=path)
        assert relative_error(prog(ids).logits, want) < 1e-5, path
