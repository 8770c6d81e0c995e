"""What the planner decides: slots, options, steps and the plan a program runs.

- A ``Slot`` is a value on a device kind: (node, "cpu"). ``moved`` says whether the value may
  arrive by a copy from another device (a copy's own input must be made where it is, so copies
  never chain).
- An ``Option`` is one way to fill a slot: a kernel (which may cover several nodes), a copy from
  another device, the decomposition of a composite, an equivalent rewritten node, or a leaf
  (fed, bound or constant). Its ``needs`` are the slots it reads.
- A ``Plan`` is one option per needed slot, in execution order: ``steps`` (kernels and copies,
  what runs), ``aliases`` (a composite's value is its decomposition's value; a node's value
  is its rewrite's value) and ``leaves``.

How errors combine along a path: each step's error is its kernel's declared tolerance (the
verified bound on its norm-wise relative error against the float64 reference computed from the
same inputs; a float16/bfloat16 result adds its own rounding). A plan is within ``tolerance``
when every step is; the plan's ``error`` is its largest step error. Steps are not summed: the
float32 rounding that compounds through a deep graph depends on the graph's conditioning and
happens in any float32 execution, the reference's included, so the tolerance bounds what each
kernel may add beyond exactly rounded arithmetic on its own inputs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import sympy

from tensor_graphs.db.cost import Estimate, format_seconds
from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import PERMUTE
from tensor_graphs.ir.ops.quant import scheme_of
from tensor_graphs.ir.shapes import format_shape, resolve


class Slot(NamedTuple):
    node: Node
    device: str  # device kind: "cpu", "cuda"
    moved: bool = True  # may be filled by a copy from another device


KERNEL, COPY, DECOMPOSE, REWRITE, LEAF = "kernel", "copy", "decompose", "rewrite", "leaf"
GENERATED = "generated"  # label prefix of a generated kernel's option (kernels/generated.py)


def launches(kernel, device: str) -> bool:
    """Whether a step of ``kernel`` on ``device`` costs a launch and the runtime's dispatch:
    not a view on a GPU. A GPU program runs as a CUDA graph, where a view is resolved at
    capture and launches nothing; costed as a kernel, a Llama decode's ten slices of its
    packed q/k/v and gate/up products outweighed the six launches packing saves."""
    return not (kernel.view and device != "cpu")


@dataclass(frozen=True, eq=False)
class Option:
    """One way to fill a slot (see the module doc). ``label`` identifies it in a lock file."""

    how: str  # kernel | copy | decompose | rewrite | leaf
    slot: Slot
    needs: tuple[Slot, ...] = ()
    kernel: object = None  # the Kernel, for kernel and copy options
    covers: tuple[Node, ...] = ()  # nodes a kernel computes (its root last)
    attrs: Mapping = field(default_factory=dict)  # keyword attributes the kernel reads
    estimate: Estimate | None = None
    error: float = 0.0
    signature: str = ""
    features: object = None
    label: str = ""
    densify: float = 0.0  # seconds to make strided views dense for a contiguous kernel
    cold: float = 0.0  # seconds its activations take through memory (a decision term)
    static: bool = False  # runs once per binding (``ir.graph.is_static``), not per call

    @property
    def runs(self) -> bool:
        return self.how in (KERNEL, COPY)

    @property
    def seconds(self) -> float:
        return self.estimate.seconds if self.estimate is not None else 0.0


@dataclass(frozen=True, eq=False)
class Step:
    """One kernel call of a plan: ``kernel`` computes ``nodes`` (root last) from ``inputs``."""

    kernel: object
    node: Node
    device: str
    inputs: tuple[Slot, ...]
    nodes: tuple[Node, ...]
    attrs: Mapping
    estimate: Estimate
    error: float
    signature: str
    features: object = None
    densify: float = 0.0  # the runtime's copies of strided views this kernel reads densely
    static: bool = False  # runs once per binding, in the prelude (``ir.graph.is_static``)
    # values the kernel stores besides its result (a generated kernel's ``also``: the residual
    # stream beside its norm), in the kernel's order, each its own value on ``device``; None
    # where another step makes that value (the kernel's store is dropped)
    also: tuple[Node | None, ...] = ()

    @property
    def also_slots(self) -> tuple[Slot | None, ...]:
        """The slots of ``also``: each value is the step's own, on its device."""
        return tuple(None if n is None else Slot(n, self.device, False) for n in self.also)

    @property
    def cost(self) -> float:
        """Seconds of one run of the step (a static step runs once per binding)."""
        return self.estimate.seconds + self.densify

    @property
    def source(self) -> str:
        return self.estimate.source

    @property
    def computes(self) -> str:
        """The op the step computes: its root's, or the op under a root permute when the
        kernel also writes its result permuted (the heads-last C attention)."""
        if self.node.op.name == PERMUTE and len(self.nodes) > 1:
            return self.nodes[-2].op.name
        return self.node.op.name

    @property
    def is_copy(self) -> bool:
        return self.kernel.backend == "copy"

    @property
    def slot(self) -> Slot:
        """The slot the step fills. A copy of a value to another device fills that value's
        movable slot there (its input is the same node on the other device); every other step
        fills its node's own slot."""
        moved = self.is_copy and bool(self.inputs) and self.inputs[0].node is self.node
        return Slot(self.node, self.device, moved)

    def __repr__(self) -> str:
        return f"<Step {self.kernel.name} -> {self.node.op.name} {format_shape(self.node.shape)}>"


