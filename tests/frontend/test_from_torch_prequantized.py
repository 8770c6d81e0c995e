"""Prequantized files in ``tg.from_torch`` (issue 23): an MLP quantized once
(``TorchProgram.save_quantized``) and loaded later with ``weights=<file>`` gives the outputs of
``from_torch(quantize=scheme)`` from the float parameters, with no float copy of a quantized
weight read: the module may live on the meta device; a bad file is refused, naming the tensor,
before anything is bound."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.errors import (  # noqa: E402
    ArgumentError,
    DTypeError,
    FeedError,
    SerializationError,
    ShapeError,
)
from tensor_graphs.kernels.c import build  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402
from tensor_graphs.runtime.prequantized import GROUP_KEY, SCHEME_KEY  # noqa: E402
from tensor_graphs.runtime.weights import write_safetensors  # noqa: E402

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")


def _mlp():
    """K = 40 (not a multiple of the group of 32: int4's last group short, int8-dynamic per
    channel), then K = 64 (two full groups)."""
    return torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.GELU(),
                               torch.nn.Linear(64, 24))


@pytest.fixture(scope="module", params=["int8-weight", "int8-dynamic", "int4-weight"])
def saved(request, tmp_path_factory):
    """(scheme, the float module, the program quantized from it, the file it saved)."""
    torch.manual_seed(0)
    module = _mlp().eval()
    ref = tg.from_torch(module, (torch.randn(3, 40),), quantize=request.param, db=":memory:")
    path = tmp_path_factory.mktemp("q") / f"{request.param}.safetensors"
    ref.save_quantized(path)
    return request.param, module, ref, path


def _file(path):
    from safetensors.numpy import load_file
    return load_file(str(path))


def test_a_saved_file_gives_the_bind_time_quantized_outputs(saved):
    scheme, module, ref, path = saved
    stored = _file(path)
    assert sorted(stored) == ["0.bias", "0.weight.q", "0.weight.scale", "2.bias", "2.weight.q",
                              "2.weight.scale"]  # no float copy of a quantized weight
    x = torch.randn(3, 40)
    got = tg.from_torch(module, (x,), weights=path, db=":memory:")
    assert relative_error(got(x), ref(x)) <= 1e-6
    with torch.no_grad():
        assert relative_error(ref(x), module(x).numpy()) > 1e-4  # quantized


def test_a_module_on_the_meta_device_loads_the_file(saved):
    """No float parameter exists at all: the module has shapes only."""
    scheme, _, ref, path = saved
    with torch.device("meta"):
        module = _mlp()
    x = torch.randn(3, 40)
    got = tg.from_torch(module, (x,), weights=path, db=":memory:")
    assert relative_error(got(x), ref(x)) <= 1e-6
    assert sorted(got.program._bound) == sorted(_file(path))


def test_prequantized_arrays_load_like_the_file(saved):
    scheme, module, ref, path = saved
    x = torch.randn(3, 40)
    got = tg.from_torch(module, (x,), weights=_file(path), quantize=scheme,
                        prequantized=True, db=":memory:")
    assert relative_error(got(x), ref(x)) <= 1e-6


def test_a_float_checkpoint_quantizes_at_bind_time(saved, tmp_path):
    """weights= a float file (no quantize metadata): read as the module's values."""
    scheme, module, ref, _ = saved
    floats = tmp_path / "float.safetensors"
    write_safetensors(floats, {k: v.numpy() for k, v in module.state_dict().items()})
    with torch.device("meta"):
        empty = _mlp()
    x = torch.randn(3, 40)
    got = tg.from_torch(empty, (x,), weights=floats, quantize=scheme, db=":memory:")
    assert relative_error(got(x), ref(x)) <= 1e-6


def _write(tmp_path, arrays, scheme):
    path = tmp_path / "bad.safetensors"
    write_safetensors(path, arrays, {SCHEME_KEY: scheme, GROUP_KEY: "32"})
    return path


