"""The native loop: a program whose every instruction is C runs in one foreign call.

The Python loop costs microseconds per instruction; a C kernel on a tiny tensor costs tens of
nanoseconds. So where every non-view instruction of a program is a C kernel, the program runs
its Python loop once more for a dims binding it has seen before while ``kernels.c.lib``'s
``recording`` notes every C call the kernels make: the function's address, its ctypes argument
types and the argument values. The recording is accepted only when

- every non-view instruction is a C kernel that made its work through C calls (a numpy or
  torch kernel, a densifying copy of a strided input, a result copied out of the arena: not),
  or the in-place append of a kept state (``numpy_state_update`` growing its buffer), which
  becomes a built-in strided copy;
- every pointer argument lies in memory that stays put for the program: the arena, the bound
  weights and prelude results, kept-state buffers, per-dims leaves (dims, constants), buffers
  a C kernel allocated for its result (kept, reused by every later run), or an input feed
  (patched per call: a relocation); small blocks a kernel passes (ctypes arrays of strides or
  pointers, generated C's dims/strides arrays, which it declares through ``wrap(fn, blocks)``)
  are copied into blocks the recording owns, their pointers relocated too.

Then the calls become a table of records {function, signature id, arguments as int64 bit
patterns}, and a small C runner (generated per set of signatures, compiled and cached on disk
by ``kernels.c.build``) walks it with a switch over the signatures: one ctypes call per run. A
C function with an int result returns 0 when it succeeds (attention's out-of-memory, generated
C's negative integer power); a run that meets a nonzero result stops and the Python loop runs
that call again, so its error is the kernel's own.

A recording belongs to one dims binding, one binding of the weights (the prelude's results)
and the kept states' buffers; it is dropped when any of them changes, and recordings are kept
for at most ``MAX_RECORDINGS`` bindings.
"""

from __future__ import annotations

import bisect
import ctypes
import dataclasses
import hashlib
import struct
import threading
from collections.abc import Mapping

import numpy as np

from tensor_graphs.kernels import storage

RECORD_LOCK = threading.Lock()  # one recording at a time: lib.recording is process-wide
RECORD_AFTER = 2  # record on the second call with the same dims: a decode loop never repeats
MAX_RECORDINGS = 16
COPY = ("void", ("void *", "void *", "void *"))  # the built-in strided copy: signature 0

# ctypes argument/result types -> C types (pointer-sized and pointer types are "void *")
_C_TYPES: dict = {
    ctypes.c_void_p: "void *", ctypes.c_char_p: "void *",
    ctypes.c_int8: "int8_t", ctypes.c_uint8: "uint8_t", ctypes.c_int16: "int16_t",
    ctypes.c_uint16: "uint16_t", ctypes.c_int32: "int32_t", ctypes.c_uint32: "uint32_t",
    ctypes.c_int64: "int64_t", ctypes.c_uint64: "uint64_t", ctypes.c_bool: "_Bool",
    ctypes.c_float: "float", ctypes.c_double: "double", None: "void",
}


class NotNativeError(Exception):
    """Why a recording cannot become a native loop."""


def _c_type(t) -> str:
    found = _C_TYPES.get(t)
    if found is not None:
        return found
    if isinstance(t, type) and issubclass(t, ctypes._Pointer):  # noqa: SLF001
        return "void *"
    raise NotNativeError(f"an argument of ctypes type {getattr(t, '__name__', t)} has no C type "
                    "in the native runner")


def _bits(x: float) -> int:
    return struct.unpack("<q", struct.pack("<d", float(x)))[0]


def _int64(v: int) -> int:
    v = int(v) & 0xFFFFFFFFFFFFFFFF
    return v - (1 << 64) if v >> 63 else v


def _extent(a: np.ndarray) -> tuple[int, int]:
    """[first byte, one past the last byte) of an array's root buffer."""
    root = storage._root(a)  # noqa: SLF001
    start = root.__array_interface__["data"][0]
    return start, start + root.nbytes


