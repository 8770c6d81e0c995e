"""On a GPU: a decode step's GEMVs as a CUDA graph replays them, our configs against cuBLAS.

    python benchmarks/gemv.py [--out DIR] [--dtype fp32|bf16] [--calls 50]

Decode runs its steps as one CUDA graph, so what a GEMV costs there is its time back to back
with the others, launch latency inside the graph included and the host's excluded. Each row
captures ``--calls`` calls of one kernel on GPT-2 124M's decode shapes (one row of x; the
weight (K, N) as GPT-2's Conv1D keeps it) into a graph, replays it, and divides: every config
of a grid around ``matmul.GEMV_CONFIGS`` (columns and K per program, warps; the splits of K
as ``gemv_splits`` picks them), and torch's ``addmm`` (cuBLAS) on the same tensors, interleaved
(the order rotates per repeat), medians of the repeats. Then the LayerNorm prologue: the
``ln_`` kernel against torch's ``layer_norm`` followed by the same GEMV config, and by
``addmm``. Each result is checked against float64 first. Last, a decode layer's four GEMVs
back to back in one graph, launched as before and with programmatic dependent launch
(``runtime.PDL``: each GEMV loads its first weights while the one before it ends), and the
same four as cuBLAS ``addmm``. Run where a GPU is usable (the ``device`` tool's machine:
``--out $OUT``); the table goes to ``DIR/gemv.md``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from tensor_graphs.kernels.triton.templates import matmul, runtime  # noqa: E402

SHAPES = [("c_attn", 768, 2304), ("attn c_proj", 768, 768), ("c_fc", 768, 3072),
          ("mlp c_proj", 3072, 768)]  # (label, K, N) of GPT-2 124M's decode GEMVs
GRID = [matmul.Gemv(n, k, 32, w, 3) for n, k, w in
        itertools.product((16, 32, 64, 128), (64, 128, 256), (4,))]
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
PLAIN = next(e for e in matmul.EPILOGUES if e.label == "matmul_bias")
NORMED = next(e for e in matmul.EPILOGUES if e.label == "ln_matmul_bias")


def in_graph(fn, calls: int):
    """fn captured ``calls`` times into one CUDA graph (after a warm-up call, which also makes
    the GEMV's arrival counters): returns a function timing one replay, us per call."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def timed() -> float:
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e3 / calls
    return timed


def error(got, ref) -> float:
    got, ref = got.double(), ref.double()
    return float((got - ref).norm() / ref.norm())


def rows_for(label, k, n, dtype, calls, repeats):
    torch.manual_seed(0)
    x = torch.randn(1, k, device="cuda", dtype=dtype)
    w = torch.randn(k, n, device="cuda", dtype=dtype) / k ** 0.5
    bias = torch.randn(n, device="cuda", dtype=dtype)
    g, beta = torch.randn(k, device="cuda", dtype=dtype), torch.randn(k, device="cuda",
                                                                      dtype=dtype)
    out = torch.empty(1, n, device="cuda", dtype=dtype)
    normed = torch.empty(1, k, device="cuda", dtype=dtype)
    ref = torch.addmm(bias.double(), x.double(), w.double())
    xn = F.layer_norm(x.double(), (k,), g.double(), beta.double(), matmul.LN_EPS)
    ref_ln = torch.addmm(bias.double(), xn, w.double())
    runners = {"cublas addmm": lambda: torch.addmm(bias, x, w, out=out)}
    checks = {"cublas addmm": ref}
    for cfg in GRID:
        runners[cfg.label + f"w{cfg.warps}"] = (
            lambda cfg=cfg: matmul.gemv(cfg, PLAIN, x, w, bias, None, out))
        checks[cfg.label + f"w{cfg.warps}"] = ref
    timed = {}  # name -> what times one replay of its graph (checked runners only)
    for name, fn in runners.items():  # checked before timed
        fn()
        torch.cuda.synchronize()
        err = error(out, checks[name])
        if err > (1e-4 if dtype == torch.float32 else 2e-2):
            print(f"  {label} {name}: error {err:.1e}, not timed")
            continue
        timed[name] = in_graph(fn, calls)
    times = {name: [] for name in timed}
    order = list(timed)
    for r in range(repeats):
        for name in order[r % len(order):] + order[:r % len(order)]:
            times[name].append(timed[name]())
    med = {name: statistics.median(t) for name, t in times.items()}
    cublas = med.pop("cublas addmm")
    ranked = sorted(med.items(), key=lambda kv: kv[1])
    mb = k * n * torch.tensor([], dtype=dtype).element_size() / 1e6
    lines = [f"| {label} | {k}x{n} ({mb:.1f} MB) | {cublas:.2f} | "
             + "<br>".join(f"`{nm}` {t:.2f}" for nm, t in ranked[:4])
             + f" | {ranked[-1][0]} {ranked[-1][1]:.2f} |"]
    # the LayerNorm prologue, in the current configs: fused against norm + GEMV, norm + addmm
    for cfg in matmul.GEMV_CONFIGS:
        fused = (lambda cfg=cfg: matmul.gemv(cfg, NORMED, x, w, bias, None, out, (g, beta)))
        fused()
        torch.cuda.synchronize()
        err = error(out, ref_ln)

        def apart(cfg=cfg):
            normed.copy_(F.layer_norm(x, (k,), g, beta, matmul.LN_EPS))
            matmul.gemv(cfg, PLAIN, normed, w, bias, None, out)

        def apart_cublas():
            normed.copy_(F.layer_norm(x, (k,), g, beta, matmul.LN_EPS))
            torch.addmm(bias, normed, w, out=out)
        timers = {"fused": in_graph(fused, calls), "norm + gemv": in_graph(apart, calls),
                  "norm + addmm": in_graph(apart_cublas, calls)}
        got = {name: [] for name in timers}
        for r in range(repeats):
            for name in list(timers)[r % 3:] + list(timers)[:r % 3]:
                got[name].append(timers[name]())
        m = {name: statistics.median(t) for name, t in got.items()}
        lines.append(f"| {label} + LayerNorm | {cfg.label}w{cfg.warps} (error {err:.1e}) | "
                     f"{m['norm + addmm']:.2f} | fused {m['fused']:.2f} | norm + gemv "
                     f"{m['norm + gemv']:.2f} |")
    return lines


def chain_rows(dtype, calls: int, repeats: int) -> list[str]:
    """GPT-2's four decode GEMVs of a layer back to back, ``calls`` layers a graph: each
    config launched as before and with PDL, and cuBLAS, interleaved; us per layer."""
    torch.manual_seed(0)
    ops = []
    for _, k, n in SHAPES:
        x = torch.randn(1, k, device="cuda", dtype=dtype)
        w = torch.randn(k, n, device="cuda", dtype=dtype) / k ** 0.5
        bias = torch.randn(n, device="cuda", dtype=dtype)
        ops.append((x, w, bias, torch.empty(1, n, device="cuda", dtype=dtype),
                    torch.addmm(bias.double(), x.double(), w.double())))
    if not runtime.pdl(ops[0][0].device)["PDL"]:
        return ["", f"(no PDL here: compute capability {torch.cuda.get_device_capability()}, "
                "or a Triton without launch_pdl)"]

    def layer(cfg):
        for x, w, bias, out, _ in ops:
            matmul.gemv(cfg, PLAIN, x, w, bias, None, out)

    def cublas():
        for x, w, bias, out, _ in ops:
            torch.addmm(bias, x, w, out=out)

    timers, errors = {}, {}
    for cfg in matmul.GEMV_CONFIGS:
        for dependent in (False, True):
            runtime.PDL = dependent  # read at each launch: the capture keeps the choice
            try:
                name = f"{cfg.label}{' pdl' if dependent else ''}"
                layer(cfg)
                torch.cuda.synchronize()
                errors[name] = max(error(out, ref) for _, _, _, out, ref in ops)
                timers[name] = in_graph(lambda cfg=cfg: layer(cfg), calls)
            finally:
                runtime.PDL = True
    timers["cublas addmm"] = in_graph(cublas, calls)
    got = {name: [] for name in timers}
    order = list(timers)
    for r in range(repeats):
        for name in order[r % len(order):] + order[:r % len(order)]:
            got[name].append(timers[name]())  # (a graph call is a layer: us per layer)
    med = {name: statistics.median(t) for name, t in got.items()}
    lines = ["", f"## A layer's four GEMVs back to back, us per layer (median of {repeats} "
             f"replays of {calls} layers)", "", "| kernels | us a layer | max error |",
             "|---|---:|---:|"]
    lines += [f"| {name} | {med[name]:.2f} | {errors.get(name, float('nan')):.1e} |"
              for name in order]
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    ap.add_argument("--calls", type=int, default=50, help="calls captured per graph")
    ap.add_argument("--repeats", type=int, default=15, help="interleaved replays each")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gemv.py needs a GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "gemv.md"
    header = [f"\n## GEMVs in a CUDA graph, {args.dtype}, {torch.cuda.get_device_name()}, "
              f"us per call (median of {args.repeats} replays of {args.calls} calls)", "",
              "| shape | K x N | cuBLAS | fastest configs | slowest |", "|---|---|---:|---|---|"]
    with table.open("a") as f:
        f.write("\n".join(header) + "\n")
    print("\n".join(header))
    for label, k, n in SHAPES:
        for line in rows_for(label, k, n, DTYPES[args.dtype], args.calls, args.repeats):
            print(line, flush=True)
            with table.open("a") as f:
                f.write(line + "\n")
    for line in chain_rows(DTYPES[args.dtype], args.calls, args.repeats):
        print(line, flush=True)
        with table.open("a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
