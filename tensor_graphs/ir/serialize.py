"""Saving and loading graphs: a readable JSON file that round-trips exactly.

    tg.save(y, "g.json"); y2 = tg.load("g.json")   # y2 is y while y is alive

The file lists the nodes in topological order, one per line, each with its op, input ids and
attributes (plus name, shape and dtype for the reader)::

    {
      "format": "tensor_graphs.graph",
      "version": 1,
      "nodes": [
        {"id": 0, "op": "input", "name": "x", "inputs": [], "attrs": {...}, ...},
        {"id": 1, "op": "gelu", "inputs": [0], "attrs": {"approximate": "tanh"}, ...}
      ],
      "outputs": [1],
      "structure": "node"
    }

Attribute values map to JSON as follows; everything else is plain JSON (tuples are lists):

- a finite float is written with Python's shortest exact repr (-0.0 stays -0.0); nan and
  +-inf are ``{"$float": "nan"}`` (``"-nan"``, ``"inf"``, ``"-inf"``);
- a symbolic size is ``{"$dim": "2*seq"}``, read back with the positive-integer dim symbols;
- a dtype is ``{"$dtype": "float32"}``;
- a constant array is ``{"$array": "float32", "shape": [2], "data": [0.5, "nan"]}`` (flat,
  row-major; non-finite floats as strings), or with ``"base64"`` of its little-endian bytes
  instead of ``"data"`` when it is large or a value would not read back bit-exactly.

Loading checks the whole file before building any node, then rebuilds each leaf and atomic
node through its ``tg.*`` builder (a file is untrusted: it may hold nothing the builder would
refuse) and composites through their decompositions; hash-consing makes a graph whose nodes are
still alive come back as the very same objects. Dim text is parsed by ``shapes.as_dim``, which
evaluates nothing. Every problem, from a missing file to a bad node, raises
:class:`SerializationError` naming the file.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import reprlib

import ml_dtypes
import numpy as np
import sympy

from tensor_graphs.errors import SerializationError, TensorGraphsError
from tensor_graphs.files import atomic_write, open_regular, parse_json, path_of
from tensor_graphs.ir import builder, dtypes
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.graph import FED_LEAVES
from tensor_graphs.ir.graph import nodes as topo_nodes
from tensor_graphs.ir.node import COMPOSITE, LEAF, Attrs, ConstValue, Node
from tensor_graphs.ir.ops import OPS, pointwise, random, selection
from tensor_graphs.ir.ops.atomic import BINARY, SPECIAL_BINARY, SPECIAL_UNARY, UNARY
from tensor_graphs.ir.ops.names import (
    ARGSORT,
    CAST,
    CONCAT,
    CONSTANT,
    COPY_TO,
    DIM,
    EXPAND,
    GATHER,
    IOTA,
    MATMUL,
    MAX,
    PAD,
    PERMUTE,
    RANDOM_BITS,
    RESHAPE,
    SCATTER,
    SLICE,
    STATE_UPDATE,
    SUM,
    WHERE,
)
from tensor_graphs.ir.shapes import as_dim

FORMAT = "tensor_graphs.graph"
VERSION = 1
INLINE_LIMIT = 1024  # constants with more elements are written as base64 bytes
_STRUCTURES = ("node", "list", "tuple")
MAX_NESTING = 32  # lists and objects inside one attribute value (deeper is not a graph file)
_SPECIAL_FLOATS = {"nan": math.nan, "-nan": -math.nan, "inf": math.inf, "-inf": -math.inf}


# ---------------------------------------------------------------------------- saving
def save(outputs, path) -> None:
    """Write the graph of ``outputs`` (a node, or a list or tuple of nodes) to ``path``."""
    structure, outs = _structure(outputs)
    order = topo_nodes(outs)
    ids = {node: i for i, node in enumerate(order)}
    enc = _Encoder()
    lines = []
    for i, node in enumerate(order):
        record = {"id": i, "op": node.op.name}
        if node.name is not None:
            record["name"] = node.name
        record["inputs"] = [ids[x] for x in node.inputs]
        attrs = {}
        for key, value in node.attrs.items():
            try:
                attrs[key] = enc.value(value)
            except SerializationError as exc:
                raise SerializationError(f"cannot save node {i} ({node.op.name}) attribute "
                                         f"'{key}': {exc}") from None
        record["attrs"] = attrs
        try:
            record["shape"] = enc.shape(node.shape)
        except SerializationError as exc:
            raise SerializationError(f"cannot save node {i} ({node.op.name}): {exc}") from None
        record["dtype"] = node.dtype.name
        lines.append("    " + json.dumps(record, allow_nan=False, ensure_ascii=False))
    out_ids = json.dumps([ids[o] for o in outs])
    text = "\n".join([
        "{",
        f'  "format": "{FORMAT}",',
        f'  "version": {VERSION},',
        '  "nodes": [' + ("\n" + ",\n".join(lines) + "\n  ]," if lines else "],"),
        f'  "outputs": {out_ids},',
        f'  "structure": "{structure}"',
        "}",
        "",
    ])
    _write_atomic(os.fspath(path), text)


def _structure(outputs):
    if isinstance(outputs, Node):
        return "node", [outputs]
    if isinstance(outputs, (list, tuple)):
        for o in outputs:
            if not isinstance(o, Node):
                raise SerializationError(f"save: outputs must be graph nodes, got "
                                         f"{type(o).__name__}")
        return ("tuple" if isinstance(outputs, tuple) else "list"), list(outputs)
    raise SerializationError(f"save: expected a node or a list/tuple of nodes, got "
                             f"{type(outputs).__name__}")


def _write_atomic(path: str, text: str) -> None:
    with atomic_write(path) as f:
        f.write(text)


class _Encoder:
    """Attribute values to JSON values; caches dim expressions (printing them is slow)."""

    def __init__(self):
        self._dims: dict[sympy.Basic, str] = {}

    def value(self, value):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, int):
            return int(value)
        if isinstance(value, float):
            return value if math.isfinite(value) else {"$float": _float_name(value)}
        if isinstance(value, tuple):
            return [self.value(v) for v in value]
        if isinstance(value, sympy.Basic):
            return {"$dim": self.dim(value)}
        if isinstance(value, DType):
            return {"$dtype": value.name}
        if isinstance(value, ConstValue):
            return _encode_array(value.array)
        raise SerializationError(f"values of type {type(value).__name__} cannot be saved "
                                 f"({value!r})")

    def dim(self, expr: sympy.Basic) -> str:
        text = self._dims.get(expr)
        if text is None:
            text = str(expr)
            try:
                back = _parse_dim(text)
            except SerializationError:
                back = None
            if back != expr:
                raise SerializationError(
                    f"the size expression {text} does not read back exactly; sizes must be "
                    "built from named dims (tg.input(..., ('seq',)) or shapes.dim_symbol)")
            self._dims[expr] = text
        return text

    def shape(self, shape) -> list:
        return [d if isinstance(d, int) else self.dim(d) for d in shape]


def _float_name(value: float) -> str:
    if math.isnan(value):
        return "-nan" if math.copysign(1.0, value) < 0 else "nan"
    return "inf" if value > 0 else "-inf"


def _encode_array(array: np.ndarray) -> dict:
    if array.dtype.kind not in "biufV" or _dtype_from_name(array.dtype.name) != array.dtype:
        raise SerializationError(f"constants of dtype {array.dtype} cannot be saved")
    out = {"$array": array.dtype.name, "shape": list(array.shape)}
    if array.size <= INLINE_LIMIT:
        flat = array.reshape(-1)
        if flat.dtype.kind in "fV":
            data = [v if math.isfinite(v) else _float_name(v) for v in map(float, flat)]
        else:
            data = flat.tolist()
        if _decode_data(data, array.dtype, array.shape).tobytes() == array.tobytes():
            out["data"] = data
            return out
    out["base64"] = base64.b64encode(_little_endian_bytes(array)).decode("ascii")
    return out


def _uint_view(dtype: np.dtype, order: str) -> np.dtype:
    return np.dtype(f"{order}u{dtype.itemsize}")


def _little_endian_bytes(array: np.ndarray) -> bytes:
    raw = np.ascontiguousarray(array).view(_uint_view(array.dtype, "="))
    return raw.astype(_uint_view(array.dtype, "<")).tobytes()


def _from_little_endian(raw: bytes, dtype: np.dtype, shape) -> np.ndarray:
    count = math.prod(shape)
    if len(raw) != count * dtype.itemsize:
        raise SerializationError(f"base64 data holds {len(raw)} bytes, but shape {tuple(shape)} "
                                 f"of {dtype.name} needs {count * dtype.itemsize}")
    ints = np.frombuffer(raw, _uint_view(dtype, "<")).astype(_uint_view(dtype, "="))
    return ints.view(dtype).reshape(shape)


def _decode_data(data: list, dtype: np.dtype, shape) -> np.ndarray:
    if dtype.kind in "fV":
        values = [_SPECIAL_FLOATS[v] if isinstance(v, str) and v in _SPECIAL_FLOATS else v
                  for v in data]
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
            raise SerializationError(f"{dtype.name} data must be numbers or 'nan'/'inf'/'-inf'")
        array = np.array(values, dtype=np.float64).astype(dtype)
    elif dtype.kind == "b":
        if not all(isinstance(v, bool) for v in data):
            raise SerializationError("bool data must be true/false")
        array = np.array(data, dtype=dtype)
    else:
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in data):
            raise SerializationError(f"{dtype.name} data must be integers")
        info = np.iinfo(dtype)
        if any(not info.min <= v <= info.max for v in data):
            raise SerializationError(f"a value is out of range for {dtype.name}")
        array = np.array(data, dtype=dtype)
    if array.size != math.prod(shape):
        raise SerializationError(f"{len(data)} values do not fill shape {tuple(shape)}")
    return array.reshape(shape)


def _dtype_from_name(name: str) -> np.dtype | None:
    ours = dtypes.BY_NAME.get(name)
    if ours is not None:
        return ours.np_dtype
    extra = getattr(ml_dtypes, name, None)
    if extra is not None:
        try:
            return np.dtype(extra)
        except TypeError:
            return None
    if name in ("int16", "uint16", "uint32", "uint64"):
        return np.dtype(name)
    return None


# ---------------------------------------------------------------------------- loading
def load(path) -> Node | list | tuple:
    """Read a graph written by :func:`save`; returns a node, list or tuple as it was saved."""
    source = path_of(path, "graph file")
    doc = parse_json(_read(source), source, "tensor_graphs graph file", _WRITE_WITH_SAVE)
    return from_json(doc, source=source)


HEAD = 1 << 20  # bytes read first, to refuse a large file that is no JSON object unread


def _read(source: str) -> bytes:
    """The graph file's bytes. A file longer than its first block whose first character is
    not the "{" every graph file begins with (a checkpoint or model given by mistake) is
    refused after that block: read whole, a 3 GiB checkpoint took 6 GiB of memory and 17 s
    before it was refused. A smaller one is parsed, for the JSON parser's precise reason."""
    with open_regular(source, "graph file", _WRITE_WITH_SAVE) as f:
        try:
            head = f.read(HEAD)
            start = head.lstrip(b" \t\r\n")[:8]
            if len(head) == HEAD and start and not start.startswith(b"{"):
                raise SerializationError(
                    f"{source} is not a tensor_graphs graph file: it begins with {start!r}, "
                    f"not with the JSON object ('{{') a graph file is; {_WRITE_WITH_SAVE}")
            return head + f.read()
        except OSError as exc:
            raise SerializationError(f"cannot read graph file {source}: "
                                     f"{exc.strerror or exc}; {_WRITE_WITH_SAVE}") from None


