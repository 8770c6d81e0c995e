"""Lowering: a plan and its memory plan become a ``Program``, the flat record a runtime runs.

Every resolved slot of the plan is numbered (a value index); each step becomes an
``Instruction`` over those indices. What the memory plan decides, the program takes from it
rather than working it out again:

- **prelude membership**: a step whose value is static (``ir.graph.is_static``: fixed for one
  weight binding) runs once per binding, in the prelude, and its value is kept with the
  weights; every other step runs per call. Static leaves are bound once too.
- **frees**: an instruction drops a value after its last use (``Value.last`` of the memory
  plan's liveness), unless it is static or an output.
- **places**: a kernel that writes into a given buffer writes its result at the value's arena
  offset (in the arena of the value's device); a view kernel whose result the memory plan lays
  out as a copy copies.
- **devices**: every instruction says where its arguments and its result live (``reads``,
  ``device``: "cpu" values are numpy arrays, "cuda" values torch tensors); a copy from the host
  to a GPU of an input leaf is marked (``copy_in``), so a feed already on the GPU is used as is.

A plan made for bounds keeps its symbolic dims; ``at`` is the same plan at the bounds (steps
in the same order), which the memory plan laid out, so the two are matched by position.
Kernels that take an argument prepared at bind time (a GEMM's packed weight) read a prepared
value: one more static value where the argument is static, a preparation per call elsewhere.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import sympy

from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import INPUT, STATE
from tensor_graphs.ir.shapes import free_symbols
from tensor_graphs.kernels.copy import placement as kernel_placement
from tensor_graphs.memory.liveness import ARENA, analyze
from tensor_graphs.memory.plan import MemoryPlan
from tensor_graphs.planner.plan import Plan, Slot


@dataclass(frozen=True, eq=False)
class Instruction:
    fn: Callable
    args: tuple[int, ...]  # value indices
    attrs: dict  # may hold symbolic dims (a reshape to (batch, seq, 768)): see ``bound``
    out: int
    free: tuple[int, ...]  # values whose last use is here
    name: str  # the kernel's name, for errors
    shape: tuple  # the result's expected shape (symbolic dims allowed)
    contiguous: bool  # the kernel reads its inputs as dense C-order buffers
    place: tuple | None = None  # (device, byte offset, bytes): write into the arena there
    fresh: bool = True  # the kernel returns a new array (not a view, not into the arena)
    kernel: object = None
    input_shapes: tuple = ()  # the kernel's arguments' shapes (symbolic), for constraints
    dtypes: tuple = ()
    dtype: object = None  # the result's numpy dtype
    device: str = "cpu"  # the device kind the result lives on ("cuda": a torch tensor)
    reads: str = "cpu"  # the device kind the kernel reads its arguments on
    copy_in: bool = False  # copies an input leaf from the host to a GPU (a GPU feed skips it)
    # values the kernel stores besides its result (``Step.also``), -1 where it drops one, and
    # per value its (device, byte offset, bytes) in the arena or None (the runtime allocates):
    # the kernel gets them as ``also=`` arrays of the result's shape (None for a dropped one)
    also: tuple[int, ...] = ()
    also_places: tuple = ()
    also_dtypes: tuple = ()
    # a state_update that may write the state's new version over the old one in place (no
    # later step reads the old version): the values to check at run time for memory shared
    # with the state (made before it, read after it); None: never in place (see _overwrites)
    overwrite: tuple[int, ...] | None = None
    # a program output the kernel makes in an array of its own each call, returned without
    # a copy (``Executable.own_outputs``), though the memory plan gave it arena bytes
    own_output: bool = False


class LeafValue(NamedTuple):
    """A leaf's value index and node (the runtime loads it: fed, bound or constant)."""

    index: int
    node: Node


@dataclass(frozen=True, eq=False)
class Prepared:
    """A static value prepared once per binding for a kernel (a GEMM's packed weight)."""

    index: int  # the prepared value
    source: int  # the static value it is prepared from
    prepare: Callable
    dense: bool  # the source is made dense first (the kernel reads it densely)
    shape: tuple  # the source's shape (symbolic dims allowed)
    key: tuple  # (source, preparation, dense): instructions preparing the same share it


