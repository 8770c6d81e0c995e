"""Reading weights from safetensors files through a memory map (tensor_graphs.runtime.weights)."""

import json
import os
import subprocess
import sys
import textwrap
import tracemalloc

import ml_dtypes
import numpy as np
import pytest
import safetensors
import safetensors.numpy as stn

from tensor_graphs.errors import (
    ArgumentError,
    DTypeError,
    FeedError,
    SerializationError,
    ShapeError,
)
from tensor_graphs.ir import dtypes as dt
from tensor_graphs.runtime import weights as weights_mod
from tensor_graphs.runtime.weights import (
    read_checkpoint,
    read_safetensors,
    read_safetensors_header,
    write_safetensors,
)

BF16 = np.dtype(ml_dtypes.bfloat16)

# safetensors code -> (numpy dtype of the data, the graph dtype it is read into)
CASES = {
    "F64": (np.dtype(np.float64), dt.float64),
    "F32": (np.dtype(np.float32), dt.float32),
    "F16": (np.dtype(np.float16), dt.float16),
    "BF16": (BF16, dt.bfloat16),
    "I64": (np.dtype(np.int64), dt.int64),
    "I32": (np.dtype(np.int32), dt.int32),
    "I16": (np.dtype(np.int16), dt.int32),  # no int16 leaves: widened
    "I8": (np.dtype(np.int8), dt.int8),
    "U8": (np.dtype(np.uint8), dt.uint8),
    "BOOL": (np.dtype(np.bool_), dt.bool_),
}


def sample(np_dtype, shape, seed=0):
    rng = np.random.default_rng(seed)
    if np_dtype == np.bool_:
        out = rng.random(shape) < 0.5
    elif np_dtype.kind in "iu":
        info = np.iinfo(np_dtype)
        out = rng.integers(info.min, info.max, size=shape, dtype=np_dtype, endpoint=True)
    else:
        out = (rng.standard_normal(shape) * 100).astype(np_dtype)
    return np.asarray(out)


def wanted_for(arrays, dtypes=None):
    return {n: (a.shape, (dtypes or {}).get(n, dt.from_numpy(a.dtype))) for n, a in arrays.items()}


def raw_file(path, header, data=b"", header_bytes=None):
    """A safetensors file written by hand, so that its header may lie."""
    raw = header_bytes if header_bytes is not None else json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + data)
    return path


# --------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("code", list(CASES))
def test_round_trip_against_safetensors_package(tmp_path, code):
    np_dtype, leaf = CASES[code]
    arrays = {"a": sample(np_dtype, (3, 5)), "b.c": sample(np_dtype, (7,), seed=1),
              "scalar": sample(np_dtype, (), seed=2), "empty": sample(np_dtype, (0, 4))}
    theirs = tmp_path / "theirs.safetensors"
    stn.save_file(arrays, str(theirs))
    header = read_safetensors_header(theirs)
    assert {t.dtype for t in header.tensors.values()} == {code}

    got = read_safetensors(theirs, {n: (a.shape, leaf) for n, a in arrays.items()})
    assert set(got) == set(arrays)
    for n, a in arrays.items():
        assert got[n].dtype == leaf.np_dtype and got[n].shape == a.shape
        assert got[n].flags.c_contiguous and got[n].flags.writeable and got[n].flags.owndata
        np.testing.assert_array_equal(got[n], a.astype(leaf.np_dtype))
        if leaf.np_dtype == np_dtype:  # bit-exact, NaNs and signed zeros included
            assert got[n].tobytes() == a.tobytes()

    ours = tmp_path / "ours.safetensors"
    write_safetensors(ours, arrays, metadata={"format": "np"})
    with safetensors.safe_open(str(ours), framework="np") as f:
        assert f.metadata() == {"format": "np"}
        assert set(f.keys()) == set(arrays)
    if code != "BF16":  # the package's numpy loader has no bfloat16
        loaded = stn.load_file(str(ours))
        for n, a in arrays.items():
            assert loaded[n].dtype == np_dtype and loaded[n].tobytes() == a.tobytes()
    else:
        torch = pytest.importorskip("torch")
        from safetensors.torch import load_file

        loaded = load_file(str(ours))
        for n, a in arrays.items():
            assert loaded[n].dtype == torch.bfloat16
            np.testing.assert_array_equal(loaded[n].view(torch.int16).numpy(),
                                          a.view(np.int16))
    again = read_safetensors(ours, {n: (a.shape, leaf) for n, a in arrays.items()})
    for n in arrays:
        assert again[n].tobytes() == got[n].tobytes()


