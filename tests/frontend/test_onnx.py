"""tg.from_onnx: opset versions against ONNX Runtime, shape subgraphs folded, weights bound
once, one error for unmapped ops, and hostile or truncated files refused by name."""

from __future__ import annotations

import os

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed "
                                          "(pip install -e '.[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed "
                                                "(pip install -e '.[onnx]')")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend.onnx_import import (  # noqa: E402
    StaticInputError,
    UnsupportedOpError,
    import_onnx,
)
from tensor_graphs.ir.ops.names import WEIGHT  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402
from tests.frontend.onnx_graphs import model, vi  # noqa: E402

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def ints(name, values):
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def against_ort(m, feeds, dims=None):
    """The compiled import and ONNX Runtime on the same feeds, by the one error measure."""
    ref = ort.InferenceSession(m.SerializeToString()).run(None, feeds)
    got = tg.from_onnx(m, dims)(**feeds)
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert g.shape == r.shape
        assert relative_error(g.astype(np.float64), r.astype(np.float64)) <= 1e-5


X = RNG.standard_normal((2, 3, 4)).astype(np.float32)

# (case, opset, nodes, initializers, output shape): one op whose attributes moved to inputs
# between opsets, in its old and its new form (ONNX Runtime runs both)
OPSET_CASES = [
    ("squeeze-attr", 11, [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0]),
                          helper.make_node("Squeeze", ["u"], ["y"], axes=[0])], [], [2, 3, 4]),
    ("squeeze-input", 13, [helper.make_node("Unsqueeze", ["x", "a"], ["u"]),
                           helper.make_node("Squeeze", ["u", "a"], ["y"])],
     [ints("a", [0])], [2, 3, 4]),
    ("reducesum-attr", 11, [helper.make_node("ReduceSum", ["x"], ["y"], axes=[1],
                                             keepdims=0)], [], [2, 4]),
    ("reducesum-input", 13, [helper.make_node("ReduceSum", ["x", "a"], ["y"], keepdims=0)],
     [ints("a", [1])], [2, 4]),
    ("reducemean-attr", 17, [helper.make_node("ReduceMean", ["x"], ["y"], axes=[-1])], [],
     [2, 3, 1]),
    ("reducemean-input", 18, [helper.make_node("ReduceMean", ["x", "a"], ["y"])],
     [ints("a", [-1])], [2, 3, 1]),
    ("split-attr", 11, [helper.make_node("Split", ["x"], ["y", "z"], axis=2, split=[1, 3])],
     [], [[2, 3, 1], [2, 3, 3]]),
    ("split-input", 13, [helper.make_node("Split", ["x", "s"], ["y", "z"], axis=2)],
     [ints("s", [1, 3])], [[2, 3, 1], [2, 3, 3]]),
    ("split-num-outputs", 18, [helper.make_node("Split", ["x"], ["y", "z"], axis=2,
                                                num_outputs=2)], [], [[2, 3, 2], [2, 3, 2]]),
    ("clip-attr", 6, [helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.5)], [],
     [2, 3, 4]),
    ("clip-input", 13, [helper.make_node("Clip", ["x", "lo", "hi"], ["y"])],
     [numpy_helper.from_array(np.array(-0.5, np.float32), "lo"),
      numpy_helper.from_array(np.array(0.5, np.float32), "hi")], [2, 3, 4]),
    ("pad-attr", 2, [helper.make_node("Pad", ["x"], ["y"], pads=[0, 1, 0, 0, 2, 1],
                                      value=1.5)], [], [2, 6, 5]),
    ("pad-input", 11, [helper.make_node("Pad", ["x", "p", "v"], ["y"])],
     [ints("p", [0, 1, 0, 0, 2, 1]), numpy_helper.from_array(np.array(1.5, np.float32), "v")],
     [2, 6, 5]),
    ("pad-axes", 18, [helper.make_node("Pad", ["x", "p", "", "a"], ["y"])],
     [ints("p", [1, 2]), ints("a", [-1])], [2, 3, 7]),
    ("slice-attr", 9, [helper.make_node("Slice", ["x"], ["y"], starts=[1, -3], ends=[3, 100],
                                        axes=[1, 2])], [], [2, 2, 3]),
    ("slice-input-steps", 10, [helper.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])],
     [ints("s", [-1]), ints("e", [-10]), ints("a", [2]), ints("t", [-2])], [2, 3, 2]),
    ("softmax-2d-coerced", 11, [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [],
     [2, 3, 4]),
    ("softmax-axis", 13, [helper.make_node("Softmax", ["x"], ["y"], axis=1)], [], [2, 3, 4]),
    ("reshape-zero", 13, [helper.make_node("Reshape", ["x", "s"], ["y"])],
     [ints("s", [0, -1])], [2, 12]),
]


@pytest.mark.parametrize("case", OPSET_CASES, ids=[c[0] for c in OPSET_CASES])
def test_opset_forms_match_onnxruntime(case):
    _, opset, nodes, inits, shape = case
    shapes = shape if isinstance(shape[0], list) else [shape]
    outs = [vi(o, s) for o, s in zip(nodes[-1].output, shapes)]
    against_ort(model(nodes, [vi("x", [2, 3, 4])], outs, opset, inits), {"x": X})


