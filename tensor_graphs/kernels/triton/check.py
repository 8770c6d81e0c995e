"""Checking a Triton kernel against the float64 reference before it is ever timed.

The kernels take device tensors; ``numpy_call`` wraps one as the numpy function the C
renderers' checks call, so a region of float32/float64/int/bool values is checked by the same
code as its C kernel (``codegen.check_kernel``: broadcast, strided, NaN/inf inputs, exact where
exactness is possible; ``rowgen.check_row_kernel`` for rows), which also declares its
tolerance. Regions with half-precision values (float16, bfloat16) have no C kernel and no
float floor there; ``check_half`` runs the same trials with ``tg.kernels.verify``'s rule for
them: a half result may be off by its dtype's rounding (``LOW_PRECISION_BUDGET``) or twice the
error of the graph evaluated in its own dtypes, or the region's rounding bound. A half result
declares the float32 floor (the planner adds the half rounding: ``step_error``); a float32
result computed through half values declares twice the worst error of that own-dtype
evaluation. ``codegen.admitted`` then runs ``tg.kernels.verify(strict=True)`` on the kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.node import Node
from tensor_graphs.kernels.c import codegen as cg
from tensor_graphs.kernels.c import rowgen
from tensor_graphs.kernels.c.codegen import CheckReport, Region
from tensor_graphs.kernels.c.rowgen import RowRegion
from tensor_graphs.kernels.triton.exprs import HALF

FLOOR = {"float16": 1e-6, "bfloat16": 1e-6, "float32": 1e-6, "float64": 1e-12}  # per dtype:
# the least tolerance a float result computed in it declares (half: float32's, the rounding
# to half being the planner's to add)
EXACT = cg.EXACT_TOLERANCE  # int and bool results


def numpy_call(run: Callable) -> Callable:
    """``run`` (device tensors in and out) as a function of numpy arrays: inputs moved to the
    GPU's torch device with their strides kept (``convert.to_cuda``: the strided and
    broadcast trials stay strided on a real GPU), the result brought back."""
    from tensor_graphs.devices import torch_device
    from tensor_graphs.kernels.torch import convert

    device = torch_device("cuda")

    def call(*arrays):
        with np.errstate(all="ignore"):  # the interpreter computes with numpy: inf, NaN
            return convert.to_host(run(*(convert.to_cuda(a, device) for a in arrays)))

    return call


def has_half(nodes: Sequence[Node], inputs: Sequence[Node]) -> bool:
    return any(n.dtype.name in HALF for n in (*nodes, *inputs))


def floor(nodes: Sequence[Node], inputs: Sequence[Node]) -> float:
    """The tolerance a region declares before it is checked: its least precise float
    dtype's ``FLOOR`` (exact for int/bool-only regions)."""
    floats = [FLOOR[n.dtype.name] for n in (*nodes, *inputs) if n.dtype.is_float]
    return max(floats, default=EXACT)


def check_elementwise(fn: Callable, region: Region, seed: int = 0) -> CheckReport:
    """``fn`` (numpy in and out) against the reference on ``codegen``'s trials."""
    if not has_half(region.nodes, region.inputs):
        return cg.check_kernel(fn, region, seed)
    leaves = lambda shapes: [cg._leaf_for(k, n, s)  # noqa: SLF001
                             for k, (n, s) in enumerate(zip(region.inputs, shapes))]
    return check_half(fn, region.root, region.inputs, region.nodes,
                      cg._trial_shapes(region), leaves,  # noqa: SLF001
                      lambda ls: cg._on_leaves(region, ls), (False, True),  # noqa: SLF001
                      bound=lambda arrays: cg.rounding_bound(region, arrays),
                      rounding_decides=cg._rounding_decides(region), seed=seed)  # noqa: SLF001