_WRITE_WITH_SAVE = "pass the path of a file written by tg.save"
_CORRECT = "correct the file or save the graph again with tg.save"  # for a node that is wrong


def from_json(doc, source: str = "graph") -> Node | list | tuple:
    """Build the graph a parsed file describes (the whole file is checked first)."""
    plan, outputs, structure = _check(doc, source)
    built: list[Node] = []
    shapes = _Encoder()
    for node_id, op, inputs, attrs, name, shape, dtype in plan:
        where = f"{source}: node {_brief(node_id)} ({op.name})"
        node = _build(op, tuple(built[k] for k in inputs), attrs, name, where)
        if dtype is not None and dtype != node.dtype.name:
            raise SerializationError(f"{where}: the file says dtype {dtype}, but the node "
                                     f"rebuilds as {node.dtype.name}")
        try:
            rebuilt_shape = shapes.shape(node.shape)
        except SerializationError as exc:
            raise SerializationError(f"{where}: {exc}") from None
        if shape is not None and shape != rebuilt_shape:
            raise SerializationError(f"{where}: the file says shape {_brief(shape)}, but the "
                                     f"node rebuilds with shape {list(map(str, node.shape))}")
        built.append(node)
    outs = [built[k] for k in outputs]
    if structure == "node":
        return outs[0]
    return tuple(outs) if structure == "tuple" else outs


