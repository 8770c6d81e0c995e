"""Per-instruction overhead of a compiled program against numpy's and torch eager's per-op cost.

    python benchmarks/overhead.py [--steps 1000] [--size 8] [--repeats 15]

A chain of ``steps`` tiny elementwise ops (``y = y * x + x`` alternating, on ``size`` float32
elements) is compiled and called; the time per call divided by the number of instructions is
the per-instruction cost of the runtime loop plus the kernel's own call. Rows: numpy kernels
(Python loop), C kernels through the Python loop (``prog.native = False``), and C kernels
through the native loop (one foreign call per run; the C backend's elementwise kernels are
generated C, so ``a * b`` and ``a + b`` are generated first). Next to them: the same chain as
plain numpy calls and as torch eager calls in a Python loop. Everything runs interleaved in one
process (medians, 10th-90th percentile spread), with ratios against numpy and torch. The
issue's target for the native loop is 0.2 us per instruction.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np


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
    from tensor_graphs.kernels.c import codegen

    a, b = tg.input("a", (args.size,)), tg.input("b", (args.size,))
    codegen.fuse_elementwise(a * b)  # register generated C for the chain's two ops
    codegen.fuse_elementwise(a + b)
    runners = {}
    for label, backends, native in (("tg numpy kernels", ("numpy",), False),
                                    ("tg C, python loop", ("c",), False),
                                    ("tg C, native loop", ("c",), True)):
        try:
            prog = tg.compile(y, db=":memory:", backends=backends)
        except tg.TensorGraphsError as exc:
            print(f"{label}: cannot compile ({exc})")
            continue
        prog.native = native
        for _ in range(3):  # the prelude, a sighting, the recording
            prog(x=data)
        print(f"{label}: {prog.loop}")
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
    def per_instr(label):
        return np.array(samples[label]) / runners[label][1] * 1e6

    numpy_us = np.median(per_instr("numpy eager"))
    torch_us = np.median(per_instr("torch eager")) if "torch eager" in runners else None
    print(f"chain of {args.steps} elementwise ops on {args.size} float32 elements, "
          f"{args.repeats} interleaved runs, 1 thread")
    print(f"{'runner':<18} {'instr':>6} {'us/instr':>9} {'p10-p90':>15} {'vs numpy':>9}"
          f" {'vs torch':>9}")
    for label, (_, n) in runners.items():
        per = per_instr(label)
        med = np.median(per)
        vs_torch = f"{med / torch_us:8.2f}x" if torch_us else f"{'-':>9}"
        print(f"{label:<18} {n:6d} {med:9.3f} {np.percentile(per, 10):7.3f}-"
              f"{np.percentile(per, 90):7.3f} {med / numpy_us:8.2f}x {vs_torch}")
    if "tg C, native loop" in runners:
        med = np.median(per_instr("tg C, native loop"))
        slow = np.median(per_instr("tg C, python loop")) if "tg C, python loop" in runners \
            else float("nan")
        print(f"native loop: {med:.3f} us per instruction (target <= 0.2: "
              f"{'met' if med <= 0.2 else 'NOT met'}), {slow / med:.0f}x faster than the "
              f"Python loop over the same C kernels")
    return 0


if __name__ == "__main__":
    sys.exit(main())
