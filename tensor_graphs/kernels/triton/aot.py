"""Ahead-of-time compiles of the rendered Triton kernels for a GPU this machine may not have.

``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32))``
runs Triton's whole compiler (TTIR, TTGIR, LLVM, PTX, ptxas) without a GPU, so CI can check
what the interpreter cannot: that every kernel and configuration compiles for the GPU and that
its shared memory fits the architecture's block limit (``SHARED_MEMORY``). Each rendered module
is compiled at the extremes of its code: an elementwise kernel at rank 1 (flat) and at
``MAX_RANK`` (every index division), a row kernel persistent at the configuration's largest
block (one row a program) and on rows of ``SHORT_ROW`` (as many as a program holds), and
looped at its loop block; a split row module's kernels (``splitrows.py``) at the loop block,
its combines at the widest partials a row may have. The modules are imported as compiled,
not interpreted, kernels (``build.import_module(..., interpret=False)``), in a process whose
triton is not the interpreter's (``require_compiler``: the simulated GPU's library functions
cannot compile).

A target may carry ``attrs``, the specialisation a launch gives its arguments (the templates'
16-byte divisibility of pointers and sizes, ``templates/targets.py``). They are handed to
``ASTSource`` as they are: divisibility is what lets loads vectorize and the pipeliner stage
them in shared memory, so a compile without them checks less shared memory than a GPU
allocates (the fp16 GEMM's tile: 24 KB without, 96 KB with). ``ASTSource(fn, signature,
constexprs=, attrs=)`` is triton 3.6's (the H200's) and 3.9's signature.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import NamedTuple

from tensor_graphs.errors import ArgumentError, DeviceError
from tensor_graphs.kernels.triton.build import Config
from tensor_graphs.kernels.triton.render import MAX_RANK, Rendered
from tensor_graphs.kernels.triton.rows import MAX_LEADING

# shared memory one block may use, by compute capability (bytes; the opt-in maximum)
SHARED_MEMORY = {
    70: 98_304,  # V100
    75: 65_536,  # T4, RTX 20xx
    80: 166_912,  # A100
    86: 101_376,  # RTX 30xx, A10
    89: 101_376,  # L4, RTX 40xx
    90: 232_448,  # H100, H200
}


SHORT_ROW = 128  # a row kernel is also compiled for rows this short, as many as a program holds


class Target(NamedTuple):
    """One compile, of the generated kernels (``targets``) or of the templates
    (``templates/targets.py``)."""

    name: str
    fn: object  # a triton JITFunction
    signature: dict  # argument name -> "*fp16", "i32" or "constexpr"
    constexprs: dict
    options: dict  # num_warps, num_stages, enable_fp_fusion
    attrs: dict | None = None  # (argument index,) -> [["tt.divisibility", 16]]: as launched
    kernel: str = ""  # the kernel x configuration it checks (one takes several compiles)


@dataclass
class Compiled:
    """What one target's compile gave: ok, the block's shared memory, seconds, or why not."""

    name: str
    ok: bool
    shared: int = 0
    seconds: float = 0.0
    error: str = ""
    kernel: str = ""  # the target's kernel x configuration (its name when it has none)


def parse_arch(text: str) -> int:
    """"sm_90" (or "90", "sm90") -> 90, a capability ``SHARED_MEMORY`` knows."""
    m = re.fullmatch(r"(?:sm_?)?(\d+)", text.strip().lower())
    if m is None or int(m.group(1)) not in SHARED_MEMORY:
        known = ", ".join(f"sm_{c}" for c in SHARED_MEMORY)
        raise ArgumentError(f"unknown GPU architecture {text!r}; use one of {known}")
    return int(m.group(1))


def targets(rendered: Rendered, configs: Iterable[Config], label: str = "") -> Iterator[Target]:
    """The compiles of one rendered module under each configuration (module docstring)."""
    from tensor_graphs.kernels import triton as package
    from tensor_graphs.kernels.triton import build

    package.require_compiler()  # the interpreter's kernels would only fail each compile
    module = build.import_module(rendered, interpret=False)
    base = dict(rendered.arguments)
    name = label or rendered.key
    for config in configs:
        options = {"num_warps": config.warps, "enable_fp_fusion": False}
        if rendered.kind == "elementwise":
            shapes = [("kernel", "flat", 1, config.block, 0),
                      ("kernel", f"rank{MAX_RANK}", MAX_RANK, config.block, 0)]
        elif rendered.kind == "split_rows":  # each phase at the loop block; the combines
            # over the most partials a row has (build.SPLIT_PROGRAMS, one row: 512 lanes)
            lanes = 1 << (build.SPLIT_PROGRAMS - 1).bit_length()
            shapes = [(k, f"rank{MAX_LEADING}", MAX_LEADING,
                       lanes if k.startswith("combine") else config.block, 0)
                      for k in rendered.kernels]
        else:  # (kernel, what, RANK, BLOCK, ROWS: rows a persistent program holds)
            many = config.block // SHORT_ROW
            shapes = [("persistent", f"block{config.persist}", 1, config.persist, 1),
                      ("persistent", f"rows{many}x{SHORT_ROW}", MAX_LEADING, SHORT_ROW, many),
                      ("looped", f"rank{MAX_LEADING}", MAX_LEADING, config.block, 0)]
        for fn_name, what, rank, block, rows in shapes:
            constexprs = {"RANK": rank, "WIDE": False, "BLOCK": block}
            if rows:
                constexprs["ROWS"] = rows
            signature = dict(base, **dict.fromkeys(constexprs, "constexpr"))
            yield Target(f"{name} {fn_name} {config.label} {what}", getattr(module, fn_name),
                         signature, constexprs, options, kernel=f"{name} {config.label}")


def compile_target(target: Target, arch: int) -> Compiled:
    """Compile one target for ``sm_<arch>``, specialised by its ``attrs``; a failure (the
    compiler's error, or shared memory beyond the architecture's limit) is a result, not an
    exception. Refused (``DeviceError``) in a process running Triton's interpreter."""
    from tensor_graphs.kernels import triton as package

    triton = package.require_compiler()
    from triton.backends.compiler import GPUTarget

    source = _ast_source()
    kernel = target.kernel or target.name
    start = time.perf_counter()
    try:
        src = source(fn=target.fn, signature=target.signature, constexprs=target.constexprs,
                     attrs=target.attrs or None)
        compiled = triton.compile(src, target=GPUTarget("cuda", arch, 32),
                                  options=dict(target.options))
    except Exception as exc:  # noqa: BLE001 - Triton's compile errors have no common base
        first = str(exc).strip().splitlines()
        return Compiled(target.name, False, 0, time.perf_counter() - start,
                        f"{type(exc).__name__}: {first[-1] if first else ''}"[:500], kernel)
    shared = int(getattr(compiled.metadata, "shared", 0) or 0)
    seconds = time.perf_counter() - start
    limit = SHARED_MEMORY[arch]
    if shared > limit:
        return Compiled(target.name, False, shared, seconds, f"uses {shared} bytes of shared "
                        f"memory; sm_{arch} allows {limit} a block", kernel)
    return Compiled(target.name, True, shared, seconds, kernel=kernel)


def _ast_source():
    """triton's ASTSource, once its signature is known to take ``constexprs`` and ``attrs``
    (an older one would drop the attrs or fail every compile alike)."""
    import triton
    from triton.compiler import ASTSource

    taken = inspect.signature(ASTSource).parameters
    if not {"constexprs", "attrs"} <= set(taken):
        raise DeviceError(f"triton {triton.__version__}'s ASTSource takes ({', '.join(taken)}), "
                          "not constexprs= and attrs=: ahead-of-time compiles need a triton "
                          "that does (3.6 and 3.9 do; pip install -U triton)")
    return ASTSource


__all__ = ["SHARED_MEMORY", "Compiled", "Target", "compile_target", "parse_arch", "targets"]