def _build(op, inputs: tuple[Node, ...], attrs: dict, name, where: str) -> Node:
    """The node a file's record describes, made the way the builder makes it, so that a file
    holds no node the builder would refuse (a negative dim, a slice past the end, float data in
    an int8 constant): leaves and atomic ops are rebuilt through their tg.* builder from their
    attributes and must come back the same; composites re-trace their decompositions, which
    call the builder."""
    try:
        if op.kind == COMPOSITE:
            return Node.make(op, inputs, attrs, name)
        rebuild = _REBUILD.get(op.name)
        if rebuild is None:
            raise SerializationError(f"no builder is known for the {op.kind} op '{op.name}'")
        expected = set(op.attr_defaults)
        if set(attrs) != expected:
            extra, missing = sorted(set(attrs) - expected), sorted(expected - set(attrs))
            raise SerializationError(
                (f"unknown attributes {extra}" if extra else f"missing attributes {missing}")
                + f" ({op.name} takes {sorted(expected) or 'none'})")
        made = rebuild(inputs, attrs, name)
        if made in inputs:  # the builder leaves the input as it is (a reshape to its own shape)
            if _has_text(tuple(attrs.values())):  # checked on their own, dims are never text
                raise SerializationError(f"its attributes {_brief(dict(attrs))} hold text "
                                         "where sizes belong (write {\"$dim\": ...})")
            node = Node.make(op, inputs, attrs, name)
            if node.shape != made.shape or node.dtype != made.dtype:
                raise SerializationError(
                    f"its attributes {_brief(dict(attrs))} do not describe {made.op.name} "
                    f"{list(map(str, made.shape))} {made.dtype.name} left unchanged")
            return node
    except Exception as exc:  # a hand-edited file can break an op's own assumptions
        why = str(exc) if isinstance(exc, TensorGraphsError) else f"{type(exc).__name__}: {exc}"
        cause = None if isinstance(exc, SerializationError) else exc
        raise SerializationError(f"{where} cannot be rebuilt: {why}; {_CORRECT}") from cause
    differences = _differences(made, op, inputs, Attrs(attrs), name)
    if differences:
        raise SerializationError(f"{where} is not what tg.{_BUILDER_NAMES.get(op.name, op.name)} "
                                 f"builds from its attributes: {'; '.join(differences)}; "
                                 f"{_CORRECT}")
    return made


