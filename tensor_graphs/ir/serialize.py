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

Loading checks the whole file before building any node and rebuilds nodes with ``Node.make``,
so a graph whose nodes are still alive comes back as the very same objects, and composite
nodes re-trace their decompositions. Every problem raises :class:`SerializationError`.
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import re

import ml_dtypes
import numpy as np
import sympy

from tensor_graphs.errors import SerializationError, TensorGraphsError
from tensor_graphs.files import atomic_write
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.graph import nodes as topo_nodes
from tensor_graphs.ir.node import COMPOSITE, LEAF, ConstValue, Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.shapes import as_dim

FORMAT = "tensor_graphs.graph"
VERSION = 1
INLINE_LIMIT = 1024  # constants with more elements are written as base64 bytes
_STRUCTURES = ("node", "list", "tuple")
_DIM_TEXT = re.compile(r"[A-Za-z0-9_+\-*/(), ]+")  # what a dim expression may contain
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
def load(path):
    """Read a graph written by :func:`save`; returns a node, list or tuple as it was saved."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SerializationError(f"{os.fspath(path)} is not a tensor_graphs graph file: it is "
                                 f"not valid JSON ({exc})") from None
    return from_json(doc, source=os.fspath(path))


def from_json(doc, source: str = "graph") -> Node | list | tuple:
    """Build the graph a parsed file describes (the whole file is checked first)."""
    plan, outputs, structure = _check(doc, source)
    built: list[Node] = []
    shapes = _Encoder()
    for node_id, op, inputs, attrs, name, shape, dtype in plan:
        where = f"{source}: node {node_id} ({op.name})"
        try:
            node = Node.make(op, tuple(built[k] for k in inputs), attrs, name)
        except TensorGraphsError as exc:
            raise SerializationError(f"{where} cannot be rebuilt: {exc}") from exc
        except Exception as exc:  # a hand-edited file can break an op's own assumptions
            raise SerializationError(f"{where} cannot be rebuilt: {type(exc).__name__}: "
                                     f"{exc}") from exc
        if dtype is not None and dtype != node.dtype.name:
            raise SerializationError(f"{where}: the file says dtype {dtype}, but the node "
                                     f"rebuilds as {node.dtype.name}")
        if shape is not None and shape != shapes.shape(node.shape):
            raise SerializationError(f"{where}: the file says shape {shape}, but the node "
                                     f"rebuilds with shape {list(map(str, node.shape))}")
        built.append(node)
    outs = [built[k] for k in outputs]
    if structure == "node":
        return outs[0]
    return tuple(outs) if structure == "tuple" else outs


def _check(doc, source: str):
    """Validate the file completely; return what to build, without building anything."""
    def fail(message: str):
        raise SerializationError(f"{source}: {message}")

    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        fail(f"not a tensor_graphs graph file (format {found!r}, expected {FORMAT!r})")
    version = doc.get("version")
    if version != VERSION or isinstance(version, bool):
        fail(f"unknown version {version!r}; this tensor_graphs reads version {VERSION} "
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
        label = f"node {node_id!r}" + (f" ({op_name})" if isinstance(op_name, str) else "")
        if not isinstance(node_id, int) or isinstance(node_id, bool):
            fail(f"node entry {i} has no integer 'id'")
        if node_id in position:
            fail(f"{label}: the id is used twice")
        if not isinstance(op_name, str):
            fail(f"{label}: 'op' must be an op name")
        op = OPS.get(op_name)
        if op is None:
            fail(f"{label}: unknown op '{op_name}' (not registered in this tensor_graphs; "
                 "import the module that defines it before loading)")
        inputs = rec.get("inputs", [])
        if not isinstance(inputs, list):
            fail(f"{label}: 'inputs' must be a list of ids")
        for k in inputs:
            if not isinstance(k, int) or isinstance(k, bool) or k not in position:
                fail(f"{label}: input id {k!r} is not defined before it (dangling input; "
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
        if op.kind == LEAF and op.name in ("input", "weight", "state") and not name:
            fail(f"{label}: a {op.name} leaf needs a name")
        expected = _arity(op, attrs)
        if expected is not None and len(inputs) != expected or op.variadic and not inputs:
            fail(f"{label} has {len(inputs)} inputs, expected "
                 f"{expected if expected is not None else 'at least 1'}")
        shape, dtype = rec.get("shape"), rec.get("dtype")
        if shape is not None and not isinstance(shape, list):
            fail(f"{label}: 'shape' must be a list")
        if dtype is not None and not isinstance(dtype, str):
            fail(f"{label}: 'dtype' must be a dtype name")
        position[node_id] = len(plan)
        plan.append((node_id, op, [position[k] for k in inputs], attrs, name, shape, dtype))
    outputs = doc.get("outputs")
    if not isinstance(outputs, list):
        fail("'outputs' must be a list of node ids")
    for k in outputs:
        if not isinstance(k, int) or isinstance(k, bool) or k not in position:
            fail(f"output id {k!r} is not a node of the file")
    structure = doc.get("structure", "list")
    if structure not in _STRUCTURES:
        fail(f"'structure' must be one of {', '.join(_STRUCTURES)}, got {structure!r}")
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

    def value(self, value):
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if isinstance(value, list):
            return tuple(self.value(v) for v in value)
        if isinstance(value, dict):
            if len(value) == 1 and "$float" in value:
                text = value["$float"]
                if text not in _SPECIAL_FLOATS:
                    raise SerializationError(f"unknown float {text!r} (nan, -nan, inf, -inf)")
                return _SPECIAL_FLOATS[text]
            if len(value) == 1 and "$dim" in value:
                return self.dim(value["$dim"])
            if len(value) == 1 and "$dtype" in value:
                name = value["$dtype"]
                if name not in dtypes.BY_NAME:
                    raise SerializationError(f"unknown dtype {name!r}")
                return dtypes.BY_NAME[name]
            if "$array" in value:
                try:
                    return ConstValue(_decode_array(value))
                except (OverflowError, ValueError, TypeError) as exc:
                    raise SerializationError(f"bad array: {exc}") from None
            raise SerializationError(f"unknown tagged value {json.dumps(value)[:80]}")
        raise SerializationError(f"unexpected value {value!r}")

    def dim(self, text):
        if not isinstance(text, str):
            raise SerializationError(f"a dim must be written as a string, got {text!r}")
        expr = self._dims.get(text)
        if expr is None:
            expr = self._dims[text] = _parse_dim(text)
        return expr


@functools.lru_cache(maxsize=4096)
def _parse_dim(text: str):
    """A size expression from its text; only names, integers, + - * / ** and a few functions,
    so reading a file never evaluates arbitrary Python."""
    if len(text) > 1000 or not _DIM_TEXT.fullmatch(text):
        raise SerializationError(f"{text[:80]!r} is not a size expression")
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
        raise SerializationError(f"unknown array dtype {name!r}")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise SerializationError(f"array shape must be a list of sizes, got {shape!r}")
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