def test_old_softmax_differs_from_new():
    """The two Softmax forms are different functions; both above match ORT, so this checks
    the test is not blind to the difference."""
    old = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])],
                [vi("y", [2, 3, 4])], 11)
    new = model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], [vi("x", [2, 3, 4])],
                [vi("y", [2, 3, 4])], 13)
    a, b = tg.from_onnx(old)(x=X)[0], tg.from_onnx(new)(x=X)[0]
    assert relative_error(a, b) > 0.1


def shape_chain(opset=13):
    """Shape -> Gather -> Unsqueeze -> Concat -> Reshape: a view to (batch, seq * 4) of an
    input of symbolic batch and seq, as exporters write it."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "zero"], ["b"], axis=0),
        helper.make_node("Gather", ["shape", "one"], ["s"], axis=0),
        helper.make_node("Mul", ["s", "four"], ["s4"]),
        helper.make_node("Unsqueeze", ["b", "axes"], ["b1"]),
        helper.make_node("Unsqueeze", ["s4", "axes"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("MatMul", ["r", "w"], ["y"]),
    ]
    inits = [ints("zero", 0), ints("one", 1), ints("four", 4), ints("axes", [0]),
             numpy_helper.from_array(np.random.default_rng(1).standard_normal((12, 5))
                                     .astype(np.float32), "w")]
    return model(nodes, [vi("x", ["batch", 3, 4])], [vi("y", ["batch", 5])], opset, inits)


def test_shape_subgraph_folds_to_a_symbolic_reshape():
    outputs, inputs, weights, bounds = import_onnx(shape_chain())
    assert bounds == {"batch": None}
    names = {n.op.name for n in tg.nodes(outputs)}
    # no run-time shape arithmetic: the reshape's target is (batch, 12), the weight a leaf
    assert "gather" not in names and "concat" not in names
    assert list(weights) == ["w"]
    assert {n.name for n in tg.nodes(outputs) if n.op.name == WEIGHT} == {"w"}
    prog = tg.from_onnx(shape_chain(), {"batch": 8})
    planned = prog.program.stats["planner_runs"]
    for batch in (1, 5):
        x = RNG.standard_normal((batch, 3, 4)).astype(np.float32)
        ref = ort.InferenceSession(shape_chain().SerializeToString()).run(None, {"x": x})
        assert relative_error(prog(x)[0], ref[0]) <= 1e-5
    assert prog.program.stats["planner_runs"] == planned  # one plan for every batch up to 8
    with pytest.raises(tg.ShapeError):
        prog(np.zeros((9, 3, 4), np.float32))


def test_dims_without_a_bound_are_planned_per_call():
    prog = tg.from_onnx(shape_chain())
    x = RNG.standard_normal((3, 3, 4)).astype(np.float32)
    ref = ort.InferenceSession(shape_chain().SerializeToString()).run(None, {"x": x})
    assert relative_error(prog(x)[0], ref[0]) <= 1e-5


def test_argument_errors_name_the_fix():
    with pytest.raises(tg.ArgumentError, match="'seq'.*dims are \\['batch'\\]"):
        tg.from_onnx(shape_chain(), {"seq": 4})
    prog = tg.from_onnx(shape_chain())
    with pytest.raises(tg.DTypeError, match="input 'x' has dtype float64.*astype"):
        prog(x=np.zeros((2, 3, 4)))
    with pytest.raises(tg.ShapeError, match="input 'x' has shape \\(2, 4, 4\\)"):
        prog(x=np.zeros((2, 4, 4), np.float32))
    with pytest.raises(tg.ArgumentError, match="missing: \\['x'\\]"):
        prog()


def test_a_shape_fed_as_input_is_named_and_taken_as_a_constant():
    m = model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
              [vi("x", [2, 3, 4]), vi("shape", [2], TensorProto.INT64)], [vi("y", [4, 6])], 14)
    with pytest.raises(StaticInputError, match="graph input 'shape'.*constants="):
        tg.from_onnx(m)
    target = np.array([4, 6], np.int64)
    got = tg.from_onnx(m, constants={"shape": target})(x=X)
    np.testing.assert_array_equal(got[0], X.reshape(4, 6))


def test_unmapped_ops_are_listed_once_in_one_error():
    nodes = [helper.make_node("NonZero", ["x"], ["a"], name="nz1"),
             helper.make_node("NonZero", ["x"], ["b"], name="nz2"),
             helper.make_node("Relu", ["x"], ["c"], name="relu"),
             helper.make_node("Unique", ["x"], ["d"], name="uniq")]
    m = model(nodes, [vi("x", [2, 3])], [vi("a", None), vi("b", None), vi("c", [2, 3]),
                                         vi("d", None)], 13, check=False)
    with pytest.raises(UnsupportedOpError) as info:
        tg.from_onnx(m)
    text = str(info.value)
    assert "opset 13" in text and "2 op type(s)" in text
    assert text.count("NonZero") == 1 and "'nz1', 'nz2'" in text
    assert "Unique (nodes 'uniq')" in text and "Relu" not in text
    assert info.value.ops == [("NonZero", "nz1"), ("NonZero", "nz2"), ("Unique", "uniq")]


def small_model():
    w = RNG.standard_normal((4, 3)).astype(np.float32)
    return model([helper.make_node("MatMul", ["x", "w"], ["y"])], [vi("x", ["n", 4])],
                 [vi("y", ["n", 3])], 13, [numpy_helper.from_array(w, "w")]), w


def test_a_path_and_bytes_import_alike(tmp_path):
    m, w = small_model()
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    x = RNG.standard_normal((5, 4)).astype(np.float32)
    for source in (path, str(path), m.SerializeToString(), m):
        assert relative_error(tg.from_onnx(source)(x)[0], x @ w) <= 1e-6


def test_hostile_and_truncated_files_are_refused_by_name(tmp_path):
    m, _ = small_model()
    data = m.SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(tg.SerializationError, match="cut.onnx"):
        tg.from_onnx(cut)
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff" * 64)
    with pytest.raises(tg.SerializationError, match="junk.onnx.*not an ONNX model"):
        tg.from_onnx(junk)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    with pytest.raises(tg.SerializationError, match="empty.onnx"):
        tg.from_onnx(empty)
    with pytest.raises(tg.SerializationError, match="directory"):
        tg.from_onnx(tmp_path)
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    with pytest.raises(tg.SerializationError, match="fifo.onnx"):
        tg.from_onnx(fifo)  # refused at once, never waited on
    with pytest.raises(tg.SerializationError, match="missing.onnx"):
        tg.from_onnx(tmp_path / "missing.onnx")


def external_model(folder, location, offset=0, length=None):
    """small_model with its weight stored outside the file, at ``location``."""
    m, w = small_model()
    init = m.graph.initializer[0]
    init.ClearField("raw_data")
    init.ClearField("float_data")
    init.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": str(offset)}
    if length is not None:
        entries["length"] = str(length)
    for k, v in entries.items():
        init.external_data.add(key=k, value=v)
    path = folder / "model.onnx"
    path.write_bytes(m.SerializeToString())
    return path, w


def test_external_data_is_read_from_the_model_folder_only(tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    x = RNG.standard_normal((2, 4)).astype(np.float32)
    path, w = external_model(folder, "weights.bin", offset=8, length=48)
    (folder / "weights.bin").write_bytes(b"\0" * 8 + w.tobytes())
    assert relative_error(tg.from_onnx(path)(x)[0], x @ w) <= 1e-6

    (tmp_path / "secret.bin").write_bytes(w.tobytes())
    for outside in ("../secret.bin", str(tmp_path / "secret.bin")):
        path, _ = external_model(folder, outside)
        with pytest.raises(tg.SerializationError, match="outside the model's folder"):
            tg.from_onnx(path)
    os.symlink(tmp_path / "secret.bin", folder / "link.bin")
    path, _ = external_model(folder, "link.bin")
    with pytest.raises(tg.SerializationError, match="outside the model's folder"):
        tg.from_onnx(path)
    path, _ = external_model(folder, "weights.bin", offset=40, length=48)
    with pytest.raises(tg.SerializationError, match="weights.bin.*truncated"):
        tg.from_onnx(path)
    m, _ = small_model()
    path, _ = external_model(folder, "weights.bin", offset=8, length=48)
    with pytest.raises(tg.SerializationError, match="pass the model's path"):
        tg.from_onnx(path.read_bytes())


def test_an_input_read_only_for_its_length_binds_the_dim():
    """Range(0, len(x)) reads x's symbolic length only: the program still binds it."""
    nodes = [helper.make_node("Shape", ["x"], ["shape"]),
             helper.make_node("Gather", ["shape", "zero"], ["n"], axis=0),
             helper.make_node("Range", ["zero", "n", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["y"], to=F)]
    m = model(nodes, [vi("x", ["n", 2])], [vi("y", ["n"])], 13,
              [ints("zero", 0), ints("one", 1)])
    prog = tg.from_onnx(m, {"n": 16})
    for n in (3, 7):
        (got,) = prog(x=np.zeros((n, 2), np.float32))
        np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32))