def _differences(made: Node, op, inputs, attrs: Attrs, name) -> list[str]:
    """How the builder's node differs from the file's record, for the error message."""
    if made.op is not op:
        return [f"the builder makes a {made.op.name} node (of {len(made.inputs)} inputs) "
                "from it"]
    out = []
    if made.inputs != inputs:
        shown = ", ".join(f"{i.op.name} {list(map(str, i.shape))} {i.dtype.name}"
                          for i in made.inputs)
        out.append(f"the builder gives it other inputs ({shown})")
    for key in sorted(set(made.attrs) | set(attrs)):
        have, want = attrs.get(key), made.attrs.get(key)
        if Attrs({key: have}) != Attrs({key: want}):
            out.append(f"attribute '{key}' is {_brief(have)} in the file, but the builder makes "
                       f"{_brief(want)}")
    if made.name != name:
        out.append(f"the name is {_brief(name)} in the file, but the builder names it "
                   f"{made.name!r}")
    return out


def _has_text(value) -> bool:
    return isinstance(value, str) or isinstance(value, tuple) and any(map(_has_text, value))


def _slices(attrs) -> tuple:
    """The Python slices whose x[...] gives a slice node's bounds: a negative bound is what
    slice.indices() writes for "before index 0" with a negative step, which None means."""
    def bound(v):
        return None if isinstance(v, int) and not isinstance(v, bool) and v < 0 else v
    return tuple(slice(bound(a), bound(c), s)
                 for a, c, s in zip(attrs["starts"], attrs["stops"], attrs["steps"], strict=True))


