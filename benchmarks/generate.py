"""Greedy decoding: tg.generate's decode program against transformers' generate (eager) and
ONNX Runtime, with the bandwidth floor.

    python benchmarks/generate.py [--layers 12] [--prompt 128] [--tokens 32] [--repeats 5]
                                  [--threads N] [--profile missing|never] [--no-ort]

GPT-2 124M (random weights from its default config: no network) decodes ``tokens`` new tokens
after a ``prompt``-token prompt. Ours: a ``tg.nn.Generator`` built once (prefill and decode
programs over one KV cache); the decode time per token is the median step time of the stream
after the first token. transformers: ``generate(do_sample=False)`` with its dynamic KV cache;
its decode time per token is (time for ``tokens`` new tokens - time for 1) / (tokens - 1), both
measured in the same repeat. ONNX Runtime: the same module exported once per run
(``torch.onnx.export``, dynamo) as two graphs, a prefill (the prompt, no past) and a decode step
(one token and every layer's past keys and values, of dynamic length, in; the logits of that
token and the present keys and values out), run greedily by two ``InferenceSession`` s (the
same intra-op thread count, sequential execution, all graph optimizations), each step's present
fed back as the next step's past with plain ``session.run``, as a user would; its decode time is
timed like ours. Ours and transformers produce the same tokens (checked: a difference stops the
run); ORT's are compared with ours, and where they differ, ORT's logits at the first difference
show whether the two tokens tie. Repeats are interleaved (ours, transformers, ORT in turn), one
thread setting for everything (tensor_graphs.threads), a 0.25 s pause before each runner so
the previous one's pool is idle; medians with min-max spread.

The floor: the bytes a decode step has to read (the weights bound to our decode program, less
the position table of which a step reads one row, plus the KV cache at the median step's
position) over the machine's read bandwidth measured here (threads each OR-reducing their share
of a 512 MiB array, best of samples taken before, between and after the runs): no step that
reads its weights from memory once can be faster; a ratio under 1 says the bandwidth was
measured short (a busy machine) and is flagged.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
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

POSITIONS = "transformer.wpe.weight"  # a decode step reads one row of it
# seconds between runners, so the previous one's thread pool is idle again (ORT's and libgomp's
# workers spin after a call), as in benchmarks/models.py
PAUSE = 0.25


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


class KVStep(torch.nn.Module):
    """The causal LM with its KV cache as flat tensors, so the exported graph takes and returns
    it: transformers keeps it in a Cache object, which ONNX cannot carry."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, past: tuple[torch.Tensor, ...] = ()):
        from transformers.cache_utils import DynamicCache

        pairs = [(past[i], past[i + 1]) for i in range(0, len(past), 2)]
        cache = DynamicCache(ddp_cache_data=pairs) if pairs else DynamicCache()
        out = self.lm(input_ids=input_ids, past_key_values=cache, use_cache=True)
        flat = [t for layer in out.past_key_values.layers for t in (layer.keys, layer.values)]
        return (out.logits[:, -1], *flat)