def test_bf16_reads_match_torch(tmp_path):
    torch = pytest.importorskip("torch")
    from safetensors.torch import save_file

    t = torch.randn(4, 33).to(torch.bfloat16)
    save_file({"w": t}, str(tmp_path / "t.safetensors"))
    got = read_safetensors(tmp_path / "t.safetensors", {"w": ((4, 33), dt.bfloat16)})["w"]
    np.testing.assert_array_equal(got.view(np.int16), t.view(torch.int16).numpy())
    f32 = read_safetensors(tmp_path / "t.safetensors", {"w": ((4, 33), dt.float32)})["w"]
    np.testing.assert_array_equal(f32, t.float().numpy())


def test_writer_handles_views_and_big_endian(tmp_path):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    arrays = {"t": a.T, "be": np.arange(5, dtype=">i4"), "strided": a[:, ::2]}
    write_safetensors(tmp_path / "v.safetensors", arrays)
    loaded = stn.load_file(str(tmp_path / "v.safetensors"))
    for n, x in arrays.items():
        np.testing.assert_array_equal(loaded[n], x)
    got = read_safetensors(tmp_path / "v.safetensors", wanted_for(
        {"t": a.T, "be": np.arange(5, dtype=np.int32), "strided": a[:, ::2]}))
    for n, x in arrays.items():
        np.testing.assert_array_equal(got[n], x)


def test_writer_rejects_unsupported(tmp_path):
    with pytest.raises(DTypeError, match="uint16"):
        write_safetensors(tmp_path / "x", {"a": np.zeros(3, np.uint16)})
    with pytest.raises(ArgumentError):
        write_safetensors(tmp_path / "x", {"a": np.zeros(3)}, metadata={"k": 1})
    assert not (tmp_path / "x").exists()


def test_metadata_and_header(tmp_path):
    write_safetensors(tmp_path / "m.safetensors", {"x": np.zeros((2, 3), np.float16)},
                      metadata={"step": "12"})
    h = read_safetensors_header(tmp_path / "m.safetensors")
    assert h.metadata == {"step": "12"}
    (info,) = h.tensors.values()
    assert (info.name, info.dtype, info.shape, info.nbytes) == ("x", "F16", (2, 3), 12)
    assert h.data_start % 8 == 0


# --------------------------------------------------------------------------------- conversions


@pytest.mark.parametrize("src", [np.float16, ml_dtypes.bfloat16])
def test_low_precision_files_into_float32_exact(tmp_path, monkeypatch, src):
    monkeypatch.setattr(weights_mod, "_CONVERT_CHUNK_ELEMS", 7)  # many chunks, ragged last one
    a = sample(np.dtype(src), (13, 11))
    a[0, :4] = [np.inf, -np.inf, np.nan, -0.0]
    stn.save_file({"w": a}, str(tmp_path / "w.safetensors"))
    got = read_safetensors(tmp_path / "w.safetensors", {"w": ((13, 11), dt.float32)})["w"]
    assert got.dtype == np.float32
    expect = a.astype(np.float32)
    assert got.tobytes() == expect.tobytes()  # exact, bit for bit (NaN, -0.0 included)


def test_float32_file_into_bfloat16_rounds_like_astype(tmp_path):
    a = sample(np.dtype(np.float32), (1000,))
    stn.save_file({"w": a}, str(tmp_path / "w.safetensors"))
    got = read_safetensors(tmp_path / "w.safetensors", {"w": ((1000,), dt.bfloat16)})["w"]
    assert got.tobytes() == a.astype(BF16).tobytes()


