"""Real models: tensor_graphs against torch eager, torch.compile and ONNX Runtime (CPU).

    python benchmarks/models.py [--only gpt2] [--repeats 9] [--threads 2] [--no-compile]
                                [--no-ort] [--unfused] [--profile missing|never]

Every workload is one torch module with its inputs; every runner gets the same weights and the
same inputs in one process. ``ours`` is ``tg.from_torch`` (planned from the measurement
database, profiling what it lacks unless --profile never); ``eager`` is the module itself under
``torch.no_grad``; ``compile`` is ``torch.compile(module)`` (a failure is recorded as such);
``ort`` is the module exported with ``torch.onnx.export`` and run by an ONNX Runtime CPU session
with its default graph optimisations. Each output is checked against eager first (norm-wise
relative error), so a row never compares different computations. Repeats are interleaved
(one call of each runner, in an order that rotates per repeat; before each timed call a short
pause, so the previous runner's thread pool is idle again (ONNX Runtime's and libgomp's workers
spin after a call), then one untimed call of the same runner, so its own pool is awake: each
runner is timed in the steady state of calling it in a loop) after warm-up calls; the table
shows medians with min-max spread, and ratios ours/competitor (< 1: ours is faster). One
thread setting for everything (tensor_graphs.threads: OpenBLAS, OpenMP and torch; ORT gets the
same count).
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

import numpy as np


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs import threads  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402


# ---------------------------------------------------------------------------- workloads
class Logits(torch.nn.Module):
    """A causal LM returning its full logits for ``input_ids`` (no cache)."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids):
        return self.lm(input_ids=input_ids, use_cache=False).logits


def gpt2(layers: int) -> tuple[torch.nn.Module, tuple]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=layers, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (1, 128))
    return Logits(GPT2LMHeadModel(cfg).eval()), (ids,)


def qwen3(layers: int) -> tuple[torch.nn.Module, tuple]:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(num_hidden_layers=layers, hidden_size=1024, intermediate_size=3072,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      vocab_size=32000, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (1, 128))
    return Logits(Qwen3ForCausalLM(cfg).eval()), (ids,)


def minilm(sentences: list[str] | None = None) -> tuple[torch.nn.Module, tuple]:
    from tensor_graphs.jobs import minilm as job

    module = job.torch_embedder()
    words = "the quick brown fox jumps over the lazy dog while a cat watches from the wall"
    if sentences is None:  # 8 sentences truncated to 128 tokens: no padding
        sentences = [" ".join([words] * 8)] * 8
    ids, mask = job.encode(sentences, max_seq=128)
    return module, (torch.from_numpy(ids), torch.from_numpy(mask))


WORKLOADS = {
    "gpt2-124m prefill 1x128": lambda: gpt2(12),
    "gpt2-2layer prefill 1x128": lambda: gpt2(2),
    "qwen3-style-4layer prefill 1x128": lambda: qwen3(4),
    "minilm 8x128": minilm,
}


# ---------------------------------------------------------------------------- runners
def ours(module, args, profile):
    prog = tg.from_torch(module, args, profile=profile)
    feeds = [a.numpy() for a in args]
    return lambda: prog(*feeds)


def unfused(module, args, profile):
    """ours with the sibling-product rewrite off (rewrite/siblings: Q, K and V, gate and up as
    one GEMM): the plan of the graph as imported, for measuring what the rewrite changes."""
    from tensor_graphs import compiler

    keep = compiler.sibling_groups
    compiler.sibling_groups = lambda graph: []
    try:
        return ours(module, args, profile)
    finally:
        compiler.sibling_groups = keep


def eager(module, args, profile):
    def run():
        with torch.no_grad():
            return module(*args)
    return run


def compiled(module, args, profile):
    fn = torch.compile(module)

    def run():
        with torch.no_grad():
            return fn(*args)
    return run


def ort(module, args, profile):
    import onnxruntime

    path = Path(tempfile.mkdtemp()) / "model.onnx"
    names = [f"input{i}" for i in range(len(args))]
    with torch.no_grad():
        torch.onnx.export(module, args, str(path), input_names=names, dynamo=True, verbose=False,
                          external_data=True)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads.get_num_threads()
    options.inter_op_num_threads = 1
    session = onnxruntime.InferenceSession(str(path), options,
                                           providers=["CPUExecutionProvider"])
    feeds = {n: a.numpy() for n, a in zip(names, args)}
    return lambda: session.run(None, feeds)[0]


