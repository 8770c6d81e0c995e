"""PyTorch import: ``tg.from_torch(module, example_args)``.

``torch.export`` gives an ATen graph; each node maps through the one table ``ATEN`` (an op
overload or its packet -> ``fn(args, kwargs) -> value``) to our builders. Composites torch
keeps whole (linear, layer_norm, gelu, softmax, scaled_dot_product_attention, ...) stay whole
so the planner can pick fused kernels; nothing here knows any model.

Table functions receive ``args`` (the positional arguments, fx nodes replaced by their
values) and ``kwargs``: every argument of the overload's schema by name, defaults filled
in. Python operators on sizes (``operator.mul`` on ``sym_size`` results) receive only
``args``.
"""

from __future__ import annotations

import inspect
import operator
from collections.abc import Callable, Mapping, Sequence

import numpy as np

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, DTypeError, ShapeError, TensorGraphsError


class UnsupportedOpError(TensorGraphsError):
    """A torch program uses ATen ops with no mapping; ``ops`` lists (op, location) pairs."""

    def __init__(self, message: str, ops: Sequence[tuple[str, str]] = ()):
        super().__init__(message)
        self.ops = list(ops)


# ---------------------------------------------------------------------------- helpers
def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - torch is an optional dependency
        raise ArgumentError("tg.from_torch needs PyTorch: pip install torch") from e
    return torch


def _dtype_name(dtype) -> str:
    name = str(dtype).removeprefix("torch.")
    return {"bool": "bool", "float": "float32", "double": "float64", "half": "float16",
            "long": "int64", "int": "int32"}.get(name, name)


def _same(x):
    return x


def _axes(dim):
    """torch's dim argument (int, list, None or []) as our axis argument."""
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return None
    return tuple(dim) if isinstance(dim, (list, tuple)) else dim


def _cast(x, dtype):
    return x if dtype is None else tg.cast(x, _dtype_name(dtype))


def _scaled(x, factor):
    return x if factor == 1 else x * factor


def _end(value):
    """A slice end of torch's 'to the end' sentinel (sys.maxsize) is None."""
    return None if isinstance(value, int) and value >= 2 ** 62 else value


def _slice(x, dim, start, end, step):
    start = None if start == 0 else start
    return tg.slice_axis(x, dim, start, _end(end), step)


def _select(x, dim, index):
    stop = None if index == -1 else index + 1
    return tg.squeeze(tg.slice_axis(x, dim, index, stop), dim)


def _split(x, sizes, dim):
    out, start = [], 0
    for size in sizes:
        out.append(tg.slice_axis(x, dim, start, start + size))
        start = start + size
    return out


def _split_size(x, size, dim):
    n = x.shape[dim if dim >= 0 else x.ndim + dim]
    if not isinstance(n, int):
        raise ShapeError(f"split: axis {dim} of {x.shape} is symbolic; split by explicit sizes")
    return _split(x, [min(size, n - s) for s in range(0, n, size)], dim)


