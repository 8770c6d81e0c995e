"""torch.compile backends on GPT-2 2-layer (CPU): "tensor_graphs" against "inductor" and eager.

    python benchmarks/dynamo_backend.py [--length 128] [--repeats 9] [--threads 2]
                                        [--profile never|missing] [--db PATH]

One module (GPT-2's real config with 2 layers, random weights, its logits for ``input_ids``
without a cache), the same weights and inputs for every runner. For each backend: the first
call's seconds (Dynamo's capture plus the backend's compile: import, planning, C compiles for
ours; inductor's codegen) and the steady-state median per call, repeats interleaved (one call
of each runner per repeat, after warm-up calls, each timed call preceded by an untimed one so
its own thread pool is awake). Every output is checked against eager first (norm-wise relative
error), so a row never compares different computations. The database is a fresh file unless
--db names one (``--profile missing`` measures what the plan lacks into it first).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

from tensor_graphs import threads  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402


class Logits(torch.nn.Module):
    """GPT-2's logits for ``input_ids`` (no cache: the same graph for every runner)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", choices=("never", "missing"), default="never")
    ap.add_argument("--db", default=None, help="measurement database (default: a fresh file)")
    args = ap.parse_args()
    threads.set_num_threads(args.threads)
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=2, attn_implementation="sdpa")
    module = Logits(GPT2LMHeadModel(cfg).eval()).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, args.length))
    db = args.db or os.path.join(tempfile.mkdtemp(prefix="tg-dynamo-"), "db.sqlite")

    runners = {
        "eager": module,
        "inductor": torch.compile(module, backend="inductor"),
        "tensor_graphs": torch.compile(module, backend="tensor_graphs",
                                       options={"db": db, "profile": args.profile,
                                                "fallback": False}),
    }
    with torch.no_grad():
        ref = module(ids).double().numpy()
        first = {}
        for name, run in runners.items():
            start = time.perf_counter()
            out = run(ids)
            first[name] = time.perf_counter() - start
            err = relative_error(out.double().numpy(), ref)
            if err > 1e-4:
                raise SystemExit(f"{name}: relative error {err:.2e} against eager")
            for _ in range(2):  # warm-up
                run(ids)
        times: dict[str, list[float]] = {name: [] for name in runners}
        names = list(runners)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                runners[name](ids)  # untimed: its pool awake
                start = time.perf_counter()
                runners[name](ids)
                times[name].append(time.perf_counter() - start)

    print(f"GPT-2 2-layer (n_embd 768, vocab 50257), ids (1, {args.length}), "
          f"{args.threads} threads, profile={args.profile}, load {os.getloadavg()[0]:.1f}")
    print(f"{'backend':<14} {'first call s':>12} {'median ms':>10} {'min-max ms':>16}")
    for name in runners:
        t = [x * 1e3 for x in times[name]]
        print(f"{name:<14} {first[name]:>12.1f} {statistics.median(t):>10.2f} "
              f"{min(t):>7.2f}-{max(t):<8.2f}")
    ours, theirs = (statistics.median(times[n]) for n in ("tensor_graphs", "inductor"))
    print(f"tensor_graphs / inductor: {ours / theirs:.2f} (< 1: ours is faster)")


if __name__ == "__main__":
    main()
