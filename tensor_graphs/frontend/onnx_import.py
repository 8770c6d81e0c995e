"""ONNX import: ``tg.from_onnx(path_or_model, dynamic_dims=...)``.

The model file is read as data (``files.open_regular``; external tensor data only from files
inside the model's own folder), its graph walked once in order: initializers become weights
bound once, graph inputs become ``tg.input`` leaves (symbolic dims named by the model's
``dim_param``), and every node maps through one table, ``frontend.onnx.ONNX_OPS``. Shape
arithmetic on static values folds at import time, so a Shape -> Gather -> Concat -> Reshape
chain ends as a reshape to a static or symbolic shape. Nothing here knows any model.
"""

from __future__ import annotations

import keyword
import os
from collections.abc import Mapping

import numpy as np

from tensor_graphs import compiler
from tensor_graphs.errors import (
    ArgumentError,
    DTypeError,
    OutOfMemory,
    SerializationError,
    ShapeError,
)
from tensor_graphs.files import open_regular, path_of, read_regular
from tensor_graphs.frontend.onnx import ONNX_OPS
from tensor_graphs.frontend.onnx.common import (
    Ctx,
    Static,
    StaticInputError,
    UnsupportedOpError,
    as_tensor,
    dtype_of,
)
from tensor_graphs.ir import api as tg
from tensor_graphs.ir import graph as ir_graph
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import INPUT, WEIGHT
from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.planner.prepare import check_dims

_FIX = "export the model again (onnx.save), or check the path"
_DOMAINS = ("", "ai.onnx")  # the default domain's two spellings
# The newest default-domain opset whose ops the mappings read: ONNX's own node tests pass up
# to it (tests/frontend/test_onnx_node.py, onnx 1.23: opsets 1 to 28). Not the onnx package's
# newest (onnx.defs.onnx_opset_version()): a later package may move an op's attribute to an
# input, or change what it computes, and a mapping would read the old form silently. Raise it
# once test_onnx_node passes at the new opset and the mappings read what moved.
NEWEST_OPSET = 28
_PROTOBUF_LIMIT = 2 ** 31  # protobuf parses no message larger: refused before reading it all


def _onnx():
    try:
        import onnx
    except ImportError as e:  # pragma: no cover - onnx is an optional dependency
        raise ArgumentError("tg.from_onnx needs the onnx package: pip install "
                            "'tensor_graphs[onnx]'") from e
    return onnx


# ---------------------------------------------------------------------------- reading
def load_model(source):
    """A ModelProto from a path, bytes or a ModelProto, external data resolved. A file that
    is not an ONNX model (truncated, another format) is a SerializationError naming it."""
    onnx = _onnx()
    if isinstance(source, onnx.ModelProto):
        model, folder, label = source, None, "the model given"
    elif isinstance(source, (bytes, bytearray)):
        model, folder, label = _parse(bytes(source), "the bytes given"), None, "the bytes given"
    else:
        path = path_of(source, "tg.from_onnx's model")
        label = f"'{path}'"
        data = read_regular(path, "ONNX model", _FIX + " (a model over 2 GiB keeps its "
                            "weights in external data files)", most=_PROTOBUF_LIMIT)
        model = _parse(data, label)
        folder = os.path.dirname(os.path.abspath(path))
    _check_text(model, label)
    _external(model, folder, label)
    return model


def _parse(data: bytes, label: str):
    onnx = _onnx()
    model = onnx.ModelProto()
    try:
        model.ParseFromString(data)
    except Exception as e:  # protobuf's DecodeError and friends
        raise SerializationError(f"{label} is not an ONNX model (it does not parse as one: "
                                 f"{e}); {_FIX}") from e
    if not model.HasField("graph") or not model.graph.node and not model.graph.output:
        raise SerializationError(f"{label} holds no ONNX graph (truncated, or another "
                                 f"format); {_FIX}")
    if not model.graph.output:  # nodes but nothing asked of them: no program to compile
        raise SerializationError(f"{label}: its graph names no outputs, so there is nothing "
                                 "to compute; export it with its outputs (output_names=)")
    return model


