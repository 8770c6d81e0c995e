"""tg.from_onnx on graph forms users' exported models hold, each against ONNX Runtime or
numpy: found by exporting real models (GPT-2 with its cache as inputs, ...) and reduced to
the few nodes that went wrong."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed "
                                          "(pip install -e '.[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed "
                                                "(pip install -e '.[onnx]')")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tests.frontend.onnx_graphs import against_ort, init, model, vi  # noqa: E402

F, I64 = TensorProto.FLOAT, TensorProto.INT64
RNG = np.random.default_rng(0)


def test_positions_after_a_symbolic_cache_gather_an_embedding():
    """GPT-2 exported by the dynamo exporter with its cache as inputs: the position ids are
    arange(seq) + past_len, a static array holding a symbolic dim, gathering rows of a
    small (foldable) position table; folding it cast the symbol to int (a bare TypeError)."""
    nodes = [
        helper.make_node("Shape", ["past"], ["past_shape"], start=1, end=2),
        helper.make_node("Squeeze", ["past_shape"], ["past_len"]),
        helper.make_node("Add", ["arange", "past_len"], ["pos"]),
        helper.make_node("Unsqueeze", ["pos", "zero"], ["pos2"]),
        helper.make_node("Gather", ["wpe", "pos2"], ["emb"]),
        helper.make_node("Add", ["x", "emb"], ["y"]),
    ]
    wpe = RNG.standard_normal((16, 4)).astype(np.float32)
    m = model(nodes, [vi("x", [1, 2, 4]), vi("past", [1, "past", 4])], [vi("y", [1, 2, 4])],
              inits=[init("wpe", wpe), init("arange", [0, 1], np.int64),
                     init("zero", [0], np.int64)])
    against_ort(m, [{"x": RNG.standard_normal((1, 2, 4)).astype(np.float32),
                     "past": np.zeros((1, p, 4), np.float32)} for p in (3, 9)],
                {"past": 12})


@pytest.mark.parametrize("op", ["Expand", "ConstantOfShape"])
def test_a_negative_size_in_a_shape_is_refused_naming_the_node(op):
    """ONNX's sizes are >= 0 and ONNX Runtime refuses these models; our broadcast_to read
    Expand's -1 as torch's "keep this axis" (an answer for an invalid model) and
    ConstantOfShape crashed in numpy, naming no node."""
    shape = numpy_helper.from_array(np.array([2, -1], np.int64), "s")
    if op == "Expand":
        m = model([helper.make_node("Expand", ["x", "s"], ["y"], name="grow")],
                  [vi("x", [2, 3])], [vi("y", [2, 3])], inits=[shape])
    else:
        m = model([helper.make_node("ConstantOfShape", ["s"], ["y"], name="grow")], [],
                  [vi("y", [2, 3])], inits=[shape])
    with pytest.raises(tg.ShapeError, match=rf"{op} node 'grow'.*negative size -1"):
        tg.from_onnx(m)


def test_a_huge_constant_of_shape_is_not_allocated_at_import():
    """numpy's product of (2**32, 2**32) wraps to 0 in int64, so the import folded it as a
    small array and asked numpy for 2**64 values (a bare ValueError): it stays a graph
    node, sized by tg.compile's memory plan."""
    from tensor_graphs.frontend.onnx_import import import_onnx

    shape = numpy_helper.from_array(np.array([2 ** 32, 2 ** 32], np.int64), "s")
    m = model([helper.make_node("ConstantOfShape", ["s"], ["y"])], [], [vi("y", [2 ** 32] * 2)],
              inits=[shape])
    (out,), *_ = import_onnx(m)
    assert tuple(out.shape) == (2 ** 32, 2 ** 32)


def test_a_negative_dim_value_on_an_input_is_an_unknown_size():
    """Some converters write an unknown size as dim_value -1; ONNX Runtime reads it as
    unknown and runs the model, where the import refused it as a size (naming no input)."""
    m = model([helper.make_node("Relu", ["x"], ["y"])], [vi("x", [2, 3])], [vi("y", [2, 3])])
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    against_ort(m, [{"x": RNG.standard_normal((k, 3)).astype(np.float32)} for k in (2, 5)])


