"""PyTorch import: ``tg.from_torch(module, example_args)``.

``torch.export`` gives an ATen graph; each node maps through the one table
``tensor_graphs.frontend.aten.ATEN`` to our builders. Composites torch keeps whole (linear,
layer_norm, gelu, softmax, scaled_dot_product_attention, ...) stay whole so the planner can
pick fused kernels; nothing here knows any model.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import sys
from collections.abc import Mapping, Sequence

import numpy as np
import sympy

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
from tensor_graphs.frontend.decompose import decompose_unmapped, unmapped, writes_through_views
from tensor_graphs.ir import api as tg
from tensor_graphs.ir import graph as ir_graph
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import INPUT, WEIGHT
from tensor_graphs.ir.shapes import dim_symbol, format_shape
from tensor_graphs.kernels.torch.convert import to_host

# torch.export's refusal of a forward that returns a non-tensor object (a transformers
# DynamicCache inside the model output): "Found <class '...'> in output, which is not a known type"
_UNKNOWN_OUTPUT = re.compile(r"Found <class '([\w.]+)'> in output, which is not a known type")
# transformers' DynamicCache flattening refusing layers it does not know (Mamba's states)
_UNKNOWN_LAYERS = re.compile(r"pytree flattening function should be applied to (DynamicCache) "
                             r"containing only")


# a stack frame inside torch's own package (the line that made the node in torch.nn)
_TORCH_DIR = f"{os.sep}torch{os.sep}"

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
    """The user's source line of a node (not torch.nn's own, inside nn.EmbeddingBag), else
    torch's line with the module it ran in, else the module, else the node's name."""
    module = None
    stack = node.meta.get("nn_module_stack")
    if stack:
        path, cls = list(stack.values())[-1]
        module = f"module '{path}' ({getattr(cls, '__name__', str(cls))})"
    trace = node.meta.get("stack_trace")
    if trace:
        lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip()]
        frames = [ln for ln in lines if ln.startswith("File ")]
        users = [ln for ln in frames if _TORCH_DIR not in ln]
        if frames:
            frame = (users or frames)[-1]
            at = lines.index(frame) + 1
            where = f"{frame}: {lines[at] if at < len(lines) else ''}".rstrip(": ")
            return where if users or module is None else f"{module} at {where}"
    return module or f"graph node '{node.name}'"


def _reads_storage(node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.name in ("aten::as_strided", "aten::as_strided_copy")


def _op_name(target) -> str:
    name = getattr(target, "_name", None) or getattr(target, "__name__", str(target))
    return str(name)


# ---------------------------------------------------------------------------- import
def _dim_names(module, example_args, dynamic_shapes, user_inputs, example_kwargs=None,
               in_spec=None) -> dict[tuple[int, int], str]:
    """(user input position, axis) -> the name of its torch.export.Dim, where one is given.
    Positions count the flat leaves torch.export made placeholders of, in its own order: the
    positional arguments', then the keyword arguments' in ``in_spec``'s key order (the order
    given), each argument's leaves as pytree flattens it; ``dynamic_shapes`` is matched to the
    arguments as torch matches it (by name, or in the forward's order)."""
    if dynamic_shapes is None:
        return {}
    kwargs = dict(example_kwargs or {})
    keys = list(_children(in_spec)[1].context or ()) if in_spec is not None else list(kwargs)
    slots = [*example_args, *(kwargs[k] for k in keys if k in kwargs)]
    leaves = []
    for value, spec in zip(slots, _slot_specs(module, example_args, kwargs, keys,
                                              dynamic_shapes)):
        leaves.extend(_leaf_specs(value, spec))
    out = {}
    for pos, spec in enumerate(leaves[:len(user_inputs)]):
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec or ())
        for axis, dim in items:
            # a derived dim (``10 * Dim("frames")``) names its root: the symbol it solves for
            name = getattr(getattr(dim, "root", dim), "__name__", None)
            if isinstance(name, str) and name.isidentifier():
                out[(pos, axis)] = name
    return out


def _slot_specs(module, args, kwargs, keys, dynamic_shapes) -> list:
    """The ``dynamic_shapes`` entry of each positional argument, then of each keyword one in
    ``keys``' order. torch matches a mapping by the forward's parameter names and a sequence
    to the arguments in the forward's order (not the order the keywords were given in)."""
    signature = _signature(module)
    bound = None
    if signature is not None:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            bound = None
    if bound is None:  # no signature: positions, then keywords as given
        if isinstance(dynamic_shapes, Mapping):
            return [None] * len(args) + [dynamic_shapes.get(k) for k in keys]
        specs = list(dynamic_shapes)
        by_key = dict(zip(kwargs, specs[len(args):]))
        return specs[:len(args)] + [by_key.get(k) for k in keys]
    by_name = dynamic_shapes if isinstance(dynamic_shapes, Mapping) \
        else dict(zip(bound, dynamic_shapes))
    positional, keyword = [], {}
    for name, value in bound.items():
        spec = by_name.get(name)
        kind = signature.parameters[name].kind
        if kind == inspect.Parameter.VAR_POSITIONAL:
            spec = list(spec) if isinstance(spec, (list, tuple)) else [None] * len(value)
            positional.extend(spec)
        elif kind == inspect.Parameter.VAR_KEYWORD:
            keyword.update({k: spec.get(k) if isinstance(spec, Mapping) else None
                            for k in value})
        elif name in kwargs:
            keyword[name] = spec
        else:
            positional.append(spec)
    return positional[:len(args)] + [keyword.get(k) for k in keys]


def _leaf_specs(value, spec) -> list:
    """``spec`` (a dynamic_shapes entry) for each leaf pytree flattens ``value`` into: a
    tensor's is its {axis: Dim}; a list, tuple or dict holds one per item."""
    torch = torch_module()
    import torch.utils._pytree as pytree

    if isinstance(value, torch.Tensor):
        return [spec]
    if isinstance(value, (list, tuple)) and isinstance(spec, (list, tuple)) \
            and len(spec) == len(value):
        return [s for v, sp in zip(value, spec) for s in _leaf_specs(v, sp)]
    if isinstance(value, dict) and isinstance(spec, Mapping):
        return [s for k, v in value.items() for s in _leaf_specs(v, spec.get(k))]
    return [None] * len(pytree.tree_leaves(value))