@dataclass(frozen=True, eq=False)
class Program:
    """A lowered plan: what ``Executable`` runs, with nothing left to work out."""

    plan: Plan  # the plan lowered (symbolic dims kept when it was planned for bounds)
    at: Plan  # the plan at concrete dims that ``memory`` laid out (``plan`` when concrete)
    memory: MemoryPlan | None  # None: no arena (every kernel allocates its result)
    size: int  # how many values
    leaves: tuple[LeafValue, ...]
    prelude: tuple[Instruction, ...]  # static steps: once per weight binding
    instructions: tuple[Instruction, ...]  # the per-call steps, in order
    prepared: tuple[Prepared, ...]  # made once per binding, after the prelude
    outputs: tuple[int, ...]
    static: tuple[int, ...]  # static values the per-call steps or the outputs read: kept
    dense_static: tuple[int, ...]  # static views made dense once (a kernel reads them densely)
    inputs: tuple[LeafValue, ...]  # the leaves fed per call
    symbols: tuple[sympy.Symbol, ...]  # the dims the instructions' shapes and attrs mention
    devices: dict[int, str] = dataclasses.field(default_factory=dict)  # value -> device kind
    host_reads: frozenset[int] = frozenset()  # input values read on the host (not just copied)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The device kinds the per-call instructions and the outputs touch."""
        found = {self.devices.get(i, "cpu") for i in self.outputs}
        for ins in self.instructions:
            found |= {ins.device, ins.reads}
        return tuple(sorted(found))


def lower(plan: Plan, memory: MemoryPlan | None = None, at: Plan | None = None) -> Program:
    """``plan`` as a ``Program`` (see the module doc). ``memory``: the memory plan of ``at``
    (the plan at the bounds; ``plan`` itself when concrete); without one the values get no
    arena places (every kernel allocates) and the liveness is analysed here (``plan`` must
    then be concrete)."""
    at = plan if at is None else at
    live = memory.liveness if memory is not None else analyze(at, symbolic=plan)
    index: dict[Slot, int] = {}

    def number(slot: Slot) -> int:
        return index.setdefault(plan.resolve(slot), len(index))

    leaves = tuple(LeafValue(number(s), s.node) for s in plan.leaves)
    outputs = tuple(number(s) for s in plan.outputs)
    devices = {number(s): s.device for s in plan.leaves}
    devices.update((number(s), plan.resolve(s).device) for s in plan.outputs)
    static = {i for (i, _), s in zip(leaves, at.leaves) if at.resolve(s) in live.static}
    prelude, main = [], []
    for pos, step in enumerate(plan.steps):
        args = tuple(number(i) for i in step.inputs)
        out = number(step.slot)
        devices[out] = step.device
        also = tuple(-1 if s is None else number(s) for s in step.also_slots)
        for a in also:
            if a >= 0:
                devices[a] = step.device
        if live.steps[pos][0] in live.static:  # the memory plan holds it with the weights
            static.add(out)
            static.update(a for a in also if a >= 0)
            prelude.append((pos, args, out))
        else:
            main.append((pos, args, out))
    keep = static | set(outputs)
    prelude_ins = [_also(_instruction(plan, pos, args, out, (), None, False), plan, at, pos,
                         number, None) for pos, args, out in prelude]
    instructions = []
    for pos, args, out in main:
        key, reads = live.steps[pos]  # the same step in the memory plan's keys
        free = tuple(sorted({a for a, k in zip(args, reads)
                             if live.values[k].last == pos and a not in keep}))
        placement = memory.placements.get(key) if memory is not None else None
        instructions.append(_also(_instruction(plan, pos, args, out, free,
                                               _place(at.steps[pos], placement),
                                               placement is not None
                                               and placement.alias_of is None),
                                  plan, at, pos, number, memory))
    instructions = _overwrites(instructions, leaves, outputs)
    size, prepared = len(index), []
    for j, ins in enumerate(instructions):
        instructions[j], size = _prepare(ins, static, prepared, size)
    for p in prepared:
        devices[p.index] = devices.get(p.source, "cpu")
    fed = {leaf.index for leaf in leaves if leaf.node.op.name == INPUT}
    host_reads = frozenset(i for i in fed if i in outputs or any(
        i in ins.args and not ins.copy_in for ins in instructions))
    needed = {a for ins in instructions for a in ins.args} | set(outputs)
    made = {p.index for p in prepared}  # prepared values are made as the kernel wants them
    kept = sorted(i for i in static if i in needed)
    kept_set = set(kept)
    dense_static = sorted({a for ins in instructions if ins.contiguous for a in ins.args
                           if a in kept_set and a not in made})
    return Program(plan, at, memory, size, leaves, tuple(prelude_ins), tuple(instructions),
                   tuple(prepared), outputs, tuple(kept), tuple(dense_static),
                   tuple(leaf for leaf in leaves if leaf.node.op.name == INPUT),
                   _symbols(instructions), devices, host_reads)


