"""``tg kernels compile --arch sm_90``: every Triton kernel and configuration, compiled for a GPU.

Triton compiles for a GPU without one (``kernels/triton/aot.py``), so a machine with no GPU
can still show that what a GPU would run compiles and fits its shared memory. The command
renders a fixed gallery of generated regions (``kernels/triton/gallery.py``: GELU chains, a
broadcast bias/residual add, softmax, log-softmax, LayerNorm with its residual add, RMSNorm) in
the dtypes asked, compiles each kernel under each launch configuration of the generators, and
the hand-written Triton templates' targets when that package is installed; it prints one line
per failure and the count, and exits 1 when anything failed.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Sequence

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
    """The hand-written templates' compiles; an empty list where that package is absent."""
    try:
        from tensor_graphs.kernels.triton import templates
    except ImportError:
        return []
    return list(templates.compile_targets())


def run_compile(arch: int, names: Sequence[str], dtypes: Sequence[str], *,
                templates: bool = True, out=sys.stdout) -> tuple[int, list]:
    """Compile everything asked for; (how many compiled, the failures)."""
    from tensor_graphs.kernels.triton import aot

    todo = list(generated_targets(names, dtypes))
    if templates:
        todo += template_targets()
    passed, failed = 0, []
    for target in todo:
        result = aot.compile_target(target, arch)
        if result.ok:
            passed += 1
        else:
            failed.append(result)
            print(f"FAIL {result.name}: {result.error}", file=out, flush=True)
    return passed, failed


def _run(args: argparse.Namespace) -> int:
    from tensor_graphs.errors import DeviceError
    from tensor_graphs.kernels import triton as package
    from tensor_graphs.kernels.triton import aot, gallery

    if not package.installed():
        raise DeviceError("tg kernels compile needs triton and torch installed (pip install "
                          "triton torch)")
    arch = aot.parse_arch(args.arch)
    names = args.region or list(gallery.NAMES)
    dtypes = args.dtype or list(DEFAULT_DTYPES)
    passed, failed = run_compile(arch, names, dtypes, templates=not args.no_templates)
    total = passed + len(failed)
    print(f"{passed} of {total} Triton kernel compiles for sm_{arch} succeeded"
          + (f", {len(failed)} failed" if failed else "")
          + f" (shared memory limit {aot.SHARED_MEMORY[arch]} bytes a block)")
    return 1 if failed else 0


DESCRIPTION = (
    "Compiles Triton kernels ahead of time for a GPU architecture, on a machine with or "
    "without a GPU: the generated kernels of a fixed gallery of regions (GELU chains, a "
    "broadcast bias and residual add, softmax, log-softmax, LayerNorm with its residual add, "
    "RMSNorm) under every launch configuration the planner offers, and the hand-written "
    "Triton templates (matmul, attention, RoPE, embedding). A compile fails when Triton "
    "refuses the kernel or its shared memory exceeds the architecture's limit for a block.",
    "Prints one line per failure, then the count; exits 1 when any compile failed. Each "
    "compile takes about half a second.",
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


__all__ = ["add_compile_command", "generated_targets", "run_compile", "template_targets"]