@dataclass(frozen=True, eq=False)
class Plan:
    """Steps in execution order plus how every needed value is found (see the module doc)."""

    steps: tuple[Step, ...]
    outputs: tuple[Slot, ...]
    aliases: Mapping[Slot, Slot]
    leaves: tuple[Slot, ...]
    decisions: tuple[str, ...]  # option labels in extraction order: the lock file's content
    tolerance: float
    dispatch: float = 0.0  # seconds the runtime spends per step besides the kernel itself

    @property
    def cost(self) -> float:
        """Predicted seconds of one call: the per-call steps' estimates plus the runtime's
        dispatch (static steps run once per binding: ``binding_cost``)."""
        return self.kernel_cost + self.dispatch_cost

    @property
    def dispatch_cost(self) -> float:
        """The runtime's dispatch of one call: of each per-call step that ``launches``."""
        return self.dispatch * sum(launches(s.kernel, s.device) for s in self.per_call)

    @property
    def per_call(self) -> list[Step]:
        """The steps every call runs (the rest run once per binding, in the prelude)."""
        return [s for s in self.steps if not s.static]

    @property
    def kernel_cost(self) -> float:
        return sum(s.cost for s in self.per_call)

    @property
    def binding_cost(self) -> float:
        """Predicted seconds of the static steps, run once per weight binding."""
        return sum(s.cost for s in self.steps if s.static)

    @property
    def error(self) -> float:
        return max((s.error for s in self.steps), default=0.0)

    @property
    def kernels(self) -> list[str]:
        return [s.kernel.name for s in self.steps]

    def __iter__(self):
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def __getitem__(self, i):
        return self.steps[i]

    def resolve(self, slot: Slot) -> Slot:
        """The slot that actually holds ``slot``'s value (following decompositions, rewrites)."""
        seen = 0
        while slot in self.aliases:
            slot = self.aliases[slot]
            seen += 1
            if seen > 10_000:  # pragma: no cover - the planner never makes cycles
                raise RuntimeError("alias cycle in a plan")
        return slot

    def explain(self, limit: int | None = None) -> str:
        return explain(self, limit)

    def summary(self) -> str:
        return summary(self)

    @property
    def symbolic(self) -> bool:
        return any(not isinstance(d, int) for s in self.steps for d in s.node.shape)

    def at(self, dims: Mapping) -> Plan:
        """The same plan with symbolic dims replaced by ``dims`` (symbol -> int): steps in the
        same order, for what needs concrete shapes (memory planning at the bounds)."""
        from tensor_graphs.ir.graph import specialize_map

        memo: dict[Node, Node] = {}
        roots = [n for st in self.steps for n in (st.node, *st.nodes, *(i.node for i in
                                                                        st.inputs),
                                                  *(a for a in st.also if a is not None))]
        roots += [s.node for s in (*self.leaves, *self.outputs)]
        roots += [s.node for pair in self.aliases.items() for s in pair]
        specialize_map(roots, dims, memo)

        def slot(s: Slot) -> Slot:
            return Slot(memo[s.node], s.device, s.moved)

        def attrs(values: Mapping) -> dict:
            return {k: resolve(v, dims) if isinstance(v, (sympy.Basic, tuple)) else v
                    for k, v in values.items()}

        steps = tuple(Step(st.kernel, memo[st.node], st.device, tuple(map(slot, st.inputs)),
                           tuple(memo[n] for n in st.nodes), attrs(st.attrs), st.estimate,
                           st.error, st.signature, st.features, st.densify, st.static,
                           tuple(None if a is None else memo[a] for a in st.also))
                      for st in self.steps)
        return Plan(steps, tuple(map(slot, self.outputs)),
                    {slot(a): slot(b) for a, b in self.aliases.items()},
                    tuple(map(slot, self.leaves)), self.decisions, self.tolerance,
                    self.dispatch)

    def __repr__(self) -> str:
        return f"<Plan {len(self.steps)} steps, predicted {format_seconds(self.cost)}>"


def check_limit(limit, where: str = "explain") -> int | None:
    """``limit`` (how many steps a report shows) checked: None (all) or an int >= 0. A str
    failed deep in a comparison, and a negative one showed no step yet counted "3 more" of 2."""
    if limit is None:
        return None
    if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)) or limit < 0:
        raise ArgumentError(f"{where}(limit={limit!r}): give how many steps to show as an int "
                            f">= 0, or None for all of them")
    return int(limit)


