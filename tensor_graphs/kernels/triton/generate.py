"""Triton kernels as planner options: the generators of ``kernels.generated.generators()``.

The regions are the C renderers': ``generated.grow`` with Triton's membership rules
(``exprs.fusable``: float16 and, on a GPU, bfloat16 too; ``rows.joins``), then
``codegen.elementwise_region`` or ``rowgen.row_region`` over the rebuilt root, given Triton's
predicates. Each region is rendered once; each launch configuration (``ELEMENTWISE_CONFIGS``,
``ROW_CONFIGS``) is its own candidate and kernel, named by a hash of the source and the
configuration, so the profiler times each, the database keeps each, and the planner picks by
cost as among any kernels. The planner asks every generator at every node, so the region found
for one configuration is kept for the others (``_last``), and nothing is offered where no GPU
can run them (``usable``).

A candidate's ``build`` writes and imports its module (``build.import_module``), checks the
kernel (``check.py``) and runs ``tg.kernels.verify(strict=True)`` on it (``codegen.admitted``)
before it is returned: nothing unchecked is ever timed or run.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections.abc import Callable, Mapping

import numpy as np

from tensor_graphs.devices import gpu_fault
from tensor_graphs.errors import KernelVerificationError, TensorGraphsError
from tensor_graphs.ir.node import Node
from tensor_graphs.kernels.c import codegen as cg
from tensor_graphs.kernels.c import rowgen
from tensor_graphs.kernels.triton import check, exprs, render, rows
from tensor_graphs.kernels.triton.build import Config

BACKEND = "triton"
DEVICE = "cuda"
# elementwise launches: one candidate each, the profiler's measurements decide
ELEMENTWISE_CONFIGS = (
    Config(1024, 4),  # Inductor's pointwise default: 8 elements a thread
    Config(4096, 8),  # 16 elements a thread: a quarter of the programs on large tensors
    Config(256, 2),  # 4 elements a thread: more programs in flight on small tensors
)
# row launches: rows of up to ``persist`` elements in one block, longer ones looped
ROW_CONFIGS = (
    Config(4096, 8, 16384),  # wide: 8 warps hold a row of 16384 (64 floats a thread)
    Config(2048, 4, 8192),  # the middle
    Config(1024, 2, 2048),  # narrow rows (768, 1024) on 2 warps; long rows in small blocks
)

# split row launches (``splitrows.py``: several programs a row, for long rows on few rows):
# the row configurations' loop blocks and warps, so ``tg kernels compile`` checks the same
SPLIT_CONFIGS = tuple(Config(c.block, c.warps) for c in ROW_CONFIGS)
SPLIT_MIN_WIDTH = 8192  # narrower rows fill a program each: the one-program kernels serve


@functools.lru_cache(maxsize=4)
def _usable(simulated) -> bool:
    from tensor_graphs.kernels import triton as package

    return package.usable()


def usable() -> bool:
    """Whether Triton candidates are offered: triton importable and a GPU, real or
    simulated (asked once per process and simulation setting)."""
    from tensor_graphs.devices import simulated_cuda

    return _usable(simulated_cuda())


def kernel_name(prefix: str, rendered: render.Rendered, config: Config) -> str:
    """The kernel's name and source hash: the source and the configuration, hashed."""
    text = rendered.source + "\n# config: " + config.label
    return f"{prefix}_{hashlib.blake2b(text.encode(), digest_size=8).hexdigest()}"


# ---------------------------------------------------------------------------- regions
class _Last(threading.local):
    """The region last found at a root, per thread: every configuration's generator asks
    for the same root in turn (keyed by identity: nodes, use counts and decomposition)."""

    key: tuple = ()
    value: object = None


_last = {"elementwise": _Last(), "rows": _Last(), "split_rows": _Last()}


def _remembered(kind: str, root: Node, uses, expand, find: Callable):
    memo = _last[kind]
    key = (root, uses, expand)
    # the planner's expand is a bound method, a new object at each access: equal, not same
    if len(memo.key) == 3 and memo.key[0] is root and memo.key[1] is uses \
            and memo.key[2] == expand:
        return memo.value
    value = find(root, uses, expand)
    memo.key, memo.value = key, value
    return value


def _fold(node: Node) -> Node:
    """An op on 0-d constants alone as the constant it computes (``codegen._fold`` for
    Triton's dtypes)."""
    if not exprs.fusable(node) or node.ndim or not node.inputs \
            or not all(exprs.inlinable(i) for i in node.inputs):
        return node
    from tensor_graphs.ir.builder import constant
    from tensor_graphs.ir.evaluate import evaluate

    return constant(np.asarray(evaluate(node, {})), node.dtype)


def _inlined(node: Node):
    return exprs.constant_value(node) if exprs.inlinable(node) else None


