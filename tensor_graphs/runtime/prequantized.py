"""Prequantized checkpoints: the file ``tg.quantize(graph, scheme, prequantized=True)`` binds,
written once from float weights and read back with every check done before anything binds.

Why a module of its own: the models that load quantized weights (``tg.nn.Generator``,
``tg.from_torch``) build their graphs differently but read the same file, and a file that is
half right (a missing scale, a NaN scale, int4 values past a nibble, written for another
scheme) must be refused the same way for both, before a program holds any of it. The layout
itself is ``rewrite/quantize.py``'s (``LOADED``, ``prequantized_weights``): this module only
chooses which of the graph's leaves go into the file and checks what comes out of it.

The file holds, for the prequantized graph: ``<name>.q`` and ``<name>.scale`` of each
quantized weight, and the float value of every other weight that graph reads (biases, norms,
a tied embedding's table: its gather still reads float rows), never the float copy of a
quantized weight. Its metadata names the scheme and the group size, so a load with another
scheme is refused by name rather than read as numbers of the wrong meaning.

Each ``.scale``'s shape is checked against its ``.q`` and the group size before any graph is
built (:func:`file_settings`, from the header alone) and against the graph's leaf before any
value is bound (:func:`read_prequantized`, :func:`check_prequantized`). Why: a file of another
group size, an int8-dynamic file saved before its scales were grouped (one scale per output
channel), or a file written by another tool otherwise reaches the binding as a bare shape
mismatch that says neither what the file holds nor how to load it. A file without metadata
takes the group size its shapes allow when they allow one meaning only (:func:`layout_groups`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from tensor_graphs.errors import ArgumentError, SerializationError, ShapeError
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.ir.shapes import dims_equal, format_shape
from tensor_graphs.rewrite.quantize import (
    GROUP_SIZE,
    GROUPED,
    LOADED,
    group_size_for,
    prequantized_weights,
)
from tensor_graphs.rewrite.quantize import quantize as quantize_graph
from tensor_graphs.runtime.weights import (
    read_safetensors,
    read_safetensors_header,
    write_safetensors,
)

__all__ = ["save_quantized", "file_settings", "read_prequantized", "check_prequantized",
           "check_layout", "layout_groups", "is_path"]

SCHEME_KEY = "tensor_graphs.quantize"  # metadata: the scheme the file's .q/.scale are in
GROUP_KEY = "tensor_graphs.group_size"  # metadata: rows of K per scale (GROUPED schemes)
SKIP_KEY = "tensor_graphs.skip"  # metadata: JSON list of the skip patterns (weights left float)

# LOADED's kind -> the values a stored ``.q`` may hold
Q_RANGE = {
    "int8": (-128, 127),  # any int8 (the scheme writes [-127, 127]; -128 dequantizes as well)
    "int4": (-8, 7),  # a nibble, one a byte: int4's [-8, 7]
}


def is_path(weights) -> bool:
    """A file name (``str`` or path-like) rather than a mapping of arrays."""
    return isinstance(weights, (str, os.PathLike))


def _outs(outputs) -> list[Node]:
    if isinstance(outputs, Node):
        return [outputs]
    if isinstance(outputs, Mapping):
        return list(outputs.values())
    return list(outputs)


def _weight_leaves(outputs) -> dict[str, Node]:
    return {leaf.name: leaf for leaf in leaves(_outs(outputs)) if leaf.op.name == WEIGHT}


def save_quantized(path, outputs, weights: Mapping[str, np.ndarray], scheme: str, *,
                      skip: Sequence[str] = (), group_size: int | None = None,
                      metadata: Mapping[str, str] | None = None) -> list[str]:
    """Write the safetensors file that ``outputs`` (the float graph) quantized with
    ``scheme`` and ``prequantized=True`` binds, from its float ``weights``; returns the
    tensor names written. ``skip``/``group_size`` as ``tg.quantize``; loading must use the
    same ones (the group size and scheme are kept in the file's metadata).

    Refused before anything is computed or written (:func:`_check_float_weights`): a weight
    whose shape is not the graph's, and a weight to quantize holding NaN or +-inf. Why at
    saving: the first would be quantized along the wrong axis and refused only at load, and
    the second gives scales the load refuses (inf), or that no float model's values explain
    (NaN), from a file that was written as if healthy."""
    if scheme not in LOADED:
        raise ArgumentError(f"save_quantized: {scheme!r} has no prequantized form; known: "
                            f"{sorted(LOADED)} (bf16/fp16 weights are saved as float16/"
                            "bfloat16 tensors of the float checkpoint)")
    group = group_size_for(scheme, group_size, "save_quantized")
    loaded = quantize_graph(_outs(outputs), scheme, skip=skip, group_size=group,
                            prequantized=True)
    float_weights = {n: (w if isinstance(w, np.ndarray) else np.asarray(w))
                     for n, w in weights.items()}
    graph, read = _weight_leaves(outputs), _weight_leaves(loaded)
    _check_float_weights(graph, float_weights, scheme,
                         {n for n in graph if f"{n}.q" in read and f"{n}.scale" in read})
    stored = prequantized_weights(_outs(outputs), float_weights, scheme, skip=skip,
                                  group_size=group)
    arrays: dict[str, np.ndarray] = {}
    for name in _weight_leaves(loaded):
        if name in stored:
            arrays[name] = stored[name]
        elif name in float_weights:  # read as float by the quantized graph too
            arrays[name] = float_weights[name]
        else:
            raise ArgumentError(f"save_quantized: no value for weight {name!r}, which the "
                                f"{scheme} graph reads (pass the model's whole state dict)")
    if isinstance(skip, str):
        skip = (skip,)
    meta = {**(metadata or {}), SCHEME_KEY: scheme, SKIP_KEY: json.dumps(list(skip)),
            **({} if group is None else {GROUP_KEY: str(group)})}
    write_safetensors(path, arrays, meta)
    return sorted(arrays)


def _check_float_weights(graph: Mapping[str, Node], weights: Mapping[str, np.ndarray],
                         scheme: str, quantized: set[str]) -> None:
    """Refuse, naming the weight, a value whose shape is not its leaf's in the float graph
    (a linear's (N, K) weight passed as (K, N): its scales would be per input channel), and
    a weight of ``quantized`` holding a value that is not finite: a channel's max |w| is then
    NaN or inf, and so its scale; the load refuses such a file, and the float model's output
    is not finite where that weight is read (a corrupted checkpoint, a diverged run)."""
    for name in sorted(weights):
        leaf = graph.get(name)
        if leaf is None:
            continue
        w = weights[name]
        got, want = tuple(np.shape(w)), tuple(leaf.shape)
        if len(got) != len(want) or not all(dims_equal(g, d) for g, d in zip(got, want)):
            hint = (" (its transpose: a linear's weight is torch's (out, in), a matmul's "
                    "right operand (in, out))" if len(got) == 2 and got[::-1] == want else "")
            raise ShapeError(f"save_quantized: weight {name!r} has shape {format_shape(got)}, "
                             f"the graph declares {format_shape(leaf.shape)}{hint}; pass the "
                             "value the float graph binds (its tg.compile(graph).bind takes "
                             "the same)")
    for name in sorted(quantized & set(weights)):
        w = np.asarray(weights[name])
        if w.dtype.kind != "f" and w.dtype.name != "bfloat16":
            continue  # integers are finite
        finite = np.isfinite(w)
        if finite.all():
            continue
        at = tuple(int(i) for i in np.argwhere(~finite)[0])
        raise ArgumentError(f"save_quantized: weight {name!r} {format_shape(w.shape)} holds "
                            f"{float(w[at])} at {at} ({int((~finite).sum())} of {w.size} values "
                            f"not finite), which {scheme} cannot store: its scale would be "
                            "NaN or inf; repair the float weights (a corrupted checkpoint or "
                            "a diverged training run) and save again")


def file_settings(path, scheme: str | None, group_size: int | None,
                  skip: Sequence[str] = ()) -> tuple[str, int | None, tuple[str, ...]]:
    """The (scheme, group size, skip patterns) to build the graph that binds the file at
    ``path``: the caller's, checked against the file's metadata where it names them, else the
    metadata's (a file without it, written by ``prequantized_weights`` + ``write_safetensors``,
    takes the caller's, ``GROUP_SIZE`` by default). Why: the same bytes mean different numbers
    under another scheme or group size, and a weight skipped at saving has no ``.q`` to bind.
    Reads the header only."""
    header = read_safetensors_header(path)
    meta = header.metadata or {}
    stored, stored_group = meta.get(SCHEME_KEY), meta.get(GROUP_KEY)
    skip = (skip,) if isinstance(skip, str) else tuple(skip)
    if scheme is None:
        if stored is None:
            raise ArgumentError(f"{header.path} does not say which quantization it holds (no "
                                f"{SCHEME_KEY!r} metadata): pass quantize=<scheme> "
                                f"({sorted(LOADED)})")
        scheme = stored
    if scheme not in LOADED:
        raise ArgumentError(f"{header.path}: {scheme!r} has no prequantized form; known: "
                            f"{sorted(LOADED)}")
    if stored is not None and stored != scheme:
        raise ArgumentError(f"{header.path} holds {stored} weights, not {scheme}: load it "
                            f"with quantize={stored!r}, or save the model again as {scheme}")
    if group_size is not None:  # checked here, as tg.quantize checks it: the layout checks
        group_size_for(scheme, group_size, str(header.path))  # below divide by it
    pairs = _pairs({n: tuple(t.shape) for n, t in header.tensors.items()})
    if stored_group is not None and scheme in GROUPED:
        try:
            file_group = int(stored_group)
        except ValueError:
            file_group = 0
        if file_group < 1:  # (0 divided by zero in the layout check; -5 read as nonsense)
            raise SerializationError(f"{header.path}: metadata {GROUP_KEY}={stored_group!r} is "
                                     "not a positive int; save the model again")
        # the caller's group size wins only where the shapes say the metadata is stale (an
        # int8-dynamic file saved before its scales were grouped wrote int4's group there)
        if group_size is not None and group_size != file_group and (
                _misfit(scheme, pairs, file_group) is None
                or _misfit(scheme, pairs, group_size) is not None):
            raise ArgumentError(f"{header.path} was saved with groups of {file_group} "
                                f"rows, not {group_size}: load it with group_size="
                                f"{file_group} (or leave group_size out)")
        group_size = file_group if group_size is None else group_size
    elif group_size is None and scheme in GROUPED and pairs \
            and _misfit(scheme, pairs, GROUP_SIZE) is not None:
        group_size = _inferred_group(header.path, scheme, pairs)  # a file without metadata
    check_layout(header.path, pairs, scheme, GROUP_SIZE if group_size is None else group_size)
    if SKIP_KEY in meta:
        try:
            file_skip = json.loads(meta[SKIP_KEY])
        except ValueError:
            file_skip = None
        # a list of patterns only: a string's characters, a dict's keys or numbers read as
        # patterns skipped the wrong weights (a string "*" every one), or failed in fnmatch
        if not isinstance(file_skip, list) or not all(isinstance(p, str) for p in file_skip):
            raise SerializationError(f"{header.path}: metadata {SKIP_KEY}={meta[SKIP_KEY]!r} "
                                     "is not a JSON list of name patterns; save the model "
                                     "again")
        file_skip = tuple(file_skip)
        if skip and sorted(skip) != sorted(file_skip):
            raise ArgumentError(f"{header.path} was saved with skip={list(file_skip)!r}, not "
                                f"{list(skip)!r}: load it with that skip (or leave skip out)")
        skip = file_skip
    return scheme, group_size_for(scheme, group_size, str(header.path)), skip


def read_prequantized(path, outputs, scheme: str, *,
                      rename=None) -> dict[str, np.ndarray]:
    """Every weight the prequantized graph ``outputs`` (or its weight leaves, by name) reads,
    from the file at ``path``, all checked (file, names, shapes, dtypes by
    ``read_safetensors``; scales and ``.q`` values by :func:`check_prequantized`) before any
    is returned. Tensors the graph does not read (a float copy of a quantized weight) stay in
    the file, unread."""
    graph = _weight_leaves(outputs)
    wanted = {n: (tuple(leaf.shape), leaf.dtype) for n, leaf in graph.items()}
    if rename is None:  # the scales' layout first: a clearer refusal than a shape mismatch
        header = read_safetensors_header(path)
        _check_against_graph({n: tuple(t.shape) for n, t in header.tensors.items()}, graph,
                             scheme, where=os.fspath(path), error=ShapeError)
    arrays = read_safetensors(path, wanted, rename=rename)
    check_prequantized(arrays, scheme, where=os.fspath(path), error=SerializationError)
    return arrays


def check_prequantized(arrays: Mapping[str, np.ndarray], scheme: str, *, where: str,
                       error: type[Exception] = ArgumentError,
                       expected: Mapping[str, Node] | None = None) -> None:
    """Refuse, naming the tensor, values no quantizer writes: a ``.scale`` that is not
    finite and positive (a NaN scale would turn its whole channel into NaN on every call) and
    a ``.q`` outside the scheme's range (``Q_RANGE``). Only pairs present together are
    checked; a missing one is the reader's error (a missing weight). ``expected``: the
    graph's weight leaves by name, whose ``.scale`` shapes the arrays' must be
    (:func:`check_layout`'s message, a ``ShapeError``), checked first."""
    if expected is not None:
        _check_against_graph({n: tuple(np.shape(a)) for n, a in arrays.items()}, expected,
                             scheme, where=where, error=ShapeError)
    lo, hi = Q_RANGE[LOADED[scheme]]
    for name in sorted(arrays):
        if not name.endswith(".scale") or name[:-len(".scale")] + ".q" not in arrays:
            continue
        s = np.asarray(arrays[name])
        bad = ~(np.isfinite(s) & (s > 0))
        if bad.any():
            at = tuple(int(i) for i in np.argwhere(bad)[0])
            raise error(f"{where}: {name!r} holds {s[at]!r} at {at} ({int(bad.sum())} of "
                        f"{s.size} scales not finite and positive); save the weights again "
                        "from the float model (tg.save_quantized)")
        qname = name[:-len(".scale")] + ".q"
        q = np.asarray(arrays[qname])
        if q.size and (int(q.min()) < lo or int(q.max()) > hi):
            at = tuple(int(i) for i in np.argwhere((q < lo) | (q > hi))[0])
            raise error(f"{where}: {qname!r} holds {int(q[at])} at {at}, outside {scheme}'s "
                        f"[{lo}, {hi}] (is it another scheme's file?); save the weights again "
                        f"as {scheme}")


# --- the scales' layout ---------------------------------------------------------------------

def _pairs(shapes: Mapping[str, tuple]) -> dict[str, tuple[tuple, tuple]]:
    """weight name -> (its ``.q`` shape, its ``.scale`` shape), for the pairs present."""
    return {n[:-len(".scale")]: (tuple(shapes[n[:-len(".scale")] + ".q"]), tuple(shapes[n]))
            for n in sorted(shapes)
            if n.endswith(".scale") and n[:-len(".scale")] + ".q" in shapes}


def _rows(scheme: str, k: int, group: int) -> int:
    """Rows of K a weight's scale has under ``scheme`` and ``group`` (``LOADED``'s layout,
    ``rewrite/quantize.py``'s ``_loaded``)."""
    if LOADED[scheme] == "int4":
        return -(-k // group)
    if scheme == "int8-dynamic" and group < k and k % group == 0:
        return k // group
    return 1


def _readings(q: tuple, s: tuple) -> list[tuple[int, tuple[int, int]]]:
    """What a ``.q``/``.scale`` pair can be, as (K, the scale's axis of rows): a linear's
    (N, K) weight with an (N, rows) scale, or a matmul's (K, N) weight with a (rows, N) one
    (the header does not say which product reads it; both are tried)."""
    if len(q) != 2 or len(s) != 2:
        return []
    out = []
    if s[0] == q[0]:
        out.append((q[1], 1))  # linear: (N, K), scale (N, rows)
    if s[1] == q[1]:
        out.append((q[0], 0))  # matmul: (K, N), scale (rows, N)
    return out


def _misfit(scheme: str, pairs: Mapping[str, tuple[tuple, tuple]], group: int) -> str | None:
    """The first weight whose scale no reading of its shapes gives under ``group``."""
    for name, (q, s) in pairs.items():
        if not any(s[axis] == _rows(scheme, k, group) for k, axis in _readings(q, s)):
            return name
    return None


def layout_groups(scheme: str, pairs: Mapping[str, tuple[tuple, tuple]]) -> list[list[int]]:
    """The group sizes the scales' shapes allow, in classes of the same meaning (each
    class: group sizes that split every weight's K alike), smallest first. One class: the
    shapes say what the file holds; several: they do not (int4's groups of 32 and of 33 both
    give a K of 64 two scales). ``pairs``: :func:`_pairs`'s."""
    if scheme not in GROUPED or not pairs:
        return []
    ks = {name: [k for k, _ in _readings(q, s)] for name, (q, s) in pairs.items()}
    top = max((k for found in ks.values() for k in found), default=0)
    classes: dict[tuple, list[int]] = {}
    for g in range(1, top + 1):  # every g >= the largest K means what g = that K means
        if _misfit(scheme, pairs, g) is not None:
            continue
        meaning = tuple((min(g, k) if LOADED[scheme] == "int4" else
                         (g if g < k and k % g == 0 else 0)) for found in ks.values()
                        for k in found)
        classes.setdefault(meaning, []).append(g)
    return sorted(classes.values())


def _advised(scheme: str, pairs: Mapping[str, tuple[tuple, tuple]]) -> list[int]:
    """One group size per meaning the shapes allow, the plainest first: the one dividing
    the most weights' K (a group size past every K where the scales are per channel)."""
    ks = [k for q, s in pairs.values() for k, _ in _readings(q, s)]

    def plain(g: int) -> tuple[int, int]:
        return (-sum(k % g == 0 or g >= k for k in ks), g)

    return sorted((min(c, key=plain) for c in layout_groups(scheme, pairs)), key=plain)


def _inferred_group(where: str, scheme: str, pairs: Mapping[str, tuple[tuple, tuple]]) -> int:
    """The group size of a file without ``GROUP_KEY`` (another tool's), from its shapes
    where they allow one meaning; refused with the candidates otherwise."""
    classes = layout_groups(scheme, pairs)
    if len(classes) == 1:
        return _advised(scheme, pairs)[0]
    if not classes:  # no group size fits: refused, by name
        check_layout(where, pairs, scheme, GROUP_SIZE)
    advice = _advised(scheme, pairs)
    raise ArgumentError(f"{where} does not say its group size (no {GROUP_KEY!r} metadata) and "
                        f"its {scheme} scales fit groups of {advice[:4]} rows alike, each "
                        "meaning other numbers: load it with the group_size= it was written "
                        f"with (e.g. group_size={advice[0]}), or save the model again with "
                        "tg.save_quantized (which records it)")


def check_layout(where: str, pairs: Mapping[str, tuple[tuple, tuple]], scheme: str,
                 group: int) -> None:
    """Refuse, naming the tensor, a ``.scale`` whose shape ``scheme`` with groups of
    ``group`` rows does not give its ``.q``: the expected and found shapes, what the found
    one is (one scale per channel: an int8-dynamic file from before grouped scales), and the
    group size that would read it, if any."""
    name = _misfit(scheme, pairs, group)
    if name is None:
        return
    q, s = pairs[name]
    readings = _readings(q, s)
    if readings:
        k, axis = readings[0]
        want = [s[0], _rows(scheme, k, group)] if axis == 1 else [_rows(scheme, k, group), s[1]]
        expected = f"{want} (K = {k}"
        expected += f", groups of {group} rows)" if scheme in GROUPED else ", per channel)"
    else:
        expected = ("(N, rows) for a linear's (N, K) .q, (rows, N) for a matmul's (K, N): "
                    "its output channels along the .q's")
    raise ShapeError(f"{where}: {name + '.scale'!r} is {list(s)} for a {list(q)} "
                     f"{name + '.q'!r}, {scheme} needs {expected}; "
                     f"{_what(scheme, pairs, name, group)}")


def _what(scheme: str, pairs: Mapping[str, tuple[tuple, tuple]], name: str, group: int) -> str:
    """What a misfit scale looks like and the fixes, for :func:`check_layout`'s message."""
    q, s = pairs[name]
    fix = "save the model again from the float weights with tg.save_quantized"
    readings = _readings(q, s)
    old = (scheme == "int8-dynamic" and readings and all(s[axis] == 1 for _, axis in readings))
    found = ("one scale per output channel, int8-dynamic's layout before its scales were "
             "grouped: " if old else "")
    advice = _advised(scheme, pairs) if scheme in GROUPED else []
    if advice:
        meaning = (" (per channel, each activation row one scale: what it was saved as)"
                   if old else "")
        return f"{found}{fix}, or load it with group_size={advice[0]}{meaning}"
    return f"{found}{fix}"


def _check_against_graph(shapes: Mapping[str, tuple], graph: Mapping[str, Node], scheme: str,
                         *, where: str, error: type[Exception]) -> None:
    """The scales' shapes against the graph's leaves (a transposed or flattened scale, or
    rows of another group size), refused by :func:`check_layout`'s message before any
    value is read or bound."""
    for name, leaf in sorted(graph.items()):
        if not name.endswith(".scale") or name not in shapes:
            continue
        base = name[:-len(".scale")]
        want, got = tuple(int(d) for d in leaf.shape), tuple(shapes[name])
        if got == want or base + ".q" not in shapes:
            continue
        q = tuple(shapes[base + ".q"])
        advice = _advised(scheme, _pairs(shapes)) if scheme in GROUPED else []
        old = scheme == "int8-dynamic" and _readings(q, got) and all(
            got[a] == 1 for _, a in _readings(q, got))
        found = ("one scale per output channel, int8-dynamic's layout before its scales "
                 "were grouped: " if old else "")
        how = f", or load it with group_size={advice[0]}" if advice else ""
        raise error(f"{where}: {name!r} is {list(got)} for a {list(q)} {base + '.q'!r}, "
                    f"the {scheme} graph reads {list(want)}; {found}save the model again "
                    f"from the float weights with tg.save_quantized{how}")
