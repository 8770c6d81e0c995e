"""Generated row kernels (kernels/c/rowgen.py) against the plans without them and torch eager.

    python benchmarks/rowgen.py [--rounds 300] [--threads 2] [--rows 256] [--width 4096]

Hand-written blocks, as a user writes them from tg.* ops: RMSNorm with a residual add,
LayerNorm with and without one, and a softmax, float32. For each: the default plan (where a
hand kernel ties with the generated one on estimates it wins: the table names the kernels),
the plan with the hand norm kernels taken out of the registry (the generated kernel, for the
blocks a hand kernel also covers), ``tg.compile(..., generate=False)`` and torch eager on the
same values. Calls are interleaved (one call of each, then the next round); the table shows
the fastest call and the median of each: whole program calls (a new result array per call,
as a user gets it: its first touch costs ~0.25 ms at (256, 4096)) and the plan's kernels
alone on buffers allocated once (as the program's arena holds intermediates). On a busy
machine the fastest call is the figure to compare: a generated kernel's OpenMP team does not
shrink while the cores are oversubscribed, the hand kernels' (tg_team) does. Every result is
checked against the float64 reference first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs as tg  # noqa: E402,I001  (first: its thread-pool settings)

import numpy as np  # noqa: E402

from tensor_graphs.kernels import registry  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

HAND = ("c_add_layer_norm", "c_layer_norm", "c_rms_norm", "c_softmax")


def rms(h, w):
    return h * tg.rsqrt(tg.mean(h * h, axis=-1, keepdims=True) + 1e-6) * w


def layer_norm(h, w, b):
    c = h - tg.mean(h, axis=-1, keepdims=True)
    return c * tg.rsqrt(tg.mean(c * c, axis=-1, keepdims=True) + 1e-5) * w + b


def softmax(x):
    e = tg.exp(x - tg.max(x, axis=-1, keepdims=True))
    return e / tg.sum(e, axis=-1, keepdims=True)


def torch_blocks(torch):
    def t_rms(h, w):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def t_ln(h, w, b):
        c = h - h.mean(-1, keepdim=True)
        return c * torch.rsqrt((c * c).mean(-1, keepdim=True) + 1e-5) * w + b

    def t_softmax(x):
        e = torch.exp(x - x.amax(-1, keepdim=True))
        return e / e.sum(-1, keepdim=True)

    return t_rms, t_ln, t_softmax


def kernel_calls(prog, values):
    """The plan's kernels called in order on buffers allocated once (as the program's arena
    holds them), without the runtime: what the steps themselves cost."""
    by_node = {}
    for step in prog.plan.steps:
        for slot in step.inputs:
            n = slot.node
            if n.op.is_leaf and n not in by_node:
                by_node[n] = values[n.name]
    steps = []
    for step in prog.plan.steps:
        out = np.empty(tuple(step.node.shape), step.node.dtype.np_dtype)
        steps.append((step, out if getattr(step.kernel, "writes_out", False) else None))

    def run():
        got = dict(by_node)
        for step, out in steps:
            args = [got[s.node] for s in step.inputs]
            kw = {"out": out} if out is not None else {}
            got[step.node] = step.kernel.fn(*args, **kw, **step.attrs)
        return got[steps[-1][0].node]
    return run


def compiled(graph, weights, generate=True, hand=True):
    saved = [] if hand else [registry.get(k) for k in HAND]
    for k in saved:
        registry.unregister(k.name)
    try:
        prog = tg.compile(graph, db=":memory:", generate=generate)
    finally:
        for k in saved:
            registry.register(k)
    if weights:
        prog.bind(**weights)
    return prog


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--width", type=int, default=4096)
    args = ap.parse_args()
    tg.threads.set_num_threads(args.threads)  # torch too
    import torch

    rows, d = args.rows, args.width
    rng = np.random.default_rng(0)
    xv, rv = (rng.standard_normal((rows, d)).astype(np.float32) for _ in range(2))
    wv, bv = (rng.standard_normal(d).astype(np.float32) for _ in range(2))
    x, r = tg.input("x", (rows, d)), tg.input("r", (rows, d))
    w, b = tg.weight("w", (d,)), tg.weight("b", (d,))
    tx, tr, tw, tb = (torch.from_numpy(a) for a in (xv, rv, wv, bv))
    t_rms, t_ln, t_softmax = torch_blocks(torch)
    blocks = [
        ("RMSNorm + residual", rms(x + r, w), {"w": wv}, {"x": xv, "r": rv},
         lambda: t_rms(tx + tr, tw)),
        ("LayerNorm + residual", layer_norm(x + r, w, b), {"w": wv, "b": bv},
         {"x": xv, "r": rv}, lambda: t_ln(tx + tr, tw, tb)),
        ("LayerNorm", layer_norm(x, w, b), {"w": wv, "b": bv}, {"x": xv},
         lambda: t_ln(tx, tw, tb)),
        ("softmax", softmax(x), {}, {"x": xv}, lambda: t_softmax(tx)),
    ]
    print(f"({rows}, {d}) float32, {args.threads} threads, {args.rounds} interleaved rounds; "
          "fastest / median call in ms")
    for name, graph, weights, feeds, torch_fn in blocks:
        progs = {"default plan": compiled(graph, weights),
                 "generated": compiled(graph, weights, hand=False),
                 "generate=False": compiled(graph, weights, generate=False)}
        ref = tg.evaluate(graph, {**feeds, **weights}, dtype="float64")
        for label, prog in progs.items():
            error = relative_error(prog(**feeds), ref)
            assert error <= 1e-5, (name, label, error)
        calls = {**{k: (lambda p=p, f=feeds: p(**f)) for k, p in progs.items()},
                 **{f"{k}, kernels": kernel_calls(p, {**feeds, **weights})
                    for k, p in progs.items()},
                 "torch eager": torch_fn}
        for k in progs:
            error = relative_error(calls[f"{k}, kernels"](), ref)
            assert error <= 1e-5, (name, k, error)
        times: dict[str, list[float]] = {k: [] for k in calls}
        with torch.no_grad():
            for f in calls.values():
                f()
            for _ in range(args.rounds):
                for k, f in calls.items():
                    t0 = time.perf_counter()
                    f()
                    times[k].append(time.perf_counter() - t0)
        best = {k: min(v) for k, v in times.items()}
        print(f"\n{name}")
        for k, v in times.items():
            kernels = " + ".join(s.kernel.name for s in progs[k].plan.steps) if k in progs \
                else ""
            print(f"  {k:26s} {best[k] * 1e3:7.3f} / {statistics.median(v) * 1e3:7.3f}  "
                  f"{kernels}")
        for suffix in ("", ", kernels"):
            gen, plain = best["generated" + suffix], best["generate=False" + suffix]
            print(f"  generated{suffix} / generate=False{suffix} {gen / plain:.2f}x, "
                  f"/ torch eager {gen / best['torch eager']:.2f}x")


if __name__ == "__main__":
    main()
