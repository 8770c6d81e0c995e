"""PyTorch import: ``tg.from_torch(module, example_args)``.

``torch.export`` gives an ATen graph; each node maps through the one table
``tensor_graphs.frontend.aten.ATEN`` to our builders. Composites torch keeps whole (linear,
layer_norm, gelu, softmax, scaled_dot_product_attention, ...) stay whole so the planner can
pick fused kernels; nothing here knows any model.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping

import numpy as np

from tensor_graphs import compiler
from tensor_graphs.devices import as_device, torch_device
from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError, TensorGraphsError
from tensor_graphs.frontend.aten import lookup, mutates
from tensor_graphs.frontend.aten.common import (
    Unavailable,
    UnsupportedOpError,
    dtype_name,
    torch_module,
)
from tensor_graphs.ir import api as tg
from tensor_graphs.ir import graph as ir_graph
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import WEIGHT

# torch.export's refusal of a forward that returns a non-tensor object (a transformers
# DynamicCache inside the model output): "Found <class '...'> in output, which is not a known type"
_UNKNOWN_OUTPUT = re.compile(r"Found <class '([\w.]+)'> in output, which is not a known type")


# ---------------------------------------------------------------------------- fx nodes
def _schema_kwargs(target, args, kwargs) -> dict:
    schema = getattr(target, "_schema", None)
    if schema is None:
        return dict(kwargs)
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            out[arg.name] = args[i]
        elif arg.name in kwargs:
            out[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


def _location(node) -> str:
    trace = node.meta.get("stack_trace")
    if trace:
        lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
        frames = [ln for ln in lines if ln.startswith("File ")]
        if frames:
            code = lines[lines.index(frames[-1]) + 1] if lines.index(frames[-1]) + 1 < len(
                lines) else ""
            return f"{frames[-1]}: {code}".rstrip(": ")
    stack = node.meta.get("nn_module_stack")
    if stack:
        path, cls = list(stack.values())[-1]
        name = getattr(cls, "__name__", str(cls))
        return f"module '{path}' ({name})"
    return f"graph node '{node.name}'"


def _op_name(target) -> str:
    name = getattr(target, "_name", None) or getattr(target, "__name__", str(target))
    return str(name)


# ---------------------------------------------------------------------------- import
def _dim_names(module, example_args, dynamic_shapes, user_inputs) -> dict[tuple[int, int], str]:
    """(user input position, axis) -> the name of its torch.export.Dim, where one is given."""
    if dynamic_shapes is None:
        return {}
    specs: list = []
    if isinstance(dynamic_shapes, Mapping):
        try:
            bound = inspect.signature(module.forward).bind(*example_args)
            names = list(bound.arguments)
        except (TypeError, ValueError):
            names = []
        specs = [dynamic_shapes.get(n) for n in names]
    else:
        specs = list(dynamic_shapes)
    out = {}
    for pos, spec in enumerate(specs[:len(user_inputs)]):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for axis, dim in items:
            name = getattr(dim, "__name__", None)
            if isinstance(name, str) and name.isidentifier():
                out[(pos, axis)] = name
    return out


def import_exported(exported, dim_names: Mapping | None = None, tensors: bool = False):
    """An ExportedProgram as our graph: (outputs, user inputs, weights, bounds).

    ``outputs``: the values of the user outputs (Nodes, or Python values) in order;
    ``inputs``: the user inputs' ``tg.input`` leaves (or Python values) in call order;
    ``weights``: state-dict name -> numpy array (with ``tensors``: the detached torch tensor,
    left where it is, for a program that keeps its weights on a GPU); ``bounds``: dim name ->
    largest value.
    """
    torch = torch_module()
    from torch.export.graph_signature import InputKind, OutputKind

    sig = exported.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]

    unsupported: dict[str, list[str]] = {}
    for node in exported.graph.nodes:
        if node.op == "call_function" and lookup(node.target) is None:
            unsupported.setdefault(_op_name(node.target), []).append(_location(node))
    if unsupported:
        lines = [f"  {op} at {loc}" for op, locs in unsupported.items() for loc in locs]
        raise UnsupportedOpError(
            f"{len(unsupported)} ATen op(s) have no mapping to tensor_graphs ops:\n"
            + "\n".join(lines)
            + "\nMap them in tensor_graphs.frontend.aten (one table module per domain).",
            [(op, loc) for op, locs in unsupported.items() for loc in locs])

    dim_names = dict(dim_names or {})
    env: dict = {}
    symbols: dict[str, str] = {}  # torch symbol -> our dim name
    bounds: dict[str, int] = {}
    weights: dict[str, np.ndarray] = {}
    inputs: list = []
    state = {**exported.state_dict, **exported.constants}

    for node in placeholders:
        spec = kinds[node.name]
        val = node.meta.get("val")
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            found = state[spec.target].detach()
            weights[spec.target] = found if tensors else found.cpu().numpy().copy()
            env[node] = tg.weight(spec.target, tuple(found.shape), dtype_name(val.dtype))
            continue
        if spec.kind != InputKind.USER_INPUT:
            raise UnsupportedOpError(f"input '{node.name}' of kind {spec.kind.name} is not "
                                     "supported", [(spec.kind.name, node.name)])
        if not isinstance(val, torch.Tensor):
            env[node] = val
            inputs.append(val)
            continue
        shape = []
        for axis, size in enumerate(val.shape):
            if isinstance(size, int):
                shape.append(size)
                continue
            expr = size.node.expr
            key = str(expr)
            if not expr.is_Symbol:
                raise ShapeError(f"input '{node.name}' axis {axis} has the size expression "
                                 f"{key}; only plain symbolic dims are supported")
            if key not in symbols:
                name = dim_names.get((len(inputs), axis)) or f"{node.name}_dim{axis}"
                symbols[key] = name
                hint = size.node.hint
                upper = exported.range_constraints.get(expr)
                top = getattr(upper, "upper", None) if upper is not None else None
                try:
                    top = int(top)
                except (TypeError, ValueError, OverflowError):
                    top = None
                bounds[name] = top if top is not None and top < 2 ** 31 else int(hint)
            shape.append(symbols[key])
        env[node] = tg.input(node.name, tuple(shape), dtype_name(val.dtype))
        inputs.append(env[node])

    def value(a):
        if isinstance(a, torch.fx.Node):
            return env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        if isinstance(a, torch.dtype):
            return a
        return a

    for node in exported.graph.nodes:
        if node.op != "call_function":
            continue
        args = value(tuple(node.args))
        kwargs = {k: value(v) for k, v in node.kwargs.items()}
        try:
            env[node] = lookup(node.target)(args, _schema_kwargs(node.target, args, kwargs))
        except TensorGraphsError as e:
            e.add_note(f"while importing {_op_name(node.target)} at {_location(node)}")
            raise
        if mutates(node.target) and isinstance(node.args[0], torch.fx.Node):
            env[node.args[0]] = env[node]  # later reads of the mutated tensor see the result

    out_node = next(n for n in exported.graph.nodes if n.op == "output")
    outputs = []
    for spec, arg in zip(sig.output_specs, out_node.args[0]):
        if spec.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedOpError(f"output of kind {spec.kind.name} (a buffer mutation?) is "
                                     "not supported", [(spec.kind.name, str(arg))])
        out = value(arg)
        if isinstance(out, Unavailable):
            raise UnsupportedOpError(f"output {len(outputs)} of the module: {out.message}",
                                     [("output", str(arg))])
        outputs.append(out)
    return outputs, inputs, weights, bounds


class TorchProgram:
    """A compiled torch module: call it like the module (torch tensors or numpy arrays in,
    numpy out, in the module's output structure; compiled with ``outputs="device"`` on a GPU,
    tensors there). ``.program`` is the CompiledGraph. On a GPU, tensor arguments are fed as
    they are (one already on the GPU is not copied)."""

    def __init__(self, program, inputs, outputs, out_spec, names, on_gpu: bool = False):
        self.program = program
        self._on_gpu = on_gpu
        self._inputs = inputs  # Node leaves (or Python values export specialised)
        self._outputs = outputs  # per user output: index into program outputs, or a value
        self._out_spec = out_spec
        self._names = names  # the forward's parameter names, for messages

    def explain(self, limit: int | None = None) -> str:
        return self.program.explain(limit) if self.program is not None else "(no tensors)"

    @property
    def plan(self):
        return self.program.plan

    def _arg_name(self, i: int) -> str:
        return f"'{self._names[i]}'" if i < len(self._names) else f"#{i}"

    def __call__(self, *args):
        torch = torch_module()
        import torch.utils._pytree as pytree

        flat, _ = pytree.tree_flatten(args)
        if len(flat) != len(self._inputs):
            raise ArgumentError(f"expected {len(self._inputs)} argument(s) "
                                f"({', '.join(map(self._arg_name, range(len(self._inputs))))})"
                                f", got {len(flat)}")
        feeds = {}
        for i, (leaf, arg) in enumerate(zip(self._inputs, flat)):
            if not isinstance(leaf, Node):
                if arg != leaf:
                    raise ArgumentError(f"argument {self._arg_name(i)} was {leaf!r} when the "
                                        f"module was exported; got {arg!r}")
                continue
            if isinstance(arg, torch.Tensor):
                arg = arg.detach()
                if not self._on_gpu:
                    arg = arg.cpu().numpy()
            else:
                arg = np.asarray(arg)
            shape = tuple(arg.shape)
            if arg.ndim != leaf.ndim or any(isinstance(d, int) and d != s
                                            for d, s in zip(leaf.shape, shape)):
                raise ShapeError(f"argument {self._arg_name(i)} has shape {shape}; the "
                                 f"exported module takes {tuple(map(str, leaf.shape))}")
            dtype = dtype_name(arg.dtype) if isinstance(arg, torch.Tensor) else arg.dtype
            if dtype != leaf.dtype.np_dtype and dtype != leaf.dtype.name:
                raise DTypeError(f"argument {self._arg_name(i)} has dtype {arg.dtype}; the "
                                 f"exported module takes {leaf.dtype.name} (convert it, e.g. "
                                 f"x.astype('{leaf.dtype.name}'))")
            feeds[leaf.name] = arg
        results = self.program(**feeds) if self.program is not None else []
        outs = [results[o] if isinstance(o, int) else o for o in self._outputs]
        return pytree.tree_unflatten(outs, self._out_spec)


def from_torch(module, example_args, dynamic_shapes=None, *, device="cpu",
               tolerance: float | None = None, bounds: Mapping[str, int] | None = None,
               **compile_options) -> TorchProgram:
    """``torch.export`` ``module`` on ``example_args``, import its ATen graph, compile it and
    bind its parameters and buffers. Dims export marks dynamic (``dynamic_shapes`` with
    ``torch.export.Dim("batch")``) become symbolic dims of that name, bounded by the Dim's
    ``max`` when given, else by the example's size (``bounds=`` overrides). ``device="cuda"``
    plans for the GPU and keeps the parameters there (copied from the module once, with no
    numpy stage); the other options go to ``tg.compile`` (``outputs="device"``...).

    Raises UnsupportedOpError listing every ATen op without a mapping, with its source line.
    """
    torch = torch_module()
    if not isinstance(example_args, tuple):
        example_args = (example_args,) if isinstance(example_args, torch.Tensor) \
            else tuple(example_args)
    if hasattr(module, "eval"):
        module.eval()
    with torch.no_grad():
        try:
            exported = torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes)
        except RuntimeError as exc:
            found = _UNKNOWN_OUTPUT.search(str(exc))
            if found is None:
                raise
            raise ArgumentError(
                f"from_torch: {type(module).__name__}.forward returns a {found.group(1)}, which "
                "torch.export cannot carry out of the graph; return tensors only (e.g. "
                "`return self.lm(input_ids=ids).logits`, or pass use_cache=False so no cache "
                "object is returned)") from exc
    user = [s for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    names = _dim_names(module, example_args, dynamic_shapes, user)
    on_gpu = as_device(device).kind != "cpu"
    outputs, inputs, weights, found = import_exported(exported, names, tensors=on_gpu)
    found.update(bounds or {})

    nodes = [o for o in outputs if isinstance(o, Node)]
    positions, k = [], 0
    for o in outputs:
        positions.append(k if isinstance(o, Node) else o)
        k += isinstance(o, Node)
    program = None
    if nodes:
        used = {str(s) for n in ir_graph.nodes(nodes) for d in n.shape
                for s in getattr(d, "free_symbols", ())}
        options = dict(compile_options)
        if tolerance is not None:
            options["tolerance"] = tolerance
        program = compiler.compile(nodes, device=device,
                                   bounds={k: v for k, v in found.items() if k in used} or None,
                                   **options)
        present = {leaf.name for leaf in ir_graph.nodes(nodes) if leaf.op.name == WEIGHT}
        # the program owns its weights: a parameter already on the GPU is cloned there (the
        # module may change it later), one elsewhere moves through the copy kernel
        program.bind(**{n: _owned(w, program) for n, w in weights.items() if n in present})
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    return TorchProgram(program, inputs, positions, exported.call_spec.out_spec, params,
                        on_gpu)


def _owned(weight, program):
    """A parameter for ``program.bind``: numpy arrays are copies already; a tensor on the
    device the program keeps its weights on is cloned (bind would hold it as is)."""
    if isinstance(weight, np.ndarray):
        return weight
    target = torch_module().device(torch_device(program.device_name("cuda")))
    return weight.clone() if weight.device == target else weight
