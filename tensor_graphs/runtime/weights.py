"""Weights from safetensors files: read through a memory map straight into their destination.

A safetensors file is an 8-byte little-endian header length ``N``, ``N`` bytes of JSON
(``{name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__":
{str: str}}``, offsets relative to the end of the header), then the raw little-endian tensor
bytes. :func:`read_safetensors` parses the header itself, checks the whole file and every
wanted tensor before copying a byte (so a failure never leaves part of the weights read),
maps the file read-only and copies each tensor's bytes once, from the page cache into a
freshly allocated C-contiguous array of the graph leaf's dtype. A file whose dtype differs
from the leaf's (a float16 or bfloat16 checkpoint into a float32 weight) is converted chunk
by chunk, so no second full-size temporary exists; pages already copied are dropped from
the process's mapping as it goes, so resident memory stays near one copy of the weights.

The ``safetensors`` package's own numpy loader is not used for reading: it materialises
every tensor as an intermediate array first. :func:`write_safetensors` is a small writer
(tests, ``tg.nn`` checkpoints) producing files the ``safetensors`` package reads.
"""

from __future__ import annotations

import difflib
import json
import math
import mmap
import os
import sys
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import ml_dtypes
import numpy as np

from tensor_graphs.errors import (
    ArgumentError,
    DTypeError,
    FeedError,
    SerializationError,
    ShapeError,
)
from tensor_graphs.files import atomic_write, open_regular, parse_json, path_of
from tensor_graphs.ir.dtypes import DType, as_dtype

__all__ = [
    "SAFETENSORS_DTYPES",
    "TensorInfo",
    "SafetensorsHeader",
    "read_safetensors_header",
    "read_safetensors",
    "write_safetensors",
]

#: safetensors dtype code -> numpy dtype of the bytes in the file (always little-endian).
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype(np.bool_),
}
_CODE_BY_NUMPY: dict[np.dtype, str] = {
    dt.newbyteorder("="): code for code, dt in SAFETENSORS_DTYPES.items()
}