def _symbol_bound(exported, sym, expr, hint) -> int:
    """The largest value of torch's symbol ``sym``: its range's upper end where export
    bounded it, else the value the example gave it (solved from ``expr`` = the example's
    size, for a derived dim)."""
    upper = exported.range_constraints.get(sym)
    top = getattr(upper, "upper", None) if upper is not None else None
    try:
        top = int(top)
    except (TypeError, ValueError, OverflowError, AttributeError):  # int_oo
        top = None
    if top is not None and top < 2 ** 31:
        return top
    if expr == sym:
        return int(hint)
    solved = [v for v in sympy.solve(sympy.Eq(expr, int(hint)), sym) if v.is_integer]
    return int(solved[0]) if solved else int(hint)


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

    exported = decompose_unmapped(exported)
    _refuse_unmapped(exported)
    _refuse_writes_through_views(exported)
    sig = exported.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]

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
            weights[spec.target] = found if tensors else to_host(found).copy()
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
            free = sorted(expr.free_symbols, key=str)
            if len(free) != 1:
                raise ShapeError(f"input '{node.name}' axis {axis} has the size expression "
                                 f"{expr}; a dim must be one symbol or a derived dim of one "
                                 "(10 * Dim('frames')): give the axis its own Dim")
            (sym,) = free
            key = str(sym)
            if key not in symbols:
                name = dim_names.get((len(inputs), axis)) or f"{node.name}_dim{axis}"
                symbols[key] = name
                bounds[name] = _symbol_bound(exported, sym, expr, size.node.hint)
            shape.append(expr.xreplace({sym: dim_symbol(symbols[key])}))
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
        kwargs = _schema_kwargs(node.target, args, {k: value(v) for k, v in node.kwargs.items()})
        if _reads_storage(node):  # as_strided addresses the storage its input is a view of
            val = node.args[0].meta["val"]
            kwargs["self_layout"] = (tuple(val.stride()), val.storage_offset())
        try:
            env[node] = lookup(node.target)(args, kwargs)
        except TensorGraphsError as e:
            e.add_note(f"while importing {_op_name(node.target)} at {_location(node)}")
            raise
        if mutates(node.target) and isinstance(node.args[0], torch.fx.Node):
            _refuse_state_write(node, kinds.get(node.args[0].name), InputKind)
            env[node.args[0]] = env[node]  # later reads of the mutated tensor see the result

    out_node = next(n for n in exported.graph.nodes if n.op == "output")
    outputs = []
    for spec, arg in zip(sig.output_specs, out_node.args[0]):
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            # the functional form's new value of an input written in place (through a view):
            # a program never writes what it is fed, as an input written directly is not
            continue
        if spec.kind in (OutputKind.BUFFER_MUTATION, OutputKind.PARAMETER_MUTATION):
            # a write to state through a view, made functional: refused as a direct one is
            what = "buffer" if spec.kind == OutputKind.BUFFER_MUTATION else "parameter"
            raise UnsupportedOpError(
                f"the forward writes {what} '{spec.target}' in place (through a view); "
                + _STATE_WRITE_FIX, [(spec.kind.name, spec.target)])
        if spec.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedOpError(f"output of kind {spec.kind.name} (a buffer mutation?) is "
                                     "not supported", [(spec.kind.name, str(arg))])
        out = value(arg)
        if isinstance(out, Unavailable):
            raise UnsupportedOpError(f"output {len(outputs)} of the module: {out.message}",
                                     [("output", str(arg))])
        outputs.append(out)
    return outputs, inputs, weights, bounds


def _refuse_state_write(node, spec, kind) -> None:
    """An in-place write to a buffer or parameter (a call counter, running statistics) would
    be lost between calls of the compiled program: torch.export keeps ``add_`` on a buffer
    without listing it as a mutation, so it is refused here, not dropped."""
    if spec is None or spec.kind not in (kind.BUFFER, kind.PARAMETER):
        return
    what = "buffer" if spec.kind == kind.BUFFER else "parameter"
    op = _op_name(node.target)
    raise UnsupportedOpError(
        f"the forward writes {what} '{spec.target}' in place ({op} at {_location(node)}); "
        + _STATE_WRITE_FIX, [(op, _location(node))])


_STATE_WRITE_FIX = (
    "a compiled program computes from the values bound once, so the write would be lost "
    "between calls. Return the new value instead of writing it (or, in eval mode, leave the "
    "module's training-only updates off)")


def _refuse_writes_through_views(exported) -> None:
    """An in-place write through a view that torch could not make functional would change
    tensors the importer does not see change: refused, naming each write."""
    found = {(_op_name(node.target), _location(node)): None
             for node in writes_through_views(exported)}
    if found:
        raise UnsupportedOpError(
            "from_torch: in-place writes through a view, which torch could not make "
            "functional here:\n" + "\n".join(f"  {op} at {loc}" for op, loc in found)
            + "\nWrite the result out of place (torch.where, slice_scatter, torch.cat) "
            "instead of into a view", list(found))


