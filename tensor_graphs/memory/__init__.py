"""Static memory planning: liveness of a plan's values, one arena per device with an offset
for every transient buffer, totals per device and OutOfMemory before anything runs.

    mp = prog.memory_plan            # a MemoryPlan (plan_memory(plan) makes one)
    mp.totals()                      # {"cpu": arena + weights + state + viewed results}
    check_fits(mp, {"cpu": tg.Device("cpu", capacity=2**30)})   # raises OutOfMemory
"""

from tensor_graphs.memory.arena import (
    ALIGNMENT,
    ALIGNMENTS,
    STRATEGIES,
    alignment_for,
    assign_offsets,
    overlapping_pairs,
)
from tensor_graphs.memory.errors import OutOfMemory
from tensor_graphs.memory.liveness import (
                                           Buffer,
                                           Liveness,
                                           Value,
                                           analyze,
                                           max_live_lower_bound,
                                           no_reuse_total,
                                           static_keys,
)
from tensor_graphs.memory.plan import (
                                           MemoryPlan,
                                           Placement,
                                           Tensor,
                                           check_fits,
                                           format_bytes,
                                           lint_memory,
                                           plan_memory,
)

__all__ = ["ALIGNMENT", "ALIGNMENTS", "STRATEGIES", "Buffer", "Liveness", "MemoryPlan",
           "OutOfMemory", "Placement", "Tensor", "Value", "alignment_for", "analyze",
           "assign_offsets", "check_fits", "format_bytes", "lint_memory", "max_live_lower_bound",
           "no_reuse_total", "overlapping_pairs", "plan_memory", "static_keys"]