_MAX_HEADER = 100 * 1024 * 1024  # the safetensors package's own limit
_COPY_CHUNK_BYTES = 16 * 1024 * 1024  # same-dtype copies: pages released after each chunk
_CONVERT_CHUNK_ELEMS = 1 << 20  # dtype conversion: at most this many elements in flight
_PAGE = mmap.ALLOCATIONGRANULARITY
_MAX_BYTES = np.iinfo(np.intp).max  # numpy's bound, empty axes aside


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a safetensors file, as its header describes it."""

    name: str
    dtype: str  # the safetensors code: "F32", "BF16", ...
    shape: tuple[int, ...]
    begin: int  # absolute byte offsets in the file
    end: int

    @property
    def np_dtype(self) -> np.dtype:
        return SAFETENSORS_DTYPES[self.dtype]

    @property
    def nbytes(self) -> int:
        return self.end - self.begin


@dataclass(frozen=True)
class SafetensorsHeader:
    path: str
    tensors: dict[str, TensorInfo]  # in file order
    metadata: dict[str, str] | None
    data_start: int
    file_size: int


# ---------------------------------------------------------------------------------------------
# header


# The fix for a file whose bytes are wrong: it was cut short or written by something else.
_REFETCH = "download or export the checkpoint again"


def _open(path: str) -> BinaryIO:
    """``path`` opened for reading once (the header and the data are read through the same
    descriptor, so a file replaced in between cannot pair one file's header with another's
    data); anything but a regular file is refused (``files.open_regular``)."""
    return open_regular(path, "safetensors file", _name_the_file(path))


def _name_the_file(path: str) -> str:
    """The fix for a path that is no file: a model's folder, the usual slip, has its
    checkpoints named."""
    hint = "name the .safetensors file itself"
    try:
        inside = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))[:4]
    except OSError:  # not a folder, or one we may not list
        inside = []
    return hint + (f" (the folder holds {', '.join(inside)})" if inside else "")


def _no_duplicates(path: str) -> Callable[[list[tuple[str, object]]], dict]:
    """A JSON object hook: a name given twice would leave which tensor is meant to chance."""
    def hook(pairs: list[tuple[str, object]]) -> dict:
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise SerializationError(f"{path} is not a valid safetensors file: the header "
                                         f"names {key!r} twice ({_REFETCH})")
            seen.add(key)
        return dict(pairs)
    return hook


def read_safetensors_header(path) -> SafetensorsHeader:
    """Parse and check the header of the safetensors file at ``path`` (nothing else is read).

    Raises :class:`SerializationError` naming the path and the fix when the file is missing,
    not a regular file, truncated, not a safetensors file, or its header lies (unknown dtype,
    offsets outside the data, a byte count that disagrees with the shape, overlapping tensors).
    """
    path = path_of(path, "safetensors file")
    with _open(path) as f:
        return _parse_header(f, path)


def _parse_header(f, path: str) -> SafetensorsHeader:
    try:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
        if len(prefix) < 8:
            raise SerializationError(
                f"{path} is not a safetensors file: {size} bytes, shorter than the "
                f"8-byte header length (truncated? {_REFETCH})")
        n = int.from_bytes(prefix, "little")
        if n > _MAX_HEADER or 8 + n > size:
            raise SerializationError(
                f"{path} is not a safetensors file or is truncated: its first 8 bytes "
                f"give a header of {n} bytes, the file has {size - 8} after them "
                f"({_REFETCH})")
        raw = f.read(n)
    except OSError as exc:
        raise SerializationError(f"cannot read safetensors file {path}: {exc}") from None
    if len(raw) != n:  # the file shrank under us
        raise SerializationError(f"{path}: truncated header ({len(raw)} of {n} bytes)")
    header = parse_json(raw, path, "safetensors file", _REFETCH,
                        object_pairs_hook=_no_duplicates(path))
    if not isinstance(header, dict):
        raise SerializationError(
            f"{path} is not a safetensors file: its header is a JSON "
            f"{type(header).__name__}, not an object ({_REFETCH})")

    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
            isinstance(metadata, dict)
            and all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise SerializationError(f"{path}: __metadata__ must map strings to strings "
                                 f"({_REFETCH})")

    data_start = 8 + n
    data_len = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise SerializationError(f"{where}: header entry is not an object ({_REFETCH})")
        code = entry.get("dtype")
        if not isinstance(code, str) or code not in SAFETENSORS_DTYPES:
            raise SerializationError(
                f"{where}: dtype {code!r} is not supported (supported: "
                f"{', '.join(SAFETENSORS_DTYPES)}); convert the checkpoint to one of them")
        shape = entry.get("shape")
        if not (isinstance(shape, list) and all(_is_count(d) for d in shape)):
            raise SerializationError(f"{where}: shape {shape!r} is not a list of sizes >= 0 "
                                     f"({_REFETCH})")
        if math.prod(d for d in shape if d) * SAFETENSORS_DTYPES[code].itemsize > _MAX_BYTES:
            raise SerializationError(f"{where}: shape {shape} is larger than any array can be "
                                     f"({_REFETCH})")
        offsets = entry.get("data_offsets")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(_is_count(o) for o in offsets)):
            raise SerializationError(
                f"{where}: data_offsets {offsets!r} is not a pair of offsets >= 0 "
                f"({_REFETCH})")
        begin, end = offsets
        if begin > end or end > data_len:
            raise SerializationError(
                f"{where}: data_offsets [{begin}, {end}] lie outside the {data_len} data "
                f"bytes of the file (truncated or corrupt: {_REFETCH})")
        expected = math.prod(shape) * SAFETENSORS_DTYPES[code].itemsize
        if end - begin != expected:
            raise SerializationError(
                f"{where}: data_offsets [{begin}, {end}] span {end - begin} bytes, but "
                f"{code}{list(shape)} needs {expected} ({_REFETCH})")
        tensors[name] = TensorInfo(name, code, tuple(shape), data_start + begin,
                                   data_start + end)

    spans = sorted((t for t in tensors.values() if t.nbytes), key=lambda t: t.begin)
    for a, b in zip(spans, spans[1:]):
        if b.begin < a.end:
            raise SerializationError(
                f"{path}: tensors {a.name!r} and {b.name!r} overlap (bytes "
                f"[{a.begin - data_start}, {a.end - data_start}) and "
                f"[{b.begin - data_start}, {b.end - data_start})): {_REFETCH}")
    return SafetensorsHeader(path, tensors, metadata, data_start, size)


def _is_count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


# ---------------------------------------------------------------------------------------------
# reading


def _castable(src: np.dtype, dst: np.dtype) -> bool:
    """Which file dtypes may fill which leaf dtypes: floats into any float (rounding to
    nearest even when narrowing, e.g. a float32 checkpoint into a bfloat16 model), integers
    and bools into an integer that holds every value, bool only into bool."""
    if src == dst:
        return True
    if src.kind == "f" or src == SAFETENSORS_DTYPES["BF16"]:
        return dst.kind == "f" or dst == SAFETENSORS_DTYPES["BF16"]
    if dst.kind in "iu":
        return src.kind in "iub" and np.can_cast(src, dst, "safe")
    return False


def read_safetensors(
    path,
    wanted: Mapping[str, tuple[tuple, DType]],
    *,
    strict: bool = False,
    rename: Callable[[str], str | None] | None = None,
    allocate: Callable[[str, tuple[int, ...], np.dtype], np.ndarray] | None = None,
    optional: Collection[str] = (),
) -> dict[str, np.ndarray]:
    """Read the tensors ``wanted`` (graph leaf name -> (shape, dtype)) from a safetensors file.

    A wanted shape may hold symbolic dims (anything not an ``int``): they take the file's
    size, and agreeing across tensors is the caller's rule (``CompiledGraph.bind`` binds the
    dims as a call does). ``rename`` maps each name in the file to a leaf name
    (``lambda n: n.removeprefix("model.")``); returning None ignores that tensor.
    ``strict=True`` also rejects tensors in the file that are not wanted. ``optional``: wanted
    names the file may lack (weights bound already). ``allocate(name, shape, np_dtype)`` makes
    a destination array (default: ``np.empty``; it must return a C-contiguous array of that
    shape and dtype), e.g. pinned or arena memory.

    Everything is checked before anything is copied: the file (:class:`SerializationError`),
    missing leaves with close matches and, if strict, unwanted tensors (:class:`FeedError`),
    shapes (:class:`ShapeError`), dtypes (:class:`DTypeError`). Returns ``{leaf name: array}``
    for the names in ``wanted`` the file holds (all of them but optional ones); on any error
    nothing is returned.
    """
    path = path_of(path, "safetensors file")
    with _open(path) as f:
        header = _parse_header(f, path)
        found = _match(header, wanted, strict, rename, set(optional))
        return _copy_all(f, header, found, allocate)


def read_safetensors_to_device(
    path,
    wanted: Mapping[str, tuple[tuple, DType]],
    device: str,
    *,
    strict: bool = False,
    rename: Callable[[str], str | None] | None = None,
    optional: Collection[str] = (),
) -> dict[str, object]:
    """``read_safetensors`` for weights a program keeps on GPU ``device`` ("cuda:0"): the
    same checks first (file, names, shapes, dtypes: nothing is read before they pass), then
    each tensor is loaded onto the GPU by safetensors' own torch loader, with no numpy array
    on the way, and converted to the leaf's dtype there. Returns ``{leaf name: tensor}``.
    Without the safetensors package it reads through ``read_safetensors`` and moves each
    array over (the caller's copy to the device)."""
    path = path_of(path, "safetensors file")
    with _open(path) as f:
        header = _parse_header(f, path)
        found = _match(header, wanted, strict, rename, set(optional))
    try:
        from safetensors import safe_open
    except ImportError:
        return read_safetensors(path, wanted, strict=strict, rename=rename, optional=optional)
    from tensor_graphs.devices import torch_device
    from tensor_graphs.kernels.torch.convert import torch_dtype

    out: dict[str, object] = {}
    try:
        with safe_open(path, framework="pt", device=torch_device(device)) as st:
            for name, (info, dt) in found.items():
                t = st.get_tensor(info.name)
                if tuple(t.shape) != tuple(info.shape):
                    raise SerializationError(f"{path}: tensor {info.name!r} changed while it "
                                             "was read; read it again once whatever writes "
                                             "it is done")
                want = torch_dtype(dt)
                out[name] = t if t.dtype == want else t.to(want)
    except SerializationError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors' own errors, e.g. a file changed
        raise SerializationError(f"cannot load {path} onto {device}: {type(exc).__name__}: "
                                 f"{exc}") from None
    return out


def _dim(d):
    """A wanted dim as an int, or itself when it is symbolic (any size fits)."""
    if isinstance(d, (int, np.integer)) or getattr(d, "is_Integer", False):
        return int(d)
    return d


def _fits(file_shape: tuple[int, ...], shape: tuple) -> bool:
    return len(file_shape) == len(shape) and all(
        not isinstance(want, int) or want == got for want, got in zip(shape, file_shape))


def _shown(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _match(header: SafetensorsHeader, wanted: Mapping, strict: bool, rename,
           optional: set[str]) -> dict[str, tuple[TensorInfo, DType]]:
    """Leaf name -> (the file's tensor, the leaf's dtype) for every wanted tensor the file
    holds, after checking names, shapes and dtypes (nothing is read yet)."""
    path = header.path
    want = {name: (tuple(_dim(d) for d in shape), as_dtype(dt))
            for name, (shape, dt) in wanted.items()}

    # file name -> leaf name
    by_leaf: dict[str, TensorInfo] = {}
    for fname, info in header.tensors.items():
        leaf = rename(fname) if rename is not None else fname
        if leaf is None:
            continue
        if not isinstance(leaf, str):
            raise ArgumentError(f"rename({fname!r}) returned {leaf!r}, not a str or None")
        if leaf in by_leaf:
            raise ArgumentError(
                f"{path}: tensors {by_leaf[leaf].name!r} and {fname!r} both rename to "
                f"{leaf!r}")
        by_leaf[leaf] = info

    missing = [n for n in want if n not in by_leaf and n not in optional]
    if missing:
        spare = [n for n in by_leaf if n not in want]
        parts = []
        for n in missing[:20]:
            close = difflib.get_close_matches(n, spare, n=3, cutoff=0.6)
            close += [s for s in spare if s.endswith("." + n) and s not in close][:3 - len(close)]
            parts.append(f"{n!r} (close: {', '.join(map(repr, close))})" if close else repr(n))
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        hint = (" (pass rename= to map the file's names to leaf names)"
                if any("(close:" in p for p in parts) else " (is it this model's checkpoint?)")
        raise FeedError(
            f"{path} has no tensor for {len(missing)} weight(s): {', '.join(parts)}{more}"
            f"{hint}; the file has {len(header.tensors)} tensors")
    if strict:
        extra = [n for n in by_leaf if n not in want]
        if extra:
            shown = ", ".join(repr(by_leaf[n].name) for n in extra[:20])
            more = f" and {len(extra) - 20} more" if len(extra) > 20 else ""
            raise FeedError(
                f"{path} has {len(extra)} tensor(s) no weight of the graph wants "
                f"(strict=True): {shown}{more}")

    found = {n: (by_leaf[n], dt) for n, (_, dt) in want.items() if n in by_leaf}
    bad_shapes = [(n, by_leaf[n], want[n][0]) for n in found
                  if not _fits(by_leaf[n].shape, want[n][0])]
    if bad_shapes:
        raise ShapeError(f"{path}: shapes disagree with the graph's weights: " + "; ".join(
            f"{n!r}" + (f" (file {info.name!r})" if info.name != n else "")
            + f" is {list(info.shape)} in the file, {_shown(shape)} in the graph"
            for n, info, shape in bad_shapes))
    bad_dtypes = [(n, info, dt) for n, (info, dt) in found.items()
                  if not _castable(info.np_dtype, dt.np_dtype)]
    if bad_dtypes:
        raise DTypeError(f"{path}: dtypes the graph's weights cannot take: " + "; ".join(
            f"{n!r} is {info.dtype} in the file, {dt} in the graph"
            for n, info, dt in bad_dtypes))
    return found


def _copy_all(f, header: SafetensorsHeader, found: Mapping[str, tuple[TensorInfo, DType]],
              allocate) -> dict[str, np.ndarray]:
    """Each found tensor copied from the mapped file into its own new array."""
    path = header.path
    alloc = allocate or (lambda _n, shape, dtype: np.empty(shape, dtype))
    out: dict[str, np.ndarray] = {}
    size = os.fstat(f.fileno()).st_size
    if size != header.file_size:
        raise SerializationError(f"{path} changed size while it was being read; read it "
                                 "again once whatever writes it is done")
    mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    try:
        if mm is not None and hasattr(mm, "madvise") and hasattr(mmap, "MADV_SEQUENTIAL"):
            mm.madvise(mmap.MADV_SEQUENTIAL)
        for name, (info, dt) in found.items():
            shape = info.shape
            dst = alloc(name, shape, dt.np_dtype)
            if (not isinstance(dst, np.ndarray) or dst.shape != shape
                    or dst.dtype != dt.np_dtype or not dst.flags.c_contiguous
                    or not dst.flags.writeable):
                raise ArgumentError(
                    f"allocate({name!r}) must return a writeable C-contiguous "
                    f"{dt}{list(shape)} array")
            _copy_into(mm, info, dst)
            out[name] = dst
    finally:
        if mm is not None:
            try:
                mm.close()
            except BufferError:  # a traceback still holds a view; the GC closes it
                pass
    return out


def _copy_into(mm: mmap.mmap, info: TensorInfo, dst: np.ndarray) -> None:
    """Copy one tensor's mapped bytes into ``dst`` (converting its dtype if needed), chunk
    by chunk, dropping each copied chunk's pages from this process's mapping."""
    count = dst.size
    if count == 0:
        return
    src_dtype = info.np_dtype
    if sys.byteorder != "little" and src_dtype == SAFETENSORS_DTYPES["BF16"]:
        raise DTypeError(f"{info.name!r}: bfloat16 files are read on little-endian hosts only")
    flat = dst.reshape(-1)
    itemsize = src_dtype.itemsize
    step = (max(1, _COPY_CHUNK_BYTES // itemsize) if src_dtype == dst.dtype
            else _CONVERT_CHUNK_ELEMS)
    release = getattr(mmap, "MADV_DONTNEED", None) if hasattr(mm, "madvise") else None
    for start in range(0, count, step):
        stop = min(count, start + step)
        lo = info.begin + start * itemsize
        chunk = np.frombuffer(mm, dtype=src_dtype, count=stop - start, offset=lo)
        np.copyto(flat[start:stop], chunk, casting="unsafe")
        del chunk
        if release is not None:
            page_lo = lo - lo % _PAGE
            mm.madvise(release, page_lo, info.begin + stop * itemsize - page_lo)


# ---------------------------------------------------------------------------------------------
# writing


def write_safetensors(path, arrays: Mapping[str, np.ndarray],
                      metadata: Mapping[str, str] | None = None) -> None:
    """Write ``arrays`` as a safetensors file at ``path`` (atomically: a temporary file in
    the same folder, then renamed). Tensors are laid out largest itemsize first, so each one
    starts aligned to its itemsize."""
    path = os.fspath(path)
    if metadata is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ArgumentError("safetensors metadata must map strings to strings")
    items = []
    for name, value in arrays.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ArgumentError(f"bad safetensors tensor name {name!r}")
        a = np.asarray(value)
        code = _CODE_BY_NUMPY.get(a.dtype.newbyteorder("="))
        if code is None:
            raise DTypeError(f"{name!r}: dtype {a.dtype} cannot be written to safetensors "
                             f"(supported: {', '.join(SAFETENSORS_DTYPES)})")
        items.append((name, code, a))
    items.sort(key=lambda t: (-SAFETENSORS_DTYPES[t[1]].itemsize, t[0]))

    header: dict = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    for name, code, a in items:
        header[name] = {"dtype": code, "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw += b" " * (-len(raw) % 8)

    with atomic_write(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for _name, code, a in items:
            if a.size == 0:
                continue
            want = SAFETENSORS_DTYPES[code]
            if a.dtype != want:  # big-endian input
                a = a.astype(want)
            f.write(memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8)))
