"""torch's grad-mode regions (``torch.no_grad()``, ``torch.set_grad_enabled(False)``, a
``@torch.no_grad()`` method) made explicit before a program is imported for training.

Exported with grad enabled (``tg.from_torch(train=True)`` does), torch.export keeps each such
region as a ``wrap_with_set_grad_enabled(enabled, body, *args)`` call of a subgraph; torch's
own retrace (``run_decompositions``, the importer's fallback) inlines the body and forgets the
mode, and exported under ``torch.no_grad()`` the regions are never recorded. So the regions
are inlined here first, each value an op computed with grad disabled passing through
``aten.detach`` where it leaves the region (an output, or an argument of a region that
enables grad again): what torch's autograd does not differentiate, tg.grad then does not
either (detach maps to ``tg.stop_gradient`` in an import for training). A value that passes
through a region unchanged (an input returned as it is, a nested grad-enabled region's
result) keeps its gradient, as in torch.
"""

from __future__ import annotations

import operator

from tensor_graphs.frontend.aten.common import UnsupportedOpError, torch_module


def inline_grad_regions(exported):
    """``exported`` with every grad-mode region inlined into its graph (in place: the caller
    exported it), values computed with grad disabled detached where they leave it. A program
    without regions is returned as it is."""
    region = _region_op()
    graph_module = exported.graph_module
    graph = graph_module.graph
    calls = [n for n in graph.nodes if n.op == "call_function" and n.target is region]
    if not calls:
        return exported
    for call in calls:
        enabled, body, *args = call.args
        with graph.inserting_before(call):
            results = _inline(graph, _module_of(graph_module, body), list(args),
                              bool(enabled), region)
        _replace_results(graph, call, results)
        if body.op == "get_attr" and not body.users:
            graph.erase_node(body)
            if hasattr(graph_module, body.target):
                delattr(graph_module, body.target)
    graph.lint()
    graph_module.recompile()
    return exported


def _region_op():
    """torch's region op; None on a torch without it, whose pre-dispatch graphs toggle the
    mode with ``_set_grad_enabled`` calls instead: those have no mapping, so the importer
    refuses them by name rather than dropping the mode."""
    return getattr(torch_module().ops.higher_order, "wrap_with_set_grad_enabled", None)


def _module_of(owner, node):
    """The subgraph module a ``get_attr`` node names (a region's body)."""
    module = owner
    for part in str(node.target).split("."):
        module = getattr(module, part)
    return module


def _inline(graph, body, args: list, enabled: bool, region) -> list:
    """The nodes of ``body`` copied into ``graph`` (at its insertion point) over ``args``;
    returns the values of its outputs. Where grad is disabled, a value an op of ``body``
    computed is detached where it leaves: as an output, or as an argument of a nested
    region that enables grad."""
    torch = torch_module()
    env: dict = {}
    computed: set = set()  # the nodes made here for ops run with grad disabled

    def leaving(value):
        if enabled or value not in computed:
            return value
        detached = graph.call_function(torch.ops.aten.detach.default, (value,))
        detached.meta = {k: v for k, v in value.meta.items()
                         if k in ("val", "tensor_meta", "stack_trace", "nn_module_stack")}
        return detached

    given = iter(args)
    output = None
    for node in body.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(given)
        elif node.op == "output":
            output = node
        elif node.op == "get_attr":
            env[node] = _module_of(body, node)
        elif node.op == "call_function" and node.target is region:
            inner_enabled, inner_body, *inner_args = (
                env[a] if isinstance(a, torch.fx.Node) else a for a in node.args)
            passed = [leaving(a) if inner_enabled else a for a in inner_args]
            env[node] = tuple(_inline(graph, inner_body, passed, bool(inner_enabled), region))
        elif (node.op == "call_function" and node.target is operator.getitem
              and isinstance(env.get(node.args[0]), tuple)):
            env[node] = env[node.args[0]][node.args[1]]
        else:
            env[node] = copied = graph.node_copy(node, lambda n: env[n])
            if not enabled:
                computed.add(copied)
    outs = output.args[0]
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    return [leaving(env[o]) if isinstance(o, torch.fx.Node) else o for o in outs]


def _replace_results(graph, call, results: list) -> None:
    """Each ``getitem(call, i)`` of the region's call replaced by its i-th value; then the
    call goes."""
    for user in list(call.users):
        if user.op == "call_function" and user.target is operator.getitem:
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
    if call.users:  # the tuple itself used: not a form torch.export writes
        raise UnsupportedOpError(
            f"from_torch: the results of the grad-mode region '{call.name}' (torch.no_grad() "
            "or set_grad_enabled in the forward) are used as one tuple, which the importer "
            "does not follow; return tensors from inside the region one by one",
            [("wrap_with_set_grad_enabled", call.name)])
    graph.erase_node(call)