def _pad_args(attrs) -> tuple:
    """tg.pad's torch order (last axis first, before then after) from per-axis pairs."""
    return tuple(v for pair in reversed(attrs["pads"]) for v in pair)


def _constant_data(value):
    return value.array if isinstance(value, ConstValue) else value


def _leaf(kind: str):
    return lambda xs, a, name: getattr(builder, kind)(name, a["shape"], a["dtype"])


def _plain(op: str):
    return lambda xs, a, name: getattr(builder, op)(*xs)


_REBUILD = {  # leaf or atomic op: its builder call from (inputs, attrs, name)
    **{kind: _leaf(kind) for kind in FED_LEAVES},
    CONSTANT: lambda xs, a, name: builder.constant(_constant_data(a["value"]), a["dtype"]),
    DIM: lambda xs, a, name: builder.size(a["expr"], a["dtype"]),
    **{op: _plain(op) for op in (*UNARY, *BINARY, WHERE, MATMUL)},
    **{op: (lambda xs, a, name, op=op: getattr(pointwise, op)(*xs))
       for op in (*SPECIAL_UNARY, *SPECIAL_BINARY)},
    CAST: lambda xs, a, name: builder.cast(xs[0], a["dtype"]),
    SUM: lambda xs, a, name: builder.sum(xs[0], a["axes"], a["keepdims"]),
    MAX: lambda xs, a, name: builder.max(xs[0], a["axes"], a["keepdims"]),
    RESHAPE: lambda xs, a, name: builder.reshape(xs[0], a["shape"]),
    PERMUTE: lambda xs, a, name: builder.permute(xs[0], a["perm"]),
    EXPAND: lambda xs, a, name: builder.expand(xs[0], a["shape"]),
    SLICE: lambda xs, a, name: builder.getitem(xs[0], _slices(a)),
    PAD: lambda xs, a, name: builder.pad(xs[0], _pad_args(a), a["value"]),
    CONCAT: lambda xs, a, name: builder.concat(xs, a["axis"]),
    GATHER: lambda xs, a, name: builder.gather(xs[0], xs[1], a["axis"]),
    IOTA: lambda xs, a, name: builder.iota(a["length"], a["dtype"]),
    COPY_TO: lambda xs, a, name: builder.copy_to(xs[0], a["device"]),
    STATE_UPDATE: lambda xs, a, name: builder.state_update(xs[0], xs[1], a["offset"],
                                                           a["axis"]),
    ARGSORT: lambda xs, a, name: selection.argsort(xs[0], a["axis"], a["descending"]),
    SCATTER: lambda xs, a, name: selection.scatter(xs[0], xs[1], xs[2], a["axis"], a["reduce"]),
    RANDOM_BITS: lambda xs, a, name: random.random_bits(xs[0], a["shape"], a["stream"]),
}
_BUILDER_NAMES = {SLICE: "getitem (x[...])", DIM: "size"}  # where the tg.* name differs