def elementwise_region(root: Node, uses: Mapping[Node, int], expand):
    """(covers, region, rebuilt root, rendered module) of the elementwise region rooted at
    ``root``, or None."""
    from tensor_graphs.kernels import generated

    if not exprs.fusable(root) or all(exprs.inlinable(i) for i in root.inputs):
        return None
    grown = generated.grow(root, uses, expand, exprs.fusable)
    if grown is None:
        return None
    covers, boundary, through = grown
    top = generated.rebuilt(covers, through, _fold)
    if top.op.is_leaf:
        return None
    region = cg.elementwise_region(top, [b for b in boundary if not exprs.inlinable(b)],
                                   decompose_composites=False, fusable=exprs.fusable,
                                   inlinable=exprs.inlinable)
    return covers, region, top, render.render(region)


def row_region(root: Node, uses: Mapping[Node, int], expand):
    """(covers, region, None, rendered module) of the row region rooted at ``root``, or
    None."""
    from tensor_graphs.kernels import generated

    if not exprs.fusable(root) or root.ndim == 0 or rowgen._is_one(rowgen._last(root)):  # noqa: SLF001
        return None
    width = rowgen._last(root)  # noqa: SLF001
    if not rowgen.reaches_reduction(root, expand, width, rows.joins):
        return None
    grown = generated.grow(root, uses, expand, lambda n: rows.joins(n, width))
    if grown is None:
        return None
    covers, boundary, through = grown
    if not any(n.op.name in rowgen.REDUCTIONS for n in covers):
        return None
    region = rowgen.row_region(generated.rebuilt(covers, through), boundary, _inlined)
    if region is None:
        return None
    return covers, region, None, rows.render(region)


def split_region(root: Node, uses: Mapping[Node, int], expand):
    """(covers, region, None, split module) of the row region rooted at ``root`` when its
    rows are at least ``SPLIT_MIN_WIDTH`` long (a static width), or None."""
    from tensor_graphs.kernels.triton import splitrows

    found = _remembered("rows", root, uses, expand, row_region)
    if found is None:
        return None
    width = rowgen._last(root)  # noqa: SLF001
    try:
        if int(width) < SPLIT_MIN_WIDTH:
            return None
    except TypeError:  # a symbolic width: the one-program kernels serve every length
        return None
    covers, region, top, _ = found
    return covers, region, top, splitrows.render(region)


# ---------------------------------------------------------------------------- candidates
def elementwise_candidate(root: Node, uses: Mapping[Node, int], expand, *,
                          config: Config = ELEMENTWISE_CONFIGS[0]):
    """The Triton elementwise option at ``root`` under one launch configuration."""
    return _candidate("elementwise", "triton_ew", elementwise_region, build_elementwise,
                      root, uses, expand, config)


def row_candidate(root: Node, uses: Mapping[Node, int], expand, *,
                  config: Config = ROW_CONFIGS[0]):
    """The Triton row option at ``root`` under one launch configuration."""
    return _candidate("rows", "triton_row", row_region, build_rows, root, uses, expand,
                      config)


def split_candidate(root: Node, uses: Mapping[Node, int], expand, *,
                    config: Config = SPLIT_CONFIGS[0]):
    """The Triton split-row option at ``root`` (long rows) under one launch configuration."""
    return _candidate("split_rows", "triton_split", split_region, build_split, root, uses,
                      expand, config)


def _candidate(kind: str, prefix: str, finder, build, root: Node, uses: Mapping[Node, int],
               expand, config: Config):
    """The candidate of the region ``finder`` finds at ``root`` (searched once for every
    configuration: ``_remembered``), named by its rendered source and ``config``."""
    if not usable():
        return None
    found = _remembered(kind, root, uses, expand, finder)
    if found is None:
        return None
    covers, region, top, rendered = found
    from tensor_graphs.kernels import generated

    name = kernel_name(prefix, rendered, config)
    return generated.Candidate(
        f"triton_{kind}_{config.label}", root, covers, region.inputs, name, name,
        check.floor(region.nodes, region.inputs), _label(rendered, config),
        functools.partial(build, region, rendered, config), computes=top,
        backend=BACKEND, device=DEVICE,
        draft=functools.partial(build, region, rendered, config, verify=False))


def _label(rendered: render.Rendered, config: Config) -> str:
    return f"generated Triton ({config.label}): {rendered.summary}"


def generator_rows() -> tuple[tuple[str, Callable], ...]:
    """The rows of ``generators()``: one generator per kind and configuration."""
    out = []
    for config in ELEMENTWISE_CONFIGS:
        out.append((f"triton_elementwise_{config.label}",
                    functools.partial(elementwise_candidate, config=config)))
    for config in ROW_CONFIGS:
        out.append((f"triton_rows_{config.label}",
                    functools.partial(row_candidate, config=config)))
    for config in SPLIT_CONFIGS:
        out.append((f"triton_split_rows_{config.label}",
                    functools.partial(split_candidate, config=config)))
    return tuple(out)


# ---------------------------------------------------------------------------- kernels
def _module(rendered: render.Rendered, name: str, summary: str):
    from tensor_graphs.kernels.triton import build

    try:
        return build.import_module(rendered)
    except TensorGraphsError:
        raise
    except Exception as exc:  # a module that does not import is a kernel that cannot run
        raise KernelVerificationError(f"{name} ({summary}): its Triton module does not "
                                      f"import: {type(exc).__name__}: {exc}") from exc