@pytest.mark.parametrize("op,direction,layout", [
    ("GRU", "forward", 0), ("GRU", "bidirectional", 0), ("LSTM", "bidirectional", 0),
    ("LSTM", "reverse", 0), ("RNN", "bidirectional", 0)])  # ORT has no layout=1: node tests do
def test_recurrent_layers_match_onnxruntime(op, direction, layout):
    """Gate order, directions, layouts, biases and initial states (GRU only in torch's
    linear_before_reset=1 form, which no ONNX node test uses) against ONNX Runtime."""
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    dirs, hidden, seq, batch, size = 2 if direction == "bidirectional" else 1, 5, 4, 3, 6
    rng = np.random.default_rng(2)
    init = [numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.5, n)
            for n, shape in (("W", (dirs, gates * hidden, size)),
                             ("R", (dirs, gates * hidden, hidden)),
                             ("B", (dirs, 2 * gates * hidden)))]
    states = [(batch, dirs, hidden) if layout else (dirs, batch, hidden)]
    inputs = [vi("X", [batch, seq, size] if layout else [seq, batch, size]),
              vi("h0", states[0])]
    names = ["X", "W", "R", "B", "", "h0"]
    if op == "LSTM":
        inputs.append(vi("c0", states[0]))
        names.append("c0")
    extra = {"linear_before_reset": 1} if op == "GRU" else {}
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, names, outs, hidden_size=hidden, direction=direction,
                            layout=layout, **extra)
    y_shape = [batch, seq, dirs, hidden] if layout else [seq, dirs, batch, hidden]
    m = model([node], inputs, [vi("Y", y_shape)] + [vi(o, states[0]) for o in outs[1:]],
              22, init)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in
                                          i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in inputs}
    against_ort(m, feeds)


