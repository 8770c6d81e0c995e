"""Checks of what the compile passes hand on: a graph, and a plan (``TG_DEBUG=2``).

Each check returns what is wrong, in words (empty when nothing is), and ``tg.compile`` raises
``PassError`` naming the pass after which it found it. They are the invariants every later
pass relies on without checking, so a pass that breaks one fails where it broke it, not three
passes later as a wrong result or a KeyError in the runtime:

- a graph: every node comes after its inputs (no cycle), each node's shape and dtype are what
  its op infers from its inputs and attributes again (a composite: what its decomposition
  gives), leaf names do not clash;
- a plan: every value a step reads is made before it (by a leaf or an earlier step), every
  value is made once, the outputs are made, every alias chain ends in a value of the same
  shape, dtype and device, and each step computes the node it is filed under.
"""

from __future__ import annotations

from collections.abc import Sequence

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.ir.graph import leaves, nodes
from tensor_graphs.ir.node import COMPOSITE, Node, expand_composite
from tensor_graphs.ir.shapes import dims_equal, format_shape
from tensor_graphs.planner.plan import Plan, Slot


def lint_graph(outputs: Sequence[Node]) -> list[str]:
    """What is wrong with the graph under ``outputs`` (see the module doc)."""
    problems: list[str] = []
    order = nodes(list(outputs))
    position = {id(n): i for i, n in enumerate(order)}
    for n in order:
        later = [i for i in n.inputs if position[id(i)] >= position[id(n)]]
        if later:
            problems.append(f"{_describe(n)} reads {_describe(later[0])}, which depends on it "
                            "(a cycle)")
            continue
        try:
            if n.op.kind == COMPOSITE:
                made = expand_composite(n.op, n.inputs, n.attrs)
                shape, dtype = made.shape, made.dtype
            else:
                shape, dtype = n.op.infer(n.inputs, n.attrs)
        except TensorGraphsError as exc:
            problems.append(f"{_describe(n)}: its op refuses its inputs ({exc})")
            continue
        if not _same_shape(shape, n.shape) or dtype != n.dtype:
            problems.append(f"{_describe(n)}: its op infers {format_shape(tuple(shape))} "
                            f"{dtype.name} from its inputs")
    try:
        leaves(list(outputs))
    except TensorGraphsError as exc:
        problems.append(str(exc))
    return problems


def lint_plan(plan: Plan) -> list[str]:
    """What is wrong with ``plan`` (see the module doc)."""
    problems: list[str] = []
    for a in plan.aliases:
        end, seen = a, {a}
        while end in plan.aliases:
            end = plan.aliases[end]
            if end in seen:
                problems.append(f"the alias of {_slot(a)} goes round in a circle")
                break
            seen.add(end)
        else:
            if not _same_shape(a.node.shape, end.node.shape) or a.node.dtype != end.node.dtype \
                    or a.device != end.device:
                problems.append(f"{_slot(a)} is an alias of {_slot(end)}: another shape, "
                                "dtype or device")
    if problems:
        return problems  # resolving below would not end
    made: dict[Slot, str] = {}
    for s in plan.leaves:
        if not s.node.op.is_leaf:
            problems.append(f"{_slot(s)} is filed as a leaf")
        made.setdefault(plan.resolve(s), "a leaf")
    for pos, step in enumerate(plan.steps):
        what = f"step {pos} ({step.kernel.name})"
        for i in step.inputs:
            if plan.resolve(i) not in made:
                problems.append(f"{what} reads {_slot(plan.resolve(i))} before any step makes "
                                "it")
        if step.nodes and step.nodes[-1] is not step.node:
            problems.append(f"{what} is filed under {_describe(step.node)} but computes "
                            f"{_describe(step.nodes[-1])}")
        for key in (plan.resolve(step.slot),
                    *(plan.resolve(a) for a in step.also_slots if a is not None)):
            if key in made:
                problems.append(f"{what} makes {_slot(key)}, already made by {made[key]}")
            made[key] = what
    for s in plan.outputs:
        if plan.resolve(s) not in made:
            problems.append(f"output {_slot(s)} is made by no step")
    return problems


def _same_shape(a, b) -> bool:
    a, b = tuple(a), tuple(b)
    return a == b or (len(a) == len(b) and all(dims_equal(x, y) for x, y in zip(a, b)))


def _describe(n: Node) -> str:
    name = f" '{n.name}'" if n.name is not None else ""
    return f"{n.op.name}{name} {format_shape(n.shape)} {n.dtype.name}"


def _slot(s: Slot) -> str:
    return f"{_describe(s.node)} on {s.device}"
