"""Prequantized files in ``tg.nn.Generator`` (issue 23): a GPT-2-shaped model quantized once
(``Generator.save_quantized``) and loaded later from the safetensors file with no float copy of
its quantized weights (``Generator.from_safetensors``) gives the logits and tokens of
``Generator(quantize=scheme)`` from the float weights; a bad file is refused, naming the
tensor, before anything is compiled or bound."""

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.errors import (  # noqa: E402
    ArgumentError,
    DTypeError,
    FeedError,
    SerializationError,
    ShapeError,
)
from tensor_graphs.kernels.c import build  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402
from tensor_graphs.runtime.prequantized import GROUP_KEY, SCHEME_KEY  # noqa: E402
from tensor_graphs.runtime.weights import write_safetensors  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

VOCAB, MAX_LEN, PROMPT, NEW = 211, 40, 9, 24
ATTN = "transformer.h.0.attn.c_attn.weight"  # a Conv1D weight (K, N): a matmul's


def _config():
    return transformers.GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB,
                                   n_positions=300, initializer_range=0.3, bos_token_id=None,
                                   eos_token_id=None)


@pytest.fixture(scope="module")
def lm():
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(_config()).eval()


@pytest.fixture(scope="module", params=["int8-weight", "int4-weight"])
def saved(request, lm, tmp_path_factory):
    """(scheme, the generator quantized from float weights, the file it saved)."""
    scheme = request.param
    ref = Generator.from_transformers(lm, max_len=MAX_LEN, max_prompt=PROMPT, quantize=scheme,
                                      db=":memory:")
    path = tmp_path_factory.mktemp("q") / f"{scheme}.safetensors"
    ref.save_quantized(path)
    return scheme, ref, path


def _prefill_logits(gen, prompt):
    gen.prefill.bind(**gen._empty)
    return gen.prefill(input_ids=prompt)[0]


def _file(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def test_a_saved_file_generates_the_bind_time_quantized_tokens(saved, lm):
    scheme, ref, path = saved
    stored = _file(path)
    # no float copy of a quantized weight; the tied token table stays float for the gather
    assert ATTN not in stored and stored[f"{ATTN}.q"].dtype == np.int8
    assert "transformer.wte.weight" in stored and "transformer.wte.weight.q" in stored
    got = Generator.from_safetensors(path, _config(), max_len=MAX_LEN, max_prompt=PROMPT,
                                     db=":memory:")
    assert ATTN not in got.decode._bound and f"{ATTN}.scale" in got.decode._bound
    prompt = np.random.default_rng(1).integers(0, VOCAB, (1, PROMPT))
    np.testing.assert_array_equal(got(prompt, NEW), ref(prompt, NEW))
    ref_logits = _prefill_logits(ref, prompt)
    assert relative_error(_prefill_logits(got, prompt), ref_logits) <= 1e-6
    floats = Generator.from_transformers(lm, max_len=MAX_LEN, max_prompt=PROMPT, db=":memory:")
    assert relative_error(ref_logits, _prefill_logits(floats, prompt)) > 1e-4  # quantized


def test_float_copies_in_the_file_are_never_read(saved, tmp_path):
    """The file may also hold the float weights (a checkpoint with both): NaN there changes
    nothing, so the prequantized generator did not read them."""
    scheme, ref, path = saved
    stored = _file(path)
    poisoned = dict(stored)
    for name in stored:
        base = name[:-len(".q")]
        if name.endswith(".q") and base not in stored:
            poisoned[base] = np.full(stored[name].shape, np.nan, np.float32)
    both = tmp_path / "both.safetensors"
    write_safetensors(both, poisoned, {SCHEME_KEY: scheme, GROUP_KEY: "32"})
    got = Generator(tg.nn.GPT2(tg.nn.GPT2Config.from_hf(_config())), both, vocab_size=VOCAB,
                    max_len=MAX_LEN, max_prompt=PROMPT, quantize=scheme, prequantized=True,
                    db=":memory:")
    prompt = np.random.default_rng(2).integers(0, VOCAB, (1, PROMPT))
    np.testing.assert_array_equal(got(prompt, 8), ref(prompt, 8))


def test_a_prequantized_state_dict_loads_like_the_file(saved):
    scheme, ref, path = saved
    got = Generator(tg.nn.GPT2(tg.nn.GPT2Config.from_hf(_config())), _file(path),
                    vocab_size=VOCAB, max_len=MAX_LEN, max_prompt=PROMPT, quantize=scheme,
                    prequantized=True, db=":memory:")
    prompt = np.random.default_rng(3).integers(0, VOCAB, (1, PROMPT))
    np.testing.assert_array_equal(got(prompt, 8), ref(prompt, 8))


def _load(path, **kw):
    return Generator.from_safetensors(path, _config(), max_len=MAX_LEN, max_prompt=PROMPT,
                                      db=":memory:", **kw)


def _rewrite(tmp_path, arrays, scheme, name="bad.safetensors"):
    path = tmp_path / name
    write_safetensors(path, arrays, {SCHEME_KEY: scheme, GROUP_KEY: "32"})
    return path


def test_bad_files_are_refused_naming_the_tensor(saved, tmp_path):
    scheme, _, path = saved
    good = _file(path)
    scale = f"{ATTN}.scale"
    with pytest.raises(FeedError, match=scale):  # missing scale
        _load(_rewrite(tmp_path, {k: v for k, v in good.items() if k != scale}, scheme))
    with pytest.raises(DTypeError, match=f"{ATTN}.q"):  # float values where int8 belongs
        _load(_rewrite(tmp_path, {**good, f"{ATTN}.q": good[f"{ATTN}.q"].astype(np.float32)},
                       scheme))
    with pytest.raises(DTypeError, match=scale):  # integer scales
        _load(_rewrite(tmp_path, {**good, scale: good[scale].astype(np.int32)}, scheme))
    with pytest.raises(ShapeError, match=scale):  # another layout's scale
        _load(_rewrite(tmp_path, {**good, scale: np.ascontiguousarray(good[scale].T)}, scheme))
    nan = good[scale].copy()
    nan[0, 5] = np.nan
    with pytest.raises(SerializationError, match=rf"{scale}.*nan.*\(0, 5\).*save"):
        _load(_rewrite(tmp_path, {**good, scale: nan}, scheme))
    zero = good[scale].copy()
    zero[0, 1] = 0.0
    with pytest.raises(SerializationError, match=rf"{scale}.*not finite and positive"):
        _load(_rewrite(tmp_path, {**good, scale: zero}, scheme))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-1000])
    with pytest.raises(SerializationError, match="cut.safetensors"):
        _load(cut)
    q = good[f"{ATTN}.q"].copy()
    q[3, 4] = 9 if scheme == "int4-weight" else -128  # past a nibble; -128 is int8's own
    if scheme == "int4-weight":  # refused at load, not by the packing on the first call
        with pytest.raises(SerializationError, match=rf"{ATTN}.q.*9 at \(3, 4\).*\[-8, 7\]"):
            _load(_rewrite(tmp_path, {**good, f"{ATTN}.q": q}, scheme))
    else:
        _load(_rewrite(tmp_path, {**good, f"{ATTN}.q": q}, scheme))


