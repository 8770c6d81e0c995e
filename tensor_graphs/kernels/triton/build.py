"""Generated Triton modules on disk, imported, and the launchers that call their kernels.

Triton reads a kernel's source from its file (``@triton.jit`` refuses code made with
``exec``), so a rendered module is written to ``<cache>/triton/tg_triton_<hash>.py`` (the
folder of ``kernels/c/build.py``'s trusted cache, beside its ``c``; private, 0700) and imported
with importlib. What is there is imported as code, so the file is written atomically, rewritten
when its text is not the rendered source, and checked (``files.check_trusted_file``) before it
is imported.

A launcher is the kernel's function under the "cuda" calling convention: torch tensors on
``devices.torch_device("cuda")`` in (any strides, broadcasting as numpy does), ``out=`` a
contiguous tensor of the result's shape and dtype or None (a new one), the result returned.
It derives the launch arguments (merged dims and element strides) from the tensors' shapes and
strides, remembered per layout, and launches with the configuration's BLOCK and num_warps and
``enable_fp_fusion=False`` (no fused multiply-add: the reference rounds every product).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType, SimpleNamespace

from tensor_graphs.errors import KernelConstraintError, UntrustedPathError
from tensor_graphs.files import atomic_write, check_trusted_file, private_dir
from tensor_graphs.kernels import triton as package
from tensor_graphs.kernels.c import codegen as cg
from tensor_graphs.kernels.c import rowgen
from tensor_graphs.kernels.triton.render import MAX_RANK, Rendered
from tensor_graphs.kernels.triton.rows import MAX_LEADING

WIDE = 1 << 31  # offsets from here on are computed in int64 (int32 arithmetic would wrap)
MIN_ROW_BLOCK = 16  # the smallest block a persistent row kernel is launched with


@dataclass(frozen=True)
class Config:
    """A launch configuration: elementwise kernels use ``block`` (elements per program) and
    ``warps``; row kernels hold rows of up to ``persist`` elements in one block and loop over
    longer ones in blocks of ``block``."""

    block: int
    warps: int
    persist: int = 0

    @property
    def label(self) -> str:
        head = f"persist{self.persist}_" if self.persist else ""
        return f"{head}block{self.block}_warps{self.warps}"


_lock = threading.RLock()
_modules: dict[tuple[str, bool], ModuleType] = {}


def cache_dir() -> Path:
    """``tensor_graphs/triton`` beside the C cache (``kernels/c/build.py``) when that is the
    configured one, else a ``triton`` folder inside whichever private folder the C cache fell
    back to."""
    from tensor_graphs.kernels.c import build as cbuild

    c = cbuild.cache_dir()
    if c == cbuild.configured_cache_dir():
        try:
            return private_dir(c.parent / "triton")
        except (UntrustedPathError, OSError):
            pass
    return private_dir(c / "triton")


def module_path(rendered: Rendered) -> Path:
    return cache_dir() / f"tg_triton_{rendered.key}.py"


def _text(path) -> str | None:
    """The module file's text; None for bytes that are no UTF-8 (a file damaged or written
    by something else), which is then written again, not a UnicodeDecodeError."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def import_module(rendered: Rendered, interpret: bool | None = None) -> ModuleType:
    """The rendered module, written to its file and imported once per process and mode:
    ``interpret`` (default: whether the GPU is simulated) decorates its kernels for Triton's
    interpreter; False gives the compiler's kernels (ahead-of-time compiles)."""
    if interpret is None:
        interpret = package.interpreted()
    key = (rendered.key, interpret)
    with _lock:
        found = _modules.get(key)
        if found is not None:
            return found
        path = module_path(rendered)
        if not path.exists() or _text(path) != rendered.source:
            with atomic_write(path, only_owner_writes=True) as f:  # checked below
                f.write(rendered.source)
        check_trusted_file(path, "generated Triton module")
        package.load()
        name = f"tensor_graphs_triton_{rendered.key}" + ("_interpreted" if interpret else "")
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        before = os.environ.get(package.INTERPRET)
        os.environ[package.INTERPRET] = "1" if interpret else "0"  # read as kernels decorate
        try:
            sys.modules[name] = module
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        finally:
            if before is None:
                os.environ.pop(package.INTERPRET, None)
            else:
                os.environ[package.INTERPRET] = before
            if package.interpreted():
                os.environ[package.INTERPRET] = "1"
        _modules[key] = module
        return module


