"""Liveness of a plan's values: which buffer holds each value, its layout in that buffer, and
the buffer's lifetime in step positions.

Positions are indices into ``plan.steps`` (prelude steps keep their index and simply own no
arena buffer, so the gaps they leave change nothing). A buffer is live over the closed interval
``[first, last]``: made by step ``first`` and read for the last time by step ``last``. Two
buffers may share bytes only when their intervals are disjoint, so a buffer freed at step i is
never the result of step i (the kernel reads its inputs while writing its result) unless the
kernel declares ``inplace`` (below). Outputs live to ``END = len(plan.steps)``.

- **Keys.** A value is keyed by its resolved slot: ``plan.resolve(step.slot)`` for a step's
  result (a copy to another device fills the value's movable slot there), ``plan.resolve(slot)``
  for inputs, leaves and outputs (what ``runtime.lower`` numbers). A value lives on its slot's
  device kind: a copy's result is a new buffer on the target (a copy of a weight is static, so
  it is held with the weights there).
- **Leaves** (``plan.leaves``) live outside the arena: inputs (the caller's arrays), weights,
  constants and dims (bound with the weights), states (their own persistent buffers).
- **Static values** (``static_keys``, the rule ``ir.graph.is_static``): a step whose inputs
  are all weights, constants, dims or other static values, and which does not depend on the
  call's dims, runs once per binding (the runtime's prelude, which it takes from here); its
  result is stored with the weights, not in the arena. A plan made at the bounds is judged on
  the symbolic plan it came from (``iota(seq)`` runs per call, so it gets arena bytes). Pass
  ``static`` to override that rule.
- **Views.** A step whose kernel declares ``view=True`` returns a view of its input 0: no bytes
  of its own, it lives in its source's buffer, whose lifetime grows to the view's last use
  (transitively: a view of a view). The view's layout (element strides and offset in the
  buffer) is tracked for reshape, permute, expand, slice and same-memory copies; a reshape
  that numpy cannot express as a view of the source's layout (or a view kernel declared
  ``contiguous`` that is handed a strided input) copies, so it gets its own buffer.
- **Scratch.** A kernel declared ``contiguous`` densifies every strided input first: that copy
  is a scratch buffer live at that step only.
- **Input copies.** A per-call copy of an input from the host to a GPU gets a buffer live from
  step 0, wherever the copy runs: a CUDA graph stages every feed before its first GPU step.
- **Stored values.** A step whose kernel stores values besides its result (``Step.also``: a
  generated row kernel's residual stream) makes each of them at its position, in a dense
  buffer of its own (static with the step).
- **In place.** A kernel with ``inplace == i`` writes its result into input i's buffer when that
  buffer dies exactly at this step (its last use is here, it holds no output, it is not a leaf
  or static), input i covers the whole buffer densely, the sizes agree, and no other input of
  the step reads the same buffer. The result then lives in that buffer, extending it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir.graph import is_static
from tensor_graphs.ir.ops.names import COPY_TO, EXPAND, PERMUTE, RESHAPE, SLICE
from tensor_graphs.ir.ops.names import INPUT as INPUT_OP
from tensor_graphs.planner.plan import Plan, Slot

LEAF_KINDS = {"input": "input", "weight": "weight", "constant": "weight", "dim": "weight",
              "state": "state"}
ARENA, WEIGHT, STATE, INPUT = "arena", "weight", "state", "input"


@dataclass(eq=False)
class Buffer:
    """Bytes that one or more values live in. ``kind``: arena (transient, placed by the
    arena planner), weight (bound leaves and prelude results), state, input (the caller's)."""

    id: int
    device: str
    nbytes: int
    first: int
    last: int
    kind: str
    node: object  # the node whose value made it (for messages)
    values: list = field(default_factory=list)  # keys of the values living in it
    scratch: bool = False  # a dense copy of a strided input, live during one step

    def overlaps(self, other: Buffer) -> bool:
        """Live at a common position (closed intervals)."""
        return self.first <= other.last and other.first <= self.last

    def __repr__(self) -> str:
        what = "scratch" if self.scratch else getattr(self.node.op, "name", "?")
        return (f"<Buffer {self.id} {self.kind} {what} {self.device} {self.nbytes} B "
                f"[{self.first}, {self.last}]>")


@dataclass(eq=False)
class Value:
    """One value of the plan: the buffer it lives in and its layout there (element strides and
    element offset; ``strides`` is None when unknown, e.g. a view kernel of an unknown op)."""

    key: Slot
    node: object
    device: str
    nbytes: int
    buffer: Buffer
    strides: tuple[int, ...] | None
    offset: int
    view_of: Slot | None = None  # the value this one is a view of
    inplace_of: Slot | None = None  # the input whose buffer this result took over
    first: int = -1
    last: int = -1  # last reading position of this value itself (END for outputs)

    @property
    def contiguous(self) -> bool:
        return self.strides is not None and is_contiguous(self.node.shape, self.strides)


@dataclass(eq=False)
class Liveness:
    """Every value and buffer of a plan; ``end`` is the position outputs live to."""

    values: dict[Slot, Value]
    buffers: list[Buffer]
    end: int
    static: set[Slot]
    steps: list[tuple[Slot, tuple[Slot, ...]]]  # per step: (result key, input keys)

    def arena_buffers(self, device: str | None = None) -> list[Buffer]:
        return [b for b in self.buffers
                if b.kind == ARENA and (device is None or b.device == device)]

    @property
    def devices(self) -> list[str]:
        return sorted({b.device for b in self.buffers})


# ----------------------------------------------------------------------------- layouts
def nbytes_of(node) -> int:
    shape = node.shape
    if not all(isinstance(d, int) for d in shape):
        raise ArgumentError(f"memory planning needs concrete shapes; {node.op.name} has shape "
                            f"{tuple(shape)} (compile with bounds=... for symbolic dims)")
    return math.prod(shape) * node.dtype.itemsize


def c_strides(shape) -> tuple[int, ...]:
    strides, step = [], 1
    for d in reversed(tuple(shape)):
        strides.append(step)
        step *= max(int(d), 1)
    return tuple(reversed(strides))


def is_contiguous(shape, strides) -> bool:
    """C-contiguous as numpy's flag says: strides of size-1 axes do not matter, nor anything
    when the array is empty."""
    if any(d == 0 for d in shape):
        return True
    step = 1
    for d, s in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if d != 1 and s != step:
            return False
        step *= d
    return True


def reshape_strides(old_shape, old_strides, new_shape) -> tuple[int, ...] | None:
    """Strides of ``new_shape`` viewing the same elements, or None when a reshape must copy
    (numpy's ``_attempt_nocopy_reshape``)."""
    new_shape = tuple(int(d) for d in new_shape)
    if math.prod(new_shape) == 0 or math.prod(old_shape) == 0:
        return c_strides(new_shape)
    old = [(int(d), s) for d, s in zip(old_shape, old_strides) if d != 1]
    olddims, oldstr = [d for d, _ in old], [s for _, s in old]
    newstr = [0] * len(new_shape)
    oi, oj, ni, nj = 0, 1, 0, 1
    while ni < len(new_shape) and oi < len(olddims):
        np_, op = new_shape[ni], olddims[oi]
        while np_ != op:
            if np_ < op:
                np_ *= new_shape[nj]
                nj += 1
            else:
                op *= olddims[oj]
                oj += 1
        for ok in range(oi, oj - 1):
            if oldstr[ok] != olddims[ok + 1] * oldstr[ok + 1]:
                return None
        newstr[nj - 1] = oldstr[oj - 1]
        for nk in range(nj - 1, ni, -1):
            newstr[nk - 1] = newstr[nk] * new_shape[nk]
        ni, nj, oi, oj = nj, nj + 1, oj, oj + 1
    last = newstr[ni - 1] if ni >= 1 else 1
    for nk in range(ni, len(new_shape)):  # trailing size-1 axes
        newstr[nk] = last
    return tuple(newstr)


def view_layout(node, src_shape, strides, offset):
    """(strides, offset) of the view ``node`` computes from a source with that layout, or None
    when it cannot be a view (the kernel copies)."""
    if strides is None:
        return None
    op, attrs = node.op.name, node.attrs
    if op == COPY_TO:
        return strides, offset
    if op == RESHAPE:
        new = reshape_strides(src_shape, strides, node.shape)
        return None if new is None else (new, offset)
    if op == PERMUTE:
        return tuple(strides[p] for p in attrs["perm"]), offset
    if op == EXPAND:
        return tuple(0 if (d == 1 and t != 1) else s
                     for d, t, s in zip(src_shape, node.shape, strides)), offset
    if op == SLICE:
        if any(d == 0 for d in node.shape):
            return tuple(strides), offset
        new = []
        for a, s, st in zip(attrs["starts"], attrs["steps"], strides):
            offset += a * st
            new.append(st * s)
        return tuple(new), offset
    return (tuple(strides), offset) if tuple(node.shape) == tuple(src_shape) else None


# ----------------------------------------------------------------------------- analysis
def static_keys(plan: Plan, symbolic: Plan | None = None) -> set[Slot]:
    """The values computed once per binding (``ir.graph.is_static``: a static leaf, or a step
    whose inputs are all static and whose node does not depend on the call's dims), keyed by
    ``plan``'s slots. ``symbolic``: the plan before its dims were bound (``plan`` is
    ``symbolic.at(bounds)``, steps in the same order), on which it is decided: at the bounds
    ``iota(seq)`` has a concrete shape, yet it runs per call."""
    source = plan if symbolic is None else symbolic
    static = {plan.resolve(s) for s, t in zip(plan.leaves, source.leaves) if is_static(t.node)}
    for step, twin in zip(plan.steps, source.steps):
        if is_static(twin.node, all(plan.resolve(i) in static for i in step.inputs)):
            static.add(plan.resolve(step.slot))
            static.update(plan.resolve(s) for s in step.also_slots if s is not None)
    return static


def analyze(plan: Plan, static: Iterable[Slot] | None = None, scratch: bool = True,
            symbolic: Plan | None = None) -> Liveness:
    """Buffers, layouts and lifetimes of every value of ``plan`` (see the module doc).
    ``static``: keys of values held with the weights (default: ``static_keys(plan,
    symbolic)``); ``scratch``: plan the dense copies that ``contiguous`` kernels make of
    strided inputs; ``symbolic``: the plan before its dims were bound (see ``static_keys``)."""
    static = set(static_keys(plan, symbolic) if static is None else static)
    end = len(plan.steps)
    values: dict[Slot, Value] = {}
    buffers: list[Buffer] = []

    def new_buffer(node, device, nbytes, first, kind, is_scratch=False) -> Buffer:
        b = Buffer(len(buffers), device, nbytes, first, first, kind, node, scratch=is_scratch)
        buffers.append(b)
        return b

    for s in plan.leaves:
        key = plan.resolve(s)
        if key in values:
            continue
        kind = LEAF_KINDS.get(key.node.op.name, INPUT)
        nb = nbytes_of(key.node)
        b = new_buffer(key.node, key.device, nb, -1, kind)
        b.last = end
        b.values.append(key)
        values[key] = Value(key, key.node, key.device, nb, b, c_strides(key.node.shape), 0,
                            first=-1)

    steps = [(plan.resolve(st.slot), tuple(plan.resolve(i) for i in st.inputs))
             for st in plan.steps]
    outputs = {plan.resolve(o) for o in plan.outputs}

    # Pass 1: which value is a view of which (layouts do not depend on in-place decisions:
    # an in-place result is dense and covers its buffer, like a fresh one).
    last_read: dict[Slot, int] = {}
    for pos, (_, ins) in enumerate(steps):
        for k in ins:
            last_read[k] = pos
    for k in outputs:
        last_read[k] = end
    view_src: dict[Slot, Slot] = {}
    layouts: dict[Slot, tuple] = {k: (v.strides, v.offset) for k, v in values.items()}
    scratch_at: list[tuple[int, Slot]] = []
    for pos, (step, (key, ins)) in enumerate(zip(plan.steps, steps)):
        if key in layouts:  # a value computed twice (the planner never does this)
            continue
        k = step.kernel
        layout = None
        if getattr(k, "view", False) and ins:
            src = ins[0]
            strides, offset = layouts[src]
            dense_needed = getattr(k, "contiguous", False) and not (
                strides is not None and is_contiguous(src.node.shape, strides))
            if not dense_needed:
                layout = view_layout(step.node, src.node.shape, strides, offset)
            if layout is not None:
                view_src[key] = src
        if layout is None:
            layout = (c_strides(step.node.shape), 0)
            if scratch and getattr(k, "contiguous", False) and not getattr(k, "view", False) \
                    and key not in static:
                for src in dict.fromkeys(ins):
                    st_, _ = layouts[src]
                    if st_ is None or not is_contiguous(src.node.shape, st_):
                        scratch_at.append((pos, src))
        layouts[key] = layout
        for s in step.also_slots:  # values a kernel stores besides its result: dense
            if s is not None:
                layouts[plan.resolve(s)] = (c_strides(s.node.shape), 0)

    def root(key: Slot) -> Slot:
        while key in view_src:
            key = view_src[key]
        return key

    # group last use: a root value's buffer must live until its last view's last read
    group_last: dict[Slot, int] = {}
    for key, pos in last_read.items():
        r = root(key)
        group_last[r] = max(group_last.get(r, -1), pos)

    # Pass 2: buffers, in execution order (in-place decisions need earlier merges).
    scratch_by_pos: dict[int, list[Slot]] = {}
    for pos, src in scratch_at:
        scratch_by_pos.setdefault(pos, []).append(src)
    for pos, (step, (key, ins)) in enumerate(zip(plan.steps, steps)):
        if key in values:
            continue
        strides, offset = layouts[key]
        nb = nbytes_of(step.node)
        for src in scratch_by_pos.get(pos, ()):
            new_buffer(src.node, step.device, nbytes_of(src.node), pos, ARENA, True)
        if key in view_src:
            src = values[view_src[key]]
            b = src.buffer
            values[key] = Value(key, step.node, step.device, nb, b, strides, offset,
                                view_of=src.key, first=pos)
            b.values.append(key)
            b.last = max(b.last, group_last.get(key, pos))
            continue
        kind = WEIGHT if key in static else ARENA
        taken = None
        i = getattr(step.kernel, "inplace", None)
        if kind == ARENA and i is not None and 0 <= i < len(ins):
            cand = values.get(ins[i])
            if cand is not None:
                b = cand.buffer
                others = {values[o].buffer.id for j, o in enumerate(ins) if j != i
                          and o in values}
                if (b.kind == ARENA and not b.scratch and b.last == pos
                        and b.nbytes == nb and cand.nbytes == nb and cand.offset == 0
                        and cand.contiguous and b.device == step.device
                        and b.id not in others):
                    taken = cand
        if taken is not None:
            b = taken.buffer
        else:
            b = new_buffer(step.node, step.device, nb, 0 if _input_copy(step) else pos, kind)
        b.values.append(key)
        b.last = max(b.last, group_last.get(key, pos))
        values[key] = Value(key, step.node, step.device, nb, b, strides, offset,
                            inplace_of=taken.key if taken is not None else None, first=pos)
        for s in step.also_slots:  # each stored value in a buffer of its own
            if s is None:
                continue
            k_ = plan.resolve(s)
            nb_ = nbytes_of(s.node)
            b_ = new_buffer(s.node, step.device, nb_, pos, WEIGHT if k_ in static else ARENA)
            b_.values.append(k_)
            b_.last = max(b_.last, group_last.get(k_, pos))
            values[k_] = Value(k_, s.node, step.device, nb_, b_, layouts[k_][0], 0, first=pos)

    for key, v in values.items():
        v.last = last_read.get(key, v.first)
    return Liveness(values, buffers, end, static, steps)


def _input_copy(step) -> bool:
    """A per-call copy of an input from the host to a GPU: its buffer is live from step 0, so
    a CUDA graph can stage every feed before its first GPU step (``runtime/graphs.py``: the
    region then holds GPU steps only) and no step before the copy writes where it lands."""
    return step.is_copy and step.slot.moved and step.device != "cpu" \
        and step.node.op.name == INPUT_OP and step.inputs[0].device == "cpu"


def max_live_lower_bound(buffers: Iterable[Buffer], alignment: int = 1) -> int:
    """The largest sum of sizes of buffers live at one position: no arena can be smaller.
    Sizes are rounded up to ``alignment`` (the arena places aligned sizes)."""
    events: dict[int, int] = {}
    for b in buffers:
        size = align(b.nbytes, alignment)
        if size:
            events[b.first] = events.get(b.first, 0) + size
            events[b.last + 1] = events.get(b.last + 1, 0) - size
    best = live = 0
    for pos in sorted(events):
        live += events[pos]
        best = max(best, live)
    return best


def no_reuse_total(buffers: Iterable[Buffer], alignment: int = 1) -> int:
    """Bytes if every buffer had its own place (no reuse at all)."""
    return sum(align(b.nbytes, alignment) for b in buffers)


def align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment if alignment > 1 else n