def test_a_file_of_another_scheme_or_group_is_refused_by_name(saved):
    scheme, _, path = saved
    other = "int4-weight" if scheme == "int8-weight" else "int8-weight"
    with pytest.raises(ArgumentError, match=rf"holds {scheme} weights.*quantize='{scheme}'"):
        _load(path, quantize=other)
    if scheme == "int4-weight":
        with pytest.raises(ArgumentError, match="groups of 32 rows, not 64.*group_size=32"):
            _load(path, group_size=64)


def test_a_file_without_metadata_loads_given_its_scheme(saved, tmp_path):
    """``prequantized_weights`` written with no metadata: from_safetensors read it as a
    float checkpoint and refused its .q/.scale as missing float weights, quantize= or not.
    Now it asks for the scheme, and given it loads as the saved file does."""
    scheme, ref, path = saved
    bare = tmp_path / "bare.safetensors"
    write_safetensors(bare, _file(path))
    with pytest.raises(ArgumentError, match="does not say which quantization.*quantize="):
        _load(bare)
    groups = {"group_size": 32} if scheme == "int4-weight" else {}  # shapes allow 32 to 36
    got = _load(bare, quantize=scheme, **groups)
    prompt = np.random.default_rng(4).integers(0, VOCAB, (1, PROMPT))
    np.testing.assert_array_equal(got(prompt, 8), ref(prompt, 8))


def test_save_quantized_needs_a_bind_time_quantized_generator(saved, tmp_path):
    _, _, path = saved
    loaded = _load(path)
    with pytest.raises(ArgumentError, match="quantize=<scheme> from float weights"):
        loaded.save_quantized(tmp_path / "again.safetensors")


def test_skip_without_a_scheme_is_refused():
    with pytest.raises(ArgumentError, match="skip=.*quantize="):
        Generator(tg.nn.GPT2(tg.nn.GPT2Config.from_hf(_config())), {}, vocab_size=VOCAB,
                  max_len=MAX_LEN, skip=["lm_head.weight"])


def test_an_int8_dynamic_file_from_before_grouped_scales_is_refused_before_compiling(
        saved, tmp_path, monkeypatch):
    """int8-weight's file is what int8-dynamic wrote before its scales were grouped (one
    scale per output channel, metadata group 32): as int8-dynamic it is refused, naming the
    tensor, both shapes and the fixes, from the file or as a state dict, before either
    program is compiled."""
    scheme, _, path = saved
    if scheme != "int8-weight":
        pytest.skip("the per-channel layout is int8-weight's")
    from tensor_graphs import compiler

    def refuse(*a, **k):
        raise AssertionError("compiled before the file was refused")
    monkeypatch.setattr(compiler, "compile", refuse)
    good = _file(path)
    old = _rewrite(tmp_path, good, "int8-dynamic")
    fix = r"per output channel.*tg.save_quantized.*group_size=256"  # mlp.c_proj's K = 256
    with pytest.raises(ShapeError, match=rf"'{ATTN}.scale' is \[1, 192\] for a \[64, 192\] "
                       rf"'{ATTN}.q', int8-dynamic needs \[2, 192\].*{fix}"):
        _load(old)
    with pytest.raises(ShapeError, match=rf"'{ATTN}.scale' is \[1, 192\].*reads \[2, 192\].*"
                       rf"{fix}"):
        Generator(tg.nn.GPT2(tg.nn.GPT2Config.from_hf(_config())), good, vocab_size=VOCAB,
                  max_len=MAX_LEN, max_prompt=PROMPT, quantize="int8-dynamic",
                  prequantized=True, db=":memory:")
    bare = tmp_path / "bare.safetensors"
    write_safetensors(bare, good)  # another tool's file: no metadata, per channel
    with pytest.raises(ArgumentError, match=r"pass quantize=<scheme>"):
        Generator(tg.nn.GPT2(tg.nn.GPT2Config.from_hf(_config())), bare, vocab_size=VOCAB,
                  max_len=MAX_LEN, max_prompt=PROMPT, prequantized=True, db=":memory:")
