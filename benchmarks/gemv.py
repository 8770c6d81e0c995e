"""On a GPU: a decode step's GEMVs as a CUDA graph replays them, our configs against cuBLAS.

    python benchmarks/gemv.py [--out DIR] [--dtype fp32|bf16] [--calls 50] [--chain-only]

Decode runs its steps as one CUDA graph, so what a GEMV costs there is its time back to back
with the others, launch latency inside the graph included and the host's excluded. Each row
captures ``--calls`` calls of one kernel on GPT-2 124M's decode shapes (one row of x; the
weight (K, N) as GPT-2's Conv1D keeps it) into a graph, replays it, and divides: every config
of a grid around ``matmul.GEMV_CONFIGS`` (columns and K per program, warps; the splits of K
as ``gemv_splits`` picks them), and torch's ``addmm`` (cuBLAS) on the same tensors, interleaved
(the order rotates per repeat), medians of the repeats. Then the LayerNorm prologue: the
``ln_`` kernel against torch's ``layer_norm`` followed by the same GEMV config, and by
``addmm``. Each result is checked against float64 first. Last, a decode layer's four GEMVs
back to back in one graph, each of ``GEMV_CONFIGS`` launched as before and with
programmatic dependent launch (``runtime.PDL``: each GEMV loads its first weights while the
one before it ends), the ``CHAIN`` variants (other configs, eight warps, more splits) with it,
and the same four as cuBLAS ``addmm``, with one layer's weights (hot in L2) and with 12 layers'
(cold, read from HBM as a decode reads them), and as one persistent kernel a layer
(``chain.chain``: a program per SM, a grid-wide barrier between GEMVs, each stage's
first weights loaded before its barrier and the next stage's asked of L2; in a block's order,
each reading the last's result), also without either prefetch. The per-call grid is timed
cold too: a graph of calls over copies of the weight that together exceed twice the L2 (a
decode reads each weight once a token). Run where a GPU is usable (the ``device`` tool's
machine: ``--out $OUT``); the table goes to ``DIR/gemv.md``.
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

from tensor_graphs.kernels.torch import bound  # noqa: E402
from tensor_graphs.kernels.triton.templates import chain, matmul, runtime  # noqa: E402

SHAPES = [("c_attn", 768, 2304), ("attn c_proj", 768, 768), ("c_fc", 768, 3072),
          ("mlp c_proj", 3072, 768)]  # (label, K, N) of GPT-2 124M's decode GEMVs
GRID = [matmul.Gemv(n, k, 32, w, 3) for n, k, w in
        itertools.product((16, 32, 64, 128), (64, 128, 256), (4, 8))]
# a layer's chain, beyond GEMV_CONFIGS launched with and without PDL (and with PDL but the
# weights not marked bound: no loads before the wait): (config, programs gemv_splits aims
# for) with PDL, the default config before the eighteenth session (n64k128), half its
# columns (80 registers a thread, where n64k128 and n32k256 take ~170: room for the next
# kernel's programs; not faster in that session's run), eight warps, and twice the programs
# for a config whose K blocks allow more splits
CHAIN = [(matmul.Gemv(64, 128, 32, 4, 3), runtime.PROGRAMS),
         (matmul.Gemv(32, 128, 32, 4, 3), runtime.PROGRAMS),
         (matmul.Gemv(16, 256, 32, 8, 3), runtime.PROGRAMS),
         (matmul.Gemv(64, 64, 32, 4, 3), 2 * runtime.PROGRAMS)]
ORDER = (1, 2, 3, 0)  # SHAPES in a block's order after its attention: each reads the last
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
    # cold: copies of the weight over twice the L2, one call each a graph call (a decode
    # reads each weight once a token, from HBM)
    nbytes = w.numel() * w.element_size()
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    copies = [w] + [w.clone() for _ in range(-(-2 * l2 // nbytes))]

    def hot_and_cold(fn):  # (one call on a weight, a call on each copy)
        return fn, lambda: [fn(wi) for wi in copies]

    runners = {"cublas addmm": hot_and_cold(lambda wi: torch.addmm(bias, x, wi, out=out))}
    for cfg in GRID:
        runners[cfg.label + f"w{cfg.warps}"] = hot_and_cold(
            lambda wi, cfg=cfg: matmul.gemv(cfg, PLAIN, x, wi, bias, None, out))
    timed = {}  # (name, "hot" or "cold") -> what times one replay, us per GEMV
    for name, (fn, cold) in runners.items():  # checked before timed
        fn(w)
        torch.cuda.synchronize()
        err = error(out, ref)
        if err > (1e-4 if dtype == torch.float32 else 2e-2):
            print(f"  {label} {name}: error {err:.1e}, not timed")
            continue
        timed[name, "hot"] = in_graph(lambda fn=fn: fn(w), calls)
        timer = in_graph(cold, 1)
        timed[name, "cold"] = lambda timer=timer: timer() / len(copies)
    times = {key: [] for key in timed}
    order = list(timed)
    for r in range(repeats):
        for key in order[r % len(order):] + order[:r % len(order)]:
            times[key].append(timed[key]())
    med = {key: statistics.median(t) for key, t in times.items()}
    cublas = med.pop(("cublas addmm", "hot")), med.pop(("cublas addmm", "cold"))

    def ranked(kind):
        return sorted(((nm, t) for (nm, kd), t in med.items() if kd == kind),
                      key=lambda kv: kv[1])
    hot, cold = ranked("hot"), ranked("cold")
    mb = nbytes / 1e6
    lines = [f"| {label} | {k}x{n} ({mb:.1f} MB) | {cublas[0]:.2f} / {cublas[1]:.2f} | "
             + "<br>".join(f"`{nm}` {t:.2f}" for nm, t in hot[:4]) + " | "
             + "<br>".join(f"`{nm}` {t:.2f} ({nbytes / t / 1e6:.2f} TB/s)" for nm, t in cold[:4])
             + f" | {hot[-1][0]} {hot[-1][1]:.2f} |"]
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


def chain_rows(dtype, calls: int, repeats: int, layers: int = 12) -> list[str]:
    """GPT-2's four decode GEMVs of a layer back to back: each config launched as before and
    with PDL, and cuBLAS, interleaved; us per layer. Hot: one layer's weights, ``calls``
    times a graph, so they stay in L2 (60 MB on an H200) after the first; cold: ``layers``
    layers of their own weights a graph (12: 340 MB in fp32), as a decode step reads them,
    each from HBM. The per-call rows above are hot: a decode's GEMVs took 9.2 us a call in
    its graph where the hot figures read 3.5-7."""
    torch.manual_seed(0)

    def layer_ops():
        ops = []
        for _, k, n in SHAPES:
            x = torch.randn(1, k, device="cuda", dtype=dtype)
            w = torch.randn(k, n, device="cuda", dtype=dtype) / k ** 0.5
            bias = torch.randn(n, device="cuda", dtype=dtype)
            ops.append((x, w, bias, torch.empty(1, n, device="cuda", dtype=dtype),
                        torch.addmm(bias.double(), x.double(), w.double())))
        return ops

    stack = [layer_ops() for _ in range(layers)]
    for ops in stack:  # as a program's bound weights are (runtime: CompiledGraph.bind)
        for _, w, _, _, _ in ops:
            bound.mark(w)
    if not runtime.pdl(stack[0][0][0].device)["PDL"]:
        return ["", f"(no PDL here: compute capability {torch.cuda.get_device_capability()}, "
                "or a Triton without launch_pdl)"]
    size = sum(w.numel() * w.element_size() for _, w, _, _, _ in stack[0])

    def model(cfg, depth: int):
        for ops in stack[:depth]:
            for x, w, bias, out, _ in ops:
                matmul.gemv(cfg, PLAIN, x, w, bias, None, out)

    def cublas(depth: int):
        for ops in stack[:depth]:
            for x, w, bias, out, _ in ops:
                torch.addmm(bias, x, w, out=out)

    # the persistent chain (chain.chain): the same four GEMVs in a block's order after
    # its attention, each reading the one before's result (attn c_proj, c_fc, mlp c_proj,
    # the next block's c_attn), a launch a layer
    chained = []  # per layer: its four (a, w, bias, out), the last out, its float64 value
    for ops in stack:
        a, specs, ref = ops[ORDER[0]][0], [], ops[ORDER[0]][0].double()
        for i in ORDER:
            _, w, bias, _, _ = ops[i]
            specs.append((a, w, bias, torch.empty(1, w.shape[1], device="cuda", dtype=dtype)))
            ref = torch.addmm(bias.double(), ref, w.double())
            a = specs[-1][-1]
        chained.append((specs, a, ref))

    def persistent(cfg, depth: int):
        for specs, _, _ in chained[:depth]:
            chain.chain([matmul.Link(cfg, PLAIN, a, w, bias, None, out)
                               for a, w, bias, out in specs])

    # (name, depth) -> what times one replay, us per graph call; a hot graph holds ``calls``
    # layers, a cold one ``calls // layers`` passes over all of them (at least 1)
    passes = max(1, calls // layers)
    variants = [(cfg, dependent, runtime.PROGRAMS, True) for cfg in matmul.GEMV_CONFIGS
                for dependent in (False, True)] + \
        [(cfg, True, runtime.PROGRAMS, False) for cfg in matmul.GEMV_CONFIGS] + \
        [(cfg, True, p, True) for cfg, p in CHAIN]
    timers, errors = {}, {}
    for depth, repeat in ((1, calls), (layers, passes)):
        for cfg, dependent, programs, early in variants:
            # each read at each launch (the capture keeps the choice), set back after
            runtime.PDL, matmul.PROGRAMS = dependent, programs
            prefetch = bound.is_weight
            bound.is_weight = prefetch if early else (lambda _: False)
            try:
                name = (f"{cfg.label}w{cfg.warps}{' pdl' if dependent else ''}"
                        + ("" if early or not dependent else " no prefetch")
                        + (f" {programs} programs" if programs != runtime.PROGRAMS else ""))
                model(cfg, depth)
                torch.cuda.synchronize()
                errors[name] = max(error(out, ref) for ops in stack[:depth]
                                   for _, _, _, out, ref in ops)
                timers[name, depth] = in_graph(lambda cfg=cfg, d=depth: model(cfg, d), repeat)
            finally:
                runtime.PDL, matmul.PROGRAMS = True, runtime.PROGRAMS
                bound.is_weight = prefetch
        # each config as a decode runs it, then the first without loading its first weights
        # before each barrier, and without asking L2 for the next stage's weights
        for cfg, early, l2 in [(cfg, True, True) for cfg in matmul.GEMV_CONFIGS] + \
                [(matmul.GEMV_CONFIGS[0], False, True), (matmul.GEMV_CONFIGS[0], True, False)]:
            prefetch = bound.is_weight
            bound.is_weight = prefetch if early else (lambda _: False)
            chain.L2_PREFETCH = l2  # (read at each launch, so the capture keeps it)
            try:
                name = f"persistent chain {cfg.label}w{cfg.warps}" + \
                    ("" if early else " no prefetch") + ("" if l2 else " no L2 prefetch")
                persistent(cfg, depth)
                torch.cuda.synchronize()
                errors[name] = max(error(out, ref) for _, out, ref in chained[:depth])
                if chain.chain_failed(torch.device("cuda")):
                    print(f"  {name}: a barrier stopped waiting (not every program resident):"
                          " not timed")
                    continue
                timers[name, depth] = in_graph(lambda cfg=cfg, d=depth: persistent(cfg, d),
                                               repeat)
            except Exception as exc:  # noqa: BLE001 - a chain that cannot run is a result
                print(f"  {name}: failed, not timed: {type(exc).__name__}: "
                      f"{str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}")
            finally:
                bound.is_weight = prefetch
                chain.L2_PREFETCH = True
        timers["cublas addmm", depth] = in_graph(lambda d=depth: cublas(d), repeat)
    got = {key: [] for key in timers}
    order = list(timers)
    for r in range(repeats):
        for key in order[r % len(order):] + order[:r % len(order)]:
            got[key].append(timers[key]() / key[1])  # (a graph call is ``depth`` layers)
    med = {key: statistics.median(t) for key, t in got.items()}
    lines = ["", f"## A layer's four GEMVs back to back, us per layer (median of {repeats} "
             f"replays; hot: one layer's {size / 1e6:.1f} MB {calls} times a graph; cold: "
             f"{layers} layers of their own weights, {passes} pass(es) a graph)", "",
             "| kernels | hot | cold | cold TB/s | max error |", "|---|---:|---:|---:|---:|"]
    for name in dict.fromkeys(name for name, _ in order):
        if (name, 1) not in med or (name, layers) not in med:
            continue
        cold = med[name, layers]
        lines.append(f"| {name} | {med[name, 1]:.2f} | {cold:.2f} | {size / cold / 1e6:.2f} | "
                     f"{errors.get(name, float('nan')):.1e} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-results"))
    ap.add_argument("--dtype", choices=tuple(DTYPES), default="fp32")
    ap.add_argument("--calls", type=int, default=50, help="calls captured per graph")
    ap.add_argument("--repeats", type=int, default=15, help="interleaved replays each")
    ap.add_argument("--chain-only", action="store_true",
                    help="only a layer's four GEMVs back to back (the last table)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("benchmarks/gemv.py needs a GPU", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = out / "gemv.md"
    header = [f"\n## GEMVs in a CUDA graph, {args.dtype}, {torch.cuda.get_device_name()}, "
              f"us per call (median of {args.repeats} replays of {args.calls} calls)", "",
              "| shape | K x N | cuBLAS hot / cold | fastest configs, hot | fastest, cold "
              "(weights from HBM) | slowest, hot |", "|---|---|---:|---|---|---|"]
    with table.open("a") as f:
        f.write("\n".join(header) + "\n")
    print("\n".join(header))
    for label, k, n in SHAPES if not args.chain_only else ():
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