# ---------------------------------------------------------------------------- layouts
def _shim(t) -> SimpleNamespace:
    """A tensor as ``codegen._layout``/``rowgen._layout`` read arrays (strides in elements)."""
    return SimpleNamespace(ndim=t.dim(), shape=tuple(t.shape), strides=t.stride(), itemsize=1)


def _reach(sizes, strides) -> int:
    """The largest element offset an operand reaches from its start."""
    return sum((d - 1) * abs(s) for d, s in zip(sizes, strides))


def _dense(t, shape) -> bool:
    """Whether a tensor is read as a C-contiguous tensor of the output's shape or as one
    scalar: the layouts that merge into one dim with any others."""
    if t.numel() <= 1:
        return True
    return tuple(t.shape) == tuple(shape) and t.is_contiguous()


def _checked(description: str, tensors, dtypes) -> None:
    """Triton reads any pointer it is given: the arguments are checked first (count, dtype,
    and the GPU's memory: the host's under the simulated GPU)."""
    if len(tensors) != len(dtypes):
        raise KernelConstraintError(f"{description}: takes {len(dtypes)} inputs, got "
                                    f"{len(tensors)}")
    where = "cpu" if package.interpreted() else "cuda"
    for k, (t, want) in enumerate(zip(tensors, dtypes)):
        if getattr(t, "dtype", None) is not want or t.device.type != where:
            got = f"{t.dtype} on {t.device}" if hasattr(t, "device") else type(t).__name__
            raise KernelConstraintError(
                f"{description}: input x{k} must be a {want} tensor in the GPU's memory "
                f"(torch device {where!r}), got {got}; copy it there first (copy_to)")


def _output(description: str, out, shape, dtype, device):
    import torch

    if out is None:
        return torch.empty(shape, dtype=dtype, device=device)
    if tuple(out.shape) != tuple(shape) or out.dtype is not dtype or not out.is_contiguous():
        raise KernelConstraintError(
            f"{description}: out= must be a contiguous {dtype} tensor of shape "
            f"{tuple(shape)}, got {out.dtype} {tuple(out.shape)} strides {out.stride()}")
    return out


def _torch_dtypes(rendered: Rendered):
    from tensor_graphs.kernels.torch import convert

    return (tuple(convert.torch_dtype(d) for d in rendered.input_dtypes),
            convert.torch_dtype(rendered.out_dtype))


