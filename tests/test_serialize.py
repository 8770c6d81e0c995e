"""tg.save / tg.load: exact round trips, node identity, fresh-process rebuilds, bad files."""

from __future__ import annotations

import gc
import json
import math
import os
import subprocess
import sys
import textwrap
import weakref

import ml_dtypes
import numpy as np
import pytest
import sympy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensor_graphs as tg
from tensor_graphs.ir.composite import composite
from tensor_graphs.ir.node import Node, _table
from tensor_graphs.ir.ops import OPS, unregister
from tensor_graphs.ir.serialize import _Decoder, _Encoder
from tensor_graphs.ir.shapes import broadcast_shapes, dim_symbol


def roundtrip(outputs, tmp_path, name="g.json"):
    path = tmp_path / name
    tg.save(outputs, path)
    return tg.load(path), path


def resave_text(outputs, tmp_path) -> str:
    path = tmp_path / "again.json"
    tg.save(outputs, path)
    return path.read_text()


def every_leaf_graph():
    x = tg.input("x", ("batch", 4))
    w = tg.weight("w", (4, 3), "float64")
    kv = tg.state("kv", ("n", 3))
    c = tg.constant(np.array([1.5, np.nan, -np.inf, -0.0], np.float32))
    n = tg.size("batch", "float32")
    y = tg.mean(x + c, axis=0) / n
    return [y, w, tg.state_update(kv, tg.reshape(y[:3], (1, 3)), offset="n")]


# ---------------------------------------------------------------------------- round trips
def test_every_leaf_kind_round_trips_to_the_same_nodes(tmp_path):
    outs = every_leaf_graph()
    kinds = {n.op.name for n in tg.nodes(outs)}
    assert {"input", "weight", "state", "constant", "dim"} <= kinds
    back, path = roundtrip(outs, tmp_path)
    assert isinstance(back, list) and all(a is b for a, b in zip(back, outs))
    doc = json.loads(path.read_text())
    assert doc["format"] == "tensor_graphs.graph" and doc["version"] == 1
    ids = [rec["id"] for rec in doc["nodes"]]
    assert ids == list(range(len(ids)))
    assert all(k < rec["id"] for rec in doc["nodes"] for k in rec["inputs"])


@pytest.mark.parametrize("structure", ["node", "list", "tuple", "empty"])
def test_output_structure_is_kept(tmp_path, structure):
    x = tg.input("x", (2,))
    outs = {"node": x + 1, "list": [x, x * 2], "tuple": (x * 3, x), "empty": []}[structure]
    back, _ = roundtrip(outs, tmp_path)
    assert type(back) is type(outs)
    if isinstance(outs, Node):
        assert back is outs
    else:
        assert len(back) == len(outs) and all(a is b for a, b in zip(back, outs))


def test_symbolic_dims_round_trip(tmp_path):
    seq, batch = dim_symbol("seq"), dim_symbol("batch")
    x = tg.input("x", ("batch", "seq", 4))
    flat = tg.reshape(x, ("batch*seq", 4))
    doubled = tg.concat([x, x], axis=1)
    padded = tg.pad(x, (0, 0, 1, 2))
    part = tg.slice_axis(x, 1, 1, "seq")
    ids = tg.iota("2*seq + 1")
    odd = tg.input("y", ("ceiling(seq/2)", "Max(seq, batch)"))
    outs = [flat, doubled, padded, part, ids, odd, tg.size("batch*seq - 1")]
    back, path = roundtrip(outs, tmp_path)
    assert all(a is b for a, b in zip(back, outs))
    assert back[1].shape == (batch, 2 * seq, 4)
    text = path.read_text()
    assert '"2*seq"' in text and '{"$dim": "batch*seq"}' in text
    assert "ceiling(seq/2)" in text and "Max(batch, seq)" in text


@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "bfloat16"])
def test_float_constants_keep_nan_inf_and_signed_zero(tmp_path, dtype):
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    values = np.array([0.1, -0.0, 0.0, np.nan, -np.nan, np.inf, -np.inf, 3.5e-5, 1e4],
                      np.float64).astype(np_dtype)
    c = tg.constant(values, dtype)
    back, _ = roundtrip(c, tmp_path)
    assert back is c
    stored = back.attrs["value"].array
    assert stored.dtype == np_dtype and stored.tobytes() == values.tobytes()


