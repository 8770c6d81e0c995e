"""A compiled program's page: its plan (``plan_html``) with the program's own facts — device
names, the loop it runs, and, given feeds, each step's time in real calls (``trace``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tensor_graphs.db.cost import format_seconds
from tensor_graphs.planner.plan import Plan
from tensor_graphs.runtime.plan_html import write_html
from tensor_graphs.runtime.trace import timed_runs


def instruction_steps(plan: Plan, instructions: Sequence) -> list[int]:
    """Per per-call instruction the index of the plan step it runs. Lowering keeps the plan's
    order and sends static steps to the prelude, so the instructions are the non-static steps
    in order where the counts agree; otherwise each is matched to the next step of its kernel
    and shape (the prelude's steps skipped)."""
    per_call = [i for i, s in enumerate(plan.steps) if not s.static]
    if len(per_call) == len(instructions) and all(
            plan.steps[i].kernel.name == ins.name for i, ins in zip(per_call, instructions)):
        return per_call
    found, at = [], 0
    for ins in instructions:
        k = at
        while k < len(plan.steps) and not (plan.steps[k].kernel.name == ins.name and tuple(
                plan.steps[k].node.shape) == tuple(ins.shape)):
            k += 1
        if k == len(plan.steps):  # (never: each instruction comes from a step)
            found.append(-1)
            continue
        found.append(k)
        at = k + 1
    return found


def write_program_html(prog, path, feeds: Mapping | None, runs: int,
                       notes: Sequence[str] = ()) -> str:
    """Write ``prog``'s plan page to ``path``; with ``feeds``, time ``runs`` calls first."""
    measured: dict[int, float] = {}
    notes = list(notes)
    if feeds is not None:
        timing = timed_runs(prog, feeds, runs)
        steps = instruction_steps(prog.plan, timing.instructions)
        for n, seconds in timing.medians().items():
            if steps[n] >= 0:
                measured[steps[n]] = seconds
        call = sorted(c[1] for c in timing.calls)[len(timing.calls) // 2]
        loop = timing.traced.split(",")[0].split(":")[0]  # "native loop" or "python loop"
        notes.append(f"measured: median of {runs} calls per step ({loop}), a call "
                     f"{format_seconds(call)} (steps {format_seconds(sum(measured.values()))})")
    name = "program"
    outputs = getattr(prog, "_outputs", ())
    if outputs:
        name = ", ".join(f"{o.op.name}{list(o.shape)}" for o in outputs[:3])
    return write_html(prog.plan, path, title=f"tensor_graphs plan: {name}", measured=measured,
                      device_name=prog.device_name, notes=tuple(notes))