def _refuse_unmapped(exported) -> None:
    """One UnsupportedOpError for every op left without a mapping after torch's
    decompositions, each (op, source line) once, with what the user can do now."""
    found: dict[tuple[str, str], None] = {}
    for node in unmapped(exported):
        name, source = _op_name(node.target), _source_op(node)
        if source is not None and source != name:  # left over from torch's decomposition
            name = f"{source} (decomposed by torch into {name})"
        found.setdefault((name, _location(node)), None)
    if not found:
        return
    aten = [(op, loc) for op, loc in found if not _is_size_op(op)]
    sizes = [(op, loc) for op, loc in found if _is_size_op(op)]
    parts = []
    if aten:
        parts.append(f"{len({op for op, _ in aten})} torch op(s) have no tensor_graphs "
                     "equivalent, and torch has no decomposition of them into ops that do:\n"
                     + "\n".join(f"  {op} at {loc}" for op, loc in aten))
    if sizes:
        parts.append("arithmetic on symbolic sizes that tensor_graphs cannot follow:\n"
                     + "\n".join(f"  {op} at {loc}" for op, loc in sizes)
                     + "\nexport those dims as concrete sizes (leave them out of "
                     "dynamic_shapes), or compute the size another way")
    raise UnsupportedOpError(
        "from_torch: " + "\n".join(parts)
        + "\nRewrite those lines with torch operations that from_torch maps (the keys of "
        "tensor_graphs.frontend.ATEN), or run that part of the model in torch and import "
        "the rest.",
        list(found))


def _source_op(node) -> str | None:
    """The op the user's program had where torch's decomposition made ``node`` (the
    provenance torch.export records), as ``_op_name`` spells it."""
    sources = node.meta.get("from_node") or ()
    source = sources[0] if sources else None
    while source is not None and getattr(source, "from_node", None):
        source = source.from_node[0]
    target = getattr(source, "target", None)
    if not isinstance(target, str) or not target.startswith("aten."):
        return None
    op, _, overload = target.removeprefix("aten.").rpartition(".")
    return f"aten::{op}" + ("" if overload == "default" else f".{overload}")


def _is_size_op(name: str) -> bool:
    """Python arithmetic on sizes (``operator.mod``, ``sym_float``...): no ATen op."""
    return "::" not in name