def test_the_cli_unrolls_a_recurrence_to_the_dims_it_plans_for(tmp_path, capsys):
    """`tg explain model.onnx --dim seq=3` on an LSTM over a dynamic sequence: the command
    imported the model without its --dim values, so every such model was refused, naming
    tg.from_onnx's dynamic_dims, which the command does not take."""
    from tensor_graphs.cli import main

    hidden = 3
    nodes = [helper.make_node("LSTM", ["x", "w", "r"], ["y"], hidden_size=hidden)]
    m = model(nodes, [vi("x", ["seq", "batch", 4])], [vi("y", ["seq", 1, "batch", hidden])],
              inits=[init("w", RNG.standard_normal((1, 4 * hidden, 4)), np.float32),
                     init("r", RNG.standard_normal((1, 4 * hidden, hidden)), np.float32)])
    path = tmp_path / "lstm.onnx"
    onnx.save(m, str(path))
    assert main(["explain", str(path), "--dim", "seq=3", "--dim", "batch=2",
                 "--db", ":memory:"]) == 0
    assert "lstm_layer" in capsys.readouterr().out


def test_an_external_data_location_with_a_nul_is_refused_naming_the_tensor(tmp_path):
    """A NUL in the external file's name names no file: os.path raised a bare ValueError
    ('embedded null byte') naming neither the model nor the tensor."""
    w = numpy_helper.from_array(np.zeros((2, 3), np.float32), "w")
    w.ClearField("raw_data")
    w.data_location = TensorProto.EXTERNAL
    entry = w.external_data.add()
    entry.key, entry.value = "location", "w.bin\0../../etc/passwd"
    (tmp_path / "w.bin").write_bytes(np.zeros(6, np.float32).tobytes())
    m = model([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", [2, 3])],
              [vi("y", [2, 3])], inits=[w], check=False)  # the checker reads the data
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    with pytest.raises(tg.SerializationError, match=r"tensor 'w' names the external data "
                                                    r"file 'w.bin\\x00.*outside the model"):
        tg.from_onnx(path)


def test_corrupt_names_and_dtype_codes_are_refused_naming_the_field():
    """Bytes flipped in a model file: a name that is not UTF-8 came back from protobuf as
    bytes and crashed the import (AttributeError: no isidentifier), and a dtype code no ONNX
    dtype has crashed the DTypeError meant for it (protobuf's Name() raising ValueError)."""
    m = model([helper.make_node("Relu", ["xQ"], ["y"])], [vi("xQ", ["bQ", 3])],
              [vi("y", ["bQ", 3])])
    data = m.SerializeToString()
    for old, new, field in ((b"xQ", b"x\xff", "a graph input's name"),
                            (b"bQ", b"b\xfe", "a dim of the graph input 'xQ'")):
        with pytest.raises(tg.SerializationError, match=f"{field} is not UTF-8 text"):
            tg.from_onnx(data.replace(old, new))
    m.graph.input[0].type.tensor_type.elem_type = 42
    with pytest.raises(tg.DTypeError, match="graph input 'xQ': ONNX dtype code 42"):
        tg.from_onnx(m)


def test_a_crash_inside_a_mapping_names_the_node(monkeypatch):
    """An error that is not ours, raised while a node is mapped (the Gather above was a bare
    TypeError), still says which node of the model was being imported."""
    from tensor_graphs.frontend import onnx_import

    def broken(c):
        raise TypeError("boom")

    monkeypatch.setitem(onnx_import.ONNX_OPS, "Relu", broken)
    m = model([helper.make_node("Relu", ["x"], ["y"], name="act")], [vi("x", [2])],
              [vi("y", [2])])
    with pytest.raises(TypeError) as info:
        tg.from_onnx(m)
    assert "while importing Relu node 'act' (opset 18)" in info.value.__notes__
