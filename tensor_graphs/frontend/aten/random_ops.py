"""ATen's random ops: dropout and its variants."""

from __future__ import annotations

from tensor_graphs.errors import ArgumentError
from tensor_graphs.frontend.aten.common import guarded


def _dropout(a, kw):
    if kw["train"] and kw["p"]:
        raise ArgumentError("dropout in training mode: call module.eval() before from_torch")
    return kw["input"]


def table(aten) -> dict:
    return guarded({
        aten.dropout: _dropout,
        aten.feature_dropout: _dropout,
        aten.alpha_dropout: _dropout,
        aten.feature_alpha_dropout: _dropout,
    })