@pytest.mark.parametrize("dim", ["if", "None", "batch size", "", "x" * 300])
def test_dim_names_that_are_no_symbol_get_the_inputs_name(dim):
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [dim, 3])],
              [vi("y", [dim, 3])], 13)
    prog = tg.from_onnx(m, {"x_dim0": 4})
    np.testing.assert_array_equal(prog(x=-X[0, :2, :3])[0], np.maximum(-X[0, :2, :3], 0))


def test_an_op_of_another_domain_is_refused_with_its_domain():
    """ONNX Runtime's contrib ops (com.microsoft) share no table with ai.onnx ops of the
    same name: refused, named with their domain."""
    node = helper.make_node("Gelu", ["x"], ["y"], name="fused", domain="com.microsoft")
    graph = helper.make_graph([node], "g", [vi("x", [2, 3])], [vi("y", [2, 3])])
    m = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", 17),
                                                helper.make_operatorsetid("com.microsoft", 1)])
    with pytest.raises(UnsupportedOpError, match="com.microsoft::Gelu \\(nodes 'fused'\\)"):
        tg.from_onnx(m)


def test_a_file_larger_than_protobuf_parses_is_refused_unread(tmp_path, monkeypatch):
    from tensor_graphs.frontend import onnx_import

    monkeypatch.setattr(onnx_import, "_PROTOBUF_LIMIT", 100)  # 2 GiB, scaled down
    big = tmp_path / "big.onnx"
    big.write_bytes(small_model()[0].SerializeToString() + b"\0" * 200)
    with pytest.raises(tg.SerializationError, match="big.onnx is larger.*external data"):
        tg.from_onnx(big)


@pytest.mark.parametrize("form", ["scales", "sizes"])
def test_resize_keeps_a_symbolic_batch(form):
    """An upsample with a dynamic batch (what torch.onnx.export writes for nn.Upsample or
    F.interpolate(size=...) with a batch Dim) resizes only the static spatial axes. Before,
    any symbolic dim of the input refused the Resize, so no such vision model imported."""
    inits = [numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    if form == "scales":
        inits.append(numpy_helper.from_array(np.array([1, 1, 2, 1.5], np.float32), "scales"))
        nodes = [helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode="linear")]
    else:  # the sizes' batch and channels read back from the input's shape
        inits += [ints("lo", [0]), ints("hi", [2]), ints("hw", [6, 5])]
        nodes = [helper.make_node("Shape", ["x"], ["shape"]),
                 helper.make_node("Slice", ["shape", "lo", "hi"], ["nc"]),
                 helper.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
                 helper.make_node("Resize", ["x", "roi", "", "sizes"], ["y"], mode="cubic")]
    m = model(nodes, [vi("x", ["n", 2, 3, 4])], [vi("y", ["n", 2, 6, None])], 19, inits)
    for n in (1, 3):
        against_ort(m, {"x": RNG.standard_normal((n, 2, 3, 4)).astype(np.float32)}, {"n": 4})


def test_resize_of_a_symbolic_axis_is_refused_by_name():
    scales = numpy_helper.from_array(np.array([1, 2], np.float32), "scales")
    m = model([helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up")],
              [vi("x", [2, "w"])], [vi("y", [2, None])], 19, [scales])
    with pytest.raises(UnsupportedOpError, match="Resize node 'up'.*symbolic axis.*\\[1\\].*"
                                                 "export the model with static sizes"):
        tg.from_onnx(m)


@pytest.mark.parametrize("dim", ["batch size", "past_sequence_length + 1"])
def test_inputs_sharing_a_dim_that_is_no_symbol_stay_tied(dim):
    """Two inputs with the same dim_param that is no symbol (ONNX Runtime's shape inference
    writes "past_sequence_length + 1") are one dim under the first input's name. Before,
    each input got its own name, and adding them was a ShapeError (x_dim0 vs z_dim0)."""
    m = model([helper.make_node("Add", ["x", "z"], ["y"])],
              [vi("x", [dim, 3]), vi("z", [dim, 3])], [vi("y", [dim, 3])], 13)
    prog = tg.from_onnx(m, {"x_dim0": 4})
    x, z = X[0, :2, :3], X[1, :2, :3]
    np.testing.assert_array_equal(prog(x=x, z=z)[0], x + z)
    with pytest.raises(tg.ShapeError, match="x_dim0"):
        prog(x=x, z=X[1, :1, :3])


def test_a_graph_without_outputs_is_refused_naming_the_model(tmp_path):
    """Before, it reached tg.compile, whose ArgumentError ("compile: give a node or a list of
    nodes") named neither the model nor what was wrong with it."""
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2])], [], 13, check=False)
    path = tmp_path / "no_outputs.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(tg.SerializationError, match="no_outputs.onnx.*names no outputs"):
        tg.from_onnx(path)


