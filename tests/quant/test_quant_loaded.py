"""Prequantized weights from safetensors: ``tg.quantize(g, scheme, prequantized=True)`` reads
``<name>.q`` / ``<name>.scale`` leaves (rewrite/quantize.py ``LOADED``) bound from a file, with
no float weight; the program equals the one that quantized the float weights at bind time;
hostile files (wrong dtype, wrong shape, missing scale, int4 values past a nibble) are refused
naming the tensor."""

import re

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import (
    ArgumentError,
    DTypeError,
    FeedError,
    SerializationError,
    ShapeError,
)
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite.quantize import prequantized_weights
from tensor_graphs.runtime.prequantized import GROUP_KEY, SCHEME_KEY, SKIP_KEY, file_settings
from tensor_graphs.runtime.weights import read_safetensors_header, write_safetensors

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")


def _model():
    """A linear (torch's (N, K) weight) into a matmul ((K, N) weight), K = 40 (not a multiple
    of int4's group of 32: groups of 20)."""
    x = tg.input("x", (3, 40))
    h = tg.gelu(tg.linear(x, tg.weight("fc.weight", (40, 40)), tg.weight("fc.bias", (40,))))
    return h @ tg.weight("proj", (40, 24))


def _weights(rng):
    return {"fc.weight": rng.standard_normal((40, 40)).astype(np.float32),
            "fc.bias": rng.standard_normal(40).astype(np.float32),
            "proj": rng.standard_normal((40, 24)).astype(np.float32)}


@pytest.mark.parametrize("scheme", ["int8-weight", "int8-dynamic", "int4-weight"])
def test_a_prequantized_file_gives_the_bind_time_quantized_program(tmp_path, scheme):
    rng = np.random.default_rng(0)
    y, weights = _model(), _weights(rng)
    stored = prequantized_weights(y, weights, scheme)
    assert stored["fc.weight.q"].shape == (40, 40) and stored["fc.weight.q"].dtype == np.int8
    ng = 2 if scheme == "int4-weight" else 1
    assert stored["fc.weight.scale"].shape == (40, ng) and stored["proj.scale"].shape == (ng, 24)
    path = tmp_path / "q.safetensors"
    write_safetensors(path, {**stored, "fc.bias": weights["fc.bias"]})
    loaded = tg.quantize(y, scheme, prequantized=True)
    names = {leaf.name for leaf in leaves(loaded) if leaf.op.name == WEIGHT}
    assert names == {"fc.weight.q", "fc.weight.scale", "fc.bias", "proj.q", "proj.scale"}
    prog = tg.compile(loaded, db=":memory:").bind_safetensors(path, strict=True)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    ref = tg.compile(tg.quantize(y, scheme), db=":memory:").bind(**weights)(x=x)
    assert relative_error(prog(x=x), ref) <= 1e-5
    assert relative_error(ref, tg.evaluate(y, {"x": x, **weights})) > 1e-4  # quantized


def _write(tmp_path, arrays):
    path = tmp_path / "bad.safetensors"
    write_safetensors(path, arrays)
    return path


def test_hostile_files_are_refused_naming_the_tensor(tmp_path):
    rng = np.random.default_rng(1)
    y, weights = _model(), _weights(rng)
    good = {**prequantized_weights(y, weights, "int4-weight"), "fc.bias": weights["fc.bias"]}
    prog = tg.compile(tg.quantize(y, "int4-weight", prequantized=True), db=":memory:")
    bad = {**good, "proj.q": good["proj.q"].astype(np.float32)}  # float values for int8
    with pytest.raises(DTypeError, match="proj.q"):
        prog.bind_safetensors(_write(tmp_path, bad))
    bad = {**good, "proj.q": good["proj.q"].astype(np.int32)}  # int32 does not fit int8
    with pytest.raises(DTypeError, match="proj.q"):
        prog.bind_safetensors(_write(tmp_path, bad))
    bad = {**good, "fc.weight.scale": np.ascontiguousarray(good["fc.weight.scale"].T)}
    with pytest.raises(ShapeError, match=r"fc.weight.scale.*\[2, 40\].*\[40, 2\]"):
        prog.bind_safetensors(_write(tmp_path, bad))
    bad = {k: v for k, v in good.items() if k != "proj.scale"}
    with pytest.raises(FeedError, match="proj.scale"):
        prog.bind_safetensors(_write(tmp_path, bad))
    bad = {**good, "proj.q": np.full((40, 24), 9, np.int8)}  # past int4's [-8, 7]
    prog.bind_safetensors(_write(tmp_path, bad))
    with pytest.raises(ArgumentError, match=r"int4 weight.*-8..7"):
        prog(x=np.ones((3, 40), np.float32))
    prog.bind_safetensors(_write(tmp_path, good))  # a good file binds after all that
    assert np.isfinite(prog(x=np.ones((3, 40), np.float32))).all()


