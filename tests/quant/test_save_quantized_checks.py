"""``tg.save_quantized`` refuses float weights it cannot store faithfully, before writing:
a weight whose shape is not the graph's (a transposed one was quantized along the wrong axis
and refused only at load) and a weight to quantize holding NaN or +-inf (its scales NaN or
inf: a NaN file loaded as if healthy, an inf one was refused only at load). Nothing is
written, and a file already at the path is left as it was."""

import os

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, ShapeError

SCHEMES = ["int8-weight", "int8-dynamic", "int4-weight"]
K, N = 64, 32


def _model():
    """A linear (torch's (N, K) weight, with a bias) into a matmul ((K, N) weight)."""
    x = tg.input("x", (2, K))
    h = tg.relu(tg.linear(x, tg.weight("fc.weight", (K, K)), tg.weight("fc.bias", (K,))))
    return h @ tg.weight("proj", (K, N))


def _weights():
    rng = np.random.default_rng(0)
    return {"fc.weight": rng.standard_normal((K, K)).astype(np.float32) * 0.1,
            "fc.bias": rng.standard_normal(K).astype(np.float32),
            "proj": rng.standard_normal((K, N)).astype(np.float32) * 0.1}


def _refused(path, weights, scheme, error):
    """The save's error; nothing at ``path``, and no temporary file left beside it."""
    before = set(os.listdir(os.path.dirname(path)))
    with pytest.raises(error) as info:
        tg.save_quantized(path, _model(), weights, scheme)
    assert not os.path.exists(path)
    assert set(os.listdir(os.path.dirname(path))) == before
    return str(info.value)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_a_transposed_weight_is_refused_naming_it_and_both_shapes(tmp_path, scheme):
    w = _weights()
    w["proj"] = np.ascontiguousarray(w["proj"].T)  # (N, K): a torch layout for a matmul
    msg = _refused(str(tmp_path / "m.safetensors"), w, scheme, ShapeError)
    assert "'proj'" in msg and f"({N}, {K})" in msg and f"({K}, {N})" in msg
    assert "transpose" in msg and "bind" in msg


def test_a_float_weight_of_another_shape_is_refused_too(tmp_path):
    """A bias is written as it is; of another shape it would bind nowhere."""
    w = _weights()
    w["fc.bias"] = np.zeros(K + 1, np.float32)
    msg = _refused(str(tmp_path / "m.safetensors"), w, "int8-weight", ShapeError)
    assert "'fc.bias'" in msg and f"({K + 1},)" in msg and f"({K},)" in msg


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("name", ["fc.weight", "proj"])
def test_a_nonfinite_weight_to_quantize_is_refused(tmp_path, scheme, bad, name):
    w = _weights()
    w[name][5, 3] = bad
    msg = _refused(str(tmp_path / "m.safetensors"), w, scheme, ArgumentError)
    assert repr(name) in msg and "(5, 3)" in msg and "not finite" in msg
    assert "repair the float weights" in msg


def test_all_nan_weights_are_refused(tmp_path):
    """The tester's case: every value NaN, which a load then took (scales NaN) as healthy."""
    w = _weights()
    w["proj"][:] = np.nan
    msg = _refused(str(tmp_path / "m.safetensors"), w, "int8-weight", ArgumentError)
    assert f"{K * N} of {K * N} values not finite" in msg


def test_a_refused_save_leaves_the_file_at_the_path_alone(tmp_path):
    path = tmp_path / "m.safetensors"
    tg.save_quantized(str(path), _model(), _weights(), "int8-weight")
    before = path.read_bytes()
    w = _weights()
    w["proj"][0, 0] = np.nan
    with pytest.raises(ArgumentError):
        tg.save_quantized(str(path), _model(), w, "int8-weight")
    w = _weights()
    w["fc.weight"] = w["fc.weight"][:, :-1]
    with pytest.raises(ShapeError):
        tg.save_quantized(str(path), _model(), w, "int8-weight")
    assert path.read_bytes() == before