@pytest.mark.parametrize("dtype", ["int8", "uint8", "int32", "int64", "bool"])
def test_int_and_bool_constants(tmp_path, dtype):
    info = np.iinfo(dtype) if dtype != "bool" else None
    values = (np.array([True, False, True]) if info is None
              else np.array([info.min, 0, 1, info.max], dtype))
    c = tg.constant(values)
    back, _ = roundtrip(c, tmp_path)
    assert back is c and back.attrs["value"].array.dtype == values.dtype


def test_large_constants_use_base64_and_stay_exact(tmp_path):
    rng = np.random.default_rng(0)
    big = rng.standard_normal(3000).astype(np.float32)
    big[[0, 5, 7]] = [np.nan, -0.0, -np.inf]
    bf = rng.standard_normal((40, 40)).astype(ml_dtypes.bfloat16)
    outs = [tg.constant(big), tg.constant(bf)]
    back, path = roundtrip(outs, tmp_path)
    assert back[0] is outs[0] and back[1] is outs[1]
    assert path.read_text().count('"base64"') == 2


def test_odd_nan_payload_falls_back_to_base64(tmp_path):
    weird = np.array([0x7FF0000000000123], np.uint64).view(np.float64)
    c = tg.constant(weird)
    back, path = roundtrip(c, tmp_path)
    assert back is c and '"base64"' in path.read_text()


def test_python_scalars_are_exact(tmp_path):
    x = tg.input("x", (3,), "float64")
    values = [0.1, 1 / 3, -0.0, 1e-310, 1.7976931348623157e308, math.pi]
    y = x
    for v in values:
        y = y * v
    back, _ = roundtrip(y, tmp_path)
    assert back is y


def test_composites_with_attrs(tmp_path):
    x = tg.input("x", (2, 5))
    outs = [tg.gelu(x, approximate="tanh"), tg.gelu(x), tg.softmax(x, axis=0),
            tg.log_softmax(x), tg.clamp(x, min=-0.0), tg.clamp(x, max=float("inf")),
            tg.elu(x, alpha=0.25), tg.softplus(x, beta=2.0, threshold=float("nan")),
            tg.var(x, axis=(0, 1), keepdims=True, correction=1), tg.argmax(x, axis=1)]
    back, path = roundtrip(outs, tmp_path)
    assert all(a is b for a, b in zip(back, outs))
    text = path.read_text()
    assert '"approximate": "tanh"' in text and '"axis": 0' in text
    assert '{"$float": "inf"}' in text and '"min": -0.0' in text


def test_attrs_keep_big_ints_nested_tuples_and_nan_sign(tmp_path):
    name = "test_serialize_tagged"  # a composite: its attributes are any keyword values

    try:
        @composite(example=lambda: (tg.input("x", (2,)),), name=name)
        def tagged(x, *, tag=0, t=()):
            """x, carrying attributes."""
            return tg.neg(tg.neg(x))

        big = tagged(tg.input("x", (2,)), tag=2**80, t=(1, (2.5, None)))
        back, path = roundtrip(big, tmp_path)
        assert back is big and back.attrs["tag"] == 2**80 and back.attrs["t"] == (1, (2.5, None))
        assert str(2**80) in path.read_text()
    finally:
        unregister(name)
    encoded = _Encoder().value((-math.nan, math.nan, -0.0))
    assert encoded == [{"$float": "-nan"}, {"$float": "nan"}, -0.0]
    decoded = _Decoder().value(json.loads(json.dumps(encoded)))
    assert [math.copysign(1, v) for v in decoded] == [-1, 1, -1]