def _texts(graph):
    """(what, value) for each name and dim name the import reads from the graph."""
    for kind, values in (("graph input", graph.input), ("graph output", graph.output)):
        for vi in values:
            yield f"a {kind}'s name", vi.name
            for d in vi.type.tensor_type.shape.dim:
                yield f"a dim of the {kind} {vi.name!r}", d.dim_param
    for init in graph.initializer:
        yield "an initializer's name", init.name
    for node in graph.node:
        yield "a node's name", node.name
        yield f"the op type of node {node.name!r}", node.op_type
        yield f"the domain of node {node.name!r}", node.domain
        for value in (*node.input, *node.output):
            yield f"a value node {node.name!r} reads or writes", value


def _check_text(model, label: str) -> None:
    """Refuse a name that is not UTF-8: protobuf hands such a string back as bytes, which
    crashed the import (bytes has no isidentifier) or matched no other name. A protobuf
    string is UTF-8, so the file is corrupt (or not written by protobuf)."""
    for what, value in _texts(model.graph):
        if not isinstance(value, str):
            raise SerializationError(f"{label}: {what} is not UTF-8 text ({value[:40]!r}): the "
                                     f"file is corrupt; {_FIX}")


def _tensors(graph):
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t


def _external(model, folder: str | None, label: str) -> None:
    """Load each tensor stored outside the model file, from a regular file inside the
    model's own folder only (no absolute path, no '..', no link out of it)."""
    onnx = _onnx()
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        info = {e.key: e.value for e in tensor.external_data}
        where = info.get("location", "")
        if folder is None:
            raise SerializationError(
                f"{label}: tensor '{tensor.name}' is stored in the external file '{where}'; "
                "pass the model's path so it is read from the model's folder")
        # a NUL names no file (os.path raises a bare ValueError on it): refused as outside
        full = None if "\0" in where else os.path.realpath(os.path.join(folder, where))
        if not where or full is None or os.path.isabs(where) or os.path.commonpath(
                [full, os.path.realpath(folder)]) != os.path.realpath(folder):
            raise SerializationError(
                f"{label}: tensor '{tensor.name}' names the external data file {where!r}, "
                "outside the model's folder; external data is read only from the model's "
                "own folder")
        try:
            offset, length = int(info.get("offset", 0)), info.get("length")
            length = None if length is None else int(length)
        except ValueError as e:
            raise SerializationError(f"{label}: tensor '{tensor.name}' has a bad external "
                                     f"offset or length {info}") from e
        for what, value in (("offset", offset), ("length", length)):
            if value is not None and value < 0:  # no file is short of a negative range
                raise SerializationError(
                    f"{label}: tensor '{tensor.name}' has a negative external data {what} "
                    f"({value}) for '{where}': the model's entry for it is corrupt; {_FIX}")
        with open_regular(full, "ONNX external data", _FIX) as f:
            size = os.fstat(f.fileno()).st_size
            if offset > size or (length is not None and offset + length > size):
                span = f"from byte {offset}" if length is None else \
                    f"bytes {offset}..{offset + length} ({length} bytes)"
                raise SerializationError(
                    f"{label}: tensor '{tensor.name}' reads {span} of '{where}', past its end "
                    f"({size} bytes): the file is truncated, or the model's offsets are not "
                    f"this file's; {_FIX}")
            f.seek(offset)
            tensor.raw_data = f.read(size - offset if length is None else length)
        del tensor.external_data[:]
        tensor.data_location = onnx.TensorProto.DEFAULT


def _array(tensor, label: str) -> np.ndarray:
    from onnx import numpy_helper

    dtype_of(tensor.data_type, f"{label}: tensor '{tensor.name}'")
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:  # a raw_data of the wrong length, say
        raise SerializationError(f"{label}: tensor '{tensor.name}' cannot be read ({e})") from e


