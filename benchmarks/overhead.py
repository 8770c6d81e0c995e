"""Per-instruction overhead of a compiled program against numpy's and torch eager's per-op cost.

    python benchmarks/overhead.py [--steps 1000] [--size 8] [--repeats 15]

A chain of ``steps`` tiny elementwise ops (``y = y * x + x`` alternating, on ``size`` float32
elements) is compiled once per backend set and called; the time per call divided by the number
of instructions is the per-instruction cost of the runtime loop plus the kernel's own call.
Next to it: the same chain as plain numpy calls and as torch eager calls in a Python loop.
Everything runs interleaved in one process (medians, 10th-90th percentile spread). The issue's
target for the native loop (one foreign call for an all-C program) is 0.2 us per instruction;
until the native loop exists this measures the Python interpreter loop.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402

try:
    import torch
except ImportError:  # the table then has no torch row
    torch = None


def chain(steps: int, size: int) -> tg.Node:
    x = tg.input("x", (size,))
    y = x
    for i in range(steps):
        y = y * x if i % 2 == 0 else y + x
    return y


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    threads.set_num_threads(1)  # tiny tensors: threads only add start-up cost
    y = chain(args.steps, args.size)
    data = np.full(args.size, 0.5, np.float32)
    runners = {}
    for label, backends in (("tg numpy kernels", ("numpy",)), ("tg C kernels", ("c",)),
                            ("tg any backend", None)):
        try:
            prog = tg.compile(y, db=":memory:", backends=backends)
        except tg.TensorGraphsError as exc:
            print(f"{label}: cannot compile ({exc})")
            continue
        runners[label] = (lambda p=prog: p(x=data), len(prog.plan))

    def numpy_chain():
        out = data
        for i in range(args.steps):
            out = out * data if i % 2 == 0 else out + data
        return out

    runners["numpy eager"] = (numpy_chain, args.steps)
    if torch is not None:
        torch.set_num_threads(1)
        t = torch.from_numpy(data)

        def torch_chain():
            out = t
            for i in range(args.steps):
                out = out * t if i % 2 == 0 else out + t
            return out

        runners["torch eager"] = (torch_chain, args.steps)
    samples: dict[str, list[float]] = {k: [] for k in runners}
    for _ in range(args.repeats):
        for label, (fn, _) in runners.items():
            t0 = time.perf_counter()
            fn()
            samples[label].append(time.perf_counter() - t0)
    base = np.median(samples["numpy eager"]) / args.steps
    print(f"chain of {args.steps} elementwise ops on {args.size} float32 elements, "
          f"{args.repeats} interleaved runs, 1 thread")
    print(f"{'runner':<18} {'instr':>6} {'us/instr':>9} {'p10-p90':>13} {'vs numpy':>9}")
    for label, (_, n) in runners.items():
        per = np.array(samples[label]) / n * 1e6
        print(f"{label:<18} {n:6d} {np.median(per):9.3f} {np.percentile(per, 10):6.3f}-"
              f"{np.percentile(per, 90):6.3f} {np.median(per) / (base * 1e6):8.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