def relu_model(opset: int):
    return model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [vi("x", [2, 3])],
                 [vi("y", [2, 3])], opset, check=False)


def test_an_opset_newer_than_the_mappings_is_refused_naming_the_fix(tmp_path):
    """An op may change meaning in a newer opset (as Softmax did at 13): a model past the
    newest opset the mappings read was imported silently before, its ops taken at the
    meaning they last had."""
    path = tmp_path / "future.onnx"
    path.write_bytes(relu_model(99).SerializeToString())
    with pytest.raises(UnsupportedOpError) as info:
        tg.from_onnx(path)
    text = str(info.value)
    from tensor_graphs.frontend import onnx_import

    newest = onnx_import.NEWEST_OPSET
    assert "future.onnx" in text and "opset 99" in text and f"up to opset {newest}" in text
    assert f"opset_version={newest}" in text
    with pytest.raises(UnsupportedOpError, match="opset 99"):  # the interpreter's entry too
        import_onnx(relu_model(99))


def test_the_newest_opset_the_mappings_read_imports():
    """The newest opset is a number checked against ONNX's own node tests (test_onnx_node,
    opsets 1 to it), not the onnx package's newest: a later package may move an op again."""
    from tensor_graphs.frontend import onnx_import

    newest = onnx_import.NEWEST_OPSET
    assert newest <= onnx.defs.onnx_opset_version()
    for opset in (6, newest):
        x = X[0, :2, :3]
        np.testing.assert_array_equal(tg.from_onnx(relu_model(opset))(x=x)[0], np.maximum(x, 0))
    # "ai.onnx" is the default domain's other spelling: its opset is checked alike
    m = relu_model(13)
    m.opset_import[0].domain = "ai.onnx"
    m.opset_import[0].version = newest + 1
    with pytest.raises(UnsupportedOpError, match=f"opset {newest + 1}"):
        tg.from_onnx(m)


@pytest.mark.parametrize("dynamo", [True, False], ids=["dynamo", "torchscript"])
def test_torch_exports_at_their_default_opset_import(tmp_path, dynamo):
    """torch.onnx.export's two exporters, at the opset this torch writes by default: the
    opset check must let real exports through."""
    torch = pytest.importorskip("torch")
    if dynamo:
        pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs it")
    import warnings

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                              torch.nn.Linear(8, 3), torch.nn.Softmax(-1)).eval()
    x = torch.randn(2, 4)
    path = tmp_path / "net.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(net, (x,), str(path), dynamo=dynamo, input_names=["x"],
                          output_names=["y"], **({"verbose": False} if dynamo else {}))
    from tensor_graphs.frontend import onnx_import

    opset = onnx_import._opsets(onnx.load(str(path)))[""]
    assert opset <= onnx_import.NEWEST_OPSET, f"torch writes opset {opset} by default"
    with torch.no_grad():
        ref = net(x).numpy()
    got = tg.from_onnx(path)(x=x.numpy())[0]
    assert relative_error(got.astype(np.float64), ref.astype(np.float64)) <= 1e-5


def test_a_value_written_twice_is_refused_naming_both_nodes():
    """ONNX graphs assign each value once (SSA); a second writer replaced the first's value
    for every later reader, silently."""
    nodes = [helper.make_node("Relu", ["x"], ["y"], name="first"),
             helper.make_node("Neg", ["x"], ["y"], name="second")]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], 13, check=False)
    with pytest.raises(tg.SerializationError) as info:
        tg.from_onnx(m)
    text = str(info.value)
    assert "'y'" in text and "node 'second' (Neg)" in text and "node 'first' (Relu)" in text
    assert "check_model" in text


@pytest.mark.parametrize("shadowed", ["x", "w"], ids=["graph-input", "initializer"])
def test_a_node_output_shadowing_an_input_or_initializer_is_refused(shadowed):
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "w")
    nodes = [helper.make_node("Relu", ["x"], [shadowed], name="relu"),
             helper.make_node("Add", ["x", "w"], ["y"], name="add")]
    m = model(nodes, [vi("x", [2, 3])], [vi("y", [2, 3])], 13, [w], check=False)
    what = "graph input" if shadowed == "x" else "initializer"
    with pytest.raises(tg.SerializationError,
                       match=f"node 'relu' \\(Relu\\) writes '{shadowed}'.*{what}"):
        tg.from_onnx(m)


# ------------------------------------------------------------------ Resize at non-integer scales
def resize_model(n: int, mode: str, coordinate: str, scale: float, opset: int = 18):
    roi = np.array([0, 0, 0.2, 0, 1, 1, 0.9, 1], np.float32) \
        if coordinate == "tf_crop_and_resize" else np.zeros(0, np.float32)
    inits = [numpy_helper.from_array(roi, "roi"),
             numpy_helper.from_array(np.array([1, 1, scale, 1], np.float32), "scales")]
    node = helper.make_node("Resize", ["x", "roi", "scales"], ["y"], mode=mode,
                            coordinate_transformation_mode=coordinate, nearest_mode="floor")
    return model([node], [vi("x", [1, 2, n, 3])], [vi("y", None)], opset, inits, check=False)


