"""Build the generated kernels a plan chose, and say which ones it may not keep.

The planner costs generated kernels from their rendered source alone (``kernels/generated``);
nothing is compiled until a plan picks one. Here each chosen candidate is compiled and verified
against the float64 reference (``generated.realize``, once per process) and its step gets the
built kernel with the tolerance its checks declared. A candidate that fails to compile or
verify, or whose measured error is above the tolerance the plan was made for, is returned as
refused: the compiler plans again without it (a correct plan always exists without generated
kernels: every region they cover has its unfused options).
"""

from __future__ import annotations

import dataclasses

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.kernels import generated
from tensor_graphs.planner.plan import Plan


def realize_plan(plan: Plan) -> tuple[Plan, dict[str, str]]:
    """(the plan with built kernels, {refused candidate name: why}); with refusals the plan
    must not run (it still names the refused candidates)."""
    built: dict[str, object] = {}
    refused: dict[str, str] = {}
    for step in plan.steps:
        kernel = step.kernel
        if not isinstance(kernel, generated.Candidate) or kernel.name in built \
                or kernel.name in refused:
            continue
        try:
            real = generated.realize(kernel)
        except TensorGraphsError as exc:  # compile or verification: planned without it
            refused[kernel.name] = str(exc).splitlines()[0]
            continue
        if real.tolerance > plan.tolerance:
            refused[kernel.name] = (f"its checked error {real.tolerance:.1e} is above the "
                                    f"tolerance {plan.tolerance:g}")
            continue
        built[kernel.name] = real
    if refused or not built:
        return plan, refused
    steps = tuple(dataclasses.replace(s, kernel=built[s.kernel.name],
                                      error=max(s.error, built[s.kernel.name].tolerance))
                  if isinstance(s.kernel, generated.Candidate) else s for s in plan.steps)
    return dataclasses.replace(plan, steps=steps), {}


__all__ = ["realize_plan"]
