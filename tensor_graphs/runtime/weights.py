"""Weights from safetensors files: the ``safetensors`` package reads the format, we copy.

The package parses and checks the header (JSON at most 128 levels deep, dtypes, shapes, and
offsets that tile the data exactly), so a hostile header is refused by the same code everyone
else trusts; this module wraps its refusals in a :class:`SerializationError` naming the file
and the fix, opens the file first under ``files.open_regular`` (a folder or FIFO is refused
without waiting) and hands the package that same descriptor (``/proc/self/fd``), so the file
checked is the file whose bytes are copied. It adds two checks the package lacks: a tensor
named twice (the package keeps the last) and dtypes our graphs have.

The bytes themselves are copied here, through one read-only memory map, once, from the page
cache into each destination (a fresh array or the caller's ``allocate``: arena memory), chunk
by chunk: a float16 or bfloat16 checkpoint into a float32 weight is converted without a second
full-size temporary, and pages already copied are dropped from the mapping, so resident memory
stays near one copy of the weights. The package's numpy loader returns each tensor as a new
array of the file's dtype (into arena memory or another dtype: a second copy and a tensor-sized
temporary) and, like its torch loader on the CPU (which needs torch, an optional extra), keeps
every page it read mapped and resident until the file is closed; reading a 498 MB float32 file
took it 190-380 ms against 80-105 ms here (2 shared cores). For weights on a GPU
:func:`read_safetensors_to_device` uses that torch loader, which reads straight onto the device.
:func:`write_safetensors` writes through the package, atomically.
"""

from __future__ import annotations

import difflib
import functools
import math
import mmap
import os
import shutil
import sys
import tempfile
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
from tensor_graphs.files import (
    check_replaceable,
    open_regular,
    parse_json,
    path_of,
    read_regular,
    replacement_mode,
)
from tensor_graphs.ir.dtypes import DType, as_dtype

