"""Dynamo's FX graph as a module ``torch.export`` takes, so the importer of
``tg.from_torch`` maps it unchanged.

Dynamo's graph differs from a module's forward in three ways export cannot follow: parameters
arrive as arguments (they must be the module's own to become weights bound once), symbolic
sizes arrive as integer arguments (export would see sizes it cannot relate to any tensor), and
unspecialized Python numbers arrive as 0-d tensors read with ``.item()`` (data export cannot
trace through). Each is rewritten here on a copy of the graph; Dynamo's own graph is left as
it is (it builds its guards from it after the backend returns).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import sympy

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.frontend.aten.common import torch_module

# the largest size a Dim may take where Dynamo sets none (a finite range for the importer)
LARGEST = 2 ** 31 - 2


class RefusedGraphError(TensorGraphsError):
    """A graph the backend cannot take for a reason no op names (gradients, devices, a size
    no tensor has)."""


class Exportable(NamedTuple):
    module: object  # the torch.fx.GraphModule to export
    user: list[int]  # positions (in Dynamo's arguments) of the user tensors, in export's order
    weights: dict[int, str]  # position -> the module buffer that holds that weight
    scalars: dict[int, float]  # position -> the number a 0-d tensor argument was taken as
    values: list  # the user tensors as Dynamo traced them (fake, of symbolic sizes)


def exportable(gm, example_inputs: list) -> Exportable:
    """A copy of Dynamo's graph that torch.export can take: parameters and buffers as the
    module's own buffers (weights of the exported program, bound once), each symbolic size
    Dynamo passes as an argument read from a tensor's shape instead (so one symbol ties them:
    export never sees a size it cannot relate to a tensor). Dynamo's own graph is left as it
    is (it builds its guards from it after we return).

    A Python number Dynamo keeps unspecialized (a float attribute such as a norm's eps,
    passed as a 0-d tensor and read with ``.item()``) becomes the constant it is now: a
    ``.item()`` is data torch.export cannot trace through; a call with another value runs
    eagerly (``DynamoProgram`` checks)."""
    torch = torch_module()
    graph = torch.fx.Graph()
    graph.output(graph.graph_copy(gm.graph, {}))
    module = torch.fx.GraphModule(gm, graph)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        raise RefusedGraphError(f"Dynamo gave {len(example_inputs)} inputs for a graph of "
                                f"{len(placeholders)} placeholders")
    user, weights, scalars, tensors, sizes = [], {}, {}, {}, []
    for i, (node, value) in enumerate(zip(placeholders, example_inputs)):
        if isinstance(value, torch.Tensor) and _is_weight(node, value):
            name = f"w{i}_{node.target}".replace(".", "_")
            module.register_buffer(name, value.detach())
            with graph.inserting_before(node):
                attr = graph.get_attr(name)
            attr.meta = dict(node.meta)
            node.replace_all_uses_with(attr)
            graph.erase_node(node)
            weights[i] = name
        elif isinstance(value, torch.Tensor) and _specialize_scalar(node, value):
            scalars[i] = value.item()
        elif isinstance(value, torch.Tensor):
            user.append(i)
            tensors[node] = node.meta.get("example_value", value)
        elif isinstance(value, (int, torch.SymInt)) and not isinstance(value, bool):
            sizes.append((node, value))
        else:
            raise RefusedGraphError(f"graph input '{node.target}' is a "
                                    f"{type(value).__name__}; the tensor_graphs backend takes "
                                    "tensors and symbolic sizes")
    for node, value in sizes:
        if not node.users:  # (a stride of a sliced input: Dynamo passes it, nothing reads it)
            graph.erase_node(node)
            continue
        expr = node.meta.get("example_value", value)
        expr = _expr(expr) if isinstance(expr, torch.SymInt) else expr
        source = _size_source(tensors, expr)
        if source is None:
            raise RefusedGraphError(f"graph input '{node.target}' is the symbolic size "
                                    f"{expr}, which is no tensor input's size; the "
                                    "tensor_graphs backend cannot follow it")
        last = [n for n in graph.nodes if n.op == "placeholder" and n in tensors][-1]
        with graph.inserting_after(last):  # where every tensor placeholder is defined
            read = graph.call_function(torch.ops.aten.sym_size.int, source)
        node.replace_all_uses_with(read)
        graph.erase_node(node)
    module.recompile()
    return Exportable(module, user, weights, scalars, list(tensors.values()))


def dynamic_shapes(values: list, duck: bool) -> list[dict]:
    """torch.export's dynamic shapes for the user tensors: one named Dim per Dynamo symbol
    (``duck``: per example size of Dynamo's symbols), so sizes Dynamo tied stay tied."""
    torch = torch_module()
    from torch.fx.experimental.symbolic_shapes import is_concrete_int

    dims: dict = {}
    spec = []
    for value in values:
        axes = {}
        for axis, size in enumerate(value.shape):
            if is_concrete_int(size):
                continue
            expr = _expr(size)
            if not expr.is_Symbol:
                axes[axis] = torch.export.Dim.AUTO
                continue
            key = size.node.hint if duck and size.node.hint is not None else expr
            if key not in dims:
                dims[key] = torch.export.Dim(str(expr), **_range(size))
            axes[axis] = dims[key]
        spec.append(axes)
    return spec


def _specialize_scalar(node, value) -> bool:
    """A number Dynamo passes as a 0-d tensor and reads only with ``.item()``: its reads
    replaced by the number (``node`` is erased)."""
    torch = torch_module()
    grapharg = node.meta.get("grapharg")
    if not getattr(grapharg, "pass_arg_as_tensor", False) or value.ndim != 0:
        return False
    if not all(u.op == "call_method" and u.target == "item" for u in node.users):
        return False
    number = value.item()
    for read in list(node.users):
        def constant(n, read=read):
            return number if n is read else n

        for user in list(read.users):
            user.args = torch.fx.node.map_arg(user.args, constant)
            user.kwargs = torch.fx.node.map_arg(user.kwargs, constant)
        read.graph.erase_node(read)
    node.graph.erase_node(node)
    return True


def _is_weight(node, value) -> bool:
    """A parameter or a module's buffer: Dynamo's source for it passes through the module's
    ``_parameters``/``_buffers`` (unspecialized nn modules) or names the module's attribute."""
    torch = torch_module()
    if isinstance(value, torch.nn.Parameter):
        return True
    source = getattr(node.meta.get("grapharg"), "source", None)
    while source is not None:
        if type(source).__name__ in ("UnspecializedParamBufferSource", "NNModuleSource",
                                     "ParamBufferSource"):
            return True
        source = getattr(source, "base", None)
    return False


def _size_source(tensors: Mapping, expr):
    """(tensor node, axis) whose size is ``expr``, or None."""
    for node, value in tensors.items():
        for axis, size in enumerate(value.shape):
            if not isinstance(size, int) and _expr(size) == expr:
                return (node, axis)
    return None


def _expr(size):
    """A symbolic size as Dynamo knows it now: symbols it found equal while tracing (a key
    and a value cache's lengths) replaced by one, so export sees them as one Dim."""
    env = size.node.shape_env
    return env.replace(size.node.expr) if env is not None else size.node.expr


def _range(size) -> dict:
    """The Dim's min/max from the range Dynamo's shape env keeps for the symbol. The max is
    always finite: the importer reads it as an int (our bounds are set apart, by the
    backend)."""
    env = size.node.shape_env
    found = env.var_to_range.get(_expr(size)) if env is not None else None
    lower, upper = (_finite(found.lower), _finite(found.upper)) if found else (None, None)
    out = {"max": min(upper, LARGEST) if upper is not None else LARGEST}
    if lower is not None:
        out["min"] = max(lower, 0)
    return out


def _finite(value) -> int | None:
    """An int, or None for torch's infinities (``int_oo``, which ``int()`` refuses)."""
    return int(value) if isinstance(value, (int, sympy.Integer)) else None


def dim_names(spec: list) -> dict[tuple[int, int], str]:
    """Our dims take the Dim names (Dynamo's symbols: ``s77``)."""
    return {(pos, axis): dim.__name__ for pos, axes in enumerate(spec)
            for axis, dim in axes.items() if isinstance(getattr(dim, "__name__", None), str)
            and dim.__name__.isidentifier()}


def written_inputs(exported) -> list[str]:
    """Each in-place write (``buf.add_(x)``, ``cache[:, i] = k``, a module's counter
    ``self.n += 1``) whose target is, through views, an input or a weight of the program, as
    "op on 'name'". torch.export's graph keeps them as in-place ops without listing them as
    mutations, and the importer reads an in-place op as its functional form, so a program
    would drop the write the caller sees in eager torch."""
    torch = torch_module()
    placeholders = {n for n in exported.graph.nodes if n.op == "placeholder"}

    def storage_of(node):  # follow ops whose result aliases their first argument (views)
        while node.op == "call_function" and node.args and isinstance(node.args[0],
                                                                      torch.fx.Node):
            schema = getattr(node.target, "_schema", None)
            if schema is None or not schema.returns or schema.returns[0].alias_info is None:
                break
            node = node.args[0]
        return node

    found = []
    for node in exported.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        for i, arg in enumerate(schema.arguments if schema is not None else ()):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
            if isinstance(value, torch.fx.Node) and storage_of(value) in placeholders:
                found.append(f"{schema.name} on '{storage_of(value).name}'")
    return found


def export(module, args: list, spec: list):
    """torch.export outside Dynamo's tracing context: export's own shape guards would
    otherwise join the frame Dynamo is compiling (and fail its guard check)."""
    torch = torch_module()
    with torch._guards.tracing(None), torch.no_grad():
        try:
            return torch.export.export(module, tuple(args), dynamic_shapes=spec or None,
                                       strict=False)
        except torch._dynamo.exc.UserError as exc:
            if "Constraints violated" not in str(exc):
                raise
        return torch.export.export(module, tuple(args), dynamic_shapes=_auto(spec),
                                   strict=False)


def _auto(spec: list) -> list[dict]:
    """``spec`` with every named Dim left to export (``Dim.AUTO``): its constraint solver
    refuses a guard it cannot prove over a Dim's range though it holds there (Llama's
    left-padded decode: ``min(16 + 16*s, 32 + 32*s) == 16 + 16*s`` for a cache length
    ``s >= 0``), where AUTO takes the guard as a fact about the dim."""
    torch = torch_module()
    return [{axis: torch.export.Dim.AUTO for axis in axes} for axes in spec]