@pytest.mark.parametrize("mode, coordinate", [
    *[(m, c) for m in ("nearest", "linear", "cubic")
      for c in ("align_corners", "pytorch_half_pixel", "tf_crop_and_resize")],
    ("nearest", "half_pixel"), ("nearest", "half_pixel_symmetric")])
def test_resize_at_non_integer_scales_matches_onnxruntime(mode, coordinate):
    """ONNX Runtime (and torch) place align_corners', tf_crop_and_resize's and
    pytorch_half_pixel's samples over the output's integer length; the weights spanned
    scale * size (ONNX's reference), off wherever that is no integer (0.5 relative error at
    scale 1.5). Positions are float32 as there, which a nearest pick at a boundary needs
    ((1 + 0.5) / 0.6 is 2.5 in float32: floor 2, not 1)."""
    for n, scale in ((5, 1.5), (5, 0.6), (3, 1.7), (5, 0.3), (2, 2.5)):
        x = RNG.standard_normal((1, 2, n, 3)).astype(np.float32)
        against_ort(resize_model(n, mode, coordinate, scale), {"x": x})


def test_interpolate_align_corners_at_scale_1_5_matches_torch():
    """The reported case: F.interpolate(scale_factor=1.5, mode="bilinear",
    align_corners=True), as torch.onnx.export writes it (Resize, linear, align_corners,
    scales (1, 1, 1.5, 1.5))."""
    torch = pytest.importorskip("torch")
    x = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
    scales = numpy_helper.from_array(np.array([1, 1, 1.5, 1.5], np.float32), "scales")
    m = model([helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear",
                                coordinate_transformation_mode="align_corners")],
              [vi("x", [1, 2, 5, 5])], [vi("y", None)], 17, [scales], check=False)
    ref = torch.nn.functional.interpolate(torch.from_numpy(x), scale_factor=1.5,
                                          mode="bilinear", align_corners=True).numpy()
    got = tg.from_onnx(m)(x=x)[0]
    assert got.shape == ref.shape == (1, 2, 7, 7)
    assert relative_error(got.astype(np.float64), ref.astype(np.float64)) <= 1e-6
    against_ort(m, {"x": x})


def test_resize_with_an_unknown_coordinate_mode_is_refused_by_name():
    """Before, a mode the weights did not know ended in a bare ValueError from numpy code."""
    m = resize_model(4, "linear", "tf_half_pixel_for_nn", 2.0)  # removed at opset 13
    with pytest.raises(UnsupportedOpError, match="coordinate_transformation_mode "
                                                 "'tf_half_pixel_for_nn'.*export the model"):
        tg.from_onnx(m)
    old = resize_model(4, "nearest", "tf_half_pixel_for_nn", 1.5, opset=11)  # mapped there
    x = RNG.standard_normal((1, 2, 4, 3)).astype(np.float32)
    against_ort(old, {"x": x})


# ------------------------------------------------------------------ Slice on a dynamic axis
SLICE_BOUNDS = [(0, 8), (-3, -1), (3, 100), (1, -1), (2, 2 ** 63 - 1), (-2, 2 ** 63 - 1),
                (5, -3), (0, -100)]


@pytest.mark.parametrize("start, end", SLICE_BOUNDS)
def test_a_slice_of_a_dynamic_axis_clamps_as_onnxruntime_at_every_length(start, end):
    """Slice's bounds clamp into the axis at every length it takes: x[:8] of 5 rows is 5
    rows. Before, a dynamic axis took the bounds as given (8 rows whatever the length), and
    a call shorter than them failed after planning ("the plan expects (8, 4)")."""
    m = model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"])],
              [vi("x", ["n", 4])], [vi("y", None)], 17,
              [ints("st", [start]), ints("en", [end]), ints("ax", [0])], check=False)
    prog = tg.from_onnx(m, {"n": 16})
    session = ort.InferenceSession(m.SerializeToString())
    for n in (1, 2, 5, 9, 16):
        x = RNG.standard_normal((n, 4)).astype(np.float32)
        (ref,) = session.run(None, {"x": x})
        (got,) = prog(x=x)
        assert got.shape == ref.shape, (n, got.shape, ref.shape)
        np.testing.assert_array_equal(got, ref)


def test_a_slice_whose_length_rises_and_falls_is_refused_naming_the_node():
    """x[-3:5] over a dynamic axis: 3 rows at n = 5, none from n = 8; refused at import,
    naming the node and the fixes, not planned for lengths it does not have."""
    m = model([helper.make_node("Slice", ["x", "st", "en", "ax"], ["y"], name="cut")],
              [vi("x", ["n", 4])], [vi("y", None)], 17,
              [ints("st", [-3]), ints("en", [5]), ints("ax", [0])], check=False)
    with pytest.raises(tg.ShapeError) as info:
        tg.from_onnx(m, {"n": 16})
    text = str(info.value) + "".join(getattr(info.value, "__notes__", ()))
    assert "x[-3:5]" in text and "symbolic axis 0 (n)" in text and "node 'cut'" in text
    assert "same end" in text and "static size" in text


