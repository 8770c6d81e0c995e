"""MemoryPlan: where every value of a plan lives, and what a program needs per device.

``plan_memory(plan)`` runs the liveness analysis (``memory.liveness``) and places the transient
buffers of each device in one arena (``memory.arena``). ``check_fits`` compares the totals with
devices' free bytes and raises ``OutOfMemory`` before anything runs.

Device keys are the plan's device kinds ("cpu", "cuda"), as in ``Step.device``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.memory.arena import ALIGNMENT, alignment_for, assign_offsets, overlapping_pairs
from tensor_graphs.memory.errors import OutOfMemory
from tensor_graphs.memory.liveness import (
    ARENA,
    INPUT,
    STATE,
    WEIGHT,
    Buffer,
    Liveness,
    analyze,
    max_live_lower_bound,
    no_reuse_total,
)
from tensor_graphs.planner.plan import Plan, Slot


class Placement(NamedTuple):
    """Where one value lives. ``kind``: arena, weight, state or input. For arena values
    ``offset`` is the byte offset of the value's first element ([0, ..., 0]) in its device's
    arena; otherwise it is relative to the start of the value's own buffer. ``strides`` are in
    bytes. ``alias_of`` is the value that owns the buffer (a view's source, or the input an
    in-place kernel overwrote); None when the value owns its bytes. ``buffer`` is the buffer's
    id in ``MemoryPlan.liveness.buffers``; ``first``/``last`` the value's own lifetime."""

    device: str
    kind: str
    offset: int
    nbytes: int
    strides: tuple[int, ...] | None
    alias_of: Slot | None
    buffer: int
    first: int
    last: int


class Tensor(NamedTuple):
    """A buffer that owns bytes, described for messages."""

    op: str
    shape: tuple
    dtype: str
    nbytes: int
    device: str
    kind: str  # arena, scratch, weight, state

    def __str__(self) -> str:
        return (f"{self.op} {format_shape(self.shape)} {self.dtype} {format_bytes(self.nbytes)}"
                f" ({self.kind})")