class TorchProgram:
    """A compiled torch module: call it like the module (torch tensors or numpy arrays in,
    numpy out, in the module's output structure, where a transformers cache object holds
    torch tensors; compiled with ``outputs="device"`` on a GPU, tensors there). ``.program``
    is the CompiledGraph. On a GPU, tensor arguments are fed as they are (one already on the
    GPU is not copied).

    Arguments bind to the forward's parameters as Python binds them, by position or by name,
    however the example gave them: ``prog(input_ids=ids, attention_mask=m)`` runs a
    program exported on ``(ids, m)``, and ``prog(ids, m)`` one exported on ``(ids,)`` with
    ``kwargs={"attention_mask": m}``. A keyword exported as a constant (``use_cache=False``)
    may be left out: the program computes with that value only."""

    def __init__(self, program, inputs, outputs, out_spec, in_spec=None, signature=None,
                 on_gpu: bool = False, read: frozenset = frozenset(),
                 owner: str = "the module"):
        self.program = program
        self._on_gpu = on_gpu
        self._inputs = inputs  # Node leaves (or Python values export specialised)
        # the leaves the program reads: an argument used for its shape only, or not at all,
        # is checked like the others and then not fed (torch accepts it, so do we)
        self._read = read
        self._outputs = outputs  # per user output: index into program outputs, or a value
        self._out_spec = out_spec
        self._torch_outs = _cache_leaves(out_spec)  # output leaves that go out as torch tensors
        self._owner = owner  # "GPT2LMHeadModel.forward", for messages
        self._signature = signature  # the forward's inspect.Signature, None where unknown
        # the exported arguments ("slots"): the positional ones, then the keyword ones in
        # the order export flattened them; each one's pytree spec and first leaf in inputs
        positional, keyword = _children(in_spec) if in_spec is not None else \
            (None, None)
        if positional is None:  # one positional argument per leaf
            leaf = _leaf_spec()
            self._specs, self._npos, keys = [leaf] * len(inputs), len(inputs), []
        else:
            keys = list(keyword.context or ())
            self._specs = [*_children(positional), *_children(keyword)]
            self._npos = len(self._specs) - len(keys)
        self._starts = np.cumsum([0] + [s.num_leaves for s in self._specs]).tolist()
        params = list(signature.parameters.values()) if signature is not None else []
        by_position = [p for p in params if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                       inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        self._varkw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in params)
        # the forward's parameter at each position a call may give (beyond the exported
        # positional ones, a positional argument fills the keyword slot of its parameter)
        self._positions = [p.name for p in by_position]
        self._slot_names = [self._positions[j] if j < len(self._positions) else None
                            for j in range(self._npos)] + keys
        self._by_name = {name: j for j, name in enumerate(self._slot_names)
                         if name is not None and (j >= self._npos or by_position[j].kind
                                                  == inspect.Parameter.POSITIONAL_OR_KEYWORD)}
        self._parameters = {p.name for p in params
                            if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                          inspect.Parameter.KEYWORD_ONLY)}
        # (float graph, scheme, skip, group size) of a program quantized at bind time: what
        # save_quantized writes from, with the float weights read back from the program then
        # (CompiledGraph.bound_weights: no reference here keeps the module's or a mapping's
        # float copy alive on a GPU build); None otherwise
        self._float = None
        self._least: dict[str, int] = {}  # dim name -> its least size (from_torch sets it)

    def explain(self, limit: int | None = None) -> str:
        return self.program.explain(limit) if self.program is not None else "(no tensors)"

    def _check_least(self, label: str, leaf: Node, shape: tuple) -> None:
        """A size below the least export's range allows (``_least_sizes``): the program holds
        what export traced for the larger sizes (a branch on the size), so it is refused as
        torch's exported program refuses it, not computed wrong."""
        for axis, (dim, size) in enumerate(zip(leaf.shape, shape)):
            least = self._least.get(str(dim), 0) if isinstance(dim, sympy.Symbol) else 0
            if size < least:
                raise ShapeError(
                    f"argument {label} has shape {format_shape(shape)}: axis {axis} ({dim}) is "
                    f"{size}, below the {least} torch.export allows for it (a Dim's min=, or a "
                    "guard export took from the model's code, such as a branch on the size); "
                    f"the program holds what export traced for {dim} >= {least}: export again "
                    f"with a smaller min= (and an example of that size) to run {size}")

    @property
    def plan(self):
        return self.program.plan

    def save_quantized(self, path, *, metadata: Mapping[str, str] | None = None) -> list[str]:
        """Write this program's weights, quantized as it was built (``quantize=``, from the
        module's float parameters), as the safetensors file ``tg.from_torch(module, args,
        weights=path)`` binds prequantized: ``<name>.q``/``<name>.scale`` per quantized
        weight, the others float. Returns the tensor names written."""
        from tensor_graphs.runtime.prequantized import save_quantized

        if self._float is None:
            raise ArgumentError("save_quantized needs a program built with quantize=<scheme> "
                                "from float weights (this one is float, or loaded "
                                "prequantized already)")
        outputs, scheme, skip, group_size = self._float
        # the program binds every float weight (its graph quantizes them at bind time)
        names = {leaf.name for leaf in ir_graph.nodes(outputs) if leaf.op.name == WEIGHT}
        return save_quantized(path, outputs, self.program.bound_weights(names), scheme,
                              skip=skip, group_size=group_size, metadata=metadata)

    def _slot_label(self, j: int) -> str:
        name = self._slot_names[j]
        return f"'{name}'" if name is not None else f"#{j}"

    def _leaf_label(self, j: int, k: int) -> str:
        many = self._specs[j].num_leaves > 1
        return self._slot_label(j) + (f" (leaf {k} of its {self._specs[j].num_leaves})"
                                      if many else "")

    def _takes(self) -> str:
        """The program's arguments as a call spells them: ``input_ids, *, use_cache=False``."""
        parts = [self._slot_label(j).strip("'") for j in range(self._npos)]
        keywords = range(self._npos, len(self._specs))
        if keywords:
            parts.append("*")
            parts += [self._slot_names[j] + (f"={self._exported(j)!r}" if self._constant(j)
                                             else "") for j in keywords]
        return f"({', '.join(parts)})"

    def _constant(self, j: int) -> bool:
        """A slot export specialised whole (``use_cache=False``, None): no tensor in it."""
        return not any(isinstance(v, Node)
                       for v in self._inputs[self._starts[j]:self._starts[j + 1]])

    def _exported(self, j: int):
        import torch.utils._pytree as pytree

        return pytree.tree_unflatten(list(self._inputs[self._starts[j]:self._starts[j + 1]]),
                                     self._specs[j])

    def _bind(self, args: tuple, kwargs: Mapping) -> list:
        """The call's value of each exported argument, bound as Python binds the forward's:
        positions first, then names; ArgumentError for one too many, unknown, given twice
        or missing, naming what the program takes."""
        given: dict[int, object] = {}
        for i, arg in enumerate(args):
            name = self._positions[i] if i < len(self._positions) else None
            j = i if i < self._npos else self._by_name.get(name)
            if j is None:
                if name is not None:
                    raise ArgumentError(self._not_exported(
                        name, f"positional argument #{i} ('{name}')"))
                raise ArgumentError(f"expected {len(self._specs)} argument(s) {self._takes()}"
                                    f", got {len(args)} positional")
            given[j] = arg
        for name, arg in kwargs.items():
            j = self._by_name.get(name)
            if j is None:
                raise ArgumentError(self._not_exported(name, f"keyword argument '{name}'"))
            if j in given:
                raise ArgumentError(f"{self._owner} got multiple values for argument '{name}' "
                                    f"(by position and by name); the program takes "
                                    f"{self._takes()}")
            given[j] = arg
        missing = []
        for j in range(len(self._specs)):
            if j not in given:
                if j >= self._npos and self._constant(j):
                    given[j] = self._exported(j)  # what the program computes with
                else:
                    missing.append(self._slot_label(j))
        if missing:
            raise ArgumentError(f"missing argument(s) {', '.join(missing)}: the program takes "
                                f"{self._takes()}")
        return [given[j] for j in range(len(self._specs))]

    def _not_exported(self, name: str | None, what: str) -> str:
        if name in self._parameters or (self._varkw and name not in self._positions):
            return (f"{what} was not given when {self._owner} was exported, so the "
                    f"program has no input for it: it takes {self._takes()}; to pass it, "
                    f"export with it (tg.from_torch(module, args, kwargs={{'{name}': "
                    "...}))")
        if name in self._positions:
            return f"{what}: '{name}' is positional-only in {self._owner}; give it by position"
        known = "" if self._signature is None else f"{self._owner} has no parameter " \
            f"'{name}'; "
        return f"{what}: {known}the program takes {self._takes()}"

    def __call__(self, *args, **kwargs):
        torch = torch_module()
        import torch.utils._pytree as pytree

        values = self._bind(args, kwargs)
        feeds = {}
        for j, value in enumerate(values):
            flat = pytree.tree_leaves(value)
            want = self._specs[j].num_leaves
            if len(flat) != want:
                raise ArgumentError(f"argument {self._slot_label(j)} holds {len(flat)} "
                                    f"value(s) (tensors, numbers, None); the module was "
                                    f"exported with {want} there")
            leaves = self._inputs[self._starts[j]:self._starts[j + 1]]
            for k, (leaf, arg) in enumerate(zip(leaves, flat)):
                label = self._leaf_label(j, k)
                if not isinstance(leaf, Node):
                    if isinstance(arg, (torch.Tensor, np.ndarray)) or arg != leaf:
                        raise ArgumentError(f"argument {label} was {leaf!r} when the module "
                                            f"was exported; got {_short(arg)}")
                    continue
                tensor = isinstance(arg, torch.Tensor)  # (the user's: a host program reads numpy)
                if tensor:
                    arg = arg.detach()
                    if not self._on_gpu:
                        arg = to_host(arg)
                else:
                    arg = np.asarray(arg)
                shape = tuple(arg.shape)
                if arg.ndim != leaf.ndim or any(isinstance(d, int) and d != s
                                                for d, s in zip(leaf.shape, shape)):
                    raise ShapeError(f"argument {label} has shape {format_shape(shape)}; "
                                     f"the exported module takes {format_shape(leaf.shape)}")
                self._check_least(label, leaf, shape)
                dtype = dtype_name(arg.dtype) if isinstance(arg, torch.Tensor) else arg.dtype
                if dtype != leaf.dtype.np_dtype and dtype != leaf.dtype.name:
                    how = (f"x.to(torch.{leaf.dtype.name})" if tensor
                           else f"x.astype('{leaf.dtype.name}')")
                    raise DTypeError(f"argument {label} has dtype {arg.dtype}; the exported "
                                     f"module takes {leaf.dtype.name} (convert it, e.g. "
                                     f"{how})")
                if leaf.name in self._read:
                    feeds[leaf.name] = arg
        results = self.program(**feeds) if self.program is not None else []
        outs = [results[o] if isinstance(o, int) else o for o in self._outputs]
        for k in self._torch_outs:  # a cache object holds torch tensors (no copy: as_tensor)
            outs[k] = torch.as_tensor(outs[k])
        return pytree.tree_unflatten(outs, self._out_spec)