def _brief(value) -> str:
    """A short repr of a value read from a file (bounded however large or deep it is)."""
    if isinstance(value, ConstValue):
        arr = value.array
        data = np.array2string(arr.reshape(-1)[:8], separator=", ")
        return f"{arr.dtype.name} data {data}{'...' if arr.size > 8 else ''} of shape " \
               f"{list(arr.shape)}"
    return _REPR.repr(value)


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 4, 60, 60


def _check(doc, source: str):
    """Validate the file completely; return what to build, without building anything."""
    def fail(message: str):
        raise SerializationError(f"{source}: {message}")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        fail(f"not a tensor_graphs graph file (format {_brief(found)}, expected {FORMAT!r})")
    version = doc.get("version")
    if version != VERSION or isinstance(version, bool):
        fail(f"unknown version {_brief(version)}; this tensor_graphs reads version {VERSION} "
             "(upgrade tensor_graphs to read newer files)")
    records = doc.get("nodes")
    if not isinstance(records, list):
        fail("'nodes' must be a list")
    decoder = _Decoder()
    position: dict[int, int] = {}
    plan = []
    for i, rec in enumerate(records):
        if not isinstance(rec, dict):
            fail(f"node entry {i} is not an object")
        node_id, op_name = rec.get("id"), rec.get("op")
        label = f"node {_brief(node_id)}" + (f" ({_brief(op_name)[1:-1]})"
                                             if isinstance(op_name, str) else "")
        if not isinstance(node_id, int) or isinstance(node_id, bool):
            fail(f"node entry {i} has no integer 'id'")
        if node_id in position:
            fail(f"{label}: the id is used twice")
        if not isinstance(op_name, str):
            fail(f"{label}: 'op' must be an op name")
        op = OPS.get(op_name)
        if op is None:
            fail(f"{label}: unknown op {_brief(op_name)} (not registered in this tensor_graphs; "
                 "import the module that defines it before loading)")
        inputs = rec.get("inputs", [])
        if not isinstance(inputs, list):
            fail(f"{label}: 'inputs' must be a list of ids")
        for k in inputs:
            if not isinstance(k, int) or isinstance(k, bool) or k not in position:
                fail(f"{label}: input id {_brief(k)} is not defined before it (dangling input; "
                     "nodes must be listed inputs first)")
        attrs_json = rec.get("attrs", {})
        if not isinstance(attrs_json, dict):
            fail(f"{label}: 'attrs' must be an object")
        attrs = {}
        for key, value in attrs_json.items():
            try:
                attrs[key] = decoder.value(value)
            except SerializationError as exc:
                fail(f"{label} attribute '{key}': {exc}")
        name = rec.get("name")
        if name is not None and not isinstance(name, str):
            fail(f"{label}: 'name' must be a string")
        if op.kind == LEAF and op.name in FED_LEAVES and not name:
            fail(f"{label}: a {op.name} leaf needs a name")
        expected = _arity(op, attrs)
        if expected is not None and len(inputs) != expected or op.variadic and not inputs:
            fail(f"{label} has {len(inputs)} inputs, expected "
                 f"{expected if expected is not None else 'at least 1'}")
        shape, dtype = rec.get("shape"), rec.get("dtype")
        if shape is not None and not (isinstance(shape, list) and all(
                isinstance(d, (int, str)) and not isinstance(d, bool) for d in shape)):
            fail(f"{label}: 'shape' must be a list of sizes and size expressions, got "
                 f"{_brief(shape)}")
        if dtype is not None and not isinstance(dtype, str):
            fail(f"{label}: 'dtype' must be a dtype name")
        position[node_id] = len(plan)
        plan.append((node_id, op, [position[k] for k in inputs], attrs, name, shape, dtype))
    outputs = doc.get("outputs")
    if not isinstance(outputs, list):
        fail("'outputs' must be a list of node ids")
    for k in outputs:
        if not isinstance(k, int) or isinstance(k, bool) or k not in position:
            fail(f"output id {_brief(k)} is not a node of the file")
    structure = doc.get("structure", "list")
    if structure not in _STRUCTURES:
        fail(f"'structure' must be one of {', '.join(_STRUCTURES)}, got {_brief(structure)}")
    if structure == "node" and len(outputs) != 1:
        fail(f"structure 'node' needs exactly one output, got {len(outputs)}")
    return plan, [position[k] for k in outputs], structure


