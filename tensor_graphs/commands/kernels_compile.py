"""``tg kernels compile --arch sm_90``: every Triton kernel and configuration, compiled for a GPU.

Triton compiles for a GPU without one (``kernels/triton/aot.py``), so a machine with no GPU
can still show that what a GPU would run compiles and fits its shared memory. The command
renders a fixed gallery of generated regions (``kernels/triton/gallery.py``: GELU chains, a
broadcast bias/residual add, softmax, log-softmax, LayerNorm with its residual add, RMSNorm) in
the dtypes asked, compiles each kernel under each launch configuration of the generators, and
the hand-written Triton templates' targets (``kernels/triton/templates/targets.py``, with the
16-byte alignment a launch specialises them on). A kernel x configuration takes several
compiles (the extremes of its code, or its dtypes and head dims) and counts as compiled when
all of them pass. It prints one line per failed compile, then the count; exits 1 when any
compile failed.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Iterable, Sequence

from tensor_graphs.cli_args import choice_of

DTYPES = ("float32", "float16", "bfloat16")  # what --dtype accepts
DEFAULT_DTYPES = ("float32", "float16")


def generated_targets(names: Sequence[str], dtypes: Sequence[str]):
    """The compiles of the gallery's regions (each name x dtype) under every configuration."""
    from tensor_graphs.kernels.triton import aot, gallery, generate

    for e in gallery.entries(names, dtypes):
        configs = generate.ELEMENTWISE_CONFIGS if e.kind == "elementwise" else \
            generate.ROW_CONFIGS
        yield from aot.targets(e.rendered, configs, f"{e.name} {e.dtype}")


def template_targets():
    """The hand-written templates' compiles (every template x config)."""
    from tensor_graphs.kernels.triton import templates

    return list(templates.compile_targets())


def run_compile(arch: int, names: Sequence[str], dtypes: Sequence[str], *,
                templates: bool = True, out=sys.stdout) -> list:
    """Compile everything asked for, printing a line per failed compile; every compile's
    ``aot.Compiled``."""
    from tensor_graphs.kernels.triton import aot

    todo = list(generated_targets(names, dtypes))
    if templates:
        todo += template_targets()
    results = []
    for target in todo:
        result = aot.compile_target(target, arch)
        results.append(result)
        if not result.ok:
            print(f"FAIL {result.name}: {result.error}", file=out, flush=True)
    return results


def summary(arch: int, results: Iterable) -> str:
    """The closing line: kernels x configurations compiled (all their compiles passed), the
    compiles, and the most shared memory one took against the architecture's limit."""
    from tensor_graphs.kernels.triton.aot import SHARED_MEMORY

    results = list(results)
    kernels: dict[str, bool] = {}
    for r in results:
        kernels[r.kernel] = kernels.get(r.kernel, True) and r.ok
    good = sum(kernels.values())
    failed = [r for r in results if not r.ok]
    most = max((r.shared for r in results if r.ok), default=0)
    memory = f"shared memory at most {most} of {SHARED_MEMORY[arch]} bytes a block"
    if not failed:
        return (f"sm_{arch}: {good} Triton kernels x configurations compiled ({len(results)} "
                f"compiles; {memory})")
    return (f"sm_{arch}: {good} of {len(kernels)} Triton kernels x configurations compiled, "
            f"{len(kernels) - good} failed ({len(failed)} of {len(results)} compiles failed; "
            f"{memory})")


def _run(args: argparse.Namespace) -> int:
    from tensor_graphs.errors import DeviceError
    from tensor_graphs.kernels import triton as package
    from tensor_graphs.kernels.triton import aot, gallery

    if not package.installed():
        raise DeviceError("tg kernels compile needs triton and torch installed (pip install "
                          "triton torch)")
    arch = aot.parse_arch(args.arch)
    package.require_compiler()  # before any rendering: the interpreter's triton cannot compile
    names = args.region or list(gallery.NAMES)
    dtypes = args.dtype or list(DEFAULT_DTYPES)
    results = run_compile(arch, names, dtypes, templates=not args.no_templates)
    print(summary(arch, results))
    return 1 if any(not r.ok for r in results) else 0


DESCRIPTION = (
    "Compiles Triton kernels ahead of time for a GPU architecture, on a machine with or "
    "without a GPU: the generated kernels of a fixed gallery of regions (GELU chains, a "
    "broadcast bias and residual add, softmax, log-softmax, LayerNorm with its residual add, "
    "RMSNorm) under every launch configuration the planner offers, and the hand-written "
    "Triton templates (matmul, attention, RoPE, embedding) under each of their configurations, "
    "specialised as a launch specialises them (16-byte aligned pointers and sizes). A compile "
    "fails when Triton refuses the kernel or its shared memory exceeds the architecture's "
    "limit for a block.",
    "Each kernel x configuration is compiled at the extremes of its code (a generated kernel "
    "flat and at the highest rank, a row kernel on one long row, on many short rows and "
    "looped; a template in each dtype and head dim that bounds its tiles) and counts as "
    "compiled when all of its compiles pass. Prints one line per failed compile, then "
    "'sm_90: N Triton kernels x configurations compiled (M compiles; shared memory at most "
    "... bytes a block)', or how many of them failed; exits 0 when all compiled, 1 when any "
    "compile failed, 2 when this process cannot compile (triton or torch missing, or Triton's "
    "interpreter on: TG_SIMULATED_CUDA or TRITON_INTERPRET set). Each compile takes about half "
    "a second; the whole default set (two dtypes and the templates) a minute or two.",
)


def add_compile_command(ksub) -> None:
    """Register ``tg kernels compile`` under ``tg kernels``."""
    from tensor_graphs.kernels.triton.aot import SHARED_MEMORY
    from tensor_graphs.kernels.triton.gallery import NAMES

    p = ksub.add_parser(
        "compile", help="compile every Triton kernel and configuration for a GPU (no GPU "
                        "needed)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(textwrap.fill(t, 78) for t in DESCRIPTION),
        epilog="example: tg kernels compile --arch sm_90 (an H100); tg kernels compile "
               "--arch sm_80 --region softmax --dtype float16 --no-templates")
    p.add_argument("--arch", required=True, metavar="ARCH",
                   help="the GPU architecture: " + ", ".join(f"sm_{c}" for c in SHARED_MEMORY))
    p.add_argument("--region", action="append", type=choice_of("region", lambda: NAMES),
                   help="only this gallery region (repeatable; default all: "
                        + ", ".join(NAMES) + ")")
    p.add_argument("--dtype", action="append", type=choice_of("dtype", lambda: DTYPES),
                   help="the gallery's dtypes (repeatable; default float32 and float16)")
    p.add_argument("--no-templates", action="store_true",
                   help="compile the generated kernels only, not the hand-written templates")
    p.set_defaults(run=_run)


__all__ = ["add_compile_command", "generated_targets", "run_compile", "summary",
           "template_targets"]