def from_torch(module, example_args, dynamic_shapes=None, *,
               kwargs: Mapping[str, object] | None = None, device="cpu",
               tolerance: float | None = None, bounds: Mapping[str, int] | None = None,
               quantize: str | None = None, skip: Sequence[str] = (),
               group_size: int | None = None, weights=None, prequantized: bool | None = None,
               **compile_options) -> TorchProgram:
    """``torch.export`` ``module`` on ``example_args`` (and the keyword inputs ``kwargs``,
    as torch.export's: ``kwargs={"attention_mask": m, "use_cache": False}``), import its ATen
    graph, compile it and bind its parameters and buffers. Dims export marks dynamic
    (``dynamic_shapes`` with ``torch.export.Dim("batch")``; a dict names the forward's
    parameters, keyword inputs' too, those it leaves out static) become symbolic dims of that
    name, bounded by the Dim's ``max`` when given, else by the example's size (``bounds=``
    overrides). The program is called like the module, by position or by name (see
    :class:`TorchProgram`). ``device="cuda"``
    plans for the GPU and keeps the parameters there (copied from the module once, with no
    numpy stage); the other options go to ``tg.compile`` (``outputs="device"``...). An
    ``ExportedProgram`` in place of ``module`` is imported as it is (no second export).
    ``quantize`` (a ``tg.quantize`` scheme: "int8-weight", "bf16-weight"...) rewrites the
    imported graph's matmul/linear weights before planning, as ``tg.quantize`` does, those
    whose parameter names match a ``skip`` pattern left float (``group_size``: int4's);
    the module's float parameters are bound and quantized once per binding.

    ``weights``: where the values come from instead of the module (by state-dict name): a
    safetensors checkpoint (a file, a model's folder or a sharded checkpoint's index, as
    ``save_pretrained`` writes them; a tied parameter saved once, under any of its names) or
    a mapping of arrays. A file written by
    :meth:`TorchProgram.save_quantized` / ``tg.save_quantized`` is prequantized (its metadata
    names the scheme; ``prequantized=`` overrides): its ``<name>.q``/``<name>.scale`` are
    bound and no float copy of a quantized weight is read. The module may then live on the
    meta device (``with torch.device("meta"): module = ...``): nothing of its parameters is
    read. Every value is checked before the program binds any.

    Raises ArgumentError for an option neither from_torch nor ``tg.compile`` takes before
    anything is exported, and UnsupportedOpError listing every ATen op without a mapping,
    with its source line.
    """
    torch = torch_module()
    import torch.utils._pytree as pytree

    from tensor_graphs.runtime.prequantized import SCHEME_KEY, file_settings, is_path

    _check_options(module, compile_options)
    if not isinstance(example_args, tuple):
        example_args = (example_args,) if isinstance(example_args, torch.Tensor) \
            else tuple(example_args)
    kwargs = _example_kwargs(module, example_args, kwargs)
    if is_path(weights):  # a model's folder: its file, or its sharded checkpoint's index
        from tensor_graphs.runtime.weights import checkpoint_path

        weights = checkpoint_path(weights)
    if prequantized is None:
        prequantized = is_path(weights) and SCHEME_KEY in (
            _header_metadata(weights) or {})
    if prequantized:
        if weights is None:
            raise ArgumentError("from_torch: prequantized=True needs weights=<the "
                                "prequantized safetensors file or arrays>")
        if is_path(weights):
            quantize, group_size, skip = file_settings(weights, quantize, group_size, skip)
        elif quantize is None:
            raise ArgumentError("from_torch: prequantized weights need quantize=<scheme> "
                                "(the scheme their .q/.scale are in)")
    if _on_meta(module):
        if weights is None:
            raise ArgumentError(f"from_torch: {type(module).__name__}'s parameters are on the "
                                "meta device (no values): pass weights=<safetensors file>")
        # shapes only: export traces the module on meta example arguments too
        example_args, kwargs = pytree.tree_map(
            lambda a: a.to("meta") if isinstance(a, torch.Tensor) else a, (example_args, kwargs))
    if isinstance(module, torch.export.ExportedProgram):
        exported = module  # exported already (by the caller, once for several imports)
    else:
        dynamic_shapes = _all_named(module, example_args, kwargs, dynamic_shapes)
        exported = _export(module, example_args, dynamic_shapes, kwargs)
    user = [s for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    in_spec = exported.call_spec.in_spec
    names = _dim_names(module, example_args, dynamic_shapes, user, kwargs, in_spec)
    on_gpu = as_device(device).kind != "cpu"
    # with weights= the module's tensors are kept as torch tensors (no copy): only the
    # constants the file need not hold are ever read from them
    outputs, inputs, own, found = import_exported(exported, names,
                                                  tensors=on_gpu or weights is not None)
    found.update(bounds or {})

    nodes = [o for o in outputs if isinstance(o, Node)]
    float_nodes = nodes
    if quantize is not None:
        from tensor_graphs.rewrite.quantize import quantize as quantize_graph

        nodes = quantize_graph(nodes, quantize, skip=skip, group_size=group_size,
                               prequantized=prequantized) if nodes else nodes
    elif skip:
        raise ArgumentError(f"from_torch: skip={list(skip)!r} names weights to leave float "
                            "under quantize=, which is not given (quantize='int8-weight'...)")
    positions, k = [], 0
    for o in outputs:
        positions.append(k if isinstance(o, Node) else o)
        k += isinstance(o, Node)
    program, read, saved = None, frozenset(), None
    if nodes:
        used = {str(s) for n in ir_graph.nodes(nodes)
                for d in (*n.shape, *n.attrs.values())  # tg.size(dim) holds it as an attr
                for s in getattr(d, "free_symbols", ())}
        present = {leaf.name: leaf for leaf in ir_graph.nodes(nodes) if leaf.op.name == WEIGHT}
        aliases = _aliases(module, present)
        values = own if weights is None else _given(weights, present, own, exported,
                                                    quantize if prequantized else None,
                                                    on_gpu, aliases)
        nodes += _shape_carriers(nodes, inputs, used)
        options = dict(compile_options)
        if tolerance is not None:
            options["tolerance"] = tolerance
        program = compiler.compile(nodes, device=device,
                                   bounds={k: v for k, v in found.items() if k in used} or None,
                                   **options)
        program.aliases = aliases
        read = frozenset(leaf.name for leaf in ir_graph.nodes(nodes) if leaf.op.name == INPUT)
        # the program owns its weights: a parameter already on the GPU is cloned there (the
        # module may change it later), one elsewhere moves through the copy kernel
        program.bind(**{n: _owned(w, program) for n, w in values.items() if n in present})
        if quantize is not None and not prequantized:  # what save_quantized writes from
            saved = (float_nodes, quantize, tuple(skip), group_size)
    prog = TorchProgram(program, inputs, positions, exported.call_spec.out_spec, in_spec,
                        _signature(module), on_gpu, read, _owner(module))
    prog._float = saved
    prog._least = _least_sizes(exported, inputs)
    return prog


def _least_sizes(exported, inputs: Sequence) -> dict[str, int]:
    """Our dim name -> the least size export's range gives it, where torch's exported
    program checks it: above 2 (a ``Dim``'s ``min=``, or a guard export took from the code,
    such as a branch on the size). 2 is export's assumption that no dynamic dim is 0 or 1,
    which torch does not hold a call to, so neither do we (GPT-2 at one token runs)."""
    kinds = {spec.arg.name: spec.kind.name for spec in exported.graph_signature.input_specs}
    user = [n for n in exported.graph.nodes
            if n.op == "placeholder" and kinds.get(n.name) == "USER_INPUT"]
    least: dict[str, int] = {}
    for node, leaf in zip(user, inputs):
        val = node.meta.get("val")
        if not isinstance(leaf, Node) or not hasattr(val, "shape"):
            continue
        for size, ours in zip(val.shape, leaf.shape):
            expr = getattr(getattr(size, "node", None), "expr", None)
            limits = exported.range_constraints.get(expr) if expr is not None else None
            lower = getattr(limits, "lower", None)
            if isinstance(ours, sympy.Symbol) and lower is not None and int(lower) > 2:
                least[str(ours)] = max(least.get(str(ours), 0), int(lower))
    return least


# from_torch's own options (``tg.compile``'s others are passed on): what an unknown one lists
_OWN_OPTIONS = ("dynamic_shapes", "kwargs", "device", "tolerance", "bounds", "quantize", "skip",
                "group_size", "weights", "prequantized", "train")


def _check_options(module, options: Mapping) -> None:
    """Refuse an option neither from_torch nor ``tg.compile`` takes before the export and
    import run (minutes on a large model). A name of one of the forward's parameters
    (``attention_mask=m``) is an input given in the wrong place: the message says to give it
    in ``kwargs=``; a Trainer's option says ``train=True``."""
    signature = _signature(module)
    hints = dict.fromkeys(("loss_fn", "optimizer", "targets", "max_grad_norm", "accumulate"),
                          "an option of tg.from_torch(..., train=True)")
    for name in options:
        if signature is not None and name in signature.parameters:
            hints[name] = (f"a parameter of {_owner(module)}; give the module's keyword inputs "
                           f"as kwargs={{{name!r}: ...}}")
    compiler.refuse_unknown_options("from_torch", options, _OWN_OPTIONS, hints)


def _example_kwargs(module, example_args: tuple, kwargs) -> dict:
    """``kwargs`` checked against the forward before anything is exported: a dict of
    parameter name -> example value that binds with ``example_args``."""
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping) or not all(isinstance(k, str) for k in kwargs):
        raise ArgumentError(f"from_torch: kwargs={_short(kwargs)}: give the module's keyword "
                            "inputs as a dict of parameter name -> example value, e.g. "
                            "kwargs={'attention_mask': mask, 'use_cache': False}")
    kwargs = dict(kwargs)
    torch = torch_module()
    if kwargs and isinstance(module, torch.export.ExportedProgram):
        raise ArgumentError("from_torch: kwargs= gives example inputs to export with; an "
                            "ExportedProgram was exported already, with its own inputs (give "
                            "kwargs to torch.export.export)")
    signature = _signature(module)
    if signature is not None:
        try:
            signature.bind(*example_args, **kwargs)
        except TypeError as exc:
            raise ArgumentError(f"from_torch: example_args and kwargs do not fit "
                                f"{_owner(module)}{signature}: {exc}") from exc
    return kwargs