def test_torch_truncating_a_dynamic_sequence_runs_shorter_calls(tmp_path):
    """x[:, :8] of a model exported with a dynamic sequence axis (the reported case) at
    sequences shorter and longer than 8, as torch and ONNX Runtime compute them."""
    torch = pytest.importorskip("torch")
    import warnings

    class Truncate(torch.nn.Module):
        def forward(self, x):
            return x[:, :8] * 2

    path = tmp_path / "truncate.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the TorchScript exporter's deprecation notice
        torch.onnx.export(Truncate(), (torch.randn(2, 12, 4),), str(path), input_names=["x"],
                          opset_version=17, dynamic_axes={"x": {1: "seq"}}, dynamo=False)
    prog = tg.from_onnx(path, {"seq": 16})
    for seq in (3, 5, 8, 12, 16):
        x = RNG.standard_normal((2, seq, 4)).astype(np.float32)
        ref = Truncate()(torch.from_numpy(x)).numpy()
        (got,) = prog(x=x)
        assert got.shape == ref.shape == (2, min(seq, 8), 4)
        np.testing.assert_array_equal(got, ref)


# ------------------------------------------------------------------ recurrences over a dynamic axis
def recurrent_model(op: str, direction: str, hidden: int = 5, inputs: int = 3, batch: int = 2,
                    **attrs):
    gates = {"RNN": 1, "GRU": 3, "LSTM": 4}[op]
    d = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(
        (rng.standard_normal(shape) * 0.5).astype(np.float32), name)
        for name, shape in (("W", (d, gates * hidden, inputs)),
                            ("R", (d, gates * hidden, hidden)), ("B", (d, 2 * gates * hidden)))]
    outs = ["Y", "Y_h"] + (["Y_c"] if op == "LSTM" else [])
    node = helper.make_node(op, ["x", "W", "R", "B"], outs, name="rec", hidden_size=hidden,
                            direction=direction, **attrs)
    return model([node], [vi("x", ["seq", batch, inputs])], [vi(o, None) for o in outs], 14,
                 inits, check=False)


@pytest.mark.parametrize("op, attrs", [("RNN", {}), ("LSTM", {}),
                                       ("GRU", {"linear_before_reset": 1}),
                                       ("GRU", {"linear_before_reset": 0})],
                         ids=["rnn", "lstm", "gru", "gru-reset-first"])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_a_recurrence_over_a_dynamic_sequence_unrolls_to_its_bound(op, attrs, direction):
    """The usual export of an RNN (a dynamic sequence axis) imports: the recurrence is
    unrolled to the dynamic_dims bound of the axis, the steps past a call's length masked,
    and every output matches ONNX Runtime's at lengths up to the bound. Before, the import
    failed asking for max_steps=, which from_onnx had no way to take."""
    m = recurrent_model(op, direction, **attrs)
    prog = tg.from_onnx(m, {"seq": 6})
    session = ort.InferenceSession(m.SerializeToString())
    for seq in (1, 4, 6):
        x = RNG.standard_normal((seq, 2, 3)).astype(np.float32)
        ref = session.run(None, {"x": x})
        got = prog(x=x)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert g.shape == r.shape
            assert relative_error(g.astype(np.float64), r.astype(np.float64)) <= 1e-5
    with pytest.raises(tg.ShapeError, match="dynamic_dims"):  # longer than the bound
        prog(x=RNG.standard_normal((7, 2, 3)).astype(np.float32))


def test_a_recurrence_over_a_dynamic_sequence_without_a_bound_names_dynamic_dims():
    m = recurrent_model("LSTM", "forward")
    with pytest.raises(tg.ShapeError) as info:
        tg.from_onnx(m)
    text = str(info.value)
    assert "LSTM node 'rec'" in text and "dynamic_dims={'seq': N}" in text


def test_a_torch_lstm_exported_with_a_dynamic_sequence_matches_onnxruntime(tmp_path):
    """The reported case: nn.LSTM(batch_first=True) exported with dynamic_axes on the
    sequence, imported with dynamic_dims={"seq": 16}, at several lengths."""
    torch = pytest.importorskip("torch")
    import warnings

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(8, 16, batch_first=True).eval()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = lstm

        def forward(self, x):
            return self.lstm(x)[0]

    path = tmp_path / "lstm.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the exporter's deprecation and batch-size notices
        torch.onnx.export(Net().eval(), (torch.randn(2, 5, 8),), str(path), input_names=["x"],
                          opset_version=14, dynamic_axes={"x": {1: "seq"}}, dynamo=False)
    prog = tg.from_onnx(path, dynamic_dims={"seq": 16})
    session = ort.InferenceSession(str(path))
    for seq in (1, 5, 16):
        x = RNG.standard_normal((2, seq, 8)).astype(np.float32)
        (ref,) = session.run(None, {"x": x})
        (got,) = prog(x=x)
        assert got.shape == ref.shape == (2, seq, 16)
        assert relative_error(got.astype(np.float64), ref.astype(np.float64)) <= 1e-5