def test_nn_composites_round_trip_and_rebuild(tmp_path):
    def build():
        x, w = tg.input("x", (2, 4, 6, 6)), tg.weight("w", (8, 2, 3, 3))
        conv = tg.conv2d(x, w, tg.weight("b", (8,)), stride=2, padding=1, groups=2)
        q, k = tg.input("q", (1, 4, "seq", 8)), tg.input("k", (1, 2, "seq", 8))
        logits, target = tg.input("logits", (3, 5)), tg.input("t", (3,), "int64")
        return [conv, tg.max_pool2d(conv, kernel_size=2), tg.interpolate(x, scale_factor=2),
                tg.scaled_dot_product_attention(q, k, k, is_causal=True),
                tg.layer_norm(q, tg.weight("g", (8,)), eps=1e-6), tg.rms_norm(q),
                tg.cross_entropy(logits, target, label_smoothing=0.1),
                tg.tril(logits, diagonal=-1)]

    outs = build()
    back, path = roundtrip(outs, tmp_path)
    assert all(a is b for a, b in zip(back, outs))
    listing, ref = tg.format_graph(*outs), weakref.ref(outs[0])
    del outs, back
    gc.collect()
    assert ref() is None
    rebuilt = tg.load(path)
    assert tg.format_graph(*rebuilt) == listing
    assert resave_text(rebuilt, tmp_path) == path.read_text()


def test_state_updates_round_trip_and_evaluate(tmp_path):
    kv = tg.state("cache", ("n", 2))
    v1 = tg.state_update(kv, tg.input("a", (1, 2)), offset="n")
    v2 = tg.state_update(v1, tg.input("b", (1, 2)), offset="n + 1")
    read = tg.sum(v1) + tg.sum(v2)
    back, _ = roundtrip([read, v2], tmp_path)
    assert back[0] is read and back[1] is v2
    feeds = {"cache": np.ones((3, 2), np.float32), "a": np.full((1, 2), 2, np.float32),
             "b": np.full((1, 2), 3, np.float32)}
    for got, want in zip(tg.evaluate(back, feeds), tg.evaluate([read, v2], feeds)):
        np.testing.assert_array_equal(got, want)


def test_deep_chain_has_no_recursion(tmp_path):
    x = tg.input("x", (4,))
    y = x
    for i in range(3000):
        y = tg.sub(y, 0.5) if i % 3 == 0 else y * 1.0001
    back, _ = roundtrip(y, tmp_path)
    assert back is y
    path = tmp_path / "g.json"
    ref = weakref.ref(y)
    del y, back
    gc.collect()
    assert ref() is None  # the chain is gone: loading rebuilds it with Node.make
    again = tg.load(path)
    assert len(tg.nodes(again)) > 3000
    assert resave_text(again, tmp_path) == path.read_text()


def test_rebuild_after_the_graph_died_gives_the_same_file(tmp_path):
    def build_and_save():
        outs = every_leaf_graph() + [tg.gelu(tg.input("z", (3,)), approximate="tanh")]
        tg.save(outs, tmp_path / "g.json")
        return tg.format_graph(*outs), weakref.ref(outs[0])

    listing, ref = build_and_save()
    gc.collect()
    assert ref() is None
    back = tg.load(tmp_path / "g.json")
    assert tg.format_graph(*back) == listing
    assert resave_text(back, tmp_path) == (tmp_path / "g.json").read_text()


FRESH = textwrap.dedent("""
    import sys
    import numpy as np
    import tensor_graphs as tg
    graph, feeds, out, again = sys.argv[1:]
    outs = tg.load(graph)
    data = dict(np.load(feeds))
    np.savez(out, *tg.evaluate(outs, data))
    tg.save(outs, again)
""")


def test_fresh_process_round_trip(tmp_path):
    x = tg.input("x", ("batch", 4))
    w = tg.weight("w", (4, 3))
    h = tg.gelu(x @ w + tg.constant(np.array([0.1, -0.0, 2.0], np.float32)),
                approximate="tanh")
    outs = [tg.softmax(h, axis=0), tg.var(h, axis=-1), tg.argmax(h, axis=1)]
    tg.save(outs, tmp_path / "g.json")
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((5, 4)).astype(np.float32),
             "w": rng.standard_normal((4, 3)).astype(np.float32)}
    np.savez(tmp_path / "feeds.npz", **feeds)
    args = [str(tmp_path / n) for n in ("g.json", "feeds.npz", "out.npz", "again.json")]
    subprocess.run([sys.executable, "-c", FRESH, *args], check=True, env=dict(os.environ))
    got = np.load(tmp_path / "out.npz")
    for i, want in enumerate(tg.evaluate(outs, feeds)):
        np.testing.assert_array_equal(got[f"arr_{i}"], want)
    assert (tmp_path / "again.json").read_text() == (tmp_path / "g.json").read_text()


