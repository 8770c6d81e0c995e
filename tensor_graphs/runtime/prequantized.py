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
quantized weight. Its metadata names the scheme and int4's group size, so a load with another
scheme is refused by name rather than read as numbers of the wrong meaning.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence

import numpy as np

from tensor_graphs.errors import ArgumentError, SerializationError
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.rewrite.quantize import GROUP_SIZE, LOADED, prequantized_weights
from tensor_graphs.rewrite.quantize import quantize as quantize_graph
from tensor_graphs.runtime.weights import (
    read_safetensors,
    read_safetensors_header,
    write_safetensors,
)

__all__ = ["save_quantized", "file_settings", "read_prequantized", "check_prequantized",
           "is_path"]

SCHEME_KEY = "tensor_graphs.quantize"  # metadata: the scheme the file's .q/.scale are in
GROUP_KEY = "tensor_graphs.group_size"  # metadata: rows of K per scale (GROUPED schemes)
SKIP_KEY = "tensor_graphs.skip"  # metadata: JSON list of the skip patterns (weights left float)

# schemes whose stored scales depend on the group size (rewrite/quantize.py: int4's groups,
# int8-dynamic's groups of K): a file of another group size holds other numbers
GROUPED = {"int4-weight", "int8-dynamic"}

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
    same ones (the group size and scheme are kept in the file's metadata)."""
    if scheme not in LOADED:
        raise ArgumentError(f"save_quantized: {scheme!r} has no prequantized form; known: "
                            f"{sorted(LOADED)} (bf16/fp16 weights are saved as float16/"
                            "bfloat16 tensors of the float checkpoint)")
    group = GROUP_SIZE if group_size is None else group_size
    loaded = quantize_graph(_outs(outputs), scheme, skip=skip, group_size=group,
                            prequantized=True)
    float_weights = {n: (w if isinstance(w, np.ndarray) else np.asarray(w))
                     for n, w in weights.items()}
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
    meta = {**(metadata or {}), SCHEME_KEY: scheme, GROUP_KEY: str(group),
            SKIP_KEY: json.dumps(list(skip))}
    write_safetensors(path, arrays, meta)
    return sorted(arrays)


def file_settings(path, scheme: str | None, group_size: int | None,
                  skip: Sequence[str] = ()) -> tuple[str, int, tuple[str, ...]]:
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
    if stored_group is not None and scheme in GROUPED:
        try:
            file_group = int(stored_group)
        except ValueError:
            raise SerializationError(f"{header.path}: metadata {GROUP_KEY}={stored_group!r} is "
                                     "not an int; save the model again") from None
        if group_size is not None and group_size != file_group:
            raise ArgumentError(f"{header.path} was saved with groups of {file_group} "
                                f"rows, not {group_size}: load it with group_size="
                                f"{file_group} (or leave group_size out)")
        group_size = file_group
    if SKIP_KEY in meta:
        try:
            file_skip = tuple(json.loads(meta[SKIP_KEY]))
        except (ValueError, TypeError):
            raise SerializationError(f"{header.path}: metadata {SKIP_KEY}={meta[SKIP_KEY]!r} "
                                     "is not a JSON list; save the model again") from None
        if skip and sorted(skip) != sorted(file_skip):
            raise ArgumentError(f"{header.path} was saved with skip={list(file_skip)!r}, not "
                                f"{list(skip)!r}: load it with that skip (or leave skip out)")
        skip = file_skip
    return scheme, GROUP_SIZE if group_size is None else group_size, skip


def read_prequantized(path, outputs, scheme: str, *,
                      rename=None) -> dict[str, np.ndarray]:
    """Every weight the prequantized graph ``outputs`` (or its weight leaves, by name) reads,
    from the file at ``path``, all checked (file, names, shapes, dtypes by
    ``read_safetensors``; scales and ``.q`` values by :func:`check_prequantized`) before any
    is returned. Tensors the graph does not read (a float copy of a quantized weight) stay in
    the file, unread."""
    wanted = {n: (tuple(leaf.shape), leaf.dtype) for n, leaf in _weight_leaves(outputs).items()}
    arrays = read_safetensors(path, wanted, rename=rename)
    check_prequantized(arrays, scheme, where=os.fspath(path), error=SerializationError)
    return arrays


def check_prequantized(arrays: Mapping[str, np.ndarray], scheme: str, *, where: str,
                       error: type[Exception] = ArgumentError) -> None:
    """Refuse, naming the tensor, values no quantizer writes: a ``.scale`` that is not
    finite and positive (a NaN scale would turn its whole channel into NaN on every call) and
    a ``.q`` outside the scheme's range (``Q_RANGE``). Only pairs present together are
    checked; a missing one is the reader's error (a missing weight)."""
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