# ------------------------------------------------------------------ Pow of an int base
@pytest.mark.parametrize("base", [TensorProto.INT64, TensorProto.INT32])
@pytest.mark.parametrize("exponent", [0.5, 2.5, -0.5, 1 / 3])
def test_pow_of_an_int_base_and_a_float_exponent_matches_onnxruntime(base, exponent):
    """The result has the base's int dtype, computed in float64 and truncated (ONNX
    Runtime's std::pow). Before, the exponent was cast to the base's dtype: x ** 0.5 was
    x ** 0, all ones."""
    dtype = {TensorProto.INT64: np.int64, TensorProto.INT32: np.int32}[base]
    e = numpy_helper.from_array(np.array(exponent, np.float32), "e")
    m = model([helper.make_node("Pow", ["x", "e"], ["y"])], [vi("x", [6], base)],
              [vi("y", None, base)], 17, [e], check=False)
    x = np.array([1, 4, 9, 17, 2, 100], dtype)
    (ref,) = ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})
    (got,) = tg.from_onnx(m)(x=x)
    assert got.dtype == ref.dtype
    np.testing.assert_array_equal(got, ref)


# ------------------------------------------------------------------ options and invalid models
def test_an_unknown_option_is_refused_naming_those_accepted():
    """Before, it reached tg.compile after the whole import: a bare TypeError."""
    m = relu_model(13)
    with pytest.raises(tg.ArgumentError) as info:
        tg.from_onnx(m, tolerence=1e-3)
    text = str(info.value)
    assert "from_onnx: unknown option(s) tolerence" in text and "did you mean tolerance=" in text
    assert "dynamic_dims, device, constants, tolerance" in text and "db" in text
    with pytest.raises(tg.ArgumentError, match="quantize.*tg.from_torch"):
        tg.from_onnx(m, quantize="int8-weight")
    with pytest.raises(tg.ArgumentError, match="bounds.*dynamic_dims="):
        tg.from_onnx(m, bounds={"n": 4})
    x = X[0, :2, :3]
    np.testing.assert_array_equal(tg.from_onnx(m, db=":memory:")(x=x)[0], np.maximum(x, 0))


def test_a_gather_index_out_of_range_is_refused_naming_the_node():
    """An initializer's index past the data's axis: numpy's bare IndexError before."""
    one = [vi("x", [1])]
    for data in (np.arange(4, dtype=np.float32), np.arange(5000, dtype=np.float32)):
        m = model([helper.make_node("Gather", ["w", "i"], ["y"], name="pick")], one,
                  [vi("y", None)], 17,
                  [numpy_helper.from_array(data, "w"), ints("i", [1, data.size + 3])],
                  check=False)
        with pytest.raises(tg.ShapeError, match=f"Gather node 'pick': index {data.size + 3} "
                                                f".*'i'.*axis 0 of size {data.size}"):
            tg.from_onnx(m)


def test_a_range_with_delta_zero_is_refused_naming_the_node():
    m = model([helper.make_node("Range", ["a", "b", "c"], ["y"], name="steps")],
              [vi("x", [1])], [vi("y", None, TensorProto.INT64)], 17,
              [numpy_helper.from_array(np.array(v, np.int64), n)
               for v, n in ((0, "a"), (10, "b"), (0, "c"))], check=False)
    with pytest.raises(tg.ShapeError, match="Range node 'steps': delta is 0"):
        tg.from_onnx(m)


def test_a_huge_range_is_refused_before_anything_is_allocated():
    """A Range of 10**12 values was allocated by numpy while importing (a MemoryError naming
    no node); now it is built in the graph and the compile's memory plan refuses it, naming
    the model's node."""
    inits = [numpy_helper.from_array(np.array(v, np.int64), n)
             for v, n in ((0, "a"), (10 ** 12, "b"), (1, "c"))]
    m = model([helper.make_node("Range", ["a", "b", "c"], ["r"], name="steps"),
               helper.make_node("Cast", ["r"], ["y"], to=F)],
              [vi("x", [1])], [vi("y", None)], 17, inits, check=False)
    outputs, *_ = import_onnx(m)  # nothing of its size is made here
    assert outputs[0].shape == (10 ** 12,)
    with pytest.raises(tg.OutOfMemory) as info:
        tg.from_onnx(m, db=":memory:")
    assert "Range node 'steps'" in "".join(info.value.__notes__)
    # a moderate one past the fold limit runs as ONNX Runtime's
    inits[1] = numpy_helper.from_array(np.array(10000, np.int64), "b")
    against_ort(model(m.graph.node, [vi("x", [1])], [vi("y", None)], 17, inits, check=False),
                {"x": np.ones(1, np.float32)})


def test_a_concat_of_different_ranks_is_refused_naming_the_node():
    """Invalid ONNX (ONNX Runtime refuses it): the rank-1 input was silently dropped."""
    for z in ([3], [0]):
        m = model([helper.make_node("Concat", ["x", "z"], ["y"], axis=0, name="join")],
                  [vi("x", [2, 3]), vi("z", z)], [vi("y", None)], 17, check=False)
        with pytest.raises(tg.ShapeError, match="Concat node 'join': its inputs have "
                                                "different ranks .*rank 2.*rank 1"):
            tg.from_onnx(m)