# ---------------------------------------------------------------------------- property
special_floats = st.sampled_from([0.0, -0.0, 0.1, -2.5, 1e300, 5e-324, math.nan, math.inf,
                                  -math.inf])
floats = st.one_of(special_floats, st.floats(allow_nan=True, allow_infinity=True))
step = st.one_of(
    st.tuples(st.sampled_from(["add", "mul", "sub", "maximum", "div"]), st.integers(0, 99),
              st.integers(0, 99)),
    st.tuples(st.sampled_from(["exp", "neg", "tanh", "relu", "sigmoid", "T2"]),
              st.integers(0, 99)),
    st.tuples(st.just("scale"), st.integers(0, 99), floats),
    st.tuples(st.just("gelu"), st.integers(0, 99), st.sampled_from(["none", "tanh"])),
    st.tuples(st.just("softmax"), st.integers(0, 99), st.sampled_from([0, 1, -1])),
    st.tuples(st.just("clamp"), st.integers(0, 99), st.one_of(st.none(), floats)),
    st.tuples(st.just("pad_slice"), st.integers(0, 99), floats),
    st.tuples(st.just("const"), st.lists(floats, min_size=6, max_size=6),
              st.sampled_from(["float32", "float64", "float16", "bfloat16"])),
)


def build_random(steps):
    pool = [tg.input("x", (2, 3)), tg.weight("w", (3,)), tg.input("s", ("seq", 3))]
    for s in steps:
        kind = s[0]
        pick = pool[s[1] % len(pool)] if kind != "const" else None
        if kind in ("add", "mul", "sub", "maximum", "div"):
            other = pool[s[2] % len(pool)]
            try:
                broadcast_shapes(pick.shape, other.shape)
            except tg.ShapeError:
                other = tg.sum(other)  # a scalar always broadcasts
            pool.append(getattr(tg, kind)(pick, other))
        elif kind == "T2":
            pool.append(tg.transpose(pick) if pick.ndim == 2 else tg.unsqueeze(pick, 0))
        elif kind in ("exp", "neg", "tanh", "relu", "sigmoid"):
            pool.append(getattr(tg, kind)(pick))
        elif kind == "scale":
            pool.append(pick * s[2])
        elif kind == "gelu":
            pool.append(tg.gelu(pick, approximate=s[2]))
        elif kind == "softmax":
            pool.append(tg.softmax(pick, axis=s[2] % pick.ndim))
        elif kind == "clamp":
            pool.append(tg.clamp(pick, min=s[2]))
        elif kind == "pad_slice":
            pool.append(tg.pad(pick, (1, 2), value=s[2])[..., 1:-2])
        else:
            pool.append(tg.constant(np.array(s[1]).reshape(2, 3), s[2]))
    return pool[3:] or pool[:1]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(st.lists(step, min_size=1, max_size=8))
def test_random_graphs_round_trip(tmp_path, steps):
    outs = build_random(steps)
    back, path = roundtrip(outs, tmp_path)
    assert all(a is b for a, b in zip(back, outs))
    listing, text = tg.format_graph(*outs), path.read_text()
    del outs, back  # nodes have no cycles: they die here unless something else holds them
    rebuilt = tg.load(path)
    assert tg.format_graph(*rebuilt) == listing
    assert resave_text(rebuilt, tmp_path) == text