def check_rows(fn: Callable, region: RowRegion, seed: int = 0) -> CheckReport:
    """``fn`` (numpy in and out) against the reference on ``rowgen``'s trials."""
    if not has_half(region.nodes, region.inputs):
        return rowgen.check_row_kernel(fn, region, seed)
    from tensor_graphs.ir.builder import input as _input

    leaves = lambda shapes: [_input(f"x{k}", s, n.dtype)
                             for k, (n, s) in enumerate(zip(region.inputs, shapes))]
    return check_half(fn, region.root, region.inputs, region.nodes,
                      rowgen.trial_shapes(region), leaves,
                      lambda ls: rowgen.region_graph(region, ls), (False,), seed=seed)


def check_half(fn: Callable, root: Node, inputs: Sequence[Node], nodes: Sequence[Node],
               trials, leaves_of, graph_of, specials, *, bound=None,
               rounding_decides: bool = False, seed: int = 0) -> CheckReport:
    """The trials of a region with half-precision values (see the module docstring):
    every other one strided, each with ``specials`` (NaN/inf/huge values or not)."""
    from tensor_graphs.ir.evaluate import evaluate
    from tensor_graphs.kernels.verify import LOW_PRECISION_BUDGET, bound_error, compare

    rng = np.random.default_rng(seed)
    out = root.dtype
    base = floor(nodes, inputs)
    worst = native_worst = 0.0
    tried: list = []
    for t, shapes in enumerate(trials):
        for special in specials:
            leaves = leaves_of(shapes)
            graph = graph_of(leaves)
            arrays = [cg._random_array(rng, s, n.dtype, special, t % 2 == 1)  # noqa: SLF001
                      for n, s in zip(inputs, shapes)]
            feeds = {leaf.name: a for leaf, a in zip(leaves, arrays)}
            try:
                native = np.asarray(evaluate(graph, feeds))
                r64 = np.asarray(evaluate(graph, feeds, dtype="float64"))
            except EvaluationError:
                continue
            got = fn(*arrays)
            tried.append(tuple(map(tuple, shapes)))
            where = f"shapes {[tuple(s) for s in shapes]}{', with NaN/inf' if special else ''}"
            if got.shape != native.shape or got.dtype != native.dtype:
                return CheckReport(False, math.inf, 0.0, tried, f"output {got.shape} "
                                   f"{got.dtype}, reference {native.shape} {native.dtype}")
            if not out.is_float:
                bad = ~((got == native) | (got == r64.astype(got.dtype)))
                if rounding_decides and bad.sum() <= max(1, bad.size // 100):
                    continue  # a last-bit difference of a transcendental moved a cut
                if bad.any():
                    i = tuple(np.argwhere(bad)[0])
                    return CheckReport(False, math.inf, 0.0, tried, f"{where}: element {i} is "
                                       f"{got[i]}, reference {native[i]}")
                continue
            error, problem = compare(got, r64, native)
            if problem is not None:
                return CheckReport(False, math.inf, 0.0, tried, f"{where}: {problem}")
            own, own_problem = compare(native, r64)
            own = 0.0 if own_problem is not None or not math.isfinite(own) else own
            native_worst = max(native_worst, own)
            allowed = max(base, LOW_PRECISION_BUDGET.get(out.name, 0.0), 2.0 * own)
            if bound is not None and error > allowed:
                allowed = max(allowed, bound_error(bound(arrays), got, r64))
            worst = max(worst, error)
            if not error <= allowed:
                return CheckReport(False, error, 0.0, tried, f"{where}: relative error "
                                   f"{error:.3g} > {allowed:.3g} (the {out.name} evaluation's "
                                   f"own error: {own:.3g})")
    if not out.is_float:
        return CheckReport(True, 0.0, base, tried)
    tolerance = base if out.name in HALF else max(base, 2.0 * native_worst)
    return CheckReport(True, worst, tolerance, tried)


__all__ = ["FLOOR", "check_elementwise", "check_half", "check_rows", "floor", "has_half",
           "numpy_call"]