def _all_named(module, args: tuple, kwargs: Mapping, dynamic_shapes):
    """A ``dynamic_shapes`` dict with the arguments it leaves out added as static: torch
    wants every argument named, ``use_cache: None`` included."""
    signature = _signature(module)
    if not isinstance(dynamic_shapes, Mapping) or signature is None:
        return dynamic_shapes
    try:
        bound = signature.bind(*args, **kwargs).arguments
    except TypeError:
        return dynamic_shapes
    return {**{name: _static_like(value) for name, value in bound.items()}, **dynamic_shapes}


def _static_like(value):
    """An argument left out of ``dynamic_shapes``, static in its own structure: torch.export
    takes None for a tensor but wants a dict or list argument's entries named (PixArt's
    ``added_cond_kwargs``: "is a dict, but dynamic_shapes[...] is not")."""
    if isinstance(value, Mapping):
        return {k: _static_like(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_static_like(v) for v in value)
    return None


def _signature(module) -> inspect.Signature | None:
    """The forward's signature (without ``self``); None for an ExportedProgram or a forward
    inspect cannot read."""
    try:
        return inspect.signature(module.forward)
    except (TypeError, ValueError, AttributeError):
        return None


def _owner(module) -> str:
    return f"{type(module).__name__}.forward"


def _children(spec) -> list:
    """A pytree spec's children (torch 2.13 deprecates ``children_specs``)."""
    return list(spec.children()) if hasattr(spec, "child") else list(spec.children_specs)


def _leaf_spec():
    import torch.utils._pytree as pytree

    return pytree.tree_flatten(0)[1]


def _short(value) -> str:
    """A value for a message: a tensor or array as its type, shape and dtype."""
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"a {type(value).__name__} of shape {tuple(shape)} {value.dtype}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _header_metadata(path) -> dict | None:
    """The checkpoint's metadata (a prequantized file names its scheme there); None for a
    sharded checkpoint, which ``tg.save_quantized`` never writes."""
    from tensor_graphs.runtime.weights import (
        checkpoint_path,
        is_shard_index,
        read_safetensors_header,
    )

    path = checkpoint_path(path)
    return None if is_shard_index(path) else read_safetensors_header(path).metadata


def _aliases(module, present: Mapping[str, Node]) -> dict[str, str]:
    """The other names of the graph's weights in the module (tied parameters: GPT-2's LM
    head is its token embedding) -> the graph's names, which ``torch.export`` picked."""
    if not isinstance(module, torch_module().nn.Module):  # (an ExportedProgram: deduplicated)
        return {}
    tensors: dict[int, list[str]] = {}
    for name, t in [*module.named_parameters(remove_duplicate=False),
                    *module.named_buffers(remove_duplicate=False)]:
        tensors.setdefault(id(t), []).append(name)
    aliases = {}
    for names in tensors.values():
        ours = [n for n in names if n in present]
        if len(ours) == 1:
            aliases.update((n, ours[0]) for n in names if n != ours[0])
    return aliases


def _on_meta(module) -> bool:
    """A module built under ``torch.device("meta")``: shapes, no values."""
    tensors = [*module.parameters(), *module.buffers()] if hasattr(module, "parameters") \
        else []
    return any(t.is_meta for t in tensors)


def _given(weights, present: Mapping[str, Node], own: Mapping, exported, scheme: str | None,
           on_gpu: bool, aliases: Mapping[str, str]) -> dict:
    """The values of the weights ``present`` in the graph, from ``weights`` (a checkpoint's
    path: a file, a model's folder or a sharded index; or a mapping), all checked before any
    is bound; a weight given under another name of its tensor (``aliases``: tied
    parameters) is taken from there. Tensors the exported program holds as constants (no
    state-dict entry) may come from the module when ``weights`` lacks them."""
    from tensor_graphs.runtime.prequantized import check_prequantized, is_path, read_prequantized
    from tensor_graphs.runtime.weights import aliased, checkpoint_names, read_checkpoint

    constants = {n for n in exported.constants if n in present and n in own
                 and not own[n].is_meta}
    if is_path(weights):
        names = checkpoint_names(weights)
        rename = aliased(None, aliases, names)
        held = {rename(n) for n in names}
        fallback = {n for n in constants if n not in held}
        wanted = {n: leaf for n, leaf in present.items() if n not in fallback}
        if scheme is not None:
            values = read_prequantized(weights, wanted, scheme)
        else:
            values = read_checkpoint(weights, {n: (tuple(lf.shape), lf.dtype)
                                               for n, lf in wanted.items()}, rename=rename)
    else:
        values = {n: to_host(w) for n, w in weights.items() if n in present}
        values.update((aliases[n], to_host(w)) for n, w in weights.items()
                      if aliases.get(n) in present and aliases[n] not in values)
        missing = sorted(n for n in present if n not in values and n not in constants)
        if missing:
            hint = (" (prequantized weights are <name>.q and <name>.scale: "
                    "tg.save_quantized)" if scheme is not None else "")
            raise ArgumentError(f"from_torch: weights= lacks {missing[:5]}"
                                f"{' ...' if len(missing) > 5 else ''}{hint}")
        if scheme is not None:
            check_prequantized(values, scheme, where="from_torch(weights=)", expected=present)
    for n in constants:
        if n not in values:
            values[n] = own[n] if on_gpu else to_host(own[n]).copy()
    return values


def _shape_carriers(nodes, inputs, used) -> list:
    """Extra (empty) outputs that read the inputs used only for their symbolic shape: a dim
    the program needs is bound from the leaves it reads, and an input the graph reads only
    through ``x.shape[0]`` would otherwise be no leaf of it. Each carrier is a 0-element
    slice of its input, nothing copied; TorchProgram never returns it."""
    read = {leaf for leaf in ir_graph.nodes(nodes) if leaf.op.name == INPUT}
    bound = {str(s) for leaf in read for d in leaf.shape for s in getattr(d, "free_symbols", ())}
    carriers = []
    for leaf in inputs:
        if not isinstance(leaf, Node) or leaf in read:
            continue
        carries = {str(s) for d in leaf.shape for s in getattr(d, "free_symbols", ())}
        if carries & used - bound:
            carriers.append(tg.slice_axis(tg.reshape(leaf, (-1,)), 0, 0, 0))
            bound |= carries
    return carriers


@contextlib.contextmanager
def _in_eval(module):
    """``module`` in eval mode (dropout off: the program is for inference), then every
    submodule back in the mode it was in: a model snapshotted mid-training went on training
    with dropout and batch-norm updates silently off."""
    modes = [(m, m.training) for m in module.modules()] if hasattr(module, "modules") else []
    if hasattr(module, "eval"):
        module.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def _cache_pytrees() -> None:
    """Let torch.export carry a transformers ``DynamicCache`` out of a graph (and into one):
    a causal LM called with its defaults (``use_cache=True``) returns one, and export refuses
    an output type it does not know. transformers' own registration is used; it is global and
    idempotent. Where that transformers lacks it, the refusal in ``_export`` names the fix."""
    if "transformers.cache_utils" not in sys.modules:  # no transformers model was built
        return
    try:
        from transformers.cache_utils import EncoderDecoderCache
        from transformers.integrations.executorch import register_dynamic_cache_export_support
    except ImportError:
        return
    register_dynamic_cache_export_support()
    import torch.utils._pytree as pytree

    if EncoderDecoderCache not in pytree.SUPPORTED_NODES:  # an encoder-decoder's (T5, BART)
        pytree.register_pytree_node(
            EncoderDecoderCache, _encoder_decoder_children, _encoder_decoder_cache,
            serialized_type_name="transformers.cache_utils.EncoderDecoderCache",
            flatten_with_keys_fn=_encoder_decoder_keyed)


# an EncoderDecoderCache as a pytree: its two DynamicCaches (self- and cross-attention)
_ENCODER_DECODER = ("self_attention_cache", "cross_attention_cache")


def _encoder_decoder_children(cache) -> tuple[list, None]:
    return [getattr(cache, name) for name in _ENCODER_DECODER], None


def _encoder_decoder_keyed(cache) -> tuple[list, None]:
    import torch.utils._pytree as pytree

    return [(pytree.GetAttrKey(name), getattr(cache, name)) for name in _ENCODER_DECODER], None


def _encoder_decoder_cache(children, _context):
    from transformers.cache_utils import EncoderDecoderCache

    return EncoderDecoderCache(*children)


def _cache_leaves(spec) -> frozenset[int]:
    """The output leaves (positions in the flat list) inside a transformers cache object: it
    is rebuilt from its tensors by transformers' code, which takes torch tensors only."""
    cache_utils = sys.modules.get("transformers.cache_utils")
    cache = getattr(cache_utils, "Cache", None)
    found: set[int] = set()

    def walk(s, start: int, inside: bool) -> None:
        inside = inside or (cache is not None and isinstance(s.type, type)
                            and issubclass(s.type, cache))
        if s.is_leaf():
            if inside:
                found.add(start)
            return
        for child in s.children():
            walk(child, start, inside)
            start += child.num_leaves

    if spec is not None:
        walk(spec, 0, False)
    return frozenset(found)


def _export(module, example_args, dynamic_shapes, kwargs: Mapping | None = None, *,
            grad: bool = False):
    """torch.export of ``module`` in eval mode, under ``torch.no_grad()`` for inference; with
    ``grad`` (an export for training) grad stays enabled, so the forward's own no_grad
    regions are recorded (``frontend/grad_regions``) rather than lost in the export's."""
    torch = torch_module()
    _cache_pytrees()
    with _in_eval(module), (torch.enable_grad() if grad else torch.no_grad()):
        try:
            return torch.export.export(module, example_args, kwargs=kwargs or None,
                                       dynamic_shapes=dynamic_shapes)
        except RuntimeError as exc:
            layers = _UNKNOWN_LAYERS.search(str(exc))
            found = _UNKNOWN_OUTPUT.search(str(exc)) or layers
            if found is None:
                _note_binding(exc, module, example_args)
                raise
            signature = _signature(module)
            if signature is not None and "use_cache" in signature.parameters:
                given = [f"{k!r}: ..., " for k in kwargs or () if k != "use_cache"]
                fix = ("or export without the cache: tg.from_torch(module, args, "
                       f"kwargs={{{''.join(given)}'use_cache': False}})")
            else:
                fix = "or, in a forward that calls a transformers model, pass it use_cache=False"
            raise ArgumentError(
                f"from_torch: {_owner(module)} returns a {found.group(1)}, which torch.export "
                "cannot carry out of the graph"
                f"{' (transformers flattens one of attention layers only)' if layers else ''}"
                "; return tensors only (e.g. `return "
                f"self.lm(input_ids=ids).logits`), {fix}, so no cache object is "
                "returned") from exc
        except Exception as exc:
            _note_binding(exc, module, example_args)
            raise


def _note_binding(exc: BaseException, module, args: tuple) -> None:
    """Say which parameter each positional example went to, when several did: a tensor meant
    for ``attention_mask`` that binds to GPT-2's second parameter (the cache) fails deep in
    the model ("'FakeTensor' object has no attribute 'get_seq_length'")."""
    signature = _signature(module)
    if signature is None or len(args) < 2:
        return
    try:
        bound = signature.bind_partial(*args).arguments
    except TypeError:
        return
    given = ", ".join(f"{name}={_short(value)}" for name, value in bound.items())
    exc.add_note(f"from_torch: example_args bound to {_owner(module)} as {given}; give an "
                 "input meant for another parameter by name: "
                 "tg.from_torch(module, args, kwargs={'attention_mask': mask})")


def _owned(weight, program):
    """A parameter for ``program.bind``: numpy arrays are copies already; a tensor on the
    device the program keeps its weights on is cloned (bind would hold it as is)."""
    if isinstance(weight, np.ndarray):
        return weight
    target = torch_module().device(torch_device(program.device_name("cuda")))
    return weight.clone() if weight.device == target else weight