def test_small_copy_chunks(tmp_path, monkeypatch):
    monkeypatch.setattr(weights_mod, "_COPY_CHUNK_BYTES", 12)  # not a multiple of the page size
    arrays = {"a": sample(np.dtype(np.float64), (9, 9)), "b": sample(np.dtype(np.int8), (77,))}
    stn.save_file(arrays, str(tmp_path / "c.safetensors"))
    got = read_safetensors(tmp_path / "c.safetensors", wanted_for(arrays))
    for n, a in arrays.items():
        assert got[n].tobytes() == a.tobytes()


def test_integer_widening_and_refused_casts(tmp_path):
    arrays = {"i16": np.array([-32768, 7, 32767], np.int16), "u8": np.array([0, 255], np.uint8),
              "flag": np.array([True, False]), "i64": np.arange(3), "f": np.ones(2, np.float32)}
    stn.save_file(arrays, str(tmp_path / "i.safetensors"))
    got = read_safetensors(tmp_path / "i.safetensors", {
        "i16": ((3,), dt.int64), "u8": ((2,), dt.int32), "flag": ((2,), dt.uint8)})
    np.testing.assert_array_equal(got["i16"], arrays["i16"])
    np.testing.assert_array_equal(got["u8"], [0, 255])
    np.testing.assert_array_equal(got["flag"], [1, 0])
    with pytest.raises(DTypeError, match=r"'i64' is I64 in the file, int32 in the graph"):
        read_safetensors(tmp_path / "i.safetensors", {"i64": ((3,), dt.int32)})
    with pytest.raises(DTypeError, match="'f' is F32"):
        read_safetensors(tmp_path / "i.safetensors", {"f": ((2,), dt.int32)})
    with pytest.raises(DTypeError, match="'i16' is I16"):
        read_safetensors(tmp_path / "i.safetensors", {"i16": ((3,), dt.int8)})
    with pytest.raises(DTypeError):
        read_safetensors(tmp_path / "i.safetensors", {"u8": ((2,), dt.bool_)})


# --------------------------------------------------------------------------------- names, shapes


@pytest.fixture
def model_file(tmp_path):
    arrays = {"model.embed.weight": np.ones((10, 4), np.float32),
              "model.layer0.weight": np.full((4, 4), 2, np.float32),
              "model.layer0.bias": np.zeros(4, np.float32),
              "lm_head.weight": np.full((4, 10), 3, np.float32)}
    stn.save_file(arrays, str(tmp_path / "model.safetensors"))
    return tmp_path / "model.safetensors", arrays


def test_missing_names_with_suggestions(model_file):
    path, arrays = model_file
    with pytest.raises(FeedError) as exc:
        read_safetensors(path, {"layer0.weight": ((4, 4), dt.float32),
                                "model.layer0.wieght": ((4, 4), dt.float32),
                                "nothing_like_it": ((1,), dt.float32),
                                "lm_head.weight": ((4, 10), dt.float32)})
    msg = str(exc.value)
    assert str(path) in msg and "3 weight(s)" in msg
    assert "'layer0.weight' (close: 'model.layer0.weight'" in msg
    assert "'model.layer0.wieght' (close: 'model.layer0.weight'" in msg
    assert "'nothing_like_it'" in msg and "rename=" in msg
    assert "'lm_head.weight'" not in msg


