"""One AdamW training step of a GPT-2-style model: tg.Trainer against torch eager.

    python benchmarks/train.py [--layers 4] [--width 256] [--batch 8] [--seq 128]
                               [--vocab 4096] [--repeats 11] [--threads 2] [--db PATH]
                               [--backends c,numpy] [--profile never|missing]
                               [--estimates-too]

The issue's targets: ours <= 0.9x torch eager's step time, and peak memory <= torch's. Both
sides train the same model (tg.nn.GPT2 / transformers' GPT2LMHeadModel, tied head, no
dropout) from the same weights on the same batches, interleaved in one process; medians and
the 10th-90th percentile spread, and the load average (a 2-core machine shared with other
work swings both sides: compare medians of runs at low load).

Peak memory, each side's first step (which also creates the optimizer's moments):
- ours, planned: the step's memory plan (``trainer.memory()``: arena of activations and
  gradients + frozen weights + states: parameters, moments, count, learning rate).
- ours, measured: tracemalloc's peak over ``bind`` and the first step, plus the optimizer's
  initial states (moments, count, learning rate), which ``tg.Trainer`` binds when it is made,
  before that. numpy reports its allocations to tracemalloc, so this sees the parameters'
  buffers, the arena and any result a kernel allocates outside it; it misses C-side scratch
  (OpenBLAS's buffers, a strided GEMM's packing), as torch's figure misses its own BLAS
  buffers.
- torch: its parameters' bytes (live before the step) + the peak of the CPU allocator's
  "Total Allocated" over the first step, from torch.profiler's memory events
  (``profile_memory=True``): every tensor allocated during the step and still live (the
  activations autograd saves, gradients, AdamW's moments). torch keeps no allocator
  statistics on the CPU (``torch.cuda.max_memory_allocated`` has no CPU twin), and a
  process's RSS mixes both sides, the Python heap and freed pages glibc keeps, so the profiler's
  allocation events are the closest to an allocator's peak.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402

MIB = 2**20


def torch_peak_bytes(step, params) -> int:
    """Parameters' bytes + the peak of torch's CPU allocator over ``step()`` (see the module
    doc), from torch.profiler's memory events."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f)["traceEvents"]
    allocated = [e["args"]["Total Allocated"] for e in events
                 if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    before = sum(p.numel() * p.element_size() for p in params)
    return before + max(allocated, default=0)


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
    ap.add_argument("--backends", default=None,
                    help="comma-separated backends the plan may use (default: all)")
    ap.add_argument("--estimates-too", action="store_true",
                    help="also time, interleaved, the same step planned from estimates alone "
                         "(an empty database): how much the database's rows change the plan")
    ap.add_argument("--profile", default="never", choices=("never", "missing"),
                    help="measure the kernels the database lacks before planning")
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
    backends = a.backends.split(",") if a.backends else None
    start = time.perf_counter()
    trainer = tg.Trainer(loss, optimizer=tg.optim.AdamW(1e-3), db=a.db, backends=backends,
                         profile=a.profile)
    plan_s = time.perf_counter() - start
    state = {k: t.detach().numpy().copy() for k, t in hf.state_dict().items()}
    first = {n: state[n] for n in trainer.params}
    topt = torch.optim.AdamW(hf.parameters(), lr=1e-3)
    rng = np.random.default_rng(0)
    batches = [(rng.integers(0, v, (b, s)), rng.integers(0, v, (b * s,)))
               for _ in range(a.repeats + 2)]

    def torch_step(x, y):
        topt.zero_grad(set_to_none=True)
        out = torch.nn.functional.cross_entropy(hf(torch.from_numpy(x)).logits.reshape(-1, v),
                                                torch.from_numpy(y))
        out.backward()
        topt.step()
        return out.item()

    # peak memory: each side's first step (it also makes the optimizer's moments)
    x, y = batches[0]
    tracemalloc.start()
    trainer.bind(**first)
    ours_loss = trainer.step(ids=x, targets=y)
    ours_measured = tracemalloc.get_traced_memory()[1] + sum(
        value.nbytes for value in trainer.updates.init.values())
    tracemalloc.stop()
    losses = [0.0]
    theirs_bytes = torch_peak_bytes(lambda: losses.__setitem__(0, torch_step(x, y)),
                                    list(hf.parameters()))
    worst = abs(ours_loss - losses[0]) / abs(losses[0])

    fresh = None
    if a.estimates_too:
        fresh = tg.Trainer(loss, optimizer=tg.optim.AdamW(1e-3), db=":memory:",
                           backends=backends)
        fresh.bind(**first)
        fresh.step(ids=batches[0][0], targets=batches[0][1])  # the same state as ours
    ours_t, theirs_t, fresh_t = [], [], []
    load = os.getloadavg()
    for i, (x, y) in enumerate(batches[1:]):
        t = time.perf_counter()
        ours = trainer.step(ids=x, targets=y)
        t1 = time.perf_counter()
        theirs = torch_step(x, y)
        t2 = time.perf_counter()
        if fresh is not None:
            worst = max(worst, abs(fresh.step(ids=x, targets=y) - theirs) / abs(theirs))
            fresh_t.append((time.perf_counter() - t2) * 1e3)
        worst = max(worst, abs(ours - theirs) / abs(theirs))
        if i:  # the first timed call of each warms up (the native loop records on it)
            ours_t.append((t1 - t) * 1e3)
            theirs_t.append((t2 - t1) * 1e3)
    load = [max(p, q) for p, q in zip(load, os.getloadavg())]

    def summary(ts):
        return f"{np.median(ts):8.1f} ms ({np.percentile(ts, 10):.1f}-{np.percentile(ts, 90):.1f})"

    n = sum(int(np.prod(p.shape)) for p in trainer.params.values())
    mem = trainer.program.memory_plan
    print(f"GPT-2-style {a.layers} layers, d {a.width}, vocab {v}, batch {b}x{s}: {n:,} "
          f"parameters, {a.threads} thread(s), load average {load[0]:.1f} {load[1]:.1f} "
          f"{load[2]:.1f}; planned in {plan_s:.1f} s, {len(trainer.program.plan.steps)} steps; "
          f"loop: {trainer.program.loop}")
    print(f"  tensor_graphs  {summary(ours_t)}")
    print(f"  torch eager    {summary(theirs_t)}")
    if fresh is not None:
        fresh_t = fresh_t[1:]
        print(f"  tensor_graphs planned from estimates alone {summary(fresh_t)}: ratio "
              f"{np.median(fresh_t) / np.median(theirs_t):.2f} to torch, "
              f"{np.median(fresh_t) / np.median(ours_t):.2f} to the database's plan")
    print(f"  time ratio {np.median(ours_t) / np.median(theirs_t):.2f}; losses within "
          f"{worst:.1e} relative")
    planned = trainer.memory()["cpu"]
    print(f"  memory: ours {planned / MIB:.1f} MiB planned (arena "
          f"{mem.arena.get('cpu', 0) / MIB:.1f} + weights "
          f"{mem.weights.get('cpu', 0) / MIB:.1f} + states "
          f"{mem.state.get('cpu', 0) / MIB:.1f}), {ours_measured / MIB:.1f} MiB measured "
          f"(tracemalloc peak over bind and the first step + the optimizer's states); "
          f"torch {theirs_bytes / MIB:.1f} MiB "
          f"(parameters + the CPU allocator's peak over its first step, torch.profiler)")
    print(f"  memory ratio {planned / theirs_bytes:.2f} planned, "
          f"{ours_measured / theirs_bytes:.2f} measured")


if __name__ == "__main__":
    main()
