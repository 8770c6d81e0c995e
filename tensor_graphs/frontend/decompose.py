"""torch's own decompositions as the importer's fallback.

An exported program hands many composites over whole (einsum, tile, outer, the losses...).
Where the ATen table maps an op, the mapping wins: composites mapped whole stay whole, so the
planner still finds their fused kernels. Every op without a mapping is replaced by torch's
decomposition of that op alone, and what that decomposition produces is mapped in turn (its
own unmapped ops decomposed again, until nothing more decomposes).

The same retrace functionalizes: an in-place op that writes through a view (``y[:, 1:] =
x``, ``y[0].add_(1)``, ``y.view(-1).mul_(2)``) changes every tensor sharing that storage,
which the importer's rebinding of the written name cannot follow; torch's functional form
of the program (``slice_scatter``, ``select_scatter``, ``copy``) says it in values.
"""

from __future__ import annotations

import functools
import operator

from tensor_graphs.frontend.aten import lookup, mutates, writes_values
from tensor_graphs.frontend.aten.common import torch_module


def unmapped(exported) -> list:
    """The call_function nodes of ``exported`` the ATen table has no mapping for."""
    return [n for n in exported.graph.nodes
            if n.op == "call_function" and lookup(n.target) is None]


@functools.lru_cache(maxsize=1)
def _export_table() -> dict:
    """torch.export's default table (core ATen decompositions and the CompositeImplicit ops)."""
    return dict(torch_module().export.default_decompositions().materialize())


def decomposition(op):
    """torch's decomposition of one ATen overload, or None (not an ATen overload, or torch
    has none)."""
    torch = torch_module()
    if not isinstance(op, torch._ops.OpOverload):
        return None
    found = _export_table().get(op) or torch._decomp.decomposition_table.get(op)
    if found is not None:
        return found
    try:
        from torch._export.utils import _get_decomp_for_cia, _is_cia_op
    except ImportError:  # pragma: no cover - a torch without these helpers: tables only
        return None
    return _get_decomp_for_cia(op) if _is_cia_op(op) else None


def writes_through_views(exported) -> list:
    """The in-place nodes of ``exported`` whose written tensor shares its storage with
    another node's: a view of it, or one it is a view of (by the ops' alias annotations:
    a view op's result aliases its input, as an in-place op's does). The importer rebinds
    only the written node's name, so these need the functional form. An in-place op that
    rewrites only metadata (``detach_``: ``writes_values``) writes nothing others see."""
    fx_node = torch_module().fx.Node
    parent: dict = {}

    def root(node):
        while parent.get(node, node) is not node:
            node = parent[node]
        return node

    viewed: set = set()
    writes = []
    for node in exported.graph.nodes:
        if node.op != "call_function" or not node.args:
            continue
        base = node.args[0]
        if node.target is operator.getitem:  # an output of a multi-output view (split...)
            if base in parent:
                parent[node] = root(base)
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is None or not schema.returns or not isinstance(base, fx_node):
            continue
        alias = schema.returns[0].alias_info
        if alias is None:
            continue
        if mutates(node.target):  # the same tensor (rebound), not a view of it
            if writes_values(node.target):
                writes.append(node)
        else:
            viewed.add(root(base))
        parent[node] = root(base)
    return [node for node in writes if root(node) in viewed]


def decompose_unmapped(exported):
    """``exported`` with torch's decomposition applied to every op without a mapping (and
    to the unmapped ops those decompositions produce), functional where an in-place op
    writes through a view (``writes_through_views``); unchanged when neither applies. Ops
    that remain unmapped are the caller's to report.

    One retrace with the decompositions of every unmapped op torch knows (only the ops in
    the program are touched; mapped ones stay whole); where torch cannot trace one of them
    on this program, the ops present are tried one at a time and the failing ones left."""
    aliased = bool(writes_through_views(exported))
    if not aliased and not any(decomposition(node.target) is not None
                               for node in unmapped(exported)):
        return exported  # nothing torch could decompose: no retrace
    decomposed = _run(exported, fallback_table())
    if decomposed is not None:
        return decomposed
    table: dict = {}
    tried: set = set()
    current = (_run(exported, {}) or exported) if aliased else exported
    while True:
        new = {}
        for node in unmapped(current):
            if node.target not in tried:
                tried.add(node.target)
                found = decomposition(node.target)
                if found is not None:
                    new[node.target] = found
        if not new:
            return current
        for op, fn in new.items():
            attempt = _run(exported, {**table, op: fn})
            if attempt is not None:
                table[op], current = fn, attempt


@functools.lru_cache(maxsize=1)
def fallback_table() -> dict:
    """Every ATen overload torch can decompose that the ATen table does not map, with its
    decomposition."""
    torch = torch_module()
    table = {}
    for op in {*_export_table(), *torch._decomp.decomposition_table}:
        if isinstance(op, torch._ops.OpOverload) and lookup(op) is None:
            found = decomposition(op)
            if found is not None:
                table[op] = found
    return table


def _run(exported, table):
    """``exported`` decomposed by ``table``, or None where torch cannot trace a decomposition
    on this program (one that needs a data-dependent size, say): the op stays unmapped and
    is reported as such. The retrace returns flat outputs (``_with_out_spec``)."""
    spec = exported.call_spec.out_spec
    try:
        flat = _with_out_spec(exported, _flat_spec(spec)) if spec is not None else exported
        decomposed = flat.run_decompositions(dict(table))
    except Exception:  # noqa: BLE001 - any failure inside torch's tracing means "not here"
        return None
    return _with_out_spec(decomposed, spec) if spec is not None else decomposed


def _flat_spec(spec):
    """A tuple's spec with ``spec``'s leaves."""
    import torch.utils._pytree as pytree

    return pytree.tree_structure(tuple(range(spec.num_leaves)))


def _with_out_spec(exported, spec):
    """``exported`` (a copy: torch's ``_update``) returning its outputs as ``spec`` arranges
    them. torch's retrace rebuilds the output's structure inside the traced forward: a
    transformers cache rebuilt there makes fresh ``torch.tensor([])`` constants, which
    torch lifts without adding them to the constants it keeps, so the retraced program
    fails its own check ("Constant tensor lifted_tensor_0 is not in the constants
    dictionary"). Retraced with flat outputs and given its structure back after, a model
    that returns its cache decomposes as one that returns its logits does."""
    copied = exported._update(exported.graph_module, exported.graph_signature)
    copied.module_call_graph[0].signature.out_spec = spec
    return copied
