"""ATen's selection and scatter families (sort, topk, scatter_add, index_put, ...): ops whose
result depends on the values' order or writes through an index."""

from __future__ import annotations

from tensor_graphs.frontend.aten.common import guarded


def table(aten) -> dict:
    return guarded({})