def _instruction(plan: Plan, pos: int, args: tuple[int, ...], out: int,
                 free: tuple[int, ...], place: tuple | None, copies: bool) -> Instruction:
    """Step ``pos`` as an instruction. ``copies``: the memory plan, made at the bounds, gives
    the result bytes of its own, so a view kernel (a reshape) copies it out: at smaller dims
    numpy may return a view of an arena buffer the plan reuses after this step (a permuted
    (1, 1, H, D) is contiguous)."""
    s = plan.steps[pos]
    k = s.kernel
    reads, _ = kernel_placement(k)
    copy_in = s.slot.moved and reads == "cpu" and s.device != "cpu" \
        and s.node.op.name == INPUT
    return Instruction(
        k.fn, args, dict(s.attrs), out, free, k.name, tuple(s.node.shape), k.contiguous,
        place, place is None and (not k.view or copies), k,
        tuple(tuple(x.node.shape) for x in s.inputs), tuple(x.node.dtype for x in s.inputs),
        s.node.dtype.np_dtype, s.device, reads, copy_in)


def _also(ins: Instruction, plan: Plan, at: Plan, pos: int, number, memory) -> Instruction:
    """``ins`` with the values its kernel stores besides its result (``Step.also``): their
    indices and arena places (None: allocated when it runs)."""
    step = plan.steps[pos]
    if not step.also:
        return ins
    indices, places = [], []
    for s, s_at in zip(step.also_slots, at.steps[pos].also_slots):
        indices.append(-1 if s is None else number(s))
        p = None if memory is None or s_at is None else memory.placements.get(at.resolve(s_at))
        dense = p is not None and p.kind == ARENA and p.nbytes and p.alias_of is None and (
            p.strides is None or p.strides == _byte_strides(s_at.node.shape,
                                                            s_at.node.dtype.np_dtype))
        places.append((p.device, p.offset, p.nbytes) if dense else None)
    dtypes = tuple(None if n is None else n.dtype.np_dtype for n in step.also)
    return dataclasses.replace(ins, also=tuple(indices), also_places=tuple(places),
                               also_dtypes=dtypes)


def _place(step, placement) -> tuple | None:
    """Where the step writes its result in the arena (kernels that take ``out=``)."""
    if placement is None or not getattr(step.kernel, "writes_out", False):
        return None
    p = placement
    if p.kind != ARENA or not p.nbytes or p.alias_of is not None:
        return None  # in-place results reuse their input's buffer: the kernel allocates
    if p.strides is not None and p.strides != _byte_strides(step.node.shape,
                                                            step.node.dtype.np_dtype):
        return None
    return (p.device, p.offset, p.nbytes)


def _overwrites(instructions: list[Instruction], leaves: Sequence[LeafValue],
                outputs: Sequence[int]) -> list[Instruction]:
    """Mark the host ``state_update`` steps that may overwrite their state in place: the
    state's new version written over the old one (an optimizer's parameter, its moments)
    instead of a copy of the whole state plus a copy back into its buffer. Allowed where the
    old version is the state leaf itself and no later step (and no output) reads it; a view
    of the old version read later still forbids it, and the runtime checks that at run time
    (``Instruction.overwrite``: the values made before the step and read after it that may
    share the state's memory: inputs, and results of steps that do not write into the arena,
    derived from the state or an input, since a kernel may return a view it did not declare).
    The runtime also checks the rest: offset 0, the whole length, a buffer the program owns."""
    states = {leaf.index for leaf in leaves if leaf.node.op.name == STATE}
    if not states:
        return instructions
    last: dict[int, int] = {}  # value -> the last instruction reading it
    for n, ins in enumerate(instructions):
        for a in ins.args:
            last[a] = n
    after = set(outputs)  # read after the last instruction
    maybe = {leaf.index for leaf in leaves if leaf.node.op.name in (INPUT, STATE)}
    made: list[int] = sorted(maybe)  # values that may share a state's memory, made so far
    found = list(instructions)
    for n, ins in enumerate(instructions):
        k = ins.kernel
        if k is not None and k.name == "numpy_state_update" and ins.device == "cpu" \
                and ins.args[0] in states and ins.args[1] != ins.args[0] \
                and last.get(ins.args[0]) == n and ins.args[0] not in after:
            check = tuple(a for a in made if a != ins.args[0]
                          and (a in after or last.get(a, -1) > n))
            found[n] = dataclasses.replace(ins, overwrite=check)
        if ins.place is None and any(a in maybe for a in ins.args):
            maybe.add(ins.out)
            made.append(ins.out)
    return found


