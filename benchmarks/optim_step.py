"""One optimizer step over many parameters: tg.optim's compiled step against torch.optim.

    python benchmarks/optim_step.py [--optimizer adamw] [--tensors 12] [--rows 256]
                                    [--cols 1024] [--repeats 21] [--threads 2]

``tensors`` float32 parameters of (rows, cols) each (the default: 3.1M values, about a
4-layer d-256 GPT-2's weights), their gradients fed as inputs. Rows: our compiled step with
the states written over in place (the default), with the old copies per state (the
runtime's ``_overwrite`` and the native loop turned off), and torch.optim's single-tensor
and foreach implementations, stepping on the same values. Interleaved in one process,
medians and the 10th-90th percentile spread, ratios against torch's faster one; which loop
ran our step is printed.
On a loaded machine the spreads are wide (torch's own 10th percentile can be a tenth of its
median): compare medians of runs on a quiet machine.
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
from tensor_graphs.runtime import program as runtime_program  # noqa: E402

OURS = {"sgd": lambda: tg.optim.SGD(1e-3, momentum=0.9),
        "adam": lambda: tg.optim.Adam(1e-3),
        "adamw": lambda: tg.optim.AdamW(1e-3)}


def torch_optimizers(name: str, params: list, torch) -> dict:
    make = {"sgd": lambda ps, f: torch.optim.SGD(ps, lr=1e-3, momentum=0.9, foreach=f),
            "adam": lambda ps, f: torch.optim.Adam(ps, lr=1e-3, foreach=f),
            "adamw": lambda ps, f: torch.optim.AdamW(ps, lr=1e-3, foreach=f)}[name]
    return {"torch single-tensor": make(params, False), "torch foreach": make(params, True)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--optimizer", choices=sorted(OURS), default="adamw")
    parser.add_argument("--tensors", type=int, default=12)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--cols", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    threads.set_num_threads(args.threads)
    shape = (args.rows, args.cols)
    names = [f"w{i}" for i in range(args.tensors)]
    params = {n: tg.state(n, shape, "float32") for n in names}
    grads = {n: tg.input(f"grad.{n}", shape, "float32") for n in names}
    up = OURS[args.optimizer]().update(params, grads)
    prog = tg.compile(up.outputs)
    rng = np.random.default_rng(0)
    init = {n: rng.standard_normal(shape).astype(np.float32) for n in names}
    feeds = {f"grad.{n}": rng.standard_normal(shape).astype(np.float32) for n in names}
    prog.bind(**init, **up.state_init())

    overwrite = runtime_program._overwrite  # noqa: SLF001
    rows = {"tg in place": lambda: prog(**feeds)}

    def copying():  # as before the overwrite: each state copied twice, the Python loop
        runtime_program._overwrite = lambda *a: False  # noqa: SLF001
        prog.native = False  # (a recording made in place would replay the in-place copy)
        try:
            prog(**feeds)
        finally:
            runtime_program._overwrite = overwrite  # noqa: SLF001
            prog.native = True
    rows["tg copying"] = copying
    try:
        import torch

        torch.set_num_threads(args.threads)
        tp = [torch.tensor(v, requires_grad=True) for v in init.values()]
        for p, g in zip(tp, feeds.values()):
            p.grad = torch.from_numpy(g)
        rows.update((k, o.step) for k, o in torch_optimizers(args.optimizer, tp, torch).items())
    except ImportError:
        pass
    for fn in rows.values():  # warm up: the native loop records on the second call
        fn()
        fn()
    times: dict[str, list[float]] = {k: [] for k in rows}
    for _ in range(args.repeats):
        for k, fn in rows.items():
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    prog(**feeds)
    values = args.tensors * args.rows * args.cols
    print(f"{args.optimizer} step over {args.tensors} x {shape} float32 ({values / 1e6:.1f}M "
          f"values), {args.threads} threads; our step: {prog.loop}")
    torch_best = min((np.median(v) for k, v in times.items() if k.startswith("torch")),
                     default=None)
    for k, v in times.items():
        ms = np.array(v) * 1e3
        ratio = f"{np.median(ms) / (torch_best * 1e3):6.2f}x torch" if torch_best else ""
        print(f"{k:<22} {np.median(ms):8.2f} ms  ({np.percentile(ms, 10):.2f}-"
              f"{np.percentile(ms, 90):.2f})  {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
