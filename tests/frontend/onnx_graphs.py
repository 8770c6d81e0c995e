"""Small ONNX graphs for the importer's tests: a checked model of some nodes, value infos,
initializers, and the check of an import against ONNX Runtime. Not a test module; imported
after a test module's ``importorskip("onnx")`` (and ``"onnxruntime"`` for ``against_ort``)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error


def model(nodes, inputs, outputs, opset: int = 18, inits=(), check: bool = True):
    """A model of ``nodes`` at ``opset`` (IR version 8, which every ONNX Runtime here reads),
    checked by onnx's checker unless ``check`` is False (a model meant to be invalid)."""
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_operatorsetid("", opset)])
    m.ir_version = 8
    if check:
        onnx.checker.check_model(m)
    return m


def vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def init(name, values, dtype=None):
    return numpy_helper.from_array(np.asarray(values, dtype=dtype), name)


def against_ort(m, feed_list, dims=None, tol=1e-5):
    """The compiled import and ONNX Runtime on each feeds, by the one error measure (exact
    for ints and bools)."""
    import onnxruntime as ort

    session = ort.InferenceSession(m.SerializeToString())
    prog = tg.from_onnx(m, dims)
    for feeds in feed_list:
        ref = session.run(None, feeds)
        got = prog(**feeds)
        assert len(got) == len(ref)
        for g, r in zip(got, ref):
            assert g.shape == r.shape and g.dtype == r.dtype
            if r.dtype.kind == "f":
                assert relative_error(g.astype(np.float64), r.astype(np.float64)) <= tol
            else:
                np.testing.assert_array_equal(g, r)
