"""Blocks nobody hand-fused: ours with and without generated kernels, torch eager, torch.compile.

    python benchmarks/fusion.py [--only mish] [--repeats 15] [--threads 2] [--no-compile]
                                [--profile missing|never] [--fresh]
    python benchmarks/fusion.py --kernel-alone 300     # the GroupNorm kernel vs F.group_norm

Every block is a torch module a user might write (an activation, a gated unit, a norm by hand,
a chain of pointwise ops) on (256, 4096) float32, and a diffusion UNet's GroupNorm + SiLU on
(8, 64, 32, 32) (32 groups). ``ours`` is ``tg.from_torch`` with generated
kernels (``generate=True``, the default: the planner may fuse any region into one C loop,
built and verified when chosen); ``ours-nogen`` the same without them (hand-written kernels and
op-by-op steps only); ``eager`` the module under ``torch.no_grad``; ``compile``
``torch.compile(module)``. Outputs are checked against eager first; repeats are interleaved in
one process (``models.bench``: rotating order, a pause so the previous runner's pool is idle,
one untimed call before each timed one); medians with min-max spread and the ratios
ours/competitor (< 1: ours is faster). ``--fresh`` plans against a new empty database (what a
new user gets; profile="missing" then measures what the plan considers before planning);
otherwise ``$TG_DB``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402
from models import bench, compiled, eager  # noqa: E402

SHAPE = (256, 4096)


# ---------------------------------------------------------------------------- blocks
class Chain12(torch.nn.Module):
    """Twelve pointwise ops in a row: scale, shift, tanh, square, sigmoid, ... ."""

    def forward(self, x):
        y = torch.tanh(x * 0.5 + 0.1)
        y = y * y - 0.25
        y = torch.sigmoid(y * 3.0)
        y = torch.exp(-y) + x
        return torch.maximum(y * 0.75, x - 1.0)


class Mish(torch.nn.Module):
    def forward(self, x):
        return x * torch.tanh(F.softplus(x))


class SwiGLU(torch.nn.Module):
    """The gated unit of a LLaMA MLP on its two projections (the matmuls are not the point)."""

    def forward(self, gate, up):
        return F.silu(gate) * up


class GeGLUTanh(torch.nn.Module):
    """GeGLU with the tanh approximation of GELU, scaled (a variant nobody hand-fused)."""

    def forward(self, gate, up):
        return F.gelu(gate, approximate="tanh") * up * 0.5


class RMSNormResidual(torch.nn.Module):
    """x + r, then RMSNorm with a learned scale, written out by hand."""

    def __init__(self, dim: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x, r):
        h = x + r
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class RMSNormKeepResidual(RMSNormResidual):
    """The same, returning the residual stream too (a pre-norm block hands it to the next
    residual add): the norm's kernel stores it as a second output (``Step.also``). The norm
    first: the one output ``models.bench`` checks against eager."""

    def forward(self, x, r):
        h = x + r
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight, h


class GroupNormSiLU(torch.nn.Module):
    """A diffusion UNet's norm and activation: GroupNorm (32 groups) with a learned per-channel
    scale and shift, then SiLU (nobody hand-fused GroupNorm here: a reshape to (N, G, rest),
    the statistics, the reshape back and the per-channel affine)."""

    def __init__(self, channels: int, groups: int = 32):
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.norm = torch.nn.GroupNorm(groups, channels)
        with torch.no_grad():
            self.norm.weight.copy_(torch.rand(channels, generator=g) + 0.5)
            self.norm.bias.copy_(torch.randn(channels, generator=g) * 0.1)

    def forward(self, x):
        return F.silu(self.norm(x))


def _inputs(n: int, shape: tuple[int, ...] = SHAPE) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(shape, generator=g) for _ in range(n))


BLOCKS = {
    "chain12 (256, 4096)": lambda: (Chain12(), _inputs(1)),
    "mish (256, 4096)": lambda: (Mish(), _inputs(1)),
    "swiglu (256, 4096)": lambda: (SwiGLU(), _inputs(2)),
    "geglu-tanh (256, 4096)": lambda: (GeGLUTanh(), _inputs(2)),
    "rmsnorm+residual (256, 4096)": lambda: (RMSNormResidual(SHAPE[1]).eval(), _inputs(2)),
    "rmsnorm+residual, both kept (256, 4096)": lambda: (RMSNormKeepResidual(SHAPE[1]).eval(),
                                                       _inputs(2)),
    "groupnorm+silu (8, 64, 32, 32)": lambda: (GroupNormSiLU(64).eval(),
                                               _inputs(1, (8, 64, 32, 32))),
}


# ---------------------------------------------------------------------------- runners
def _ours(generate: bool):
    def build(module, args, profile):
        prog = tg.from_torch(module, args, profile=profile, generate=generate)
        feeds = [a.numpy() for a in args]
        print(f"  [{'ours' if generate else 'ours-nogen'}] {len(prog.plan.steps)} steps: "
              + ", ".join(s.kernel.name for s in prog.plan.steps)[:200])
        return lambda: prog(*feeds)
    return build


RUNNERS = {"ours": _ours(True), "ours-nogen": _ours(False), "eager": eager,
           "compile": compiled}


def kernel_alone(calls: int) -> None:
    """GroupNorm (8, 64, 32, 32), 32 groups, with and without SiLU: the one generated step's
    kernel on preallocated buffers against torch's ``F.group_norm`` (and ``F.silu`` of it),
    interleaved, min and median of ``calls`` each: what the kernel costs without a program
    call's dispatch and its fresh result's page faults."""
    import time

    import numpy as np

    shape, groups = (8, 64, 32, 32), 32
    g = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=g) * 3 + 50
    w, b = torch.rand(shape[1], generator=g) + 0.5, torch.randn(shape[1], generator=g) * 0.1
    xs, ws, bs = tg.input("x", shape), tg.input("w", (shape[1],)), tg.input("b", (shape[1],))
    norm = tg.group_norm(xs, ws, bs, num_groups=groups)
    out = np.empty(shape, np.float32)
    arrays = {"x": x.numpy(), "w": w.numpy(), "b": b.numpy()}
    load = os.getloadavg()[0]
    for name, y, theirs in (("groupnorm", norm, lambda: F.group_norm(x, groups, w, b)),
                            ("groupnorm+silu", tg.silu(norm),
                             lambda: F.silu(F.group_norm(x, groups, w, b)))):
        prog = tg.compile(y, db=":memory:")
        if len(prog.plan.steps) != 1:
            print(f"  {name}: {len(prog.plan.steps)} steps, not one kernel: skipped")
            continue
        step = prog.plan.steps[0]
        args = [arrays[s.node.name] for s in step.inputs]

        def ours(fn=step.kernel.fn, args=args):
            fn(*args, out=out)

        times: dict[str, list[float]] = {"ours": [], "torch": []}
        for _ in range(calls):
            for label, fn in (("ours", ours), ("torch", theirs)):
                t = time.perf_counter()
                fn()
                times[label].append((time.perf_counter() - t) * 1e3)
        pool = torch.get_num_threads()
        torch.set_num_threads(1)  # on a loaded machine our kernel runs on one thread
        one = []
        for _ in range(calls):
            t = time.perf_counter()
            theirs()
            one.append((time.perf_counter() - t) * 1e3)
        torch.set_num_threads(pool)
        (mo, mt), (do, dt) = ((min(v) for v in times.values()),
                              (float(np.median(v)) for v in times.values()))
        print(f"  {name:15s} {step.kernel.name}: {mo:.3f} ms min, {do:.3f} median; torch "
              f"{mt:.3f} min, {dt:.3f} median ({pool} threads), {min(one):.3f} min, "
              f"{float(np.median(one)):.3f} median (1 thread); ours/torch {mo / mt:.2f} (min), "
              f"{do / dt:.2f} (median), {mo / min(one):.2f} (min, torch on 1 thread)")
    print(f"  load average {load:.1f} -> {os.getloadavg()[0]:.1f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0] + " Blocks: "
                                 + "; ".join(BLOCKS) + ".",
                                 epilog="smoke run: python benchmarks/fusion.py --only mish "
                                        "--repeats 1 --no-compile")
    ap.add_argument("--only", default="", help="run blocks whose name contains this text")
    ap.add_argument("--repeats", type=int, default=15,
                    help="interleaved timed calls of each runner after warm-up (default 15)")
    ap.add_argument("--threads", type=int, default=None, help="threads for every pool")
    ap.add_argument("--pause", type=float, default=0.1,
                    help="seconds of sleep before each runner's call pair (default 0.1)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--profile", choices=("missing", "never"), default="missing",
                    help="ours: measure what the database lacks before planning (default)")
    ap.add_argument("--fresh", action="store_true",
                    help="plan against a new empty database (a new user's first run)")
    ap.add_argument("--kernel-alone", type=int, default=0, metavar="CALLS",
                    help="time the generated GroupNorm kernel alone against torch's "
                         "F.group_norm, CALLS interleaved calls each, instead of the blocks")
    args = ap.parse_args(argv)
    if args.kernel_alone:
        threads.set_num_threads(args.threads or threads.get_num_threads())
        print(f"# kernel alone: {threads.get_num_threads()} threads, {args.kernel_alone} "
              f"interleaved calls, torch {torch.__version__}")
        kernel_alone(args.kernel_alone)
        return 0
    if args.fresh:
        os.environ["TG_DB"] = str(Path(tempfile.mkdtemp(prefix="tg-fusion-")) / "m.sqlite")
    threads.set_num_threads(args.threads or threads.get_num_threads())
    runners = {k: v for k, v in RUNNERS.items() if not (k == "compile" and args.no_compile)}
    print(f"# fusion: {threads.get_num_threads()} threads, {args.repeats} interleaved repeats, "
          f"torch {torch.__version__}, tensor_graphs {tg.__version__}, database "
          f"{os.environ.get('TG_DB', 'the user cache')}")
    for name, make in BLOCKS.items():
        if args.only in name:
            bench(name, make, runners, args.repeats, args.profile, args.pause)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