def test_rename(model_file):
    path, arrays = model_file
    wanted = {n.removeprefix("model."): (a.shape, dt.float32) for n, a in arrays.items()}
    got = read_safetensors(path, wanted, rename=lambda n: n.removeprefix("model."), strict=True)
    assert set(got) == {"embed.weight", "layer0.weight", "layer0.bias", "lm_head.weight"}
    np.testing.assert_array_equal(got["layer0.weight"], arrays["model.layer0.weight"])
    # None drops a tensor: strict does not count it as extra
    got = read_safetensors(path, {"embed": ((10, 4), dt.float32)}, strict=True,
                           rename=lambda n: "embed" if n == "model.embed.weight" else None)
    np.testing.assert_array_equal(got["embed"], np.ones((10, 4)))
    with pytest.raises(ArgumentError, match="both rename to 'w'"):
        read_safetensors(path, {"w": ((4, 4), dt.float32)}, rename=lambda n: "w")
    # a dict maps the names it holds (None drops one); the others keep theirs
    got = read_safetensors(path, {"embed": ((10, 4), dt.float32),
                                  "model.layer0.bias": ((4,), dt.float32)},
                           rename={"model.embed.weight": "embed", "model.layer0.weight": None})
    np.testing.assert_array_equal(got["embed"], np.ones((10, 4)))
    assert set(got) == {"embed", "model.layer0.bias"}


def test_strict_extra_names(model_file):
    path, arrays = model_file
    wanted = {"model.layer0.weight": ((4, 4), dt.float32)}
    assert set(read_safetensors(path, wanted)) == {"model.layer0.weight"}
    with pytest.raises(FeedError) as exc:
        read_safetensors(path, wanted, strict=True)
    msg = str(exc.value)
    assert "3 tensor(s)" in msg and "strict=True" in msg
    for n in ("model.embed.weight", "model.layer0.bias", "lm_head.weight"):
        assert repr(n) in msg


def test_shape_mismatch_names_tensor_and_both_shapes(model_file):
    path, _ = model_file
    with pytest.raises(ShapeError) as exc:
        read_safetensors(path, {"model.layer0.weight": ((4, 5), dt.float32),
                                "model.layer0.bias": ((4,), dt.float32),
                                "model.embed.weight": ((4, 10), dt.float32)})
    msg = str(exc.value)
    assert "'model.layer0.weight' is [4, 4] in the file, [4, 5] in the graph" in msg
    assert "'model.embed.weight' is [10, 4] in the file, [4, 10] in the graph" in msg
    assert "bias" not in msg
    with pytest.raises(ShapeError, match=r"\(file 'model.layer0.bias'\) is \[4\]"):
        read_safetensors(path, {"b": ((1, 4), dt.float32)},
                         rename=lambda n: "b" if n.endswith("bias") else n)


def test_nothing_allocated_before_validation(model_file):
    path, _ = model_file
    calls = []

    def allocate(name, shape, dtype):
        calls.append(name)
        return np.empty(shape, dtype)

    for wanted in ({"model.layer0.weight": ((4, 4), dt.float32), "x": ((1,), dt.float32)},
                   {"model.layer0.weight": ((4, 4), dt.float32),
                    "model.layer0.bias": ((5,), dt.float32)},
                   {"model.layer0.weight": ((4, 4), dt.float32),
                    "model.layer0.bias": ((4,), dt.int32)}):
        with pytest.raises((FeedError, ShapeError, DTypeError)):
            read_safetensors(path, wanted, allocate=allocate)
    assert calls == []


def test_allocate_into_given_buffers(model_file):
    path, arrays = model_file
    arena = np.zeros(100, np.float32)
    views = {"model.layer0.weight": arena[:16].reshape(4, 4),
             "model.layer0.bias": arena[16:20]}
    got = read_safetensors(path, {n: (v.shape, dt.float32) for n, v in views.items()},
                           allocate=lambda n, shape, dtype: views[n])
    assert got["model.layer0.weight"] is views["model.layer0.weight"]
    np.testing.assert_array_equal(arena[:16], 2)
    np.testing.assert_array_equal(arena[20:], 0)
    with pytest.raises(ArgumentError, match="C-contiguous"):
        read_safetensors(path, {"model.layer0.weight": ((4, 4), dt.float32)},
                         allocate=lambda n, shape, dtype: np.empty((4, 8), dtype)[:, ::2])