@dataclass(frozen=True, eq=False)
class MemoryPlan:
    """Per value: a ``Placement``; per device: arena, weights, packed copies of weights, state
    and input bytes; the arena's lower bound and no-reuse size, and which strategy placed it."""

    placements: Mapping[Slot, Placement]
    buffer_offsets: Mapping[int, int]  # arena buffer id -> byte offset
    arena: Mapping[str, int]
    weights: Mapping[str, int]  # weight/constant/dim leaves + prelude results kept
    state: Mapping[str, int]
    inputs: Mapping[str, int]  # the caller's arrays (not counted in totals)
    lower_bound: Mapping[str, int]  # max-live lower bound of each arena
    no_reuse: Mapping[str, int]  # each arena without any reuse
    strategy: Mapping[str, str]
    liveness: Liveness
    alignments: Mapping[str, int] = dataclasses.field(default_factory=dict)  # per device
    prepared: Mapping[str, int] = dataclasses.field(default_factory=dict)  # packed weights
    # a call's results that are views of no arena value (an input broadcast, a constant):
    # each call copies them out whole, beyond what the program holds (``check_fits``)
    results: Mapping[str, int] = dataclasses.field(default_factory=dict)

    @property
    def alignment(self) -> int:
        """The host arena's alignment (``alignments`` has every device's: 256 on a GPU)."""
        return self.alignments.get("cpu", ALIGNMENT)

    @property
    def devices(self) -> list[str]:
        return sorted(set(self.arena) | set(self.weights) | set(self.prepared) | set(self.state))

    def total(self, device: str) -> int:
        """Bytes the program holds on ``device``: arena + weights + packed copies + state."""
        return self.arena.get(device, 0) + self.weights.get(device, 0) \
            + self.prepared.get(device, 0) + self.state.get(device, 0)

    def totals(self) -> dict[str, int]:
        """{device: arena + weights + packed copies + state + results copied out of views}:
        what ``prog.memory()`` and ``tg.estimate_memory`` return, the bytes ``check_fits``
        requires (without the results, a broadcast of an input estimated at 0 B was refused
        for 240 TB)."""
        return {d: self.total(d) + self.results.get(d, 0)
                for d in sorted(set(self.devices) | set(self.results))}

    def ratio(self, device: str) -> float:
        """Arena size over its max-live lower bound (1.0 is optimal)."""
        lb = self.lower_bound.get(device, 0)
        return self.arena.get(device, 0) / lb if lb else 1.0

    def largest(self, n: int = 3, device: str | None = None) -> list[Tensor]:
        """The ``n`` largest buffers that own bytes (arena, scratch, weights, state), largest
        first; on ``device`` only when given."""
        found = []
        for b in self.liveness.buffers:
            if b.kind == INPUT or b.nbytes == 0 or (device is not None and b.device != device):
                continue
            kind = "scratch" if b.scratch else b.kind
            found.append((b.nbytes, -b.id, Tensor(b.node.op.name, tuple(b.node.shape),
                                                  b.node.dtype.name, b.nbytes, b.device, kind)))
        found.sort(key=lambda t: (-t[0], -t[1]))
        return [t for _, _, t in found[:n]]

    def summary(self) -> str:
        rows = []
        for d in self.devices:
            rows.append(f"{d}: {format_bytes(self.total(d))} = arena "
                        f"{format_bytes(self.arena.get(d, 0))} (lower bound "
                        f"{format_bytes(self.lower_bound.get(d, 0))}, {self.ratio(d):.3f}x; "
                        f"no reuse {format_bytes(self.no_reuse.get(d, 0))}; "
                        f"{self.strategy.get(d, '-')}) + weights "
                        f"{format_bytes(self.weights.get(d, 0))} + packed weights "
                        f"{format_bytes(self.prepared.get(d, 0))} + state "
                        f"{format_bytes(self.state.get(d, 0))}")
        return "\n".join(rows)

    def __repr__(self) -> str:
        return "<MemoryPlan " + ", ".join(f"{d}: {format_bytes(self.total(d))}"
                                          for d in self.devices) + ">"


def plan_memory(plan: Plan, static_keys: Iterable[Slot] | None = None,
                alignment: int | None = None, scratch: bool = True,
                symbolic: Plan | None = None) -> MemoryPlan:
    """Liveness plus arena offsets for ``plan`` (shapes must be concrete: a plan made for
    dims, or a plan for bounds at them, ``symbolic.at(bounds)``). ``static_keys``: values
    computed once per binding (default: ``liveness.static_keys``, decided on ``symbolic`` when
    given); ``alignment``: one for every arena (default: each device's, ``arena.ALIGNMENTS``:
    64 bytes on the host, 256 on a GPU); ``scratch``: plan the dense copies of strided inputs
    that ``contiguous`` kernels make."""
    live = analyze(plan, static_keys, scratch=scratch, symbolic=symbolic)
    alignments = {d: alignment or alignment_for(d) for d in live.devices}
    arena, lower, no_reuse, strategy = {}, {}, {}, {}
    weights: dict[str, int] = {}
    state: dict[str, int] = {}
    inputs: dict[str, int] = {}
    buffer_offsets: dict[int, int] = {}
    for device in live.devices:
        bufs = live.arena_buffers(device)
        if bufs:
            align = alignments[device]
            offsets, size, name = assign_offsets(bufs, align)
            buffer_offsets.update(offsets)
            arena[device], strategy[device] = size, name
            lower[device] = max_live_lower_bound(bufs, align)
            no_reuse[device] = no_reuse_total(bufs, align)
    needed = _needed_static(live)
    for b in live.buffers:
        if b.kind == WEIGHT and (b.node.op.kind == "leaf" or b.id in needed):
            weights[b.device] = weights.get(b.device, 0) + b.nbytes
        elif b.kind == STATE:
            state[b.device] = state.get(b.device, 0) + b.nbytes
        elif b.kind == INPUT:
            inputs[b.device] = inputs.get(b.device, 0) + b.nbytes
    prepared: dict[str, int] = {}
    for device, nbytes in _prepared(plan):
        prepared[device] = prepared.get(device, 0) + nbytes
    placements = {}
    for key, v in live.values.items():
        b = v.buffer
        itemsize = v.node.dtype.itemsize
        base = buffer_offsets.get(b.id, 0) if b.kind == ARENA else 0
        owner = b.values[0] if b.values else key
        placements[key] = Placement(
            v.device, b.kind, base + v.offset * itemsize, v.nbytes,
            None if v.strides is None else tuple(s * itemsize for s in v.strides),
            None if owner == key else owner, b.id, v.first, v.last)
    return MemoryPlan(placements, buffer_offsets, arena, weights, state, inputs, lower,
                      no_reuse, strategy, live, alignments, prepared,
                      _viewed_results(plan, placements))