def _chunk(x, chunks, dim):
    n = x.shape[dim if dim >= 0 else x.ndim + dim]
    return _split_size(x, -(-n // chunks), dim)


def _unbind(x, dim):
    n = x.shape[dim if dim >= 0 else x.ndim + dim]
    return [_select(x, dim, i) for i in range(n)]


def _norm_shape(x, normalized_shape, params, fn):
    """torch's norms over the trailing ``normalized_shape`` dims; ours over the last axis:
    more than one trailing dim is flattened into one and back."""
    k = len(normalized_shape)
    if k == 0 or tuple(x.shape[x.ndim - k:]) != tuple(normalized_shape):
        raise ShapeError(f"normalized_shape {tuple(normalized_shape)} is not the trailing "
                         f"dims of the input {x.shape}")
    if k == 1:
        return fn(x, *params)
    flat = tg.reshape(x, tuple(x.shape[:x.ndim - k]) + (-1,))
    y = fn(flat, *(None if p is None else tg.reshape(p, (-1,)) for p in params))
    return tg.reshape(y, x.shape)


def _layer_norm(a, kw):
    return _norm_shape(kw["input"], kw["normalized_shape"], (kw["weight"], kw["bias"]),
                       lambda x, w, b: tg.layer_norm(x, w, b, eps=kw["eps"]))


def _rms_norm(a, kw):
    x, eps = kw["input"], kw["eps"]
    if eps is None:  # torch's default: the dtype's machine epsilon
        eps = float(np.finfo(x.dtype.np_dtype).eps)
    return _norm_shape(x, kw["normalized_shape"], (kw["weight"],),
                       lambda x, w: tg.rms_norm(x, w, eps=eps))


def _sdpa(a, kw):
    if kw["dropout_p"]:
        raise ArgumentError("scaled_dot_product_attention: dropout_p must be 0 (inference)")
    return tg.scaled_dot_product_attention(kw["query"], kw["key"], kw["value"], kw["attn_mask"],
                                           is_causal=kw["is_causal"], scale=kw["scale"])


def _dropout(a, kw):
    if kw["train"] and kw["p"]:
        raise ArgumentError("dropout in training mode: call module.eval() before from_torch")
    return kw["input"]


def _div(a, kw):
    mode = kw.get("rounding_mode")
    if mode is not None:
        raise ArgumentError(f"div: rounding_mode={mode!r} is not supported yet")
    return tg.div(kw["self"], kw["other"])


def _addmm(a, kw):
    product = _scaled(tg.matmul(kw["mat1" if "mat1" in kw else "batch1"],
                                kw["mat2" if "mat2" in kw else "batch2"]), kw["alpha"])
    return _scaled(kw["self"], kw["beta"]) + product


def _where(cond, a, b):
    return tg.where(cond, a, b)


def _conv2d(a, kw):
    if isinstance(kw["padding"], str):
        raise ArgumentError(f"conv2d: padding={kw['padding']!r} is not supported yet")
    return tg.conv2d(kw["input"], kw["weight"], kw["bias"], stride=tuple(kw["stride"]),
                     padding=tuple(kw["padding"]), dilation=tuple(kw["dilation"]),
                     groups=kw["groups"])


def _unary(fn):
    return lambda a, kw: fn(kw["self"])


def _binary(fn):
    return lambda a, kw: fn(kw["self"], kw["other"])


def _build_table() -> dict:
    aten = _torch().ops.aten
    table: dict = {
        # linear algebra
        aten.linear: lambda a, kw: tg.linear(kw["input"], kw["weight"], kw["bias"]),
        aten.matmul: _binary(tg.matmul),
        aten.mm: lambda a, kw: tg.matmul(kw["self"], kw["mat2"]),
        aten.bmm: lambda a, kw: tg.matmul(kw["self"], kw["mat2"]),
        aten.addmm: _addmm,
        aten.baddbmm: _addmm,
        # arithmetic
        aten.add: lambda a, kw: kw["self"] + _scaled(kw["other"], kw["alpha"]),
        aten.sub: lambda a, kw: kw["self"] - _scaled(kw["other"], kw["alpha"]),
        aten.rsub: lambda a, kw: tg.sub(kw["other"], _scaled(kw["self"], kw["alpha"])),
        aten.mul: _binary(tg.mul),
        aten.div: _div,
        aten.pow: lambda a, kw: tg.pow(kw["self"], kw["exponent"]),
        aten.neg: _unary(tg.neg),
        aten.maximum: _binary(tg.maximum),
        aten.minimum: _binary(tg.minimum),
        aten.clamp: lambda a, kw: tg.clamp(kw["self"], min=kw["min"], max=kw["max"]),
        aten.clamp_min: lambda a, kw: tg.clamp(kw["self"], min=kw["min"]),
        aten.clamp_max: lambda a, kw: tg.clamp(kw["self"], max=kw["max"]),
        # elementwise functions
        aten.exp: _unary(tg.exp),
        aten.log: _unary(tg.log),
        aten.sqrt: _unary(tg.sqrt),
        aten.rsqrt: _unary(tg.rsqrt),
        aten.reciprocal: _unary(tg.reciprocal),
        aten.abs: _unary(tg.abs),
        aten.sin: _unary(tg.sin),
        aten.cos: _unary(tg.cos),
        aten.erf: _unary(tg.erf),
        aten.square: _unary(tg.square),
        aten.tanh: _unary(tg.tanh),
        aten.sigmoid: _unary(tg.sigmoid),
        aten.relu: _unary(tg.relu),
        aten.silu: _unary(tg.silu),
        aten.gelu: lambda a, kw: tg.gelu(kw["self"], approximate=kw["approximate"]),
        # comparisons and selection
        aten.eq: _binary(tg.equal),
        aten.ne: _binary(tg.not_equal),
        aten.lt: _binary(tg.less),
        aten.le: _binary(tg.less_equal),
        aten.gt: _binary(tg.greater),
        aten.ge: _binary(tg.greater_equal),
        aten.logical_not: _unary(tg.logical_not),
        aten.where: lambda a, kw: _where(kw["condition"], kw["self"], kw["other"]),
        aten.masked_fill: lambda a, kw: _where(kw["mask"], kw["value"], kw["self"]),
        aten.tril: lambda a, kw: tg.tril(kw["self"], diagonal=kw["diagonal"]),
        aten.triu: lambda a, kw: tg.triu(kw["self"], diagonal=kw["diagonal"]),
        # reductions and the softmax family
        aten.sum: lambda a, kw: _cast(tg.sum(kw["self"], axis=_axes(kw.get("dim")),
                                             keepdims=kw.get("keepdim", False)), kw["dtype"]),
        aten.mean: lambda a, kw: tg.mean(_cast(kw["self"], kw["dtype"]),
                                         axis=_axes(kw.get("dim")),
                                         keepdims=kw.get("keepdim", False)),
        aten.amax: lambda a, kw: tg.max(kw["self"], axis=_axes(kw["dim"]),
                                        keepdims=kw["keepdim"]),
        aten.amin: lambda a, kw: tg.min(kw["self"], axis=_axes(kw["dim"]),
                                        keepdims=kw["keepdim"]),
        aten.var.correction: lambda a, kw: tg.var(
            kw["self"], axis=_axes(kw["dim"]), keepdims=kw["keepdim"],
            correction=1 if kw["correction"] is None else kw["correction"]),
        aten.cumsum: lambda a, kw: tg.cumsum(_cast(kw["self"], kw["dtype"]), axis=kw["dim"]),
        aten.softmax.int: lambda a, kw: tg.softmax(_cast(kw["self"], kw["dtype"]),
                                                   axis=kw["dim"]),
        aten._softmax: lambda a, kw: tg.softmax(kw["self"], axis=kw["dim"]),
        aten.log_softmax.int: lambda a, kw: tg.log_softmax(_cast(kw["self"], kw["dtype"]),
                                                           axis=kw["dim"]),
        aten._log_softmax: lambda a, kw: tg.log_softmax(kw["self"], axis=kw["dim"]),
        # neural-network layers
        aten.layer_norm: _layer_norm,
        aten.rms_norm: _rms_norm,
        aten.embedding: lambda a, kw: tg.embedding(kw["indices"], kw["weight"]),
        aten.scaled_dot_product_attention: _sdpa,
        aten.dropout: _dropout,
        aten.conv2d.default: _conv2d,
        aten.group_norm: lambda a, kw: tg.group_norm(kw["input"], kw["weight"], kw["bias"],
                                                     num_groups=kw["num_groups"],
                                                     eps=kw["eps"]),
        # shapes and views
        aten.view.default: lambda a, kw: tg.reshape(kw["self"], tuple(kw["size"])),
        aten._unsafe_view: lambda a, kw: tg.reshape(kw["self"], tuple(kw["size"])),
        aten.reshape: lambda a, kw: tg.reshape(kw["self"], tuple(kw["shape"])),
        aten.flatten.using_ints: lambda a, kw: tg.flatten(kw["self"], kw["start_dim"],
                                                          kw["end_dim"]),
        aten.permute: lambda a, kw: tg.permute(kw["self"], tuple(kw["dims"])),
        aten.transpose.int: lambda a, kw: tg.transpose(kw["self"], kw["dim0"], kw["dim1"]),
        aten.t: lambda a, kw: tg.permute(kw["self"], tuple(range(kw["self"].ndim))[::-1]),
        aten.expand: lambda a, kw: tg.expand(kw["self"], tuple(kw["size"])),
        aten.unsqueeze: lambda a, kw: tg.unsqueeze(kw["self"], kw["dim"]),
        aten.squeeze.default: lambda a, kw: tg.squeeze(kw["self"]),
        aten.squeeze.dim: lambda a, kw: _squeeze(kw["self"], [kw["dim"]]),
        aten.squeeze.dims: lambda a, kw: _squeeze(kw["self"], kw["dim"]),
        aten.slice.Tensor: lambda a, kw: _slice(kw["self"], kw["dim"], kw["start"], kw["end"],
                                                kw["step"]),
        aten.select.int: lambda a, kw: _select(kw["self"], kw["dim"], kw["index"]),
        aten.cat: lambda a, kw: tg.concat(list(kw["tensors"]), axis=kw["dim"]),
        aten.split.Tensor: lambda a, kw: _split_size(kw["self"], kw["split_size"], kw["dim"]),
        aten.split_with_sizes: lambda a, kw: _split(kw["self"], kw["split_sizes"], kw["dim"]),
        aten.chunk: lambda a, kw: _chunk(kw["self"], kw["chunks"], kw["dim"]),
        aten.unbind.int: lambda a, kw: _unbind(kw["self"], kw["dim"]),
        # identities and casts
        aten.contiguous: _unary(_same),
        aten.clone: _unary(_same),
        aten.alias: _unary(_same),
        aten.detach: _unary(_same),
        aten.lift_fresh_copy: _unary(_same),
        aten._assert_tensor_metadata: lambda a, kw: None,
        aten._to_copy: lambda a, kw: _cast(kw["self"], kw["dtype"]),
        aten.to.dtype: lambda a, kw: _cast(kw["self"], kw["dtype"]),
        aten.type_as: lambda a, kw: tg.cast(kw["self"], kw["other"].dtype),
        # sizes
        aten.sym_size.int: lambda a, kw: kw["self"].shape[kw["dim"]],
        operator.getitem: lambda a, kw: a[0][a[1]],
        operator.add: lambda a, kw: a[0] + a[1],
        operator.sub: lambda a, kw: a[0] - a[1],
        operator.mul: lambda a, kw: a[0] * a[1],
        operator.floordiv: lambda a, kw: a[0] // a[1],
        operator.neg: lambda a, kw: -a[0],
    }
    return table


def _squeeze(x, dims):
    keep = [d % x.ndim for d in dims if x.shape[d] == 1] if x.ndim else []
    return tg.squeeze(x, tuple(keep)) if keep else x


ATEN: dict = _build_table()


def _lookup(target) -> Callable | None:
    fn = ATEN.get(target)
    if fn is None and hasattr(target, "overloadpacket"):
        fn = ATEN.get(target.overloadpacket)
    return fn


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


def import_exported(exported, dim_names: Mapping | None = None):
    """An ExportedProgram as our graph: (outputs, user inputs, weights, bounds).

    ``outputs``: the values of the user outputs (Nodes, or Python values) in order;
    ``inputs``: the user inputs' ``tg.input`` leaves (or Python values) in call order;
    ``weights``: state-dict name -> numpy array; ``bounds``: dim name -> largest value.
    """
    torch = _torch()
    from torch.export.graph_signature import InputKind, OutputKind

    sig = exported.graph_signature
    kinds = {spec.arg.name: spec for spec in sig.input_specs}
    placeholders = [n for n in exported.graph.nodes if n.op == "placeholder"]

    unsupported: dict[str, list[str]] = {}
    for node in exported.graph.nodes:
        if node.op == "call_function" and _lookup(node.target) is None:
            unsupported.setdefault(_op_name(node.target), []).append(_location(node))
    if unsupported:
        lines = [f"  {op} at {loc}" for op, locs in unsupported.items() for loc in locs]
        raise UnsupportedOpError(
            f"{len(unsupported)} ATen op(s) have no mapping to tensor_graphs ops:\n"
            + "\n".join(lines) + "\nAdd them to tensor_graphs.frontend.torch_export.ATEN.",
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
            array = state[spec.target].detach().cpu().numpy().copy()
            weights[spec.target] = array
            env[node] = tg.weight(spec.target, array.shape, _dtype_name(val.dtype))
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
        env[node] = tg.input(node.name, tuple(shape), _dtype_name(val.dtype))
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
            env[node] = _lookup(node.target)(args, _schema_kwargs(node.target, args, kwargs))
        except TensorGraphsError as e:
            e.add_note(f"while importing {_op_name(node.target)} at {_location(node)}")
            raise

    out_node = next(n for n in exported.graph.nodes if n.op == "output")
    outputs = []
    for spec, arg in zip(sig.output_specs, out_node.args[0]):
        if spec.kind != OutputKind.USER_OUTPUT:
            raise UnsupportedOpError(f"output of kind {spec.kind.name} (a buffer mutation?) is "
                                     "not supported", [(spec.kind.name, str(arg))])
        outputs.append(value(arg))
    return outputs, inputs, weights, bounds


class TorchProgram:
    """A compiled torch module: call it like the module (torch tensors or numpy arrays in,
    numpy out, in the module's output structure). ``.program`` is the CompiledGraph."""

    def __init__(self, program, inputs, outputs, out_spec, names):
        self.program = program
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
        torch = _torch()
        import torch.utils._pytree as pytree

        flat, _ = pytree.tree_flatten(args)
        if len(flat) != len(self._inputs):
            raise ArgumentError(f"expected {len(self._inputs)} argument(s) "
                                f"({', '.join(map(self._arg_name, range(len(self._inputs))))})"
                                f", got {len(flat)}")
        feeds = {}
        for i, (leaf, arg) in enumerate(zip(self._inputs, flat)):
            if not isinstance(leaf, tg.Node):
                if arg != leaf:
                    raise ArgumentError(f"argument {self._arg_name(i)} was {leaf!r} when the "
                                        f"module was exported; got {arg!r}")
                continue
            if isinstance(arg, torch.Tensor):
                arg = arg.detach().cpu().numpy()
            arg = np.asarray(arg)
            if arg.ndim != leaf.ndim or any(isinstance(d, int) and d != s
                                            for d, s in zip(leaf.shape, arg.shape)):
                raise ShapeError(f"argument {self._arg_name(i)} has shape {arg.shape}; the "
                                 f"exported module takes {tuple(map(str, leaf.shape))}")
            if arg.dtype != leaf.dtype.np_dtype:
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
    ``max`` when given, else by the example's size (``bounds=`` overrides).

    Raises UnsupportedOpError listing every ATen op without a mapping, with its source line.
    """
    torch = _torch()
    if not isinstance(example_args, tuple):
        example_args = (example_args,) if isinstance(example_args, torch.Tensor) \
            else tuple(example_args)
    if hasattr(module, "eval"):
        module.eval()
    with torch.no_grad():
        exported = torch.export.export(module, example_args, dynamic_shapes=dynamic_shapes)
    user = [s for s in exported.graph_signature.input_specs if s.kind.name == "USER_INPUT"]
    names = _dim_names(module, example_args, dynamic_shapes, user)
    outputs, inputs, weights, found = import_exported(exported, names)
    found.update(bounds or {})

    nodes = [o for o in outputs if isinstance(o, tg.Node)]
    positions, k = [], 0
    for o in outputs:
        positions.append(k if isinstance(o, tg.Node) else o)
        k += isinstance(o, tg.Node)
    program = None
    if nodes:
        used = {str(s) for n in tg.nodes(nodes) for d in n.shape
                for s in getattr(d, "free_symbols", ())}
        options = dict(compile_options)
        if tolerance is not None:
            options["tolerance"] = tolerance
        program = tg.compile(nodes, device=device,
                             bounds={k: v for k, v in found.items() if k in used} or None,
                             **options)
        present = {leaf.name for leaf in tg.nodes(nodes) if leaf.op.name == "weight"}
        program.bind(**{n: w for n, w in weights.items() if n in present})
    try:
        params = list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):
        params = []
    return TorchProgram(program, inputs, positions, exported.call_spec.out_spec, params)