def test_zero_d_and_empty_tensors(tmp_path):
    arrays = {"s": np.array(2.5, np.float32), "e": np.zeros((3, 0, 2), np.float16),
              "e0": np.zeros(0, np.int64)}
    write_safetensors(tmp_path / "z.safetensors", arrays)
    got = read_safetensors(tmp_path / "z.safetensors", wanted_for(arrays))
    assert got["s"].shape == () and got["s"] == 2.5
    assert got["e"].shape == (3, 0, 2) and got["e"].dtype == np.float16
    assert got["e0"].shape == (0,)
    # a file holding only empty tensors has no data section at all
    write_safetensors(tmp_path / "only_empty.safetensors", {"e": np.zeros((0, 5), np.float32)})
    got = read_safetensors(tmp_path / "only_empty.safetensors", {"e": ((0, 5), dt.float32)})
    assert got["e"].shape == (0, 5)
    got = read_safetensors(tmp_path / "only_empty.safetensors", {})
    assert got == {}


# --------------------------------------------------------------------------------- bad files


def test_missing_file(tmp_path):
    with pytest.raises(SerializationError, match="nope.safetensors"):
        read_safetensors(tmp_path / "nope.safetensors", {})


def test_truncated_files(tmp_path):
    arrays = {"w": np.arange(100, dtype=np.float32)}
    good = tmp_path / "good.safetensors"
    stn.save_file(arrays, str(good))
    data = good.read_bytes()
    for cut, expect in [(len(data) - 1, "not fully covered; truncated"),
                        (len(data) - 400, "not fully covered; truncated"),
                        (20, "truncated"), (4, "truncated"), (0, "truncated")]:
        bad = tmp_path / f"cut{cut}.safetensors"
        bad.write_bytes(data[:cut])
        with pytest.raises(SerializationError, match=expect) as exc:
            read_safetensors(bad, {"w": ((100,), dt.float32)})
        assert str(bad) in str(exc.value)


def test_header_lies_about_offsets(tmp_path):
    data = bytes(64)
    cases = {
        "beyond": ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [56, 72]}},
                   "invalid offset for tensor `w`"),
        "reversed": ({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}},
                     "invalid offset"),
        "size": ({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}},
                 "invalid shape, data type, or offset"),
        "overlap": ({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                     "b": {"dtype": "I8", "shape": [8], "data_offsets": [12, 20]}},
                    "invalid offset for tensor `b`"),
        "negative": ({"w": {"dtype": "F32", "shape": [1], "data_offsets": [-4, 0]}},
                     "integer `-4`, expected usize"),
        "dtype": ({"w": {"dtype": "U16", "shape": [32], "data_offsets": [0, 64]}},
                  "'U16' is not supported"),
        "shape": ({"w": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}}, "integer `-1`"),
        "floatshape": ({"w": {"dtype": "F32", "shape": [1.0], "data_offsets": [0, 4]}},
                       "floating point `1.0`"),
        "entry": ({"w": [1, 2]}, "expected string or map"),
        "metadata": ({"__metadata__": {"a": 1}}, "integer `1`, expected a string"),
    }
    for name, (header, expect) in cases.items():
        path = raw_file(tmp_path / f"{name}.safetensors", header, data)
        with pytest.raises(SerializationError, match=expect) as exc:
            read_safetensors(path, {})
        assert str(path) in str(exc.value), name
    # the package agrees that these files are broken
    with pytest.raises(Exception):  # noqa: B017
        stn.load_file(str(tmp_path / "overlap.safetensors"))


def test_not_a_safetensors_file(tmp_path):
    text = tmp_path / "model.bin"
    text.write_bytes(b"PK\x03\x04 this is a zip / pickle checkpoint, not safetensors" * 10)
    with pytest.raises(SerializationError, match="not a safetensors file") as exc:
        read_safetensors(text, {"w": ((1,), dt.float32)})
    assert str(text) in str(exc.value)
    for name, raw in {"badjson": b'{"w": {', "list": b"[1, 2]", "utf8": b"\xff\xfe{}"}.items():
        path = raw_file(tmp_path / f"{name}.safetensors", None, b"", header_bytes=raw)
        with pytest.raises(SerializationError, match="not a safetensors file"):
            read_safetensors(path, {})
    with pytest.raises(SerializationError):
        read_safetensors(tmp_path, {})  # a directory