def _admitted(kernel, checker, fn, region, source: str):
    """``codegen.admitted`` after the renderer's check; a kernel that raises while checked
    (Triton refuses its code) is refused as a kernel that disagrees would be."""
    try:
        report = checker(check.numpy_call(fn), region)
    except TensorGraphsError:
        raise
    except Exception as exc:  # noqa: BLE001 - Triton's errors have no common base
        fault = gpu_fault(exc, f"checking kernel {kernel.name} ({kernel.summary})")
        if fault is not None:  # no finding on this kernel (devices.gpu_fault)
            raise fault from exc
        raise KernelVerificationError(f"{kernel.name} ({kernel.summary}) failed while "
                                      f"checked: {type(exc).__name__}: {exc}\n{source}") from exc
    return cg.admitted(kernel, report, source)


def build_elementwise(region: cg.Region, rendered: render.Rendered, config: Config,
                      verify: bool = True) -> cg.FusedKernel:
    """The checked kernel of an elementwise region under ``config`` (not registered)."""
    from tensor_graphs.kernels.triton import build

    name = kernel_name("triton_ew", rendered, config)
    summary = _label(rendered, config)
    module = _module(rendered, name, summary)
    fn = build.elementwise_function(rendered, module, config, f"{name} ({summary})")
    pattern, var_names = cg.region_pattern(region)
    size = cg.pattern_size(pattern, cg.MAX_PATTERN_MATCH)
    in_dtypes = rendered.input_dtypes
    where = cg.broadcast_constraint(name, in_dtypes)
    kernel = cg.FusedKernel(
        name=name, pattern=pattern, backend=BACKEND, device=DEVICE, fn=fn, inputs=var_names,
        signatures=cg.region_signatures(region), dtypes=tuple(dict.fromkeys(in_dtypes)) or None,
        where=where, tolerance=check.floor(region.nodes, region.inputs), writes_out=True,
        doc=summary, source_hash=name, region_digest=cg.region_digest(region),
        pattern_size=size, summary=summary,
        error_bound=cg.error_bound(region))
    if not verify:
        return kernel
    return _admitted(kernel, check.check_elementwise, fn, region, rendered.source)


def build_rows(region: rowgen.RowRegion, rendered: render.Rendered, config: Config,
               verify: bool = True) -> rowgen.RowKernel:
    """The checked kernel of a row region under ``config`` (not registered)."""
    from tensor_graphs.kernels.triton import build

    name = kernel_name("triton_row", rendered, config)
    summary = _label(rendered, config)
    module = _module(rendered, name, summary)
    fn = build.row_function(rendered, module, config, f"{name} ({summary})")
    return _row_kernel(region, rendered, name, summary, fn, verify)


def build_split(region: rowgen.RowRegion, rendered: render.Rendered, config: Config,
                verify: bool = True) -> rowgen.RowKernel:
    """The checked kernel of a row region split across programs (``splitrows.py``) under
    ``config`` (not registered)."""
    from tensor_graphs.kernels.triton import build, splitrows

    name = kernel_name("triton_split", rendered, config)
    summary = _label(rendered, config)
    module = _module(rendered, name, summary)
    fn = build.split_function(rendered, module, config, f"{name} ({summary})",
                              len(region.reductions), splitrows.accumulates_in(region))
    return _row_kernel(region, rendered, name, summary, fn, verify)


def _row_kernel(region: rowgen.RowRegion, rendered: render.Rendered, name: str, summary: str,
                fn, verify: bool) -> rowgen.RowKernel:
    """A row launcher as a registry kernel, checked unless ``verify`` is False."""
    pattern, var_names = rowgen.region_pattern(region)
    in_dtypes = rendered.input_dtypes

    def where(shapes, dts, attrs):
        for k, (d, want) in enumerate(zip(dts, in_dtypes)):
            if d != want:
                return f"input 'x{k}' must be {want.name}, got {d.name}"
        return rowgen.shape_failure(rendered, shapes) or True

    kernel = rowgen.RowKernel(
        name=name, pattern=pattern, backend=BACKEND, device=DEVICE, fn=fn, inputs=var_names,
        signatures=rowgen.region_signatures(region),
        dtypes=tuple(dict.fromkeys(in_dtypes)) or None, where=where,
        tolerance=check.floor(region.nodes, region.inputs), writes_out=True, doc=summary,
        source_hash=name, summary=summary)
    if not verify:
        return kernel
    return _admitted(kernel, check.check_rows, fn, region, rendered.source)


__all__ = ["BACKEND", "DEVICE", "ELEMENTWISE_CONFIGS", "ROW_CONFIGS", "SPLIT_CONFIGS",
           "SPLIT_MIN_WIDTH", "build_elementwise", "build_rows", "build_split",
           "elementwise_candidate", "elementwise_region", "generator_rows", "kernel_name",
           "row_candidate", "row_region", "split_candidate", "split_region", "usable"]