class OrtDecoder:
    """GPT-2 exported as a prefill and a decode-step graph, decoded greedily with ONNX
    Runtime."""

    def __init__(self, lm, prompt: torch.Tensor, folder: Path, n_threads: int):
        import onnxruntime

        cfg = lm.config
        layers, heads = cfg.n_layer, cfg.n_head
        head_dim = cfg.n_embd // heads
        self.past_names = [f"past.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        present = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
        step = KVStep(lm).eval()
        seq = torch.export.Dim("seq", min=2, max=cfg.n_positions)
        past = torch.export.Dim("past", min=1, max=cfg.n_positions - 1)
        sample_past = tuple(torch.zeros(1, heads, prompt.shape[1], head_dim)
                            for _ in self.past_names)
        start = time.perf_counter()
        with torch.no_grad():
            torch.onnx.export(step, (prompt,), str(folder / "prefill.onnx"),
                              input_names=["input_ids"], output_names=["logits", *present],
                              dynamic_shapes=({1: seq},), dynamo=True, external_data=True,
                              verbose=False)
            torch.onnx.export(step, (prompt[:, :1], sample_past), str(folder / "decode.onnx"),
                              input_names=["input_ids", *self.past_names],
                              output_names=["logits", *present],
                              dynamic_shapes=(None, tuple({2: past} for _ in self.past_names)),
                              dynamo=True, external_data=True, verbose=False)
        self.export_s = time.perf_counter() - start
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = n_threads
        options.inter_op_num_threads = 1
        options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        start = time.perf_counter()
        self.prefill, self.decode = (
            onnxruntime.InferenceSession(str(folder / name), options,
                                         providers=["CPUExecutionProvider"])
            for name in ("prefill.onnx", "decode.onnx"))
        self.session_s = time.perf_counter() - start
        self.version = onnxruntime.__version__

    def run(self, prompt: np.ndarray, tokens: int) -> tuple[float, float, list, list]:
        """(prefill ms, median decode ms per token, tokens, each token's logits)."""
        start = time.perf_counter()
        logits, *kv = self.prefill.run(None, {"input_ids": prompt})
        token = logits.argmax(axis=-1)
        prefill = (time.perf_counter() - start) * 1e3
        out, all_logits, steps = [int(token[0])], [logits], []
        for _ in range(tokens - 1):
            t = time.perf_counter()
            feeds = dict(zip(self.past_names, kv))
            feeds["input_ids"] = token[:, None].astype(np.int64)
            logits, *kv = self.decode.run(None, feeds)
            token = logits.argmax(axis=-1)
            steps.append((time.perf_counter() - t) * 1e3)
            out.append(int(token[0]))
            all_logits.append(logits)
        return prefill, statistics.median(steps), out, all_logits


class ReadBandwidth:
    """The best bytes per second that ``n_threads`` threads read, each OR-reducing its share of
    a uint64 array far larger than the caches (numpy releases the GIL while it reduces). An OR
    keeps up with memory on one core; a float32 sum (pairwise adds) does not (22 against 34
    GB/s on one core here). Sampled before, between and after the runs: on a shared machine
    the best sample is the nearest to what the memory gives."""

    def __init__(self, n_threads: int, mib: int = 512):
        self.data = np.ones(mib * 2**20 // 8, np.uint64)
        self.parts = np.array_split(self.data, n_threads)
        self.pool = ThreadPoolExecutor(n_threads)
        self.best, self.samples = float("inf"), 0

    def sample(self, repeats: int) -> None:
        for _ in range(repeats):
            t = time.perf_counter()
            list(self.pool.map(np.bitwise_or.reduce, self.parts))
            self.best = min(self.best, time.perf_counter() - t)
        self.samples += repeats

    @property
    def bytes_per_s(self) -> float:
        return self.data.nbytes / self.best


def step_bytes(gen: Generator, cfg, past: int) -> tuple[int, int]:
    """(weight bytes, KV cache bytes) one decode step reads at cache length ``past``. The
    weights are those bound to the decode program (its one copy of each), the position table
    counted as the one row a step reads."""
    bound = {a.__array_interface__["data"][0]: a for a in gen.decode._bound.values()}
    weights = sum(a.nbytes for a in bound.values())
    table = gen.decode._bound.get(POSITIONS)
    if table is not None:
        weights -= table.nbytes - table[0].nbytes
    cache = 2 * cfg.n_layer * past * cfg.n_embd * 4  # keys and values, float32, batch 1
    return weights, cache


def ort_agreement(mine: list, theirs: list, logits: list) -> str:
    """One line: where ORT's greedy tokens differ from ours, whether its logits tie there."""
    if mine == theirs:
        return f"ORT: same {len(mine)} tokens as ours"
    i = next(k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b)
    row = logits[i][0]
    gap = float(row[theirs[i]] - row[mine[i]])
    scale = float(np.abs(row).max())
    verdict = "a tie (float32 rounding)" if gap <= 1e-5 * scale else "NOT a tie"
    return (f"ORT: tokens differ from ours at step {i} ({theirs[i]} vs {mine[i]}); ORT's logits "
            f"there differ by {gap:.2e} (max |logit| {scale:.2f}): {verdict}")


def line(label: str, s: list, unit: str) -> str:
    return f"  {label:22s} {statistics.median(s):8.2f} {unit:10s} ({min(s):.2f}-{max(s):.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--profile", choices=("missing", "never"), default="missing")
    ap.add_argument("--no-ort", action="store_true", help="skip ONNX Runtime")
    args = ap.parse_args(argv)
    if args.tokens < 2:
        ap.error("--tokens must be at least 2 (decode steps follow the first token)")
    threads.set_num_threads(args.threads or threads.get_num_threads())
    n_threads = threads.get_num_threads()
    bandwidth = ReadBandwidth(n_threads)
    bandwidth.sample(7)  # before any runner's pool exists
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=args.layers, bos_token_id=None, eos_token_id=None)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt))
    start = time.perf_counter()
    gen = Generator.from_transformers(lm, max_len=args.prompt + args.tokens,
                                      max_prompt=args.prompt, profile=args.profile)
    print(f"# generate: GPT-2 {args.layers} layers, prompt {args.prompt}, {args.tokens} new "
          f"tokens, {n_threads} threads, {args.repeats} interleaved repeats; "
          f"our build (compile both programs) {time.perf_counter() - start:.1f} s")
    ort = None
    if not args.no_ort:
        folder = tempfile.TemporaryDirectory(prefix="tg-ort-decode-")
        ort = OrtDecoder(lm, prompt, Path(folder.name), n_threads)
        print(f"# ORT: export of prefill and decode graphs {ort.export_s:.1f} s, sessions "
              f"{ort.session_s:.1f} s (onnxruntime {ort.version})")
        with torch.no_grad():
            ref = lm(prompt).logits[:, -1].numpy()
        got = ort.run(prompt.numpy(), 2)[3][0]
        print(f"# ORT prefill logits against transformers': relative error "
              f"{np.linalg.norm(got - ref) / np.linalg.norm(ref):.1e}")
    ours_step_ms(gen, prompt.numpy(), args.tokens)  # warm-up of every side
    hf_ms(lm, prompt, args.tokens)
    if ort is not None:
        ort.run(prompt.numpy(), args.tokens)
    prefills, ours, theirs, ort_steps, ort_prefills = [], [], [], [], []
    agreement = None
    for _ in range(args.repeats):
        time.sleep(PAUSE)
        bandwidth.sample(3)
        prefill, step, mine = ours_step_ms(gen, prompt.numpy(), args.tokens)
        prefills.append(prefill)
        ours.append(step)
        time.sleep(PAUSE)
        step, reference = hf_ms(lm, prompt, args.tokens)
        theirs.append(step)
        if mine != reference:
            print("  tokens differ from transformers':", mine, reference)
            return 1
        if ort is not None:
            time.sleep(PAUSE)
            prefill, step, got, logits = ort.run(prompt.numpy(), args.tokens)
            ort_prefills.append(prefill)
            ort_steps.append(step)
            agreement = agreement or ort_agreement(mine, got, logits)
    print(f"# ours: same {len(mine)} tokens as transformers'" + (f"; {agreement}" if agreement
                                                                 else ""))
    time.sleep(1.0)  # every pool idle again (ORT's and torch's workers spin after a call)
    bandwidth.sample(7)
    bandwidth.pool.shutdown()
    past = args.prompt + args.tokens // 2  # the median step's cache length
    weights, cache = step_bytes(gen, cfg, past)
    floor = (weights + cache) / bandwidth.bytes_per_s * 1e3
    print(line("ours decode", ours, "ms/token"))
    print(line("transformers decode", theirs, "ms/token"))
    if ort is not None:
        print(line("ORT decode", ort_steps, "ms/token"))
    print(f"  {'floor':22s} {floor:8.2f} ms/token   ({weights / 1e6:.1f} MB of weights + "
          f"{cache / 1e6:.1f} MB of KV cache at length {past}, at "
          f"{bandwidth.bytes_per_s / 1e9:.1f} GB/s: {n_threads} threads OR-reducing a 512 MiB "
          f"array, best of {bandwidth.samples} before, between and after the runs)")
    print(line("ours prefill", prefills, "ms"))
    if ort is not None:
        print(line("ORT prefill", ort_prefills, "ms"))
    med = statistics.median
    print(f"  ratio ours/transformers decode: {med(ours) / med(theirs):.2f}")
    if ort is not None:
        print(f"  ratio ours/ORT decode: {med(ours) / med(ort_steps):.2f}; "
              f"ORT/floor {med(ort_steps) / floor:.2f}")
        # each round's ratio: ours and ORT ran a second or two apart, in the same spell of the
        # host's memory bandwidth (it swung 44-74 GB/s within minutes here), where the
        # medians above may each land in a different one; and each one's best round
        paired = [a / b for a, b in zip(ours, ort_steps)]
        print(f"  ratio ours/ORT decode per round: {med(paired):.2f} "
              f"({min(paired):.2f}-{max(paired):.2f}); best rounds {min(ours):.2f} vs "
              f"{min(ort_steps):.2f} ms/token: {min(ours) / min(ort_steps):.2f}")
    print(f"  ratio ours/floor decode: {med(ours) / floor:.2f}" + (
        "  (under 1: no sample saw the machine's bandwidth; the machine is busy)"
        if med(ours) < floor else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