# --------------------------------------------------------------------------------- memory


N_BIG = 50 * 1024 * 1024  # 200 MB of float32


@pytest.fixture(scope="module")
def big_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("big")
    a = (np.arange(N_BIG, dtype=np.int32) % 2048).astype(np.float32)  # exact in float16
    write_safetensors(d / "f32.safetensors", {"w": a})
    write_safetensors(d / "f16.safetensors", {"w": a.astype(np.float16)})
    del a
    return d


@pytest.mark.slow
@pytest.mark.parametrize("src", ["f32", "f16"])
def test_peak_allocation_is_one_copy(big_files, src):
    """tracemalloc sees numpy's allocations: the destination and nothing near its size."""
    path = big_files / f"{src}.safetensors"
    tracemalloc.start()
    try:
        got = read_safetensors(path, {"w": ((N_BIG,), dt.float32)})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    nbytes = N_BIG * 4
    assert got["w"].nbytes == nbytes
    assert peak < 1.05 * nbytes, f"peak {peak / 2**20:.0f} MiB for {nbytes / 2**20:.0f} MiB"
    assert got["w"][12345] == 12345 % 2048 and got["w"][-1] == (N_BIG - 1) % 2048


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="VmHWM and MADV_DONTNEED: Linux")
@pytest.mark.parametrize("src", ["f32", "f16"])
def test_peak_resident_memory_is_near_one_copy(big_files, src):
    """Resident memory, mapped file pages included, stays under 1.5x the tensor.

    Measured in a fresh process by VmHWM (the peak RSS of this address space; ru_maxrss
    would inherit the pytest process's peak across fork and exec)."""
    script = textwrap.dedent(f"""
        import numpy as np
        from tensor_graphs.ir import dtypes as dt
        from tensor_graphs.runtime.weights import read_safetensors

        def hwm():
            with open("/proc/self/status") as f:
                line = next(x for x in f if x.startswith("VmHWM:"))
            return int(line.split()[1]) * 1024

        np.ones(1 << 16).sum()
        before = hwm()
        got = read_safetensors({str(big_files / (src + ".safetensors"))!r},
                               {{"w": (({N_BIG},), dt.float32)}})
        after = hwm()
        assert got["w"][7] == 7
        print(after - before)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         env={**os.environ, "PYTHONHASHSEED": "0"}, check=True)
    delta = int(out.stdout.split()[-1])
    nbytes = N_BIG * 4
    assert delta < 1.5 * nbytes, f"RSS grew {delta / 2**20:.0f} MiB for {nbytes / 2**20:.0f} MiB"
    assert delta > 0.9 * nbytes  # the measurement sees the destination itself


def test_bad_files_are_serialization_errors_naming_the_file(tmp_path):
    """Files that let RecursionError, TypeError or a blocked open through before; every one a
    SerializationError naming the file and what to do."""
    entry = {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}
    whole = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}  # all 8 data bytes
    cases = {
        "deep": (b"[" * 100_000 + b"]" * 100_000, "expected struct"),
        "deep_entry": (b'{"w": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "recursion limit"),
        "dtype_list": (json.dumps({"w": {**entry, "dtype": ["F32"]}}).encode(),
                       "sequence, expected string or map"),
        "dtype_object": (json.dumps({"w": {**entry, "dtype": {}}}).encode(), "invalid value: map"),
        # the package takes the last of two same names: ours refuses (which one is meant?)
        "twice": (b'{"w": ' + json.dumps(entry).encode() + b', "w": '
                  + json.dumps(whole).encode() + b"}", "names 'w' twice"),
        "too_big": (json.dumps({"w": {**entry, "shape": [2**62, 4, 0],
                                      "data_offsets": [0, 0]}}).encode(), "overflow"),
        "digits": (json.dumps(entry).encode().replace(b"[1]", b"[" + b"9" * 5000 + b"]"),
                   "number out of range"),
    }
    for name, (header, expect) in cases.items():
        path = raw_file(tmp_path / f"{name}.safetensors", None, bytes(8), header_bytes=header)
        with pytest.raises(SerializationError, match=expect) as exc:
            read_safetensors(path, {})
        assert str(path) in str(exc.value), name
        assert "again" in str(exc.value) or "convert" in str(exc.value), name


@pytest.mark.parametrize("where", ["top", "entry", "shape", "metadata", "offsets"])
@pytest.mark.parametrize("depth", [200, 5_000, 1_000_000])
def test_a_deeply_nested_header_is_a_clear_error(tmp_path, where, depth):
    """Nesting anywhere in the header, deeper than any real file needs, is refused by the
    safetensors package (at most 128 levels) as a SerializationError naming the file, never a
    RecursionError or a crash, however deep (up to the 100 MB header limit)."""
    nest = b"[" * depth + b"]" * depth
    header = {
        "top": nest,
        "entry": b'{"w": ' + nest + b"}",
        "shape": b'{"w": {"dtype": "F32", "shape": ' + nest + b', "data_offsets": [0, 4]}}',
        "metadata": b'{"__metadata__": {"a": ' + nest + b"}}",
        "offsets": b'{"w": {"dtype": "F32", "shape": [1], "data_offsets": ' + nest + b"}}",
    }[where]
    path = raw_file(tmp_path / "deep.safetensors", None, bytes(4), header_bytes=header)
    with pytest.raises(SerializationError) as exc:
        read_safetensors(path, {"w": ((1,), dt.float32)})
    msg = str(exc.value)
    assert str(path) in msg and "safetensors package refuses it" in msg
    assert "again" in msg


def test_paths_that_are_not_files(tmp_path):
    write_safetensors(tmp_path / "model.safetensors", {"w": np.ones(2, np.float32)})
    with pytest.raises(SerializationError, match="is a directory.*holds model.safetensors"):
        read_safetensors(tmp_path, {})
    with pytest.raises(SerializationError, match="no such safetensors file; check the path"):
        read_safetensors(tmp_path / "nope.safetensors", {})
    fifo = tmp_path / "pipe.safetensors"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer
    with pytest.raises(SerializationError, match="FIFO"):
        read_safetensors(fifo, {})
    with pytest.raises(ArgumentError, match="str or os.PathLike"):
        read_safetensors(None, {})


def _sharded(folder, shards):
    """A checkpoint in shards as save_pretrained writes one: {file: {name: array}}."""
    weight_map = {}
    for file, arrays in shards.items():
        write_safetensors(folder / file, arrays)
        weight_map.update(dict.fromkeys(arrays, file))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


def test_a_sharded_checkpoint_reads_each_tensor_from_its_shard(tmp_path):
    a, b = np.arange(4, dtype=np.float32), np.full((2, 2), 7, BF16)
    _sharded(tmp_path, {"m-1.safetensors": {"a": a, "unwanted": a}, "m-2.safetensors": {"b": b}})
    want = {"a": ((4,), dt.float32), "b": ((2, 2), dt.float32)}
    for path in (tmp_path, tmp_path / "model.safetensors.index.json"):
        got = read_checkpoint(path, want)
        assert sorted(got) == ["a", "b"]
        np.testing.assert_array_equal(got["a"], a)
        np.testing.assert_array_equal(got["b"], b.astype(np.float32))
    # a single file, itself or in its folder, reads as read_safetensors does
    single = tmp_path / "single"
    single.mkdir()
    write_safetensors(single / "model.safetensors", {"a": a})
    np.testing.assert_array_equal(read_checkpoint(single, {"a": ((4,), dt.float32)})["a"], a)


def test_a_bad_shard_is_refused_naming_it_before_anything_is_copied(tmp_path, monkeypatch):
    a = np.arange(4, dtype=np.float32)
    _sharded(tmp_path, {"m-1.safetensors": {"a": a}, "m-2.safetensors": {"b": a}})
    copied = []
    monkeypatch.setattr(weights_mod, "_copy_all", lambda *args: copied.append(args))
    with pytest.raises(ShapeError, match=r"m-2.safetensors: shapes disagree.*'b' is \[4\]"):
        read_checkpoint(tmp_path, {"a": ((4,), dt.float32), "b": ((5,), dt.float32)})
    (tmp_path / "m-2.safetensors").write_bytes((tmp_path / "m-2.safetensors").read_bytes()[:-4])
    with pytest.raises(SerializationError, match="m-2.safetensors: its tensors cover|m-2"
                       ".safetensors is not a safetensors file"):
        read_checkpoint(tmp_path, {"a": ((4,), dt.float32), "b": ((4,), dt.float32)})
    (tmp_path / "m-2.safetensors").unlink()
    with pytest.raises(SerializationError, match=r"names shard\(s\) m-2.safetensors that"):
        read_checkpoint(tmp_path, {"a": ((4,), dt.float32), "b": ((4,), dt.float32)})
    with pytest.raises(FeedError, match=r"maps no shard to 1 weight\(s\): 'c'"):
        read_checkpoint(tmp_path, {"a": ((4,), dt.float32), "c": ((4,), dt.float32)})
    assert copied == []
    # a shard name that is not a file beside the index could read any file
    index = tmp_path / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "../elsewhere.safetensors"}}))
    with pytest.raises(SerializationError, match="not files beside the index"):
        read_checkpoint(index, {"a": ((4,), dt.float32)})
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(SerializationError, match="holding neither model.safetensors nor"):
        read_checkpoint(empty, {})


def test_writer_is_atomic_and_leaves_nothing_behind(tmp_path, monkeypatch):
    """The package writes the file; a write that fails half way leaves the old file whole and
    no temporary file or folder next to it."""
    import safetensors.numpy

    path = tmp_path / "ckpt.safetensors"
    write_safetensors(path, {"w": np.arange(4, dtype=np.float32)}, metadata={"step": "1"})
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    before = path.read_bytes()

    real = safetensors.numpy.save_file

    def half_then_fail(tensors, filename, metadata=None):
        real(tensors, filename, metadata=metadata)
        with open(filename, "r+b") as f:
            f.truncate(20)  # a disk that filled up half way
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", half_then_fail)
    with pytest.raises(SerializationError, match="No space left") as exc:
        write_safetensors(path, {"w": np.zeros(1000, np.float32)})
    assert str(path) in str(exc.value)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["ckpt.safetensors"]
    monkeypatch.undo()
    with safetensors.safe_open(str(path), framework="np") as f:
        assert f.metadata() == {"step": "1"}


def test_the_package_checks_the_file_that_is_copied(tmp_path, monkeypatch):
    """The package is handed the descriptor we opened, not the path again: a file swapped
    for another after the open is never the one checked (or copied)."""
    import safetensors

    path = tmp_path / "w.safetensors"
    write_safetensors(path, {"w": np.full(3, 7, np.float32)})
    other = tmp_path / "other.safetensors"
    write_safetensors(other, {"w": np.full(3, 9, np.float32), "x": np.ones(1, np.int8)})
    opened = []
    real = safetensors.safe_open

    def spy(name, *args, **kwargs):
        opened.append(name)
        os.replace(other, path)  # swapped after our open, before the package's
        return real(name, *args, **kwargs)

    monkeypatch.setattr(safetensors, "safe_open", spy)
    got = read_safetensors(path, {"w": ((3,), dt.float32)}, strict=True)
    np.testing.assert_array_equal(got["w"], [7, 7, 7])
    assert opened and opened[0].startswith("/proc/self/fd/")