def test_bad_files_are_refused_naming_the_tensor(saved, tmp_path):
    scheme, module, _, path = saved
    good = _file(path)
    x = torch.randn(3, 40)

    def load(p, **kw):
        return tg.from_torch(module, (x,), weights=p, db=":memory:", **kw)

    with pytest.raises(FeedError, match="2.weight.scale"):
        load(_write(tmp_path, {k: v for k, v in good.items() if k != "2.weight.scale"},
                    scheme))
    with pytest.raises(DTypeError, match="0.weight.q"):
        load(_write(tmp_path, {**good, "0.weight.q": good["0.weight.q"].astype(np.int16)},
                    scheme))
    with pytest.raises(ShapeError, match="0.weight.scale"):
        load(_write(tmp_path, {**good, "0.weight.scale": good["0.weight.scale"][:-1]}, scheme))
    nan = good["2.weight.scale"].copy()
    nan[7, 0] = np.nan
    with pytest.raises(SerializationError, match=r"2.weight.scale.*\(7, 0\)"):
        load(_write(tmp_path, {**good, "2.weight.scale": nan}, scheme))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(path.read_bytes()[:-7])
    with pytest.raises(SerializationError, match="cut.safetensors"):
        load(cut)
    other = "int4-weight" if scheme == "int8-weight" else "int8-weight"
    with pytest.raises(ArgumentError, match=f"holds {scheme} weights"):
        load(path, quantize=other)
    if scheme != "int8-weight":  # its scales are per group of 32 rows of K
        with pytest.raises(ArgumentError, match="groups of 32 rows, not 16.*group_size=32"):
            load(path, group_size=16)
    with torch.device("meta"):
        empty = _mlp()
    with pytest.raises(ArgumentError, match="meta device.*weights="):
        tg.from_torch(empty, (x,), db=":memory:")
    with pytest.raises(ArgumentError, match="from float weights"):
        load(path).save_quantized(tmp_path / "again.safetensors")


def test_skipped_weights_stay_float_in_the_file_and_load_with_its_skip(tmp_path):
    """skip= is kept in the file: the load needs no skip, and another one is refused."""
    torch.manual_seed(1)
    module = _mlp().eval()
    x = torch.randn(3, 40)
    ref = tg.from_torch(module, (x,), quantize="int8-weight", skip=["2.*"], db=":memory:")
    path = tmp_path / "skip.safetensors"
    assert "2.weight" in ref.save_quantized(path) and "2.weight.q" not in _file(path)
    got = tg.from_torch(module, (x,), weights=path, db=":memory:")
    assert relative_error(got(x), ref(x)) <= 1e-6
    with pytest.raises(ArgumentError, match=r"saved with skip=\['2.\*'\].*not \['0.\*'\]"):
        tg.from_torch(module, (x,), weights=path, skip=["0.*"], db=":memory:")


# --- the scales' layout: another group size, the old int8-dynamic layout, other tools' files ---

def _no_compile(monkeypatch):
    """Refusals must come before anything is compiled (and so before anything is bound)."""
    from tensor_graphs import compiler

    def refuse(*a, **k):
        raise AssertionError("compiled before the file was refused")
    monkeypatch.setattr(compiler, "compile", refuse)


def test_an_int8_dynamic_file_from_before_grouped_scales(tmp_path, monkeypatch):
    """A file saved before int8-dynamic's scales were grouped: one scale per output channel,
    metadata group 32 (int4's, written for every scheme). Refused, naming the tensor and
    both shapes, file or arrays, before compiling; loads with the group size it advises,
    giving per-channel weights and per-row activations: what it was saved as."""
    torch.manual_seed(2)
    module = _mlp().eval()
    x = torch.randn(3, 40)
    per_channel = tg.from_torch(module, (x,), quantize="int8-dynamic", group_size=64,
                                db=":memory:")  # 64 >= every K: no groups, as before
    path = tmp_path / "new.safetensors"
    per_channel.save_quantized(path)
    arrays = _file(path)
    assert arrays["2.weight.scale"].shape == (24, 1)
    old = _write(tmp_path, arrays, "int8-dynamic")  # metadata group 32
    with monkeypatch.context() as m:
        _no_compile(m)
        with pytest.raises(ShapeError, match=r"'2.weight.scale' is \[24, 1\] for a \[24, 64\] "
                           r"'2.weight.q', int8-dynamic needs \[24, 2\].*per output channel.*"
                           r"tg.save_quantized.*group_size=64"):
            tg.from_torch(module, (x,), weights=old, db=":memory:")
        with pytest.raises(ShapeError, match=r"'2.weight.scale' is \[24, 1\].*reads \[24, 2\]"
                           r".*tg.save_quantized.*group_size=64"):
            tg.from_torch(module, (x,), weights=arrays, quantize="int8-dynamic",
                          prequantized=True, db=":memory:")
    got = tg.from_torch(module, (x,), weights=old, group_size=64, db=":memory:")
    assert relative_error(got(x), per_channel(x)) <= 1e-6
    with pytest.raises(ArgumentError, match="groups of 32 rows, not 16"):  # fits neither
        tg.from_torch(module, (x,), weights=old, group_size=16, db=":memory:")


