"""ATen's rounding, special and integer pointwise functions (floor, log1p, atan2, bitwise
ops on integers, ...): the families issue 21 adds, kept apart from math_ops' arithmetic."""

from __future__ import annotations

from tensor_graphs.frontend.aten.common import guarded


def table(aten) -> dict:
    return guarded({})