def elementwise_function(rendered: Rendered, module: ModuleType, config: Config,
                         description: str):
    """The launcher of an elementwise module's kernel (see the module docstring)."""
    import torch

    kernel = module.kernel
    in_dtypes, out_dtype = _torch_dtypes(rendered)
    plans: dict[tuple, tuple] = {}

    def plan(tensors):
        try:
            shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
        except RuntimeError:
            shown = ", ".join(str(tuple(t.shape)) for t in tensors)
            raise KernelConstraintError(f"{description}: input shapes {shown} do not "
                                        "broadcast") from None
        dims, strides = cg._layout([_shim(t) for t in tensors], shape)  # noqa: SLF001
        dense = ()
        if len(dims) > MAX_RANK:  # odd operands read as contiguous copies: one merged dim
            dense = tuple(not _dense(t, shape) for t in tensors)
            made = [t.expand(shape).contiguous() if d else t for t, d in zip(tensors, dense)]
            dims, strides = cg._layout([_shim(t) for t in made], shape)  # noqa: SLF001
        rank = len(dims)
        z = [1] * (MAX_RANK - rank) + list(dims)
        flat = []
        for st in strides:
            flat += [0] * (MAX_RANK - rank) + list(st)
        n = math.prod(shape)
        wide = n + config.block >= WIDE or any(_reach(dims, st) >= WIDE for st in strides)
        if len(plans) >= 256:
            plans.clear()
        return shape, n, dense, (n, *z[1:], *flat), rank, wide

    def run(*tensors, out=None):
        _checked(description, tensors, in_dtypes)
        key = tuple((tuple(t.shape), t.stride()) for t in tensors)
        found = plans.get(key)
        if found is None:
            found = plans[key] = plan(tensors)
        shape, n, dense, scalars, rank, wide = found
        if dense:
            tensors = [t.expand(shape).contiguous() if d else t
                       for t, d in zip(tensors, dense)]
        out = _output(description, out, shape, out_dtype, tensors[0].device)
        if n == 0:
            return out
        grid = ((n + config.block - 1) // config.block,)
        kernel[grid](out, *tensors, *scalars, RANK=rank, WIDE=wide, BLOCK=config.block,
                     num_warps=config.warps, enable_fp_fusion=False)
        return out

    return _named(run, rendered, description)


def row_function(rendered: Rendered, module: ModuleType | None, config: Config,
                 description: str, plan_only: bool = False):
    """The launcher of a row module: ``persistent`` for rows of up to ``config.persist``
    elements (BLOCK the next power of two; as many rows a program as make about
    ``config.block`` elements), ``looped`` over blocks of ``config.block`` beyond.
    ``plan_only``: a function returning (tensors, plan, out) instead, which the split
    launcher shares."""
    import torch

    in_dtypes, out_dtype = _torch_dtypes(rendered)
    plans: dict[tuple, tuple] = {}

    def plan(tensors):
        why = rowgen.shape_failure(rendered, [tuple(t.shape) for t in tensors])
        if why is not None:
            raise KernelConstraintError(f"{description}: {why}")
        shape = tuple(torch.broadcast_shapes(*(t.shape for t in tensors)))
        dims, strides = rowgen._layout([_shim(t) for t in tensors], shape)  # noqa: SLF001
        dense = ()
        if len(dims) > MAX_LEADING:  # inputs as contiguous copies: one merged leading dim
            dense = tuple(True for _ in tensors)
            made = [_rows_dense(t, shape, f) for t, f in zip(tensors, rendered.full)]
            dims, strides = rowgen._layout([_shim(t) for t in made], shape)  # noqa: SLF001
        lead = dims or [1]
        rank = len(lead)
        z = [1] * (MAX_LEADING - rank) + list(lead)
        flat = []
        for st, f in zip(strides, rendered.full):
            leading = st[:-1] or [0]
            flat += [0] * (MAX_LEADING - rank) + list(leading) + ([st[-1]] if f else [])
        width = shape[-1]
        rows = math.prod(shape[:-1])
        wide = rows * width >= WIDE or any(_reach(list(dims) + [width], st) >= WIDE
                                           for st in strides)
        block = max(MIN_ROW_BLOCK, 1 << max(0, width - 1).bit_length())
        persistent = block <= config.persist
        # rows per persistent program: about config.block elements (short rows share one),
        # no more than there are rows
        per = min(max(1, config.block // block), 1 << max(0, rows - 1).bit_length()) \
            if persistent else 1
        if len(plans) >= 256:
            plans.clear()
        return (shape, rows, dense, (rows, width, *z[1:], *flat), rank, wide,
                block if persistent else config.block, per, persistent)

    def run(*tensors, out=None):
        _checked(description, tensors, in_dtypes)
        key = tuple((tuple(t.shape), t.stride()) for t in tensors)
        found = plans.get(key)
        if found is None:
            found = plans[key] = plan(tensors)
        shape, rows, dense, scalars, rank, wide, block, per, persistent = found
        if dense:
            tensors = [_rows_dense(t, shape, f) for t, f in zip(tensors, rendered.full)]
        out = _output(description, out, shape, out_dtype, tensors[0].device)
        if plan_only:
            return tensors, found, out
        if out.numel() == 0:
            return out
        if persistent:  # (not BLOCK <= persist: a looped row's BLOCK is the loop's, which
            # every configuration keeps below its persist, so long rows ran persistent)
            module.persistent[((rows + per - 1) // per,)](
                out, *tensors, *scalars, RANK=rank, WIDE=wide, ROWS=per, BLOCK=block,
                num_warps=config.warps, enable_fp_fusion=False)
        else:
            module.looped[(rows,)](out, *tensors, *scalars, RANK=rank, WIDE=wide, BLOCK=block,
                                   num_warps=config.warps, enable_fp_fusion=False)
        return out

    return _named(run, rendered, description)


SPLIT_PROGRAMS = 2 * 132  # split rows: programs to aim for (two waves of an H100's SMs)


def split_count(rows: int, width: int, block: int) -> tuple[int, int]:
    """(S, CHUNK): chunks per row and elements per chunk (a multiple of ``block``), so that
    rows x S is about ``SPLIT_PROGRAMS`` and no chunk is empty."""
    blocks = -(-width // block)
    s = max(1, min(blocks, -(-SPLIT_PROGRAMS // max(rows, 1))))
    chunk = -(-blocks // s) * block
    return -(-width // chunk), chunk


def split_function(rendered: Rendered, module: ModuleType, config: Config, description: str,
                   nred: int, scratch: str):
    """The launcher of a split row module (``splitrows.py``): per level of reductions a
    ``part`` launch over rows x S chunks and a ``combine`` launch per row, then ``final``
    over rows x S; ``red`` and ``part`` scratch of ``scratch`` dtype made per call."""
    import torch

    rows_launcher = row_function(rendered, None, config, description, plan_only=True)
    phases = sum(1 for k in rendered.kernels if k.startswith("part"))
    acc = getattr(torch, scratch)

    def run(*tensors, out=None):
        tensors, found, out = rows_launcher(*tensors, out=out)
        if out.numel() == 0:
            return out
        shape, rows, dense, scalars, rank, wide, *_ = found
        width = shape[-1]
        s, chunk = split_count(rows, width, config.block)
        red = torch.empty((rows, max(nred, 1)), dtype=acc, device=out.device)
        part = torch.empty((rows, s, max(nred, 1)), dtype=acc, device=out.device)
        wide = wide or rows * s * max(nred, 1) >= WIDE
        args = (out, *tensors, *scalars, red, part, s, chunk)
        opts = {"RANK": rank, "WIDE": wide, "num_warps": config.warps,
                "enable_fp_fusion": False}
        lanes = max(MIN_ROW_BLOCK, 1 << max(0, s - 1).bit_length())
        for p in range(phases):
            getattr(module, f"part{p}")[(rows * s,)](*args, BLOCK=config.block, **opts)
            getattr(module, f"combine{p}")[(rows,)](*args, BLOCK=lanes, **opts)
        module.final[(rows * s,)](*args, BLOCK=config.block, **opts)
        return out

    return _named(run, rendered, description)


def _rows_dense(t, shape, full: bool):
    """A row kernel's input as a contiguous tensor whose leading dims are the output's."""
    target = tuple(shape) if full else tuple(shape[:-1]) + (1,)
    return t.expand(target).contiguous()


def _named(run, rendered: Rendered, description: str):
    run.source_text = rendered.source
    run.__name__ = run.__qualname__ = description.split(" ")[0]
    run.__doc__ = description
    return run


__all__ = ["Config", "WIDE", "cache_dir", "elementwise_function", "import_module",
           "module_path", "row_function", "split_count", "split_function"]
