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

F = TensorProto.FLOAT
RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs, opset: int, inits=(), check: bool = True):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
    m.ir_version = 8
    if check:
        onnx.checker.check_model(m)
    return m


def vi(name, shape, dtype=F):
    return helper.make_tensor_value_info(name, dtype, shape)


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