# ---------------------------------------------------------------------------- bad files
def write(tmp_path, doc, name="bad.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def good_doc(tmp_path):
    x = tg.input("x", (2,))
    tg.save(tg.exp(x + 1.0), tmp_path / "good.json")
    return json.loads((tmp_path / "good.json").read_text())


@pytest.mark.parametrize("content, message", [
    ("not json {", "not valid JSON"),
    (b"\xff\xfe\x00", "not UTF-8 text"),
    ([1, 2, 3], "not a tensor_graphs graph file"),
    ({"format": "onnx", "version": 1}, "not a tensor_graphs graph file"),
])
def test_not_a_graph_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(tg.SerializationError, match=message):
        tg.load(path)


def test_unknown_version(tmp_path):
    doc = good_doc(tmp_path)
    doc["version"] = 2
    with pytest.raises(tg.SerializationError, match="unknown version 2"):
        tg.load(write(tmp_path, doc))


def test_unknown_op(tmp_path):
    doc = good_doc(tmp_path)
    doc["nodes"][-1]["op"] = "frobnicate"
    with pytest.raises(tg.SerializationError, match="unknown op 'frobnicate'"):
        tg.load(write(tmp_path, doc))


@pytest.mark.parametrize("bad", [99, -1, "0", None])
def test_dangling_input(tmp_path, bad):
    doc = good_doc(tmp_path)
    doc["nodes"][-1]["inputs"] = [bad]
    with pytest.raises(tg.SerializationError, match="dangling input"):
        tg.load(write(tmp_path, doc))


def test_forward_reference_is_dangling(tmp_path):
    doc = good_doc(tmp_path)
    doc["nodes"][0], doc["nodes"][-1] = doc["nodes"][-1], doc["nodes"][0]
    with pytest.raises(tg.SerializationError, match="dangling input"):
        tg.load(write(tmp_path, doc))


@pytest.mark.parametrize("edit, message", [
    (lambda d: d["nodes"].append(dict(d["nodes"][0])), "used twice"),
    (lambda d: d.update(outputs=[42]), "output id 42"),
    (lambda d: d.update(structure="set"), "'structure'"),
    (lambda d: d["nodes"][-1].update(inputs=[]), "has 0 inputs, expected 1"),
    (lambda d: d["nodes"][0]["attrs"].update(dtype={"$dtype": "complex64"}), "unknown dtype"),
    (lambda d: d["nodes"][0]["attrs"].update(shape=[{"$dim": "__import__('os')"}]),
     "cannot read dim .* as a size expression"),
    (lambda d: d["nodes"][0]["attrs"].update(shape=[{"$weird": 1}]), "unknown tagged value"),
    (lambda d: d["nodes"][0]["attrs"].update(shape=[3]), "rebuilds with shape"),
    (lambda d: d["nodes"][1]["attrs"].update(value={"$array": "float64", "shape": [2],
                                                    "data": [1.0]}), "do not fill"),
    (lambda d: d["nodes"][1]["attrs"].update(value={"$array": "float64", "shape": [1],
                                                    "base64": "!!"}), "base64"),
])
def test_malformed_files(tmp_path, edit, message):
    doc = good_doc(tmp_path)
    edit(doc)
    with pytest.raises(tg.SerializationError, match=message):
        tg.load(write(tmp_path, doc))


def _named(name):
    return [k for k in list(_table.keys()) if k[3] == name]


def test_failed_load_leaves_nothing_half_built(tmp_path):
    x = tg.input("only_in_the_file", (2,))
    tg.save([tg.exp(x), tg.neg(x)], tmp_path / "g.json")
    doc = json.loads((tmp_path / "g.json").read_text())
    del x
    gc.collect()
    assert not _named("only_in_the_file")
    for bad in (dict(doc, outputs=[7]), dict(doc, nodes=doc["nodes"] + [{"id": 9, "op": "?"}])):
        with pytest.raises(tg.SerializationError):
            tg.load(write(tmp_path, bad))
        gc.collect()
        assert not _named("only_in_the_file")
    doc["nodes"][-1]["attrs"] = {"junk": 1}  # fails while building: built nodes are dropped
    doc["nodes"][-1]["op"] = "reshape"
    with pytest.raises(tg.SerializationError, match="cannot be rebuilt"):
        tg.load(write(tmp_path, doc))
    gc.collect()
    assert not _named("only_in_the_file")


def test_save_rejects_values_it_cannot_write_and_keeps_the_old_file(tmp_path):
    x = tg.input("x", (2,))
    path = tmp_path / "g.json"
    tg.save(x, path)
    before = path.read_text()
    odd = Node.make(OPS["copy_to"], (x,), {"device": "cpu", "hook": object()})
    with pytest.raises(tg.SerializationError, match="attribute 'hook'"):
        tg.save(odd, path)
    plain = Node.make(OPS["copy_to"], (x,), {"device": sympy.Symbol("plain")})
    with pytest.raises(tg.SerializationError, match="does not read back"):
        tg.save(plain, path)
    with pytest.raises(tg.SerializationError, match="node or a list"):
        tg.save("x", path)
    assert path.read_text() == before
    assert sorted(os.listdir(tmp_path)) == ["g.json"]  # no temporary files left behind