def step_computes(s: Step) -> str:
    """What ``s`` computes as the table's "computes" column (and ``tg explain -o json``'s)
    shows it: a copy's destination, a generated kernel's ops, the fused nodes, the scheme of a
    quantized product, and whether it runs once per binding."""
    if s.is_copy:
        computes = f"copy to {s.device}"
    elif getattr(s.kernel, "generated", False):
        computes = f"generated: {ops_inside(s.nodes)}"
        if any(a is not None for a in s.also):
            computes += f" (stores {sum(a is not None for a in s.also)} more)"
    else:
        fused = len(s.nodes) - 1
        computes = s.computes + (f" (+{fused} fused)" if fused else "")
    if not s.is_copy and (scheme := scheme_of(s.nodes, [i.node for i in s.inputs])):
        computes += f" [{scheme}]"  # tg.quantize's scheme (ir/ops/quant.py)
    if s.static:
        computes += " (once per binding)"
    return computes


def explain(plan: Plan, limit: int | None = None) -> str:
    """The plan as a table: one row per step (copies included), then totals by backend and by
    cost source, and which parts rest on estimates rather than measurements. A plan of no
    steps (every output an input, weight or constant) says so instead of an empty table."""
    limit = check_limit(limit)
    if not plan.steps:
        return "\n".join([NO_STEPS, "", *_totals(plan)])
    rows = [("#", "kernel", "backend", "computes", "shape", "time", "source", "error")]
    for i, s in enumerate(plan.steps):
        if limit is not None and i >= limit:
            break
        rows.append((str(i), s.kernel.name, s.kernel.backend, step_computes(s),
                     format_shape(s.node.shape), format_seconds(s.cost), s.source,
                     f"{s.error:.0e}"))
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if limit is not None and len(plan.steps) > limit:
        lines.append(f"... {len(plan.steps) - limit} more steps")
    lines.append("")
    lines += _totals(plan)
    return "\n".join(lines)


def ops_inside(covered) -> str:
    """The ops a fused step computes, most frequent first: "12 ops: mul x5, add x4, exp x3"."""
    counts: dict[str, int] = {}
    for n in covered:
        counts[n.op.name] = counts.get(n.op.name, 0) + 1
    shown = ", ".join(f"{k} x{v}" if v > 1 else k
                      for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    return f"{len(covered)} ops: {shown}"


def summary(plan: Plan) -> str:
    """The totals of ``explain`` without the table, plus which kernels compute a composite op
    whole or several nodes fused, with counts: what a user checks first (did attention and the
    norms land on fused kernels, and are the costs measured)."""
    groups: dict[str, int] = {}
    for s in plan.steps:
        if not s.is_copy and (len(s.nodes) > 1 or not s.node.op.is_atomic):
            groups[s.kernel.name] = groups.get(s.kernel.name, 0) + 1
    fused = ", ".join(f"{name} x{n}" for name, n in sorted(groups.items(), key=lambda kv: -kv[1]))
    return "\n".join([*_totals(plan), f"fused or whole: {fused or 'none'}"])


NO_STEPS = ("no steps: nothing runs a call; every output is an input, weight or constant, "
            "returned as it is")


def _totals(plan: Plan) -> list[str]:
    by_backend: dict[str, list[float]] = {}
    by_source: dict[str, list[float]] = {}
    for s in plan.steps:
        by_backend.setdefault(s.kernel.backend, []).append(s.cost)
        by_source.setdefault(s.source, []).append(s.cost)
    fused = sum(1 for s in plan.steps if len(s.nodes) > 1)
    copies = sum(1 for s in plan.steps if s.is_copy)
    static = len(plan.steps) - len(plan.per_call)
    once = (f"; {static} static steps once per binding, {format_seconds(plan.binding_cost)}"
            if static else "")
    lines = [f"total: {len(plan.steps)} steps ({fused} fused, {copies} copies), predicted "
             f"{format_seconds(plan.cost)} a call (kernels {format_seconds(plan.kernel_cost)} + "
             f"dispatch {format_seconds(plan.dispatch_cost)}){once}, largest "
             f"step error {plan.error:.1e} (tolerance {plan.tolerance:g})"]
    lines.append("by backend: " + (", ".join(
        f"{b} {len(v)} steps {format_seconds(sum(v))}" for b, v in sorted(by_backend.items()))
        or "none (no steps)"))
    lines.append("by source:  " + (", ".join(
        f"{k} {len(v)} steps {format_seconds(sum(v))}" for k, v in sorted(by_source.items()))
        or "none (no steps)"))
    guessed = sum(len(v) for k, v in by_source.items()
                  if k in ("estimated", "stale", "calibrated"))
    if guessed:
        lines.append(f"{guessed} of {len(plan.steps)} steps rest on estimates, not "
                     "measurements: `tg profile` or tg.compile(..., profile='missing') "
                     "measures them")
    return lines
