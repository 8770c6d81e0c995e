"""One AdamW training step of a GPT-2-style model: tg.Trainer against torch eager.

    python benchmarks/train.py [--layers 4] [--width 256] [--batch 8] [--seq 128]
                               [--vocab 4096] [--repeats 11] [--threads 2]

The issue's target: ours <= 0.9x torch eager's step time, and peak memory <= torch's. Both
sides train the same model (tg.nn.GPT2 / transformers' GPT2LMHeadModel, tied head, no
dropout) from the same weights on the same batches, interleaved in one process; medians and
the 10th-90th percentile spread. Memory: our step's plan (arena + weights + states:
parameters and moments, ``trainer.memory()``) against torch's resident growth over the
process (parameters, moments, activations and gradients: torch has no allocator statistics
on the CPU, so that is the best it tells). On a loaded machine the spreads are wide: compare
medians of runs on a quiet machine.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--db", default=None)
    a = ap.parse_args()
    threads.set_num_threads(a.threads)
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    b, s, v = a.batch, a.seq, a.vocab
    torch.manual_seed(0)
    hf = GPT2LMHeadModel(GPT2Config(vocab_size=v, n_positions=s, n_embd=a.width,
                                    n_layer=a.layers, n_head=a.heads, resid_pdrop=0.0,
                                    embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                                    eos_token_id=None)).train()
    model = tg.nn.GPT2(tg.nn.GPT2Config(vocab_size=v, n_positions=s, n_embd=a.width,
                                        n_layer=a.layers, n_head=a.heads))
    ids, targets = tg.input("ids", (b, s), "int64"), tg.input("targets", (b * s,), "int64")
    loss = tg.cross_entropy(tg.reshape(model(ids), (b * s, v)), targets)
    start = time.perf_counter()
    trainer = tg.Trainer(loss, optimizer=tg.optim.AdamW(1e-3), db=a.db)
    plan_s = time.perf_counter() - start
    state = {k: t.detach().numpy().copy() for k, t in hf.state_dict().items()}
    trainer.bind(**{n: state[n] for n in trainer.params})
    topt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, v, (b, s)), rng.integers(0, v, (b * s,)))
               for _ in range(a.repeats + 1)]

    def torch_step(x, y):
        topt.zero_grad(set_to_none=True)
        out = torch.nn.functional.cross_entropy(hf(torch.from_numpy(x)).logits.reshape(-1, v),
                                                torch.from_numpy(y))
        out.backward()
        topt.step()
        return out.item()

    rss0 = _rss_mib()
    ours_t, theirs_t, worst = [], [], 0.0
    for i, (x, y) in enumerate(batches):
        t = time.perf_counter()
        ours = trainer.step(ids=x, targets=y)
        t1 = time.perf_counter()
        theirs = torch_step(x, y)
        t2 = time.perf_counter()
        worst = max(worst, abs(ours - theirs) / abs(theirs))
        if i:  # the first call of each warms up (generated kernels, torch's allocator)
            ours_t.append((t1 - t) * 1e3)
            theirs_t.append((t2 - t1) * 1e3)

    def summary(ts):
        return f"{np.median(ts):8.1f} ms ({np.percentile(ts, 10):.1f}-{np.percentile(ts, 90):.1f})"

    n = sum(int(np.prod(p.shape)) for p in trainer.params.values())
    print(f"GPT-2-style {a.layers} layers, d {a.width}, vocab {v}, batch {b}x{s}: {n:,} "
          f"parameters, {a.threads} thread(s); planned in {plan_s:.1f} s, "
          f"{len(trainer.program.plan.steps)} steps; loop: {trainer.program.loop}")
    print(f"  tensor_graphs  {summary(ours_t)}")
    print(f"  torch eager    {summary(theirs_t)}")
    print(f"  ratio {np.median(ours_t) / np.median(theirs_t):.2f}; losses within {worst:.1e} "
          "relative")
    print(f"  memory: ours {trainer.memory()['cpu'] / 2**20:.1f} MiB planned (arena + weights + "
          f"states); process peak RSS {_rss_mib():.0f} MiB ({rss0:.0f} MiB before the steps)")


if __name__ == "__main__":
    main()