def _attrs(node, label: str) -> dict:
    from onnx import helper

    out = {}
    for attr in node.attribute:
        if attr.ref_attr_name:
            raise UnsupportedOpError(f"{label}: attribute references (functions) are not "
                                     "mapped", [(node.op_type, node.name)])
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        elif attr.HasField("t"):
            value = _array(attr.t, label)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8", "replace") for v in value]
        out[attr.name] = value
    return out


# ---------------------------------------------------------------------------- import
def _opsets(model) -> dict:
    return {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}


def _check_opset(model, label: str) -> int:
    """The default domain's opset, refused past NEWEST_OPSET: an op of a newer opset may read
    its inputs or compute differently, and the mappings know only the forms up to it."""
    opset = _opsets(model).get("", 1)
    if opset > NEWEST_OPSET:
        raise UnsupportedOpError(
            f"from_onnx: {label} uses opset {opset} of the default ONNX domain; tensor_graphs "
            f"maps ops up to opset {NEWEST_OPSET} (an op of a newer opset may compute "
            f"something else). Export the model again with opset {NEWEST_OPSET} or lower, "
            f"e.g. torch.onnx.export(..., opset_version={NEWEST_OPSET})")
    return opset


def _check_single_assignment(graph, label: str) -> None:
    """Refuse a value written twice: an ONNX graph assigns each name once (SSA; the checker
    refuses it), and a second node writing a name, or a node writing a graph input's or an
    initializer's, would silently replace that value for every node after it."""
    made: dict[str, str] = {}  # value name -> what already makes it, as the error says it
    for init in graph.initializer:
        made[init.name] = f"the initializer '{init.name}'"
    for vi in graph.input:
        made.setdefault(vi.name, f"the graph input '{vi.name}'")
    for i, node in enumerate(graph.node):
        writer = f"node '{node.name or f'#{i}'}' ({node.op_type})"
        for out in node.output:
            if not out:  # an omitted optional output
                continue
            if out in made:
                raise SerializationError(
                    f"{label}: {writer} writes '{out}', which {made[out]} already makes: an "
                    "ONNX graph assigns each value once, so which one later nodes read is "
                    "undefined (invalid ONNX: onnx.checker.check_model refuses it); rename "
                    "one of them where the model is made, and export it again")
            made[out] = writer


def _refuse_unmapped(model, label: str) -> None:
    """One UnsupportedOpError naming each op type without a mapping once, with its nodes."""
    opsets = _opsets(model)
    found: dict[str, list[str]] = {}
    for i, node in enumerate(model.graph.node):
        if node.domain in _DOMAINS and node.op_type in ONNX_OPS:
            continue
        key = node.op_type if node.domain in _DOMAINS else f"{node.domain}::{node.op_type}"
        found.setdefault(key, []).append(node.name or f"#{i}")
    if not found:
        return
    lines = []
    for op, names in found.items():
        shown = ", ".join(f"'{n}'" for n in names[:5]) + (
            f" and {len(names) - 5} more" if len(names) > 5 else "")
        lines.append(f"  {op} (nodes {shown})")
    raise UnsupportedOpError(
        f"from_onnx: {label} (opset {opsets.get('', '?')}) uses {len(found)} op type(s) "
        "tensor_graphs does not map:\n" + "\n".join(lines)
        + "\nExport the model with ops that from_onnx maps (the keys of "
        "tensor_graphs.frontend.onnx.ONNX_OPS), or run that part in ONNX Runtime and "
        "import the rest.",
        [(op, n) for op, names in found.items() for n in names])