def _viewed_results(plan: Plan, placements: Mapping[Slot, Placement]) -> dict[str, int]:
    """{device: bytes} of the results a call copies out of an input's, a weight's or a
    constant's storage: a view of no arena value whose copy may be far larger than what it
    views (``broadcast_to(x, 10**7, ...)`` of a (2, 3) input compiled, then failed in the call
    with numpy's MemoryError for 218 TiB). A result in the arena is the arena's size already;
    a state's is returned as the state's view."""
    out: dict[str, int] = {}
    for slot in dict.fromkeys(plan.resolve(s) for s in plan.outputs):
        p = placements.get(slot)
        if p is None or p.kind not in (INPUT, WEIGHT) or not all(
                isinstance(d, int) for d in slot.node.shape):
            continue
        nbytes = slot.node.dtype.itemsize
        for d in slot.node.shape:
            nbytes *= d
        out[p.device] = out.get(p.device, 0) + nbytes
    return out


def _prepared(plan: Plan) -> list[tuple[str, int]]:
    """(device, bytes) of each bind-time prepared copy of a static value (a packed GEMM
    weight), kept beside the weights: one per value and preparation, as the runtime makes
    them (``runtime/lower.py``)."""
    seen, out = set(), []
    for step in plan.steps:
        if not getattr(step.kernel, "prepare", None):
            continue
        for pos, prep in step.kernel.prepared_positions(len(step.inputs)).items():
            slot = step.inputs[pos]
            key = (slot.node, prep.name or id(prep))
            if prep.nbytes is None or key in seen:
                continue
            seen.add(key)
            out.append((slot.device, int(prep.nbytes(tuple(int(d) for d in slot.node.shape),
                                                      slot.node.dtype))))
    return out


def _needed_static(live: Liveness) -> set[int]:
    """Ids of static buffers that a per-call step or an output reads (kept after the
    prelude, as ``Program.static``)."""
    needed = set()
    for key, ins in live.steps:
        if key in live.static:
            continue
        for k in ins:
            v = live.values.get(k)
            if v is not None and v.buffer.kind == WEIGHT:
                needed.add(v.buffer.id)
    for v in live.values.values():
        if v.last == live.end and v.buffer.kind == WEIGHT:
            needed.add(v.buffer.id)
    return needed


def lint_memory(memory_plan: MemoryPlan) -> list[str]:
    """What is wrong with ``memory_plan`` (empty when nothing): every value of the plan has a
    placement, an alias names a value that owns the same buffer, every arena buffer lies
    inside its arena, and no two arena buffers live at a common step share bytes.
    ``TG_DEBUG=2`` runs it after memory planning."""
    problems: list[str] = []
    live, places = memory_plan.liveness, memory_plan.placements
    for key, reads in live.steps:
        for k in (key, *reads):
            if k not in places:
                problems.append(f"{_value(k)} has no placement")
    for key, p in places.items():
        if p.alias_of is None:
            continue
        owner = places.get(p.alias_of)
        if owner is None or owner.buffer != p.buffer or owner.alias_of is not None:
            problems.append(f"{_value(key)} is placed as an alias of {_value(p.alias_of)}, "
                            "which does not own its buffer")
    for device in live.devices:
        bufs = live.arena_buffers(device)
        size = memory_plan.arena.get(device, 0)
        for b in bufs:
            start = memory_plan.buffer_offsets.get(b.id)
            if start is None or start < 0 or start + b.nbytes > size:
                problems.append(f"arena buffer {b.id} ({b.nbytes} B) at offset {start} lies "
                                f"outside the {device} arena of {size} B")
        for a, b in overlapping_pairs(bufs, memory_plan.buffer_offsets):
            problems.append(f"arena buffers {a.id} and {b.id} are live together at steps "
                            f"{max(a.first, b.first)}-{min(a.last, b.last)} and share bytes")
    return problems


