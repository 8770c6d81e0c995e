"""Small ONNX graphs for the importer's tests: a checked model of some nodes, and value
infos. Not a test module; imported after a test module's ``importorskip("onnx")``."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


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