@pytest.mark.parametrize("key, value", [
    (GROUP_KEY, "0"), (GROUP_KEY, "-5"), (GROUP_KEY, "x"),
    (SKIP_KEY, '"*"'), (SKIP_KEY, "[1, 2]"), (SKIP_KEY, '{"proj": 1}'), (SKIP_KEY, "[")])
def test_hostile_metadata_is_refused_naming_the_key(tmp_path, key, value):
    """A group size that is no positive int (0 divided by zero, -5 read as nonsense shapes)
    and skip patterns that are no JSON list of strings (a string's characters, a dict's
    keys, numbers reaching fnmatch) are refused by name, before any graph is built."""
    y, weights = _model(), _weights(np.random.default_rng(2))
    meta = {SCHEME_KEY: "int4-weight", GROUP_KEY: "32", SKIP_KEY: "[]", key: value}
    path = tmp_path / "meta.safetensors"
    write_safetensors(path, prequantized_weights(y, weights, "int4-weight"), meta)
    with pytest.raises(SerializationError, match=rf"{re.escape(key)}=.*save the model again"):
        file_settings(path, None, None)


@pytest.mark.parametrize("group_size", [0, -1, 2.5, True])
def test_a_bad_group_size_for_a_file_is_refused_as_tg_quantize_refuses_it(tmp_path,
                                                                          group_size):
    y, weights = _model(), _weights(np.random.default_rng(3))
    path = tmp_path / "bare.safetensors"  # no metadata: the caller's group size is read
    write_safetensors(path, prequantized_weights(y, weights, "int4-weight"))
    with pytest.raises(ArgumentError, match=r"group_size must be a positive int"):
        file_settings(path, "int4-weight", group_size)
    assert file_settings(path, "int4-weight", 20)[1] == 20


def test_a_group_size_for_int8_weight_is_refused_not_ignored(tmp_path):
    """int8-weight has a scale per output channel: a group size asked of it, at saving or
    at loading, is refused (it was ignored, and the file's metadata claimed groups of 32)."""
    y, weights = _model(), _weights(np.random.default_rng(4))
    path = tmp_path / "int8.safetensors"
    with pytest.raises(ArgumentError, match="group_size is for.*int8-weight has none"):
        tg.save_quantized(path, y, weights, "int8-weight", group_size=64)
    assert not path.exists()
    tg.save_quantized(path, y, weights, "int8-weight")
    assert GROUP_KEY not in read_safetensors_header(path).metadata
    assert file_settings(path, None, None)[:2] == ("int8-weight", None)
    with pytest.raises(ArgumentError, match=rf"{re.escape(str(path))}: group_size is for"):
        file_settings(path, None, 64)


def test_schemes_without_a_stored_form_are_refused():
    with pytest.raises(ArgumentError, match="prequantized"):
        tg.quantize(_model(), "bf16-weight", prequantized=True)


@pytest.mark.parametrize("scheme", ["int8-weight", "int8-dynamic", "int4-weight"])
def test_a_weight_read_by_a_linear_and_a_matmul_saves_and_loads_back(tmp_path, scheme):
    """One (64, 64) weight read as linear(h, w) (its rows the output channels) and as
    h @ w (its columns): two quantizations of one shape. The matmul's is stored under
    ``w.matmul.q``/``w.matmul.scale``; before, both readings' leaves were ``w.q``/``w.scale``
    and save_quantized failed with a FeedError about two leaves named 'w.scale'."""
    rng = np.random.default_rng(2)
    x = tg.input("x", (3, 64))
    w = tg.weight("w", (64, 64))
    y = tg.linear(x, w) + x @ w
    weights = {"w": (rng.standard_normal((64, 64)) * 0.1).astype(np.float32)}
    path = tmp_path / "shared.safetensors"
    names = tg.save_quantized(path, y, weights, scheme)
    assert names == ["w.matmul.q", "w.matmul.scale", "w.q", "w.scale"]
    loaded = tg.quantize(y, scheme, prequantized=True)
    prog = tg.compile(loaded, db=":memory:").bind_safetensors(path, strict=True)
    a = rng.standard_normal((3, 64)).astype(np.float32)
    ref = tg.compile(tg.quantize(y, scheme), db=":memory:").bind(**weights)(x=a)
    assert relative_error(prog(x=a), ref) <= 1e-6
    assert relative_error(ref, tg.evaluate(y, {"x": a, **weights})) > 1e-4  # quantized