def _prepare(ins: Instruction, static: set[int], prepared: list[Prepared], size: int
             ) -> tuple[Instruction, int]:
    """``ins`` reading the prepared values of its prepared arguments (see the registry's
    ``prepare=``): new static values for static arguments (shared by instructions that
    prepare the same value the same way), a per-call preparation for the others. Returns the
    instruction and the new number of values."""
    k = ins.kernel
    if k is None or not getattr(k, "prepare", None):
        return ins, size
    args, per_call = list(ins.args), {}
    for pos, prep in k.prepared_positions(len(args)).items():
        src = args[pos]
        if src not in static:
            per_call[pos] = prep
            continue
        dense = ins.contiguous and not prep.strided
        key = (src, prep.name or id(prep), dense)
        found = next((p.index for p in prepared if p.key == key), None)
        if found is None:
            found, size = size, size + 1
            static.add(found)
            prepared.append(Prepared(found, src, prep, dense, tuple(ins.input_shapes[pos]),
                                     key))
        args[pos] = found
    fn = ins.fn
    if per_call:
        def fn(*arrays, _fn=ins.fn, _per_call=per_call, **kw):
            arrays = list(arrays)
            for pos, prep in _per_call.items():
                arrays[pos] = prep(arrays[pos])
            return _fn(*arrays, **kw)
    return dataclasses.replace(ins, fn=fn, args=tuple(args)), size


def _symbols(instructions: Sequence[Instruction]) -> tuple[sympy.Symbol, ...]:
    found: set = set()
    for ins in instructions:
        found |= free_symbols(ins.shape) | free_symbols(tuple(ins.input_shapes))
        found |= free_symbols(tuple(v for v in ins.attrs.values()
                                    if isinstance(v, (sympy.Basic, tuple))))
    return tuple(sorted(found, key=str))


def _byte_strides(shape, dtype) -> tuple[int, ...]:
    """Byte strides of a C-contiguous array of ``shape`` (size-0 axes count as 1)."""
    out, step = [], np.dtype(dtype).itemsize
    for d in reversed(tuple(int(d) for d in shape)):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


# ----------------------------------------------------------------------------- checks
def lint_program(program: Program) -> list[str]:
    """What is wrong with ``program`` (empty when nothing): every value an instruction reads
    is made before (a leaf, the prelude, a prepared value or an earlier instruction) and not
    dropped yet, every value is made once, no static value or output is dropped, the outputs
    exist after the last instruction. ``TG_DEBUG=2`` runs it after lowering."""
    problems: list[str] = []
    made: dict[int, str] = {}

    def make(i: int, what: str) -> None:
        if not 0 <= i < program.size:
            problems.append(f"{what} writes value {i}, outside the program's {program.size}")
        elif i in made:
            problems.append(f"{what} makes value {i}, already made by {made[i]}")
        made[i] = what

    def read(i: int, what: str, gone: dict[int, str]) -> None:
        if i in gone:
            problems.append(f"{what} reads value {i}, dropped after {gone[i]}")
        elif i not in made:
            problems.append(f"{what} reads value {i} before anything makes it")

    for leaf in program.leaves:
        if leaf.index not in made:  # a leaf fed under two slots is one value
            make(leaf.index, f"leaf {leaf.node.op.name} {leaf.node.name or ''}".rstrip())
    gone: dict[int, str] = {}
    for n, ins in enumerate(program.prelude):
        what = f"prelude instruction {n} ({ins.name})"
        for a in ins.args:
            read(a, what, gone)
        make(ins.out, what)
        for a in ins.also:
            if a >= 0:
                make(a, what)
    for p in program.prepared:
        read(p.source, f"prepared value {p.index}", gone)
        make(p.index, f"prepared value {p.index}")
    kept = set(program.static) | set(program.outputs)
    for n, ins in enumerate(program.instructions):
        what = f"instruction {n} ({ins.name})"
        for a in ins.args:
            read(a, what, gone)
        make(ins.out, what)
        for a in ins.also:
            if a >= 0:
                make(a, what)
        for f in ins.free:
            if f in kept:
                problems.append(f"{what} drops value {f}, which is "
                                + ("an output" if f in program.outputs else "static: kept"))
            elif f not in ins.args:
                problems.append(f"{what} drops value {f}, which it does not read")
            gone[f] = what
    for i in program.outputs:
        read(i, "the outputs", gone)
    return problems