def _value(key: Slot) -> str:
    node = key.node
    return f"{node.op.name} {format_shape(node.shape)} on {key.device}"


def check_fits(memory_plan: MemoryPlan, devices: Mapping[str, object]) -> None:
    """Raise ``OutOfMemory`` when a device of ``memory_plan`` lacks the bytes it needs.
    ``devices`` maps a device kind ("cpu") or name ("cuda:0") to a ``tg.Device``; a device
    kind of the plan with no entry is not checked. Available bytes: capacity - allocated."""
    for kind in sorted(set(memory_plan.devices) | set(memory_plan.results)):
        device = devices.get(kind)
        if device is None:
            device = next((d for d in devices.values() if getattr(d, "kind", None) == kind),
                          None)
        if device is None:
            continue
        required = memory_plan.total(kind) + memory_plan.results.get(kind, 0)
        available = device.capacity - device.allocated
        if required <= available:
            continue
        largest = memory_plan.largest(3, kind)
        held = f", {format_bytes(device.allocated)} already allocated" if device.allocated else ""
        parts = [f"arena {format_bytes(memory_plan.arena.get(kind, 0))}",
                 f"weights {format_bytes(memory_plan.weights.get(kind, 0))}"]
        if memory_plan.prepared.get(kind):
            parts.append(f"packed weights {format_bytes(memory_plan.prepared[kind])}")
        if memory_plan.state.get(kind):
            parts.append(f"state {format_bytes(memory_plan.state[kind])}")
        if memory_plan.results.get(kind):
            parts.append(f"results copied out of views {format_bytes(memory_plan.results[kind])}")
        tensors = "; ".join(str(t) for t in largest) or "none"
        needs, free = format_apart(required, max(available, 0))
        capacity = format_bytes(device.capacity) if needs == format_bytes(required) \
            else f"{device.capacity:,} B"  # in the unit the two figures are shown in
        raise OutOfMemory(
            f"out of memory on {device.name}: the program needs {needs} "
            f"({' + '.join(parts)}) but {free} are available "
            f"(capacity {capacity}{held}). Largest tensors: {tensors}. "
            f"Use a smaller batch or sequence length (or smaller bounds=...), or a device "
            f"with a larger capacity (tg.Device({device.name!r}, capacity=...)).",
            device=device.name, required=required, available=available, largest=largest)


def format_bytes(n: int) -> str:
    if n < 1000:
        return f"{n} B"
    for unit, scale in (("kB", 1e3), ("MB", 1e6), ("GB", 1e9), ("TB", 1e12)):
        if n < scale * 1000 or unit == "TB":
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"  # pragma: no cover


def format_apart(a: int, b: int) -> tuple[str, str]:
    """``a`` and ``b`` as ``format_bytes`` writes them, or both exactly in bytes where those
    would read the same: "needs 1.8 MB but 1.8 MB are available" (1 byte short) told nothing."""
    shown = format_bytes(a), format_bytes(b)
    return (f"{a:,} B", f"{b:,} B") if a != b and shown[0] == shown[1] else shown


def arena_buffers(memory_plan: MemoryPlan, device: str | None = None) -> list[Buffer]:
    return memory_plan.liveness.arena_buffers(device)