@pytest.mark.parametrize("scheme", ["int8-weight", "int8-dynamic", "int4-weight"])
def test_a_file_of_another_group_size(scheme, tmp_path, monkeypatch):
    """Saved with groups of 16: its metadata says so (loads with no group_size, another is
    refused); without metadata (another tool's file) the shapes decide where they allow one
    meaning (int8-dynamic: K / rows; int8-weight: no groups), else refused with advice."""
    torch.manual_seed(3)
    module = _mlp().eval()
    x = torch.randn(3, 40)
    groups = {} if scheme == "int8-weight" else {"group_size": 16}  # (refused: no groups)
    ref = tg.from_torch(module, (x,), quantize=scheme, db=":memory:", **groups)
    path = tmp_path / "g16.safetensors"
    ref.save_quantized(path)
    assert relative_error(tg.from_torch(module, (x,), weights=path, db=":memory:")(x),
                          ref(x)) <= 1e-6
    bare = tmp_path / "bare.safetensors"
    write_safetensors(bare, _file(path))  # no metadata at all

    def load(**kw):
        return tg.from_torch(module, (x,), weights=bare, quantize=scheme, prequantized=True,
                             db=":memory:", **kw)

    if scheme == "int4-weight":  # K = 40 in 3 groups, 64 in 4: groups of 16 to 19 alike
        with monkeypatch.context() as m:
            _no_compile(m)
            with pytest.raises(ArgumentError, match=r"does not say its group size.*"
                               r"\[16, 17, 18, 19\].*group_size=16"):
                load()
            with pytest.raises(ShapeError, match=r"'0.weight.scale' is \[64, 3\].*needs "
                               r"\[64, 2\] \(K = 40, groups of 32 rows\).*group_size=16"):
                load(group_size=32)
        got = load(group_size=16)
    else:
        got = load()
    assert relative_error(got(x), ref(x)) <= 1e-6
    if scheme != "int8-weight":  # the arrays, with the default group of 32
        misfit = (r"'0.weight.scale' is \[64, 3\].*reads \[64, 2\]" if scheme == "int4-weight"
                  else r"'2.weight.scale' is \[24, 4\].*reads \[24, 2\]")  # K = 40: 1 row
        with monkeypatch.context() as m:
            _no_compile(m)
            with pytest.raises(ShapeError, match=misfit + ".*group_size=16"):
                tg.from_torch(module, (x,), weights=_file(path), quantize=scheme,
                              prequantized=True, db=":memory:")


@pytest.mark.parametrize("scheme", ["int8-weight", "int8-dynamic", "int4-weight"])
def test_a_scale_of_the_right_size_but_another_shape(scheme, tmp_path, monkeypatch):
    """Flattened or reshaped scales are refused by name, in a file or as arrays, before
    compiling: which value belongs to which channel is not the file's to guess."""
    torch.manual_seed(4)
    module = _mlp().eval()
    x = torch.randn(3, 40)
    ref = tg.from_torch(module, (x,), quantize=scheme, db=":memory:")
    path = tmp_path / "ok.safetensors"
    ref.save_quantized(path)
    good = _file(path)
    s = good["2.weight.scale"]  # (24, rows)
    _no_compile(monkeypatch)
    flat = _write(tmp_path, {**good, "2.weight.scale": s.reshape(-1)}, scheme)
    with pytest.raises(ShapeError, match=r"'2.weight.scale' is \[\d+\] for a \[24, 64\] "
                       r"'2.weight.q'.*\(N, rows\).*tg.save_quantized"):
        tg.from_torch(module, (x,), weights=flat, db=":memory:")
    other = np.ascontiguousarray(s.reshape(s.shape[::-1]))
    with pytest.raises(ShapeError, match=rf"'2.weight.scale' is \[{s.shape[1]}, 24\].*"
                       rf"reads \[24, {s.shape[1]}\].*tg.save_quantized"):
        tg.from_torch(module, (x,), weights={**good, "2.weight.scale": other}, quantize=scheme,
                      prequantized=True, db=":memory:")


@pytest.mark.parametrize("scheme", ["int8-weight", "int4-weight"])
def test_a_parameter_read_by_linear_and_matmul_saves_and_loads_back(tmp_path, scheme):
    """The reported case: F.linear(h, w) + h @ w quantizes w twice (rows, then columns);
    save_quantized stored both under one name and failed with a FeedError the user could
    not act on. Now it saves, and the file loads back to the same outputs."""
    class Shared(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(48, 48) * 0.1)

        def forward(self, h):
            return torch.nn.functional.linear(h, self.w) + h @ self.w

    torch.manual_seed(0)
    module, x = Shared().eval(), torch.randn(2, 48)
    ref = tg.from_torch(module, (x,), quantize=scheme, db=":memory:")
    path = tmp_path / "shared.safetensors"
    assert ref.save_quantized(path) == ["w.matmul.q", "w.matmul.scale", "w.q", "w.scale"]
    got = tg.from_torch(module, (x,), weights=path, db=":memory:")
    assert relative_error(got(x), ref(x)) <= 1e-6
