"""Greedy decoding: tg.generate's decode program against transformers' generate (eager).

    python benchmarks/generate.py [--layers 12] [--prompt 128] [--tokens 32] [--repeats 5]
                                  [--threads N] [--profile missing|never]

GPT-2 124M (random weights from its default config: no network) decodes ``tokens`` new tokens
after a ``prompt``-token prompt. Ours: a ``tg.nn.Generator`` built once (prefill and decode
programs over one KV cache); the decode time per token is the median step time of the stream
after the first token. transformers: ``generate(do_sample=False)`` with its dynamic KV cache;
its decode time per token is (time for ``tokens`` new tokens - time for 1) / (tokens - 1), both
measured in the same repeat. Both produce the same tokens (checked). Repeats are interleaved,
one thread setting for everything (tensor_graphs.threads); medians with min-max spread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers  # noqa: E402

from tensor_graphs import threads  # noqa: E402
from tensor_graphs.nn import Generator  # noqa: E402


def ours_step_ms(gen: Generator, prompt: np.ndarray, tokens: int) -> tuple[float, float, list]:
    """(prefill ms, median decode ms per token, tokens)."""
    start = time.perf_counter()
    stream = gen.stream(prompt, tokens)
    out = [next(stream)]
    prefill = (time.perf_counter() - start) * 1e3
    steps = []
    while True:
        t = time.perf_counter()
        try:
            out.append(next(stream))
        except StopIteration:
            break
        steps.append((time.perf_counter() - t) * 1e3)
    return prefill, statistics.median(steps), [int(x[0]) for x in out]


def hf_ms(lm, prompt: torch.Tensor, tokens: int) -> tuple[float, list]:
    mask = torch.ones_like(prompt)
    kw = dict(do_sample=False, pad_token_id=0, attention_mask=mask)
    with torch.no_grad():
        t = time.perf_counter()
        lm.generate(prompt, max_new_tokens=1, min_new_tokens=1, **kw)
        one = time.perf_counter() - t
        t = time.perf_counter()
        out = lm.generate(prompt, max_new_tokens=tokens, min_new_tokens=tokens, **kw)
        many = time.perf_counter() - t
    return (many - one) / (tokens - 1) * 1e3, out[0, prompt.shape[1]:].tolist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", choices=("missing", "never"), default="missing")
    args = ap.parse_args(argv)
    threads.set_num_threads(args.threads or threads.get_num_threads())
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=args.layers, bos_token_id=None, eos_token_id=None)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt))
    start = time.perf_counter()
    gen = Generator.from_transformers(lm, max_len=args.prompt + args.tokens,
                                      max_prompt=args.prompt, profile=args.profile)
    print(f"# generate: GPT-2 {args.layers} layers, prompt {args.prompt}, {args.tokens} new "
          f"tokens, {threads.get_num_threads()} threads, {args.repeats} interleaved repeats; "
          f"our build (compile both programs) {time.perf_counter() - start:.1f} s")
    ours_step_ms(gen, prompt.numpy(), args.tokens)  # warm-up of both sides
    hf_ms(lm, prompt, args.tokens)
    prefills, ours, theirs = [], [], []
    for _ in range(args.repeats):
        prefill, step, mine = ours_step_ms(gen, prompt.numpy(), args.tokens)
        prefills.append(prefill)
        ours.append(step)
        step, reference = hf_ms(lm, prompt, args.tokens)
        theirs.append(step)
        if mine != reference:
            print("  tokens differ from transformers':", mine, reference)
            return 1
    for label, s in (("ours decode", ours), ("transformers decode", theirs),
                     ("ours prefill", prefills)):
        print(f"  {label:20s} {statistics.median(s):8.2f} ms/token  ({min(s):.2f}-{max(s):.2f})"
              if "decode" in label else
              f"  {label:20s} {statistics.median(s):8.2f} ms        ({min(s):.2f}-{max(s):.2f})")
    print(f"  ratio ours/transformers decode: "
          f"{statistics.median(ours) / statistics.median(theirs):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