def _data(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


class _Wrapped:
    """A ctypes function seen through a recorder: notes each call, then makes it."""

    __slots__ = ("rec", "fn", "blocks")

    def __init__(self, rec: Recorder, fn, blocks):
        self.rec, self.fn, self.blocks = rec, fn, blocks

    @property
    def restype(self):
        return self.fn.restype

    @restype.setter
    def restype(self, value):  # attention sets it on the function it got
        self.fn.restype = value

    def __call__(self, *args):
        rec = self.rec
        if rec.failure is None:
            try:
                rec.note(self.fn, args, self.blocks)
            except NotNativeError as exc:
                rec.fail(str(exc))
            except Exception as exc:  # noqa: BLE001 - recording never breaks the run itself
                rec.fail(f"cannot record a call: {type(exc).__name__}: {exc}")
        result = self.fn(*args)
        if rec.failure is None and result not in (None, 0):
            rec.fail(f"{getattr(self.fn, '__name__', 'a C function')} returned {result}")
        return result


# region kinds whose memory is the same across calls (its address is recorded as is) and
# kinds made per call (a per-dims leaf, a buffer a C kernel allocated), which a recording
# replayed at other dims replaces by buffers of its own (``native_dims``)
STABLE = frozenset({"arena", "static", "state", "anon"})


class Recorder:
    """Notes the C calls of one Python run (``lib.recording`` while it runs).

    Besides the raw table (``records``: absolute addresses, input pointers relocated), every
    argument gets a descriptor saying what it is, so that runs at several dims can be fitted
    into one recording (``native_dims``): ``("i", value)``, ``("f", bits)``, ``("null",)``,
    ``("region", key, offset)`` (into fixed memory of that key: ``("arena", device)``,
    ``("static", value)``, ``("state", name)``, ``("leaf", value)``, ``("alloc", step)``),
    ``("feed", k, offset)`` or ``("block", b, offset)``."""

    def __init__(self, own_outputs: bool = True):
        """``own_outputs``: the results of instructions marked ``own_output`` (program outputs
        made in arrays of their own, ``Executable.own_outputs``) become per-call buffers the
        recording relocates like inputs (False: kept and reused like any kernel-allocated
        result, as a recording fitted over dims keeps them)."""
        self.thread = threading.get_ident()
        self.own_outputs = own_outputs
        self.owned: list[tuple[int, tuple, np.dtype]] = []  # (input index, shape, dtype)
        self.records: list[tuple[int, tuple, list[int]]] = []  # (fn, signature, args)
        self.descs: list[list[tuple]] = []  # per record, per argument: its descriptor
        self.owners: list[str] = []  # per record: the instruction that made the call
        self.owner_steps: list[int] = []  # per record: that instruction's index (prog.trace)
        self.blocks: list[np.ndarray] = []  # owned copies of the blocks kernels passed
        # per block: a descriptor per 8-byte slot, or None (elements of another size: compared
        # as bytes)
        self.block_descs: list[list[tuple] | None] = []
        self._block_of: dict[int, tuple[np.ndarray, int]] = {}  # id(array) -> (array, index)
        self.relocs: list[tuple[tuple, int, int]] = []  # (where, input, byte offset)
        self.pending: list[tuple[int, tuple, str]] = []  # pointers resolved after the step
        self.failure: str | None = None
        self.keep: list = []  # arrays the records point into
        self.inputs: list[tuple[int, int]] = []
        self.regions: dict[tuple, tuple[int, int, np.ndarray]] = {}  # key -> start, end, root
        self.steps: list[tuple] = []  # per instruction: kernel name and what it was given
        self._starts: list[int] = []
        self._regions: list[tuple[int, int]] = []  # fixed regions, sorted by start
        self._keys: list[tuple] = []  # their keys, in the same order
        self._mark = 0
        self._step = ""
        self._index = -1

    # ---------------------------------------------------------------- regions
    def fixed(self, a: np.ndarray, key: tuple | None = None) -> None:
        """Memory that stays put for the program (its root buffer); ``key`` names it the same
        way in every run (see the class doc)."""
        start, end = _extent(a)
        i = bisect.bisect_left(self._regions, (start, end))
        if i < len(self._regions) and self._regions[i] == (start, end):
            return
        key = ("anon", start) if key is None else key
        self._regions.insert(i, (start, end))
        self._starts.insert(i, start)
        self._keys.insert(i, key)
        self.regions.setdefault(key, (start, end, storage._root(a)))  # noqa: SLF001
        self.keep.append(a)

    def input(self, a: np.ndarray) -> None:
        start = _data(a)
        self.inputs.append((start, start + a.nbytes))

    def overlapping(self) -> bool:
        """Inputs that share bytes with each other or with fixed memory: their pointers
        would be ambiguous."""
        spans = sorted(self.inputs)
        for (_, e0), (s1, _) in zip(spans, spans[1:]):
            if s1 < e0:
                return True
        return any(s < fe and fs < e for s, e in spans for fs, fe in self._regions)

    def _region_at(self, p: int) -> int | None:
        """The index of the fixed region ``p`` lies in (strictly: a temporary may start where
        a region ends), or None."""
        i = bisect.bisect_right(self._starts, p) - 1
        if i >= 0 and p < self._regions[i][1]:
            return i
        for j, (s, e) in enumerate(self._regions):  # regions may nest
            if s <= p < e:
                return j
        return None

    def _fixed_at(self, p: int) -> bool:
        return self._region_at(p) is not None

    def _input_at(self, p: int) -> tuple[int, int] | None:
        for k, (s, e) in enumerate(self.inputs):
            if s <= p < e:
                return k, p - s
        return None

    def _fixed_desc(self, p: int) -> tuple | None:
        i = self._region_at(p)
        if i is None:
            return None
        return ("region", self._keys[i], p - self._regions[i][0])

    # ---------------------------------------------------------------- calls
    def wrap(self, fn, blocks=()):
        """``fn`` as the kernel should call it: recorded when called from this thread.
        ``blocks``: small arrays its integer pointer arguments may point into (copied)."""
        if threading.get_ident() != self.thread:
            return fn
        return _Wrapped(self, fn, blocks)

    def fail(self, reason: str) -> None:
        if self.failure is None:
            self.failure = f"{self._step}: {reason}" if self._step else reason

    def note(self, fn, args: tuple, declared) -> None:
        types = fn.argtypes
        name = getattr(fn, "__name__", "a C function")
        if types is None or len(types) != len(args):
            raise NotNativeError(f"{name} has no declared argument types")
        ret = _C_TYPES.get(fn.restype)
        if ret not in ("void", "int32_t"):
            raise NotNativeError(f"{name} returns {getattr(fn.restype, '__name__', fn.restype)}, "
                            "which a kernel would read")
        ctypes_sig = tuple(_c_type(t) for t in types)
        index = len(self.records)
        values: list[int] = []
        descs: list[tuple] = []
        self.descs.append(descs)  # (pointers resolved later fill their slots in)
        for k, (c, v) in enumerate(zip(ctypes_sig, args)):
            if c == "void *":
                descs.append(("null",))
                values.append(self._pointer(v, ("arg", index, k), declared, name))
            elif c in ("float", "double"):
                values.append(_bits(v))
                descs.append(("f", values[-1]))
            else:
                values.append(_int64(v.value if isinstance(v, ctypes._SimpleCData) else v))
                descs.append(("i", values[-1]))
        address = ctypes.cast(fn, ctypes.c_void_p).value
        self.owners.append(self._step)
        self.owner_steps.append(self._index)
        self.records.append((address, ("int" if ret == "int32_t" else "void", ctypes_sig),
                             values))

    def _pointer(self, v, where: tuple, declared, name: str) -> int:
        if v is None:
            return 0
        if isinstance(v, ctypes.c_void_p):
            v = v.value or 0
        if isinstance(v, (int, np.integer)):
            return self._address(int(v), where, declared)
        if isinstance(v, ctypes.Array):
            b = self._array_block(v, declared, name)
            self._describe(where, ("block", b, 0))
            return _data(self.blocks[b])
        raise NotNativeError(f"{name} takes a {type(v).__name__} as a pointer argument")

    def _address(self, p: int, where: tuple, declared=()) -> int:
        if p == 0:
            self._describe(where, ("null",))
            return 0
        found = self._input_at(p)
        if found is not None:
            self.relocs.append((where, found[0], found[1]))
            self._describe(where, ("feed", found[0], found[1]))
            return 0
        desc = self._fixed_desc(p)
        if desc is not None:
            self._describe(where, desc)
            return p
        for a in declared:
            start = _data(a)
            if start <= p < start + a.nbytes:
                copy, index = self._copy_block(a)
                self._describe(where, ("block", index, p - start))
                return _data(copy) + (p - start)
        self.pending.append((p, where, "a pointer argument"))
        return 0

    def _describe(self, where: tuple, desc: tuple) -> None:
        if where[0] == "arg":
            self.descs[where[1]][where[2]] = desc
        else:
            slots = self.block_descs[where[1]]
            if slots is not None:
                slots[where[2]] = desc

    def _copy_block(self, a: np.ndarray) -> tuple[np.ndarray, int]:
        found = self._block_of.get(id(a))
        if found is None or found[0] is not a:
            raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
            copy = np.zeros((raw.size + 7) // 8, np.int64)
            copy.view(np.uint8)[:raw.size] = raw
            self.blocks.append(copy)
            ints = a.dtype == np.int64 and a.flags.c_contiguous
            self.block_descs.append([("i", int(v)) for v in copy] if ints else None)
            found = self._block_of[id(a)] = (a, len(self.blocks) - 1)
            self.keep.append(a)  # its id stays unique while the recording lives
        return self.blocks[found[1]], found[1]

    def _array_block(self, v: ctypes.Array, declared, name: str) -> int:
        size = ctypes.sizeof(v)
        block = np.zeros((size + 7) // 8, np.int64)
        ctypes.memmove(_data(block), ctypes.addressof(v), size)
        self.blocks.append(block)
        b = len(self.blocks) - 1
        elem = v._type_
        if elem is ctypes.c_void_p or (isinstance(elem, type)
                                       and issubclass(elem, ctypes._Pointer)):  # noqa: SLF001
            self.block_descs.append([("null",)] * len(block))
            for j in range(len(v)):
                p = int(block[j]) & 0xFFFFFFFFFFFFFFFF
                block[j] = _int64(self._address(p, ("block", b, j), declared))
        elif ctypes.sizeof(elem) not in (1, 2, 4, 8) or elem in (ctypes.c_char_p,):
            raise NotNativeError(f"{name} takes an array of {elem.__name__}")
        else:
            eight = ctypes.sizeof(elem) == 8 and elem not in (ctypes.c_double,)
            self.block_descs.append([("i", int(x)) for x in block] if eight else None)
        return b

    def _resolve(self, p: int, where: tuple) -> int:
        found = self._input_at(p)
        if found is not None:
            self.relocs.append((where, found[0], found[1]))
            self._describe(where, ("feed", found[0], found[1]))
            return 0
        desc = self._fixed_desc(p)
        if desc is not None:
            self._describe(where, desc)
            return p
        raise NotNativeError("a pointer argument points outside the program's memory (a temporary "
                        "array the kernel made per call)")

    def _set(self, where: tuple, value: int) -> None:
        if where[0] == "arg":
            self.records[where[1]][2][where[2]] = value
        else:
            self.blocks[where[1]][where[2]] = _int64(value)

    # ---------------------------------------------------------------- steps
    def begin_step(self, name: str, index: int = -1) -> None:
        self._step, self._index = name, index

    def after(self, ins, attrs: Mapping, given: list, args: list, raw, out) -> None:
        """Judge one instruction once it has run (``attrs``: its attributes at these dims,
        ``given``: its input values, ``args``: what the kernel got, ``raw``: what it
        returned, ``out``: the value kept)."""
        if self.failure is not None:
            return
        calls = len(self.records) - self._mark
        self._mark = len(self.records)
        k = ins.kernel
        try:
            if any(a is not g for a, g in zip(args, given)):
                raise NotNativeError("a strided input is copied to a dense one per call")
            if raw is not out:
                raise NotNativeError("its result is copied out of the arena per call")
            if k is not None and k.view:
                if out.size and not (self._fixed_at(_data(out))
                                     or self._input_at(_data(out))):
                    raise NotNativeError("the view kernel returned a copy")
            elif k is not None and k.name == "numpy_state_update":
                self._state_append(given, out, attrs)
            elif k is not None and k.backend == "c":
                if not calls and out.size:
                    raise NotNativeError("the C kernel made no C call")
                if out.size and not (self._fixed_at(_data(out)) or self._input_at(_data(out))):
                    if self.own_outputs and getattr(ins, "own_output", False) \
                            and out.base is None \
                            and out.flags.c_contiguous:
                        # a program output: a new array each run, relocated like an input
                        self.input(out)
                        self.owned.append((len(self.inputs) - 1, out.shape, out.dtype))
                    else:  # allocated by the kernel: kept and reused by every run
                        self.fixed(out, ("alloc", self._index))
            else:
                backend = getattr(k, "backend", "?")
                raise NotNativeError(f"a {backend} kernel runs in Python")
            pending, self.pending = self.pending, []
            for p, where, _ in pending:
                self._set(where, self._resolve(p, where))
            self.steps.append((k.name if k is not None else ins.name,
                               bool(k is not None and k.view), calls,
                               tuple((g.shape, g.strides) for g in given),
                               repr(sorted(attrs.items())), out.shape, out.strides))
        except NotNativeError as exc:
            self.fail(str(exc))
        except Exception as exc:  # noqa: BLE001 - recording never breaks the run itself
            self.fail(f"cannot record: {type(exc).__name__}: {exc}")

    def _state_append(self, given: list, out: np.ndarray, attrs: Mapping) -> None:
        state, value = given[0], given[1]
        if storage._root(out) is not storage._root(state) \
                or (state.size and _data(out) != _data(state)):  # noqa: SLF001
            raise NotNativeError("the state update copied the state (it is not appended in place)")
        axis, offset = int(attrs["axis"]), int(attrs["offset"])
        index = [slice(None)] * out.ndim
        index[axis] = slice(offset, offset + value.shape[axis])
        dst = out[tuple(index)]
        if dst.size == 0:
            return
        block = np.array([dst.ndim, dst.itemsize, *dst.shape, *dst.strides, *value.strides],
                         np.int64)
        self.blocks.append(block)
        self.block_descs.append([("i", int(v)) for v in block])
        index = len(self.records)
        self.descs.append([("null",), ("null",), ("block", len(self.blocks) - 1, 0)])
        args = [0, 0, _data(block)]
        self.owners.append(self._step)
        self.owner_steps.append(self._index)
        self.records.append((0, COPY, args))
        args[0] = self._address(_data(dst), ("arg", index, 0))
        args[1] = self._address(_data(value), ("arg", index, 1))

    # ---------------------------------------------------------------- result
    def _check_outputs(self, outputs: list) -> None:
        if self.failure is not None:
            raise NotNativeError(self.failure)
        owned = {k for k, _, _ in self.owned}
        for o in outputs:
            found = self._input_at(_data(o)) if o.size else None
            if found is not None and found[0] in owned:
                if found[1] or o.base is not None:
                    raise NotNativeError("an output is a view of another output")
                continue
            if found is not None:
                raise NotNativeError("an output is a view of an input")
            if o.size and not self._fixed_at(_data(o)):
                raise NotNativeError("an output lies outside the program's memory")

    def finish(self, outputs: list) -> Recording:
        self._check_outputs(outputs)
        return Recording(self, outputs)

    def sample(self, outputs: list, values: tuple[int, ...], states: tuple = ()) -> Sample:
        """This run as one sample for fitting recordings at several dims (``native_dims``);
        ``values``: the dims' values (in the program's symbols order), ``states``: (name,
        buffer, first byte, strides) of each kept state it read."""
        self._check_outputs(outputs)
        described = []
        for o in outputs:
            desc = self._fixed_desc(_data(o)) if o.size else ("null",)
            if desc is None:
                raise NotNativeError("an output lies outside the program's memory")
            described.append((desc, o.shape, o.strides, o.dtype))
        return Sample(values, [(fn, sig) for fn, sig, _ in self.records], self.owners,
                      self.descs, self.blocks, self.block_descs, self.regions, described,
                      self.steps, len(self.inputs), tuple(states), self.keep)


@dataclasses.dataclass(frozen=True, eq=False)
class Sample:
    """One recorded run described for fitting (see ``Recorder``'s descriptors)."""

    values: tuple[int, ...]  # the dims' values
    calls: list[tuple[int, tuple]]  # (function address, signature)
    owners: list[str]  # the instruction that made each call
    descs: list[list[tuple]]
    blocks: list[np.ndarray]
    block_descs: list[list[tuple] | None]
    regions: dict[tuple, tuple[int, int, np.ndarray]]
    outputs: list[tuple]  # (descriptor of its first byte, shape, strides, dtype)
    # per instruction: (kernel, is a view, C calls, inputs, attributes, shape, strides)
    steps: list[tuple]
    inputs: int
    states: tuple  # (name, buffer, first byte, strides) of each kept state read
    keep: list  # the arrays its addresses point into, alive while it is


class Recording:
    """A table of C calls and the runner that makes them in one foreign call."""

    def __init__(self, rec: Recorder, outputs: list):
        sigs = [COPY] + sorted({s for _, s, _ in rec.records if s != COPY})
        sig_id = {s: i for i, s in enumerate(sigs)}
        width = max((len(a) for _, _, a in rec.records), default=0)
        self.stride = 2 + width
        self.count = len(rec.records)
        self.table = np.zeros((max(self.count, 1), self.stride), np.int64)
        for i, (fn, sig, args) in enumerate(rec.records):
            self.table[i, 0] = _int64(fn)
            self.table[i, 1] = sig_id[sig]
            self.table[i, 2:2 + len(args)] = [_int64(a) for a in args]
        base = _data(self.table)
        rows = []
        for where, k, off in rec.relocs:
            if where[0] == "arg":
                addr = base + 8 * (where[1] * self.stride + 2 + where[2])
            else:
                addr = _data(rec.blocks[where[1]]) + 8 * where[2]
            rows.append((addr, 1 + k, off))
        self.patches = np.array(rows or [(0, 0, 0)], np.int64)  # relocations: input + offset
        self.npatches = len(rows)
        self.bases = np.zeros(1 + max(len(rec.inputs), 1), np.int64)  # [0] stays 0
        self.blocks = rec.blocks
        self.keep = rec.keep
        self.outputs = outputs
        # the outputs made anew each run: their arrays follow the inputs (relocated alike)
        self.made = [(shape, dtype) for _, shape, dtype in rec.owned]
        slot_of = {k: j for j, (k, _, _) in enumerate(rec.owned)}
        self.slots: list[int | None] = []  # per output: its array in ``made``, or None
        for o in outputs:
            found = rec._input_at(_data(o)) if o.size else None  # noqa: SLF001
            self.slots.append(None if found is None else slot_of[found[0]])
        self.owned = frozenset(p for p, j in enumerate(self.slots) if j is not None)
        self.signatures = sigs
        self.owner_steps = tuple(rec.owner_steps)  # (runtime/trace.py runs it step by step)
        self.run_fn = runner(tuple(sigs))
        self._args = (_data(self.table), self.count, self.stride, _data(self.patches),
                      self.npatches, 3, _data(self.bases), 0)

    def fresh(self) -> list[np.ndarray]:
        """New arrays for the outputs this recording makes anew each run (after the feeds in
        ``run``'s inputs)."""
        return [np.empty(shape, dtype) for shape, dtype in self.made]

    def results(self, made: list[np.ndarray]) -> list:
        """The outputs of a run given ``made`` (``fresh``): those arrays where an output is
        one, the recorded buffers (reused by every run) elsewhere."""
        return [o if j is None else made[j] for o, j in zip(self.outputs, self.slots)]

    def run(self, inputs: list[np.ndarray]) -> int:
        """Run the table with these input arrays (the feeds, then ``fresh``'s); 0, or 1 + the
        index of a failed call."""
        bases = self.bases
        for k, a in enumerate(inputs):
            bases[k + 1] = _data(a)
        return self.run_fn(*self._args)


# ---------------------------------------------------------------------------- the runner
_runners: dict[tuple, object] = {}
_runner_lock = threading.Lock()

_PRELUDE = r"""
#include <stdint.h>
#include <string.h>

static int64_t tg_runs = 0;    /* foreign calls into the runner (tests count them) */
static int64_t tg_called = 0;  /* C functions it called */
int64_t tg_native_runs(void) { return tg_runs; }
int64_t tg_native_called(void) { return tg_called; }

static inline double tg_f64(int64_t v) { double d; memcpy(&d, &v, 8); return d; }
#define P(v) ((void *)(intptr_t)(v))

/* b: ndim, itemsize, shape[ndim], destination strides[ndim], source strides[ndim] (bytes) */
static void tg_copy(char *dst, const char *src, const int64_t *b) {
    int64_t nd = b[0], item = b[1];
    const int64_t *shape = b + 2, *ds = shape + nd, *ss = ds + nd;
    int64_t idx[64] = {0};
    if (nd > 64) return;
    for (int64_t i = 0; i < nd; i++) if (shape[i] == 0) return;
    if (nd == 0) { memcpy(dst, src, (size_t)item); return; }
    int64_t last = nd - 1, n = shape[last];
    int dense = ds[last] == item && ss[last] == item;
    for (;;) {
        int64_t od = 0, os = 0;
        for (int64_t i = 0; i < last; i++) { od += idx[i] * ds[i]; os += idx[i] * ss[i]; }
        if (dense) memcpy(dst + od, src + os, (size_t)(n * item));
        else for (int64_t j = 0; j < n; j++)
            memcpy(dst + od + j * ds[last], src + os + j * ss[last], (size_t)item);
        int64_t i = last - 1;
        while (i >= 0 && ++idx[i] == shape[i]) idx[i--] = 0;
        if (i < 0) return;
    }
}
"""


def runner_source(signatures: tuple) -> str:
    """The runner for these signatures: (result "void"/"int", C argument types) each, the
    first being the built-in copy."""
    cases = []
    for i, (ret, types) in enumerate(signatures):
        if i == 0:
            cases.append("        case 0: tg_copy((char *)P(a[2]), (const char *)P(a[3]), "
                         "(const int64_t *)P(a[4])); break;")
            continue
        params = ", ".join(types) or "void"
        args = []
        for k, t in enumerate(types):
            v = f"a[{2 + k}]"
            if t == "void *":
                args.append(f"P({v})")
            elif t in ("float", "double"):
                args.append(f"({t})tg_f64({v})")
            else:
                args.append(f"({t}){v}")
        call = f"(({'int' if ret == 'int' else 'void'} (*)({params}))P(a[0]))({', '.join(args)})"
        if ret == "int":
            cases.append(f"        case {i}: if ({call}) return i + 1; break;")
        else:
            cases.append(f"        case {i}: {call}; break;")
    return _PRELUDE + "\n".join([
        "int64_t tg_native_run(int64_t *table, int64_t n, int64_t stride,",
        "                      const int64_t *patches, int64_t npatches, int64_t pstride,",
        "                      const int64_t *bases, const int64_t *mono) {",
        "    tg_runs++;",
        "    for (int64_t r = 0; r < npatches; r++) {",
        "        const int64_t *p = patches + r * pstride;",
        "        int64_t v = bases[p[1]] + p[2];",
        "        for (int64_t j = 3; j < pstride; j++) v += p[j] * mono[j - 3];",
        "        *(int64_t *)P(p[0]) = v;",
        "    }",
        "    for (int64_t i = 0; i < n; i++) {",
        "        const int64_t *a = table + i * stride;",
        "        tg_called++;",
        "        switch (a[1]) {",
        *cases,
        "        default: return i + 1;",
        "        }",
        "    }",
        "    return 0;",
        "}", ""])


def runner(signatures: tuple):
    """The compiled runner's entry point for these signatures (built once, cached on disk)."""
    with _runner_lock:
        fn = _runners.get(signatures)
        if fn is None:
            from tensor_graphs.kernels.c.build import load_library

            source = runner_source(signatures)
            digest = hashlib.blake2b(source.encode(), digest_size=6).hexdigest()
            library = load_library(f"tg_native_{digest}", source)
            fn = library.tg_native_run
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                           ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int64
            fn._tg_library = library  # noqa: SLF001 - counters for tests
            _runners[signatures] = fn
        return fn


def counters() -> dict[str, int]:
    """Foreign calls into every runner built in this process, and the C calls they made."""
    runs = called = 0
    with _runner_lock:
        libraries = {id(f._tg_library): f._tg_library for f in _runners.values()}  # noqa: SLF001
    for library in libraries.values():
        for name in ("tg_native_runs", "tg_native_called"):
            getattr(library, name).restype = ctypes.c_int64
        runs += library.tg_native_runs()
        called += library.tg_native_called()
    return {"runs": runs, "called": called}


# ---------------------------------------------------------------------------- per program
class NativeLoop:
    """An executable's recordings, one per dims binding, the recording fitted over several dims
    (``native_dims``), and why the last call ran where."""

    def __init__(self):
        self.recordings: dict[tuple, object] = {}  # key -> (Recording, checks) or a reason
        self.seen: dict[tuple, int] = {}
        self.last = "python loop: not run yet"
        # recordings at distinct dims, fitted into one replayed at any dims once enough agree:
        # the fitted DimsRecording, a reason it cannot be made, or None while sampling
        self.symbolic = None
        self.samples: list = []
        self._generation = None

    def lookup(self, key: tuple, generation: int, arrays: Mapping) -> Recording | None:
        found = self.recordings.get(key)
        if found is None or isinstance(found, str):
            return None
        recording, gen, states = found
        if gen != generation or not states_hold(states, arrays):
            del self.recordings[key]  # weights re-bound or a state buffer replaced
            return None
        return recording

    def wants(self, key: tuple) -> bool:
        """Record on this call? (Not for a binding that failed, nor a first sighting.)"""
        if key in self.recordings:
            return False
        if len(self.seen) > 4 * MAX_RECORDINGS:
            self.seen.clear()
        n = self.seen[key] = self.seen.get(key, 0) + 1
        return n >= RECORD_AFTER

    def store(self, key: tuple, value) -> None:
        if len(self.recordings) >= MAX_RECORDINGS:
            self.recordings.pop(next(iter(self.recordings)))
        self.recordings[key] = value

    # ------------------------------------------------------------------ across dims
    def fitted(self, generation: int, arrays: Mapping, values: tuple[int, ...]):
        """The recording fitted over several dims if it replays these (same weights and state
        buffers, pinned dims equal), else None; weights re-bound or a state buffer replaced
        start the sampling again."""
        sym = self.symbolic
        if sym is None or isinstance(sym, str):
            return None
        if sym.generation != generation or not states_hold(sym.states, arrays):
            self.symbolic, self.samples = None, []
            return None
        return sym if sym.replays(values) else None

    def wants_sample(self, generation: int, values: tuple[int, ...]) -> bool:
        """Record this call as a sample for the fit? (While no fit is made or refused, at dims
        not sampled yet.)"""
        if self.symbolic is not None:
            return False
        if generation != self._generation:
            self.samples, self._generation = [], generation
        return all(s.values != values for s in self.samples)

    def add_sample(self, sample: Sample, context) -> None:
        """Keep ``sample`` and fit the samples when there are enough (``native_dims.fit``):
        the fitted recording, or the reason none can be made, replaces the sampling."""
        from tensor_graphs.runtime import native_dims

        self.samples.append(sample)
        try:
            found = native_dims.fit(self.samples, context)
        except NotNativeError as exc:
            found = f"python loop: dims change every call and {exc}"
        if found is None and len(self.samples) >= native_dims.MAX_SAMPLES:
            found = (f"python loop: {len(self.samples)} calls at distinct dims did not determine "
                     "the dims' effect on the C calls (too few distinct values)")
        if found is not None:
            self.symbolic, self.samples = found, []

    def refuse(self, reason: str) -> None:
        """No recording fitted over dims for this program (``reason``: why)."""
        self.symbolic, self.samples = reason, []


def states_hold(states, arrays: Mapping) -> bool:
    """Every kept state is still fed as the same view of the same buffer (name, buffer, first
    byte, strides). The first byte is implied: a call the native loop runs feeds no state
    itself, so each is its buffer's active prefix, which starts where the buffer does."""
    for name, root, _, strides in states:
        a = arrays[name]
        if a.base is not root and storage._root(a) is not root or a.strides != strides:  # noqa: SLF001
            return False
    return True