def _arity(op, attrs) -> int | None:
    if op.kind == LEAF:
        return 0
    if op.variadic:
        return None
    if op.kind == COMPOSITE and op.optional:
        present = attrs.get("args", op.params)
        return len(present) if isinstance(present, tuple) else len(op.params)
    return len(op.params)


class _Decoder:
    """JSON values back to attribute values; caches parsed dim expressions."""

    def __init__(self):
        self._dims: dict[str, sympy.Basic] = {}

    def value(self, value, depth: int = 0):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if depth >= MAX_NESTING:
            raise SerializationError(f"a value nested more than {MAX_NESTING} levels deep")
        if isinstance(value, list):
            return tuple(self.value(v, depth + 1) for v in value)
        if isinstance(value, dict):
            tag = next(iter(value)) if len(value) == 1 else None
            if tag == "$float":
                text = value[tag]
                if not isinstance(text, str) or text not in _SPECIAL_FLOATS:
                    raise SerializationError(f"unknown float {_brief(text)} (nan, -nan, inf, "
                                             "-inf)")
                return _SPECIAL_FLOATS[text]
            if tag == "$dim":
                return self.dim(value[tag])
            if tag == "$dtype":
                name = value[tag]
                if not isinstance(name, str) or name not in dtypes.BY_NAME:
                    raise SerializationError(f"unknown dtype {_brief(name)} (one of "
                                             f"{', '.join(dtypes.BY_NAME)})")
                return dtypes.BY_NAME[name]
            if "$array" in value:
                try:
                    return ConstValue(_decode_array(value))
                except (OverflowError, ValueError, TypeError) as exc:
                    raise SerializationError(f"bad array: {exc}") from None
            raise SerializationError(f"unknown tagged value {_brief(value)}")
        raise SerializationError(f"unexpected value {_brief(value)}")

    def dim(self, text):
        if not isinstance(text, str):
            raise SerializationError(f"a dim must be written as a string, got {_brief(text)}")
        expr = self._dims.get(text)
        if expr is None:
            expr = self._dims[text] = _parse_dim(text)
        return expr


@functools.lru_cache(maxsize=4096)
def _parse_dim(text: str):
    """A size expression from its text, parsed by shapes.as_dim: names, integers, arithmetic and
    a few functions within fixed bounds, so reading a file never evaluates Python or a huge
    power."""
    try:
        expr = as_dim(text)
    except TensorGraphsError as exc:
        raise SerializationError(str(exc)) from None
    if isinstance(expr, int):
        raise SerializationError(f"the size expression {text!r} is a plain integer; write it "
                                 "as a JSON number")
    return expr


def _decode_array(value: dict) -> np.ndarray:
    name, shape = value.get("$array"), value.get("shape")
    dtype = _dtype_from_name(name) if isinstance(name, str) else None
    if dtype is None:
        raise SerializationError(f"unknown array dtype {_brief(name)}")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise SerializationError(f"array shape must be a list of sizes, got {_brief(shape)}")
    extra = set(value) - {"$array", "shape", "data", "base64"}
    if extra or ("data" in value) == ("base64" in value):
        raise SerializationError("an array needs 'shape' and exactly one of 'data' or 'base64'")
    if "data" in value:
        if not isinstance(value["data"], list):
            raise SerializationError("array 'data' must be a flat list")
        return _decode_data(value["data"], dtype, shape)
    try:
        raw = base64.b64decode(value["base64"], validate=True)
    except (TypeError, ValueError) as exc:
        raise SerializationError(f"array 'base64' is not valid base64 ({exc})") from None
    return _from_little_endian(raw, dtype, shape)