RUNNERS = {"ours": ours, "unfused": unfused, "eager": eager, "compile": compiled, "ort": ort}


def _array(out) -> np.ndarray:
    if isinstance(out, (list, tuple)):
        out = out[0]
    return out.detach().numpy() if isinstance(out, torch.Tensor) else np.asarray(out)


def bench(name, make, runners, repeats, profile, pause=0.25):
    print(f"\n## {name}", flush=True)  # first: what a runner prints while it builds is this block's
    module, args = make()
    calls, notes = {}, {}
    ref = _array(eager(module, args, profile)())
    for label, build in runners.items():
        start = time.perf_counter()
        try:
            fn = build(module, args, profile)
            err = relative_error(_array(fn()), ref)  # warm-up call, checked
        except Exception as e:  # a competitor that cannot run this model is a result
            notes[label] = f"failed: {type(e).__name__}: {str(e).splitlines()[0][:100]}"
            continue
        if not err <= 1e-3:
            notes[label] = f"wrong result: relative error {err:.1e}"
            continue
        notes[label] = f"setup {time.perf_counter() - start:.1f} s, error {err:.1e}"
        fn()
        calls[label] = fn
    samples = {label: [] for label in calls}
    order = list(calls)
    for r in range(repeats):  # the order rotates, so no runner always follows the same one
        for label in order[r % len(order):] + order[:r % len(order)]:
            time.sleep(pause)  # every pool (ORT's, torch's, OpenBLAS's) idle again
            calls[label]()  # untimed: wakes this runner's own pool (steady state, as in a loop)
            t = time.perf_counter()
            calls[label]()
            samples[label].append((time.perf_counter() - t) * 1e3)
    for label in runners:
        if label in samples:
            s = samples[label]
            print(f"  {label:8s} {statistics.median(s):9.2f} ms  ({min(s):.2f}-{max(s):.2f})"
                  f"  {notes[label]}")
        else:
            print(f"  {label:8s}    -       {notes.get(label, '')}")
    if "ours" in samples:
        mine = statistics.median(samples["ours"])
        ratios = [f"ours/{label} {mine / statistics.median(s):.2f}"
                  for label, s in samples.items() if label != "ours"]
        print("  " + ", ".join(ratios))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n")[0] + " Workloads: " + "; ".join(WORKLOADS) + ".",
        epilog="smoke run of one workload: python benchmarks/models.py --only minilm "
               "--repeats 1 --no-compile")
    ap.add_argument("--only", default="", help="run workloads whose name contains this text")
    ap.add_argument("--repeats", type=int, default=9,
                    help="interleaved timed calls of each runner after warm-up (default 9)")
    ap.add_argument("--threads", type=int, default=None, help="threads for every pool")
    ap.add_argument("--pause", type=float, default=0.25,
                    help="seconds of sleep before each runner's untimed + timed call pair, so "
                         "the previous runner's spinning thread pool is idle again (default 0.25)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    ap.add_argument("--unfused", action="store_true",
                    help="also run ours with sibling products left unfused (rewrite/siblings)")
    ap.add_argument("--profile", choices=("missing", "never"), default="missing",
                    help="ours: measure kernels the database ($TG_DB) lacks before planning "
                         "(default) or plan from what it has and estimates")
    args = ap.parse_args(argv)
    threads.set_num_threads(args.threads or threads.get_num_threads())
    runners = {k: v for k, v in RUNNERS.items()
               if not (k == "compile" and args.no_compile) and not (k == "ort" and args.no_ort)
               and not (k == "unfused" and not args.unfused)}
    print(f"# models: {threads.get_num_threads()} threads, {args.repeats} interleaved repeats, "
          f"torch {torch.__version__}, tensor_graphs {tg.__version__}")
    for name, make in WORKLOADS.items():
        if args.only in name:
            bench(name, make, runners, args.repeats, args.profile, args.pause)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