def _symbol(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and len(name) <= 64


def _input_shape(vi, label: str, dynamic_dims: Mapping, bounds: dict,
                 renamed: dict) -> tuple:
    """``renamed``: each dim_param that is no symbol -> the name its first input gave it, so
    the inputs sharing it ("batch size", "past_sequence_length + 1") stay one dim."""
    tt = vi.type.tensor_type
    if not tt.HasField("shape"):
        raise ShapeError(f"{label}: graph input '{vi.name}' has no shape; export it with one")
    shape = []
    for axis, d in enumerate(tt.shape.dim):
        # a negative dim_value (-1, as some converters write an unknown size) is an unknown
        # size, as ONNX Runtime reads it: named like an unnamed dim, not refused as a size
        if d.HasField("dim_value") and d.dim_value >= 0:
            shape.append(int(d.dim_value))
            continue
        # a dim's name must read back as one symbol: not a keyword, not "batch size"
        name = d.dim_param if _symbol(d.dim_param) else renamed.get(d.dim_param)
        if name is None:
            name = f"{vi.name}_dim{axis}"
            name = name if _symbol(name) else f"input{len(bounds)}_dim{axis}"
            if d.dim_param:  # an empty one is an unknown size, tied to nothing
                renamed[d.dim_param] = name
        if name in dynamic_dims:
            bounds[name] = dynamic_dims[name]
        else:
            bounds.setdefault(name, None)
        shape.append(name)
    return tuple(shape)


def import_onnx(model, dynamic_dims: Mapping[str, int] | None = None,
                constants: Mapping[str, np.ndarray] | None = None, label: str = "the model",
                origins: dict | None = None, not_one: dict | None = None):
    """An ONNX ModelProto as our graph: (outputs, inputs, weights, bounds).

    ``outputs``: the graph outputs' nodes in order; ``inputs``: the ``tg.input`` leaves by
    ONNX input name; ``weights``: initializer name -> numpy array, for those the graph reads
    as tensors; ``bounds``: dim name -> largest value (None where not given). ``origins``,
    when given, is filled with each ONNX node's output node -> the ONNX node, as errors name
    it ("Range node 'r'"); ``not_one`` with each symbolic dim a mapping took as not 1 -> the
    node that did (``Ctx.not_one``).
    """
    graph = model.graph
    opset = _check_opset(model, label)
    _check_single_assignment(graph, label)
    _refuse_unmapped(model, label)
    dynamic_dims = check_dims(dynamic_dims, "from_onnx(dynamic_dims=...)")
    constants = dict(constants or {})
    env: dict = {}
    arrays: dict[str, np.ndarray] = {}
    for init in graph.initializer:
        arrays[init.name] = _array(init, label)
        env[init.name] = Static(arrays[init.name], weight=init.name)
    inputs: dict[str, Node] = {}
    sources: dict = {}
    bounds: dict = {}
    renamed: dict = {}
    for vi in graph.input:
        if vi.name in env:
            continue  # an initializer listed as an input (IR < 4): a weight
        if vi.name in constants:
            env[vi.name] = Static(np.asarray(constants[vi.name]))
            continue
        dtype = dtype_of(vi.type.tensor_type.elem_type, f"{label}: graph input '{vi.name}'")
        leaf = tg.input(vi.name, _input_shape(vi, label, dynamic_dims, bounds, renamed), dtype)
        inputs[vi.name] = env[vi.name] = leaf
        sources[leaf] = vi.name
    weights_made: dict = {}
    for i, node in enumerate(graph.node):
        name = node.name or f"#{i}"
        args = []
        for inp in node.input:
            if inp == "":
                args.append(None)
                continue
            if inp not in env:
                raise SerializationError(f"{label}: node '{name}' ({node.op_type}) reads "
                                         f"'{inp}', which nothing before it makes")
            value = env[inp]
            if isinstance(value, Exception):
                raise value
            args.append(value)
        outs = [o for o in node.output]
        ctx = Ctx(node.op_type, name, opset, args, _attrs(node, label), weights_made, sources,
                  outputs=sum(1 for o in outs if o), bounds=bounds, not_one=not_one)
        try:
            result = ONNX_OPS[node.op_type](ctx)
        except Exception as e:  # ours, or a mapping's crash: either names the node
            e.add_note(f"while importing {node.op_type} node '{name}' (opset {opset})")
            raise
        results = result if isinstance(result, tuple) else (result,)
        for out, value in zip(outs, results):
            if out:
                env[out] = value
                if origins is not None and isinstance(value, Node):
                    origins.setdefault(value, f"{node.op_type} node '{name}'")
    outputs = []
    for vi in graph.output:
        value = env.get(vi.name)
        if value is None:
            raise SerializationError(f"{label}: graph output '{vi.name}' is made by no node")
        if isinstance(value, Exception):
            raise value
        outputs.append(as_tensor(value, weights_made))
    used = {n.name for n in ir_graph.nodes(outputs) if n.op.name == WEIGHT}
    weights = {k: v for k, v in arrays.items() if k in used}
    return outputs, inputs, weights, bounds


class OnnxProgram:
    """A compiled ONNX model: call it with the graph inputs by name (or in order), numpy in,
    a list of numpy arrays out in the graph's output order (what ONNX Runtime's
    ``session.run(None, feeds)`` returns). ``.program`` is the CompiledGraph."""

    def __init__(self, program, inputs: dict, outputs: list, output_names: list,
                 bounds: Mapping[str, int] | None = None,
                 not_one: Mapping[str, str] | None = None):
        self.program = program
        self.not_one = dict(not_one or {})  # dim -> the node that took it as not 1
        # dim -> the largest value ``dynamic_dims`` gave (those the program was compiled for):
        # a call above one is refused here, naming from_onnx's parameter
        self.bounds = dict(bounds or {})
        self._inputs = inputs  # ONNX input name -> its tg.input leaf
        self.input_names = list(inputs)
        self.output_names = output_names
        # the leaves the program reads: an input used for nothing (or only for its static
        # shape) is checked like the others and then not fed
        self._read = {n.name for n in ir_graph.nodes(outputs) if n.op.name == INPUT}

    def explain(self, limit: int | None = None) -> str:
        return self.program.explain(limit)

    @property
    def plan(self):
        return self.program.plan

    def __call__(self, *args, **feeds) -> list:
        if len(args) > len(self.input_names):
            raise ArgumentError(f"expected at most {len(self.input_names)} positional "
                                f"input(s) ({', '.join(self.input_names)}), got {len(args)}")
        given = dict(zip(self.input_names, args))
        twice = set(given) & set(feeds)
        if twice:
            raise ArgumentError(f"input(s) {sorted(twice)} given both by position and name")
        given.update(feeds)
        unknown = set(given) - set(self.input_names)
        missing = [n for n in self.input_names if n not in given]
        if unknown or missing:
            raise ArgumentError(f"the model takes inputs {self.input_names}; unknown: "
                                f"{sorted(unknown)}, missing: {missing}")
        run = {}
        for name, arr in given.items():
            leaf = self._inputs[name]
            arr = np.asarray(arr)
            if arr.ndim != leaf.ndim or any(isinstance(d, int) and d != s
                                            for d, s in zip(leaf.shape, arr.shape)):
                raise ShapeError(f"input '{name}' has shape {arr.shape}; the model takes "
                                 f"{tuple(map(str, leaf.shape))}")
            if arr.dtype != leaf.dtype.np_dtype:
                raise DTypeError(f"input '{name}' has dtype {arr.dtype}; the model takes "
                                 f"{leaf.dtype.name} (convert it, e.g. "
                                 f"x.astype('{leaf.dtype.name}'))")
            if name in self._read:
                run[name] = arr
        self._check_bounds(given)
        self._check_not_one(given)
        results = self.program(**run)
        results = results if isinstance(results, (list, tuple)) else [results]
        return [np.asarray(r) for r in results[:len(self.output_names)]]

    def _check_bounds(self, given: Mapping) -> None:
        """A call whose inputs make a dim larger than ``dynamic_dims`` gave is a ShapeError
        that says how to import for it (the compiled program's own check names ``tg.compile``'s
        ``bounds=``, which an ONNX program's caller never passed)."""
        over: dict[str, int] = {}
        for name, arr in given.items():
            for dim, size in zip(self._inputs[name].shape, np.shape(arr)):
                bound = self.bounds.get(str(dim))
                if bound is not None and size > bound:
                    over[str(dim)] = max(size, over.get(str(dim), 0))
        if over:
            shown = ", ".join(f"{d}={s} (dynamic_dims gave {self.bounds[d]})"
                              for d, s in over.items())
            larger = {**self.bounds, **over}
            raise ShapeError(f"{shown}: above the dynamic_dims this model was imported with; "
                             f"import it again with larger dynamic_dims= (tg.from_onnx(model, "
                             f"dynamic_dims={larger}))")


    def _check_not_one(self, given: Mapping) -> None:
        """A call where a dim an axes-less Squeeze took as not 1 is 1 is a ShapeError: ONNX
        squeezes every size-1 dim, so that output would have another rank than the graph
        imported (ONNX Runtime's (3, 4) came back (1, 3, 4))."""
        for name, arr in given.items():
            for dim, size in zip(self._inputs[name].shape, np.shape(arr)):
                node = self.not_one.get(str(dim))
                if node is not None and size == 1:
                    raise ShapeError(
                        f"input '{name}' has {dim}=1, which {node} squeezes (it has no axes: "
                        f"ONNX squeezes every dim of size 1), so the model's ranks differ at "
                        f"{dim}=1 from those it was imported with; call it with {dim} >= 2, "
                        f"or export it with the squeeze's axes (torch: x.squeeze(dim))")


def from_onnx(model, dynamic_dims: Mapping[str, int] | None = None, *, device="cpu",
              constants: Mapping[str, np.ndarray] | None = None,
              tolerance: float | None = None, **compile_options) -> OnnxProgram:
    """Import an ONNX model (a path, its bytes, or an ``onnx.ModelProto``), compile it and bind
    its initializers once. Graph inputs' symbolic dims keep the model's ``dim_param`` names
    (an unnamed one is ``<input>_dim<axis>``); ``dynamic_dims`` gives their largest values
    (``{"batch": 8, "seq": 128}``: planned once for every size up to those), and a dim left
    out is planned on each call's sizes. ``constants`` fixes graph inputs the graph's shapes
    depend on (a Reshape's shape fed as an input). The other options go to ``tg.compile``.

    Raises ArgumentError for an option neither from_onnx nor ``tg.compile`` takes, before
    the model is read; UnsupportedOpError naming every op type without a mapping once, with
    its nodes and the opset, or the model's opset when it is past NEWEST_OPSET;
    SerializationError naming the file for one that is not an ONNX model, or a graph that
    writes a value twice.
    """
    _check_options(compile_options)
    label = f"'{model}'" if isinstance(model, (str, os.PathLike)) else "the model"
    check_dims(dynamic_dims, "from_onnx(dynamic_dims=...)")  # before reading the model
    proto = load_model(model)
    origins: dict = {}
    not_one: dict = {}
    outputs, inputs, weights, bounds = import_onnx(proto, dynamic_dims, constants, label,
                                                   origins, not_one)
    unknown = set(dynamic_dims or {}) - set(bounds)
    if unknown:
        raise ArgumentError(f"from_onnx: dynamic_dims names {sorted(unknown)}, which no graph "
                            f"input has; the model's dims are {sorted(bounds) or 'all static'}")
    options = dict(compile_options)
    if tolerance is not None:
        options["tolerance"] = tolerance
    given = {k: v for k, v in bounds.items() if v is not None}
    used = {str(s) for n in ir_graph.nodes(outputs)
            for d in (*n.shape, *n.attrs.values()) for s in getattr(d, "free_symbols", ())}
    carriers = _shape_carriers(outputs, inputs, used)
    compiled_for = {k: v for k, v in given.items() if k in used}
    try:
        program = compiler.compile(list(outputs) + carriers, device=device,
                                   bounds=compiled_for or None, **options)
    except OutOfMemory as e:
        _name_largest(e, origins)
        raise
    present = {leaf.name for leaf in ir_graph.nodes(outputs) if leaf.op.name == WEIGHT}
    if present:
        program.bind(**{n: w for n, w in weights.items() if n in present})
    return OnnxProgram(program, inputs, outputs + carriers,
                       [vi.name for vi in proto.graph.output], bounds=compiled_for,
                       not_one=not_one)


_OWN_OPTIONS = ("dynamic_dims", "device", "constants", "tolerance")  # from_onnx's own
# options of the other importers that from_onnx has no counterpart for: what to do instead
_ELSEWHERE = {
    "bounds": "from_onnx sizes the model's symbolic dims by dynamic_dims= (their largest "
              "values), which it passes to tg.compile as bounds",
    "quantize": "from_onnx imports the model as it is; tg.from_torch and tg.nn.Generator take "
                "quantize= (or quantize the graph import_onnx returns with tg.quantize, then "
                "tg.compile it)",
    "max_steps": "a recurrence over a dynamic sequence is unrolled to the largest length "
                 "dynamic_dims= gives that dim",
}


def _check_options(options: Mapping) -> None:
    """Refuse an option neither from_onnx nor ``tg.compile`` takes before the model is read,
    naming those accepted (as ``tg.from_torch`` and ``tg.nn.Generator`` do); another
    importer's option says what from_onnx does instead. It sets tg.compile's bounds itself,
    from dynamic_dims."""
    compiler.refuse_unknown_options("from_onnx", options, _OWN_OPTIONS, _ELSEWHERE,
                                    sets=("bounds",))


def _name_largest(error: OutOfMemory, origins: Mapping) -> None:
    """Add to ``error`` the model's nodes whose outputs have the shape and dtype of its
    largest tensors: the planner names our ops (an ``iota`` of 10**12 values), the user knows
    the model's (the Range node that makes them)."""
    found = []
    for t in error.largest:
        names = sorted({label for node, label in origins.items()
                        if tuple(map(str, node.shape)) == tuple(map(str, t.shape))
                        and node.dtype.name == t.dtype})
        if names:
            found.append(f"{t.op} {format_shape(t.shape)} {t.dtype}: "
                         f"{', '.join(names[:3])}{' ...' if len(names) > 3 else ''}")
    if found:
        error.add_note("the model's nodes making tensors of those shapes: " + "; ".join(found))


def _shape_carriers(outputs, inputs: dict, used: set) -> list:
    """Extra (empty) outputs that read the inputs used only for their symbolic shape (a
    Range to an input's length): a dim the program needs is bound from the leaves it reads.
    Each is a 0-element slice of its input; OnnxProgram never returns it."""
    read = {leaf for leaf in ir_graph.nodes(outputs) if leaf.op.name == INPUT}
    bound = {str(s) for leaf in read for d in leaf.shape for s in getattr(d, "free_symbols", ())}
    carriers = []
    for leaf in inputs.values():
        carries = {str(s) for d in leaf.shape for s in getattr(d, "free_symbols", ())}
        if leaf not in read and carries & used - bound:
            carriers.append(tg.slice_axis(tg.reshape(leaf, (-1,)), 0, 0, 0))
            bound |= carries
    return carriers


__all__ = ["NEWEST_OPSET", "OnnxProgram", "StaticInputError", "UnsupportedOpError", "from_onnx",
           "import_onnx", "load_model"]

