"""The tolerance buys speed: the same graph planned at 1e-2 and at 1e-7, both timed.

    python benchmarks/tolerance.py [--rows 512] [--cols 1024] [--repeats 15] [--threads 2]

An elementwise graph, ``tanh(x) * sigmoid(x) + x``, is compiled with
``profile="missing"`` into a temporary database at each tolerance. At 1e-2 the planner may use
the approximate kernels (``c_tanh_fast``: a Pade tanh, error about 1e-4); at 1e-7 only kernels
within one float32 rounding qualify. Both programs run interleaved in one process; the table
shows medians with the 10th-90th percentile spread, the kernels each plan chose, their errors
against the float64 reference, and the speed ratio.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np


import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    threads.set_num_threads(args.threads)

    x = tg.input("x", (args.rows, args.cols))
    y = tg.tanh(x) * tg.sigmoid(x) + x
    data = np.random.default_rng(0).standard_normal((args.rows, args.cols)).astype(np.float32)
    ref = tg.evaluate(y, {"x": data}, dtype="float64")
    db = str(Path(tempfile.mkdtemp(prefix="tg-tolerance-")) / "m.sqlite")
    progs = {tol: tg.compile(y, tolerance=tol, db=db, profile="missing")
             for tol in (1e-2, 1e-7)}
    samples: dict[float, list[float]] = {tol: [] for tol in progs}
    for _ in range(args.repeats):
        for tol, prog in progs.items():
            t0 = time.perf_counter()
            prog(x=data)
            samples[tol].append(time.perf_counter() - t0)
    print(f"tanh(x) * sigmoid(x) + x on ({args.rows}, {args.cols}) float32, "
          f"{args.threads} threads, {args.repeats} interleaved runs")
    print(f"{'tolerance':>9}  {'median':>9}  {'p10-p90':>17}  {'error':>8}  kernels")
    for tol, prog in progs.items():
        t = np.array(samples[tol]) * 1e3
        err = relative_error(prog(x=data), ref)
        print(f"{tol:9.0e}  {np.median(t):7.3f}ms  {np.percentile(t, 10):7.3f}-"
              f"{np.percentile(t, 90):7.3f}ms  {err:8.1e}  {', '.join(prog.plan.kernels)}")
    ratio = np.median(samples[1e-7]) / np.median(samples[1e-2])
    print(f"\nplan at 1e-2 is {ratio:.2f}x faster than the plan at 1e-7 "
          f"(uses c_tanh_fast: {'c_tanh_fast' in progs[1e-2].plan.kernels})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
