"""Arena size vs the max-live lower bound vs no reuse, on GPT-2-style graphs.

    python benchmarks/memory.py            # the issue's cases: 12 and 2 layers, batch 1, seq 128
    python benchmarks/memory.py --more     # plus longer sequences, a small vocabulary (where
                                           # activations rather than the logits dominate) and
                                           # numpy-only plans (no fused attention)

Target (issue 6): arena <= 1.15x the lower bound on the 12-layer graph. The lower bound is the
largest sum of (64-byte aligned) sizes of the transient buffers live at one step; no reuse is
the sum of all of them. Weights (and prelude results) live outside the arena and are listed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.demo import gpt2_style  # noqa: E402
from tensor_graphs.memory import format_bytes, plan_memory  # noqa: E402


def case(label, layers, batch, seq, vocab=50257, backends=None):
    y = gpt2_style(layers, vocab=vocab)
    t0 = time.perf_counter()
    prog = tg.compile(y, db=":memory:", bounds={"batch": batch, "seq": seq}, backends=backends)
    t1 = time.perf_counter()
    mp = plan_memory(prog.concrete_plan)
    t2 = time.perf_counter()
    d = "cpu"
    return (label, str(len(prog.plan.steps)), str(len(mp.liveness.arena_buffers(d))),
            format_bytes(mp.arena[d]), format_bytes(mp.lower_bound[d]),
            format_bytes(mp.no_reuse[d]), f"{mp.ratio(d):.3f}x",
            f"{mp.no_reuse[d] / mp.arena[d]:.1f}x", mp.strategy[d],
            format_bytes(mp.weights.get(d, 0)), f"{t1 - t0:.2f} s", f"{(t2 - t1) * 1e3:.0f} ms")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]))
    ap.add_argument("--more", action="store_true", help="also run the extra cases")
    args = ap.parse_args(argv)
    cases = [("gpt2 12 layers b1 s128", 12, 1, 128), ("gpt2 2 layers b1 s128", 2, 1, 128)]
    if args.more:
        cases += [("gpt2 12 layers b4 s512", 12, 4, 512),
                  ("gpt2 12 layers b1 s128 vocab 256", 12, 1, 128, 256),
                  ("gpt2 12 layers b4 s512 vocab 256", 12, 4, 512, 256),
                  ("gpt2 12 layers b1 s128 numpy", 12, 1, 128, 50257, ("numpy",)),
                  ("gpt2 12 layers b1 s128 vocab 256 numpy", 12, 1, 128, 256, ("numpy",))]
    rows = [("graph", "steps", "buffers", "arena", "lower bound", "no reuse", "arena/lb",
             "saved", "strategy", "weights", "compile", "plan_memory")]
    for c in cases:
        rows.append(case(*c))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for n, r in enumerate(rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))
    print("\narena/lb: arena over the max-live lower bound (target <= 1.15x); saved: no reuse "
          "over arena")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