__all__ = [
    "SAFETENSORS_DTYPES",
    "TensorInfo",
    "SafetensorsHeader",
    "read_safetensors_header",
    "read_safetensors",
    "SAFETENSORS_INDEX",
    "checkpoint_path",
    "shard_map",
    "read_checkpoint",
    "checkpoint_names",
    "aliased",
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


def _same_file(f, path: str) -> str:
    """The path the package opens for the file ``f`` holds open: its descriptor's, so a file
    renamed over ``path`` since is not the one read (``path`` itself where /proc is absent)."""
    fd_path = f"/proc/self/fd/{f.fileno()}"
    return fd_path if os.path.exists(fd_path) else path


def _parse_header(f, path: str) -> SafetensorsHeader:
    """The header as the ``safetensors`` package reads and checks it (JSON, dtypes, shapes,
    offsets: contiguous, in bounds, each the size its shape needs), opened through ``f``'s
    descriptor so that the file checked is the file whose bytes are then copied."""
    try:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(8)
    except OSError as exc:
        raise SerializationError(f"cannot read safetensors file {path}: {exc}") from None
    # the two facts the package's messages leave vague, named before it is asked
    if len(prefix) < 8:
        raise SerializationError(
            f"{path} is not a safetensors file: {size} bytes, shorter than the "
            f"8-byte header length (truncated? {_REFETCH})")
    n = int.from_bytes(prefix, "little")
    if n > _MAX_HEADER or 8 + n > size:
        raise SerializationError(
            f"{path} is not a safetensors file or is truncated: its first 8 bytes "
            f"give a header of {n} bytes, the file has {size - 8} after them ({_REFETCH})")
    from safetensors import safe_open

    try:
        with safe_open(_same_file(f, path), framework="numpy") as st:
            names = list(st.offset_keys())
            metadata = st.metadata()
            entries = []
            for name in names:
                piece = st.get_slice(name)
                entries.append((name, piece.get_dtype(), tuple(piece.get_shape())))
    except Exception as exc:  # noqa: BLE001 - the package's SafetensorError, OSError
        reason = str(exc).removeprefix("Error while deserializing header: ")
        raise SerializationError(
            f"{path} is not a safetensors file or is damaged (the safetensors package refuses "
            f"it: {reason}; truncated or corrupt: {_REFETCH})") from None
    # The package lets a name given twice through (the last one wins); which tensor is meant
    # must not be left to chance. Its JSON is known sane here (the package parsed it, at most
    # 128 levels deep), so reading it once more cannot recurse without bound.
    try:
        f.seek(8)
        raw = f.read(n)
    except OSError as exc:
        raise SerializationError(f"cannot read safetensors file {path}: {exc}") from None
    parse_json(raw, path, "safetensors file", _REFETCH, object_pairs_hook=_no_duplicates(path))

    data_start = 8 + n
    tensors: dict[str, TensorInfo] = {}
    offset = data_start  # the package holds tensors contiguous, in this order, from the start
    for name, code, shape in entries:
        if code not in SAFETENSORS_DTYPES:
            raise SerializationError(
                f"{path}: tensor {name!r}: dtype {code!r} is not supported (supported: "
                f"{', '.join(SAFETENSORS_DTYPES)}); convert the checkpoint to one of them")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[code].itemsize
        tensors[name] = TensorInfo(name, code, shape, offset, offset + nbytes)
        offset += nbytes
    if offset != size:  # the package's rule; checked again since the copy trusts it
        raise SerializationError(f"{path}: its tensors cover {offset - data_start} of the "
                                 f"{size - data_start} data bytes ({_REFETCH})")
    return SafetensorsHeader(path, tensors, metadata, data_start, size)


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


#: the index transformers' ``save_pretrained`` writes beside a sharded checkpoint's files
SAFETENSORS_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
_MAX_INDEX = 64 * 1024 * 1024  # an index of a million tensors is well under this


def checkpoint_path(path) -> str:
    """The checkpoint file ``path`` names: itself, or in a model's folder (as transformers'
    ``save_pretrained`` writes it) its ``model.safetensors`` or, sharded,
    ``model.safetensors.index.json``. Why: a folder is what a user has, and a large
    checkpoint is only ever sharded."""
    path = path_of(path, "safetensors file")
    if not os.path.isdir(path):
        return path
    for name in (_SINGLE, SAFETENSORS_INDEX):
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise SerializationError(f"{path} is a folder holding neither {_SINGLE} nor "
                             f"{SAFETENSORS_INDEX} (a save_pretrained folder holds one); "
                             f"{_name_the_file(path)}")


def is_shard_index(path) -> bool:
    """Whether ``path`` (after :func:`checkpoint_path`) is a sharded checkpoint's index."""
    return os.fspath(path).endswith(".index.json")


def shard_map(index) -> dict[str, str]:
    """Tensor name -> the path of the shard holding it, from a sharded checkpoint's index
    (``{"weight_map": {name: file}}``). A shard must be a file beside the index: a name with
    a folder in it could make the index read any file."""
    index = path_of(index, "safetensors index")
    fix = f"write the checkpoint again (save_pretrained) or {_REFETCH}"
    data = parse_json(read_regular(index, "safetensors index", fix, most=_MAX_INDEX), index,
                      "safetensors index", fix)
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise SerializationError(f"{index} is not a safetensors index: it has no "
                                 '"weight_map" of tensor names to shard files; ' + fix)
    odd = sorted({v for v in weight_map.values()
                  if os.path.basename(v) != v or v in ("", ".", "..")})
    if odd:
        raise SerializationError(f"{index}: shard names {odd[:3]} are not files beside the "
                                 "index; " + fix)
    folder = os.path.dirname(index)
    return {name: os.path.join(folder, shard) for name, shard in weight_map.items()}


def checkpoint_names(path) -> set[str]:
    """The tensor names a checkpoint holds (a file, a model's folder or a sharded index),
    from its header or its index: nothing is read."""
    path = checkpoint_path(path)
    return set(shard_map(path)) if is_shard_index(path) \
        else set(read_safetensors_header(path).tensors)


def aliased(rename, aliases: Mapping[str, str], names: Collection[str]
            ) -> Callable[[str], str | None]:
    """``rename`` (as :func:`read_checkpoint` takes it; None: names as they are) that also
    gives a tensor the graph's name where the checkpoint ``names`` hold it under another name
    of the same tensor (``aliases``: a tied weight's other names -> the graph's).
    ``save_pretrained`` writes a tied tensor once: GPT-2's LM head is only in the file as
    ``transformer.wte.weight``, while ``torch.export`` names the weight ``lm_head.weight``.
    Where the file also holds the graph's own name, the alias is skipped."""
    base = renamer(rename)

    def named(fname: str) -> str | None:
        return base(fname) if base is not None else fname

    held = {named(n) for n in names}

    def renamed(fname: str) -> str | None:
        name = named(fname)
        target = aliases.get(name) if name is not None else None
        if target is None:
            return name
        return None if target in held else target

    return renamed


def read_checkpoint(path, wanted: Mapping[str, tuple[tuple, DType]], *,
                    allocate: Callable[[str, tuple[int, ...], np.dtype], np.ndarray]
                    | None = None, strict: bool = False,
                    rename: Callable[[str], str | None] | Mapping | None = None,
                    optional: Collection[str] = (), device: str | None = None
                    ) -> dict[str, object]:
    """:func:`read_safetensors` of a checkpoint: a file, a model's folder or a sharded
    checkpoint's index (:func:`checkpoint_path`), with its options; ``device`` (a GPU):
    :func:`read_safetensors_to_device`. Sharded, every check runs before any copy: the
    index's names (weights it lacks, and with ``strict`` tensors nothing wants:
    :class:`FeedError`), shards missing, truncated or damaged (:class:`SerializationError`,
    naming the shard), then each shard's names, shapes and dtypes; then each shard is read
    for the wanted tensors it holds. On any error nothing is returned."""
    path = checkpoint_path(path)

    def read(file, names, may_lack, strict):
        if device is not None:
            return read_safetensors_to_device(file, names, device, strict=strict,
                                              rename=rename, optional=may_lack)
        return read_safetensors(file, names, strict=strict, rename=rename, allocate=allocate,
                                optional=may_lack)

    if not is_shard_index(path):
        return read(path, wanted, optional, strict)
    where = shard_map(path)
    rename = renamer(rename)
    leaf_of = {}  # leaf name -> the index's tensor name
    for fname in where:
        leaf = rename(fname) if rename is not None else fname
        if leaf is not None:
            leaf_of[leaf] = fname
    missing = [n for n in wanted if n not in leaf_of and n not in optional]
    if missing:
        raise FeedError(f"{path} maps no shard to {len(missing)} weight(s): "
                        f"{', '.join(map(repr, missing[:20]))}"
                        f"{' and more' if len(missing) > 20 else ''} (is it this model's "
                        f"checkpoint?); it maps {len(where)} tensors")
    extra = [leaf_of[n] for n in leaf_of if n not in wanted] if strict else []
    if extra:
        raise FeedError(f"{path} maps {len(extra)} tensor(s) no weight of the graph wants "
                        f"(strict=True): {', '.join(map(repr, extra[:20]))}"
                        f"{' and more' if len(extra) > 20 else ''}")
    shards: dict[str, dict] = {}
    for name, spec in wanted.items():
        if name in leaf_of:
            shards.setdefault(where[leaf_of[name]], {})[name] = spec
    absent = sorted(os.path.basename(s) for s in shards if not os.path.exists(s))
    if absent:
        raise SerializationError(f"{path} names shard(s) {', '.join(absent)} that "
                                 f"{os.path.dirname(path) or '.'} lacks (an interrupted "
                                 f"download or copy?): {_REFETCH}")
    for shard, names in shards.items():  # every shard's header and names before any copy
        _match(read_safetensors_header(shard), names, False, rename, set())
    out: dict[str, object] = {}
    for shard, names in shards.items():
        out.update(read(shard, names, (), False))
    return out


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
    on the way, and converted to the leaf's dtype there. Returns ``{leaf name: tensor}``."""
    from safetensors import safe_open

    from tensor_graphs.devices import torch_device
    from tensor_graphs.kernels.torch.convert import torch_dtype

    path = path_of(path, "safetensors file")
    out: dict[str, object] = {}
    with _open(path) as f:
        header = _parse_header(f, path)
        found = _match(header, wanted, strict, rename, set(optional))
        try:
            out = _load_to_device(safe_open(_same_file(f, path), framework="pt",
                                            device=torch_device(device)), found, path,
                                  torch_dtype)
        except SerializationError:
            raise
        except Exception as exc:  # noqa: BLE001 - safetensors' own errors
            raise SerializationError(f"cannot load {path} onto {device}: "
                                     f"{type(exc).__name__}: {exc}") from None
    return out


def _load_to_device(opened, found, path: str, torch_dtype) -> dict[str, object]:
    """Each found tensor from the package's torch loader (already on the device), in the
    leaf's dtype."""
    out: dict[str, object] = {}
    with opened as st:
        for name, (info, dt) in found.items():
            t = st.get_tensor(info.name)
            if tuple(t.shape) != tuple(info.shape):
                raise SerializationError(f"{path}: tensor {info.name!r} changed while it was "
                                         "read; read it again once whatever writes it is done")
            want = torch_dtype(dt)
            out[name] = t if t.dtype == want else t.to(want)
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


def _renamed(names: Mapping, fname: str):
    return names.get(fname, fname)


def renamer(rename) -> Callable[[str], str | None] | None:
    """``rename`` as a function of a file's tensor name: a mapping's missing names stay."""
    return functools.partial(_renamed, dict(rename)) if isinstance(rename, Mapping) else rename


def _match(header: SafetensorsHeader, wanted: Mapping, strict: bool, rename,
           optional: set[str]) -> dict[str, tuple[TensorInfo, DType]]:
    """Leaf name -> (the file's tensor, the leaf's dtype) for every wanted tensor the file
    holds, after checking names, shapes and dtypes (nothing is read yet)."""
    path = header.path
    want = {name: (tuple(_dim(d) for d in shape), as_dtype(dt))
            for name, (shape, dt) in wanted.items()}

    rename = renamer(rename)  # file name -> leaf name
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
    """Write ``arrays`` as a safetensors file at ``path`` with the ``safetensors`` package
    (its layout: each tensor aligned to its itemsize), atomically: a temporary file in the same
    folder, renamed over ``path`` once whole (``files.atomic_write``). Only the dtypes
    ``read_safetensors`` reads back are written."""
    path = os.fspath(path)
    check_replaceable(path, "safetensors file")
    if metadata is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise ArgumentError("safetensors metadata must map strings to strings")
    tensors: dict[str, np.ndarray] = {}
    for name, value in arrays.items():
        if not isinstance(name, str) or name == "__metadata__":
            raise ArgumentError(f"bad safetensors tensor name {name!r}")
        a = np.asarray(value)
        code = _CODE_BY_NUMPY.get(a.dtype.newbyteorder("="))
        if code is None:
            raise DTypeError(f"{name!r}: dtype {a.dtype} cannot be written to safetensors "
                             f"(supported: {', '.join(SAFETENSORS_DTYPES)})")
        # the package writes each array's memory as it lies: C order, little-endian (a copy
        # only for views and big-endian input)
        tensors[name] = np.asarray(a, dtype=SAFETENSORS_DTYPES[code], order="C")
    meta = dict(metadata) if metadata is not None else None
    from safetensors.numpy import save_file

    # The package writes to a path it opens itself; a private folder next to ``path`` (same
    # file system) holds the file until it is whole and on disk, then one rename publishes it.
    folder = os.path.dirname(os.path.abspath(path))
    try:
        tmpdir = tempfile.mkdtemp(dir=folder, prefix="." + os.path.basename(path) + ".")
    except OSError as exc:
        raise SerializationError(f"cannot write safetensors file {path}: {exc}") from None
    try:
        tmp = os.path.join(tmpdir, "tensors.safetensors")
        save_file(tensors, tmp, metadata=meta)
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        # the package writes 0600 whatever the umask: give the mode a plain open() would, or
        # the replaced file's, so a shared checkpoint stays readable to others
        os.chmod(tmp, replacement_mode(path))
        os.replace(tmp, path)
    except Exception as exc:  # noqa: BLE001 - OSError, the package's SafetensorError
        raise SerializationError(f"cannot write safetensors file {path}: "
                                 f"{type(exc).__name__}: {exc}") from None
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
