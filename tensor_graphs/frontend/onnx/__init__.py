"""The ONNX table: op type (default domain, ``ai.onnx``) -> ``fn(ctx) -> value`` built from
our ops, split by domain like the ATen table. A mapping reads its inputs and attributes
through ``common.Ctx`` (which knows the node's opset) and returns one value, or a tuple for
an op with several outputs; a key in two modules is an error."""

from __future__ import annotations

from tensor_graphs.frontend.onnx import (
    attention_ops,
    loss_ops,
    math_ops,
    nn_ops,
    recurrent_ops,
    resize_ops,
    select_ops,
    shape_ops,
)
from tensor_graphs.frontend.onnx.common import StaticInputError, UnsupportedOpError

MODULES = (math_ops, nn_ops, shape_ops, select_ops, attention_ops, recurrent_ops, loss_ops,
           resize_ops)


def build_table() -> dict:
    table: dict = {}
    for module in MODULES:
        part = module.table()
        twice = set(part) & set(table)
        if twice:
            raise RuntimeError(f"{module.__name__} maps ONNX ops mapped elsewhere: {twice}")
        table.update(part)
    return table


ONNX_OPS: dict = build_table()

__all__ = ["MODULES", "ONNX_OPS", "StaticInputError", "UnsupportedOpError", "build_table"]
