"""On a GPU: the GPU tests, then tensor_graphs against torch eager and torch.compile.

    python benchmarks/gpu.py [--out DIR] [--only TEXT] [--dtypes fp32,bf16] [--repeats 20]
                             [--no-tests] [--no-compile] [--profile missing|never]

Run where a GPU is usable (the ``device`` tool's machine: ``--out $OUT``). First the GPU tests
(``pytest tests/gpu tests/kernels/test_torch.py``, real GPU, no simulation; their log goes to
``DIR/gpu_tests.log``), then each workload in each dtype, every runner with the same weights and
inputs in one process: ``ours`` is ``tg.from_torch(module, args, device="cuda")`` planned from a
fresh measurement database in ``DIR`` (``profile="missing"`` measures what the plan lacks on
this GPU: the first-run cost a new user pays is printed as its setup time) with
``outputs="device"`` (results stay on the GPU, as the others' do), ``eager`` the module
under ``torch.no_grad``, ``compile`` ``torch.compile(module)`` and ``compile-ro`` its
``mode="reduce-overhead"`` (CUDA graphs). Each output is checked against eager in float32 first
(norm-wise relative error), so a row never compares different computations. Timed calls are
interleaved (the order rotates per repeat), each between two ``torch.cuda.synchronize()``;
medians with min-max spread, ratios ours/competitor (< 1: ours is faster). Decode: GPT-2 124M
greedy tokens from ``tg.nn.Generator`` on the GPU against transformers' ``generate``, eager
and (unless ``--no-compile``) with a static cache whose step transformers compiles itself
(``compile_config``: torch.compile's default mode, ``hf compile``, and reduce-overhead's CUDA
graphs, ``hf compile-ro``), as users of transformers compile a decode (ours
also on its first run, which captures a CUDA graph per power-of-two bucket of the cache
length and replays the other steps; with a graph per cache length, padding off; and a second
generator whose graphs launch each GEMV and attention alone, ``runtime/chains.py`` off; each with
the host's time from the call to its graph's launch, the rest being the GPU's; and each
runner's time to its first token, the prompt's prefill), with the
HBM floor (the decode program's weights read once per token at the device-to-device copy rate
measured here). ``--only split`` times log-softmax over a 50257-wide row: the Triton row
kernels (one program a row) and the split ones against torch. The table is appended to
``DIR/gpu_table.md`` as each row finishes, so a run
cut short keeps what it measured; the database is ``DIR/gpu.sqlite``, and each of our plans
(``explain()``) goes to ``DIR/gpu_plans.txt``, and the GPU's time per kernel over one decode
generation and over three calls of each of our prefills (torch.profiler) to
``DIR/gpu_kernels.txt``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tensor_graphs as tg  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TOLERANCE = {"fp32": 1e-3, "bf16": 5e-2}  # against eager in float32 (bf16 rounds each weight)


# ---------------------------------------------------------------------------- workloads
sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import Logits  # noqa: E402  (benchmarks/models.py: the CPU comparison's wrapper)


class Embed(torch.nn.Module):
    """A BERT encoder's last hidden state for ids and an attention mask (MiniLM-shaped)."""

    def __init__(self, bert):
        super().__init__()
        self.bert = bert

    def forward(self, input_ids, attention_mask):
        return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(attn_implementation="sdpa")
    return Logits(GPT2LMHeadModel(cfg).eval()), (torch.randint(0, cfg.vocab_size, (1, 128)),)


def qwen3():
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)  # Qwen3-0.6B's shape, random weights (no download)
    cfg = Qwen3Config(num_hidden_layers=28, hidden_size=1024, intermediate_size=3072,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      vocab_size=151936, tie_word_embeddings=True, attn_implementation="sdpa")
    return Logits(Qwen3ForCausalLM(cfg).eval()), (torch.randint(0, cfg.vocab_size, (1, 128)),)


def minilm():
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)  # all-MiniLM-L6-v2's shape, random weights
    cfg = BertConfig(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                     intermediate_size=1536, attn_implementation="sdpa")
    ids = torch.randint(0, cfg.vocab_size, (32, 128))
    mask = torch.ones_like(ids)
    mask[1::2, 96:] = 0  # half the sentences padded
    return Embed(BertModel(cfg, add_pooling_layer=False).eval()), (ids, mask)


WORKLOADS = {
    "gpt2-124m prefill 1x128": gpt2,
    "qwen3-0.6b-shape prefill 1x128": qwen3,
    "minilm-shape 32x128": minilm,
}


# ---------------------------------------------------------------------------- runners
def on_gpu(module, args, dtype):
    module = module.to("cuda", dtype)
    return module, tuple(a.to("cuda") for a in args)


def ours(module, args, db):
    # results left on the GPU, as eager and torch.compile leave theirs: copying GPT-2's
    # 1x128x50257 fp32 logits to the host (~26 MB, ~2 ms at 12 GB/s) would be timed as ours
    prog = tg.from_torch(module, args, device="cuda", db=db, profile=PROFILE,
                         outputs="device")

    def run():
        return prog(*args)
    run.program = prog.program  # its loop: CUDA graph replays, or why not
    return run


def eager(module, args, db):
    def run():
        with torch.no_grad():
            return module(*args)
    return run


def compiled(mode):
    def build(module, args, db):
        fn = torch.compile(module, mode=mode)

        def run():
            with torch.no_grad():
                return fn(*args)
        return run
    return build


RUNNERS = {"ours": ours, "eager": eager, "compile": compiled(None),
           "compile-ro": compiled("reduce-overhead")}
PROFILE = "missing"


def _array(out) -> np.ndarray:
    if isinstance(out, (list, tuple)):
        out = out[0]
    if isinstance(out, torch.Tensor):
        return out.detach().float().cpu().numpy()
    return np.asarray(out, dtype=np.float64)


def _error(got, ref) -> float:
    got, ref = _array(got).astype(np.float64), _array(ref).astype(np.float64)
    return float(np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30))


def timed(fn) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def bench(name, make, dtype, runners, repeats, db, table) -> None:
    module, args = make()
    module, args = on_gpu(module, args, torch.float32)
    with torch.no_grad():
        ref = module(*args)
    if dtype != "fp32":
        module = module.to(DTYPES[dtype])
    calls, notes = {}, {}
    for label, build in runners.items():
        start = time.perf_counter()
        try:
            fn = build(module, args, db)
            err = _error(fn(), ref)
        except Exception as exc:  # a runner that cannot run this model is a result
            notes[label] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            traceback.print_exc(limit=3)
            continue
        if not err <= TOLERANCE[dtype]:
            notes[label] = f"wrong result: relative error {err:.1e}"
            continue
        notes[label] = f"setup {time.perf_counter() - start:.1f} s, error {err:.1e}"
        for _ in range(3):
            fn()
        calls[label] = fn
    samples = {label: [] for label in calls}
    order = list(calls)
    for r in range(repeats):
        for label in order[r % len(order):] + order[:r % len(order)]:
            samples[label].append(timed(calls[label]))
    lines = [f"\n## {name}, {dtype}"]
    for label in runners:
        if label in samples:
            s = samples[label]
            lines.append(f"  {label:10s} {statistics.median(s):9.3f} ms  ({min(s):.3f}-"
                         f"{max(s):.3f})  {notes[label]}")
        else:
            lines.append(f"  {label:10s}    -       {notes.get(label, '')}")
    if "ours" in calls:
        lines.append(f"  ours: {calls['ours'].program.loop}")
        plans(table, f"{name}, {dtype}", calls["ours"].program)
        kernel_times(table, f"{name}, {dtype}: GPU time per kernel over 3 calls of ours",
                     lambda: [calls["ours"]() for _ in range(3)])
    if "ours" in samples:
        mine = statistics.median(samples["ours"])
        lines.append("  " + ", ".join(f"ours/{label} {mine / statistics.median(s):.2f}"
                                      for label, s in samples.items() if label != "ours"))
    report(table, "\n".join(lines))


def device_bandwidth() -> float:
    """Bytes per second of a device-to-device copy, counting bytes read and written."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    best = min(timed(lambda: b.copy_(a)) for _ in range(10))
    return 2 * a.numel() / (best / 1e3)


def hf_decoders(compile_too: bool) -> dict[str, dict]:
    """transformers' ``generate`` as users call it, by label -> its extra arguments: eager
    (a dynamic cache) and, with torch.compile, a static cache whose decode step transformers
    compiles itself (``compile_config``: default mode, and reduce-overhead's CUDA graphs)."""
    from transformers import CompileConfig

    runs = {"hf generate": {}}
    if compile_too:
        for label, mode in (("hf compile", "default"), ("hf compile-ro", "reduce-overhead")):
            runs[label] = {"cache_implementation": "static",
                           "compile_config": CompileConfig(mode=mode, fullgraph=True)}
    return runs


def hf_steps(lm, prompt, tokens: int, extra: Mapping) -> tuple[float, list[int], float]:
    """transformers' ms per decode token (a generation of ``tokens`` less one of 1, over the
    tokens between), its tokens, and the ms to the first token (the generation of 1)."""
    kw = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(prompt), **extra)
    with torch.no_grad():
        one = timed(lambda: lm.generate(prompt, max_new_tokens=1, min_new_tokens=1, **kw))
        out = []
        many = timed(lambda: out.append(lm.generate(prompt, max_new_tokens=tokens,
                                                    min_new_tokens=tokens, **kw)))
    return (many - one) / (tokens - 1), out[0][0, prompt.shape[1]:].tolist(), one


def decode(db, table, tokens: int = 32, prompt_len: int = 128, compile_too: bool = True
           ) -> None:
    import transformers

    from tensor_graphs.nn import Generator

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(bos_token_id=None, eos_token_id=None)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len))
    start = time.perf_counter()
    try:
        gen = Generator.from_transformers(lm, max_len=prompt_len + tokens,
                                          max_prompt=prompt_len, device="cuda", db=db,
                                          profile=PROFILE)
    except Exception as exc:
        traceback.print_exc(limit=3)
        report(table, f"\n## gpt2-124m decode\n  ours failed: {type(exc).__name__}: "
                      f"{str(exc).splitlines()[0][:160]}")
        return
    setup = time.perf_counter() - start
    # the same generator whose graphs launch each GEMV and attention alone (runtime/chains.py
    # off while it captures): what the persistent chains change, in the same rounds
    unchained = Generator.from_transformers(lm, max_len=prompt_len + tokens,
                                            max_prompt=prompt_len, device="cuda", db=db,
                                            profile="never")
    lm = lm.to("cuda")
    gpu_prompt = prompt.to("cuda")

    launches = []  # perf_counter at each graph replay's launch (runtime/graphs.py)

    def noting(replay):
        def run(self):
            launches.append(time.perf_counter())
            return replay(self)
        return run

    from tensor_graphs.runtime import chains, graphs

    chained = []  # per padded capture of ours: its steps run as persistent chains
    fold = chains.fold

    def counted(instructions):
        out = fold(instructions)
        chained.append(sum(hasattr(ins.fn, "stands_for") for ins in out))
        return out

    chains.fold = counted  # (given back after the timed rounds)
    replays = {cls: cls.replay for cls in (graphs.CudaGraph, graphs.SimulatedGraph)}
    for cls, replay in replays.items():  # (given back after the timed rounds)
        cls.replay = noting(replay)

    firsts = []  # ms from stream() to its first token (the prefill and the first choice)

    def ours_steps(generator=None):
        """Median ms per token (next() on the stream, as a user sees it), median host ms
        from the call to the graph's launch (the replayed tokens), and the tokens; the ms to
        the first token goes to ``firsts``. ``generator``: ``gen`` unless given."""
        start = time.perf_counter()
        stream = (generator or gen).stream(prompt.numpy(), tokens)
        out, steps, host = [next(stream)], [], []
        firsts.append((time.perf_counter() - start) * 1e3)
        while True:
            launches.clear()
            t = time.perf_counter()
            try:
                out.append(next(stream))
            except StopIteration:
                return (statistics.median(steps), statistics.median(host or [float("nan")]),
                        [int(x[0]) for x in out])
            steps.append((time.perf_counter() - t) * 1e3)
            if launches:
                host.append((launches[0] - t) * 1e3)

    def unchained_steps():  # (chains off whenever it might capture)
        chains.CHAINS = False
        try:
            return ours_steps(unchained)
        finally:
            chains.CHAINS = True

    # graphs are padded to power-of-two buckets of the cache length (runtime/graphs.py): the
    # first run captures one graph per bucket on its second step and replays the rest; with
    # padding off (exe.graphs.padding = None) one graph per cache length, captured on the
    # second run. The timed rounds run exact, padded and each of transformers' in the same
    # order each time (the first H100 run timed exact only after the padded rounds, not
    # between transformers' runs as padded was); each competitor's first generation (its
    # compile) is untimed, and its tokens are compared with ours
    exe = gen.decode._symbolic
    first, first_host, _ = ours_steps()
    captures_first = gen.decode.stats["graph_captures"]
    ours_steps()
    exe.graphs.padding = None
    ours_steps()
    ours_steps()  # (captures one graph per length)
    exe.graphs.padding = "pow2"
    _, _, expected = ours_steps()
    unchained_steps()
    unchained_steps()  # (captured, then replayed)
    theirs, notes = {}, {}
    for label, extra in hf_decoders(compile_too).items():
        start = time.perf_counter()
        try:
            _, got, _ = hf_steps(lm, gpu_prompt, tokens, extra)  # (compiles the step)
        except Exception as exc:  # a competitor that cannot run is a result
            traceback.print_exc(limit=3)
            notes[label] = f"failed: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            continue
        theirs[label] = extra
        notes[label] = (f"setup {time.perf_counter() - start:.1f} s, tokens "
                        f"{'equal' if got == expected else 'DIFFER'}")
    mine, mine_host, exact, exact_host, agree = [], [], [], [], True
    plain, plain_host = [], []
    samples = {label: [] for label in theirs}
    mine_first, their_firsts = [], {}  # ms to the first token (a generation's prefill)
    for _ in range(5):
        exe.graphs.padding = None
        step, host, same = ours_steps()
        exe.graphs.padding = "pow2"
        exact.append(step)
        exact_host.append(host)
        step, host, got = ours_steps()
        mine.append(step)
        mine_host.append(host)
        mine_first.append(firsts[-1])
        step, host, apart = unchained_steps()
        plain.append(step)
        plain_host.append(host)
        agree = agree and got == same == apart == expected
        for label, extra in theirs.items():
            per_token, _, to_first = hf_steps(lm, gpu_prompt, tokens, extra)
            samples[label].append(per_token)
            their_firsts.setdefault(label, []).append(to_first)
    for cls, replay in replays.items():
        cls.replay = replay
    chains.fold = fold
    weights = sum(p.numel() * p.element_size() for p in lm.parameters()) \
        - lm.transformer.wpe.weight.numel() * 4  # a step reads one row of the positions
    floor = weights / device_bandwidth() * 1e3  # the copy's rate counts bytes read + written
    lines = [f"\n## gpt2-124m decode, fp32, prompt {prompt_len}, {tokens} tokens "
             f"(our build {setup:.1f} s; our tokens the same in each round: "
             f"{'yes' if agree else 'NO'})",
             f"  ours        {statistics.median(mine):8.3f} ms/token (host to the graph's "
             f"launch {statistics.median(mine_host):.3f}; first token "
             f"{statistics.median(mine_first):.2f} ms)",
             f"  ours, first {first:8.3f} ms/token (host to launch {first_host:.3f}; "
             f"{captures_first} graphs captured: one per power-of-two bucket of the cache "
             "length)",
             f"  ours, exact {statistics.median(exact):8.3f} ms/token (host to launch "
             f"{statistics.median(exact_host):.3f}; a graph per cache length, no padding)",
             f"  ours, no chains {statistics.median(plain):8.3f} ms/token (host to launch "
             f"{statistics.median(plain_host):.3f}; padded, each GEMV and attention a launch "
             f"of its own: ours' graphs chain up to {max(chained, default=0)} steps each)",
             *(f"  {label:13s} {statistics.median(samples[label]):8.3f} ms/token "
               f"({notes[label]}; first token {statistics.median(their_firsts[label]):.2f} ms)"
               if label in samples else f"  {label:13s} {notes[label]}" for label in notes),
             f"  HBM floor   {floor:8.3f} ms/token ({weights / 1e6:.0f} MB of weights)",
             "  " + ", ".join([f"ours/floor {statistics.median(mine) / floor:.2f}"] + [
                 f"ours/{label} {statistics.median(mine) / statistics.median(s):.2f}"
                 for label, s in samples.items()]),
             f"  ours decode: {gen.decode.loop}"]
    report(table, "\n".join(lines))
    plans(table, "gpt2-124m decode step", gen.decode)
    kernel_times(table, f"gpt2-124m decode, GPU time per kernel over {tokens} tokens",
                 ours_steps)
    # where the host waits: padded graphs took 0.3 ms a token more than exact ones on an H200
    # with 0.17 ms more host time, as if the host waited for the GPU each token
    for padding in ("pow2", None):
        exe.graphs.padding = padding
        host_times(table, f"gpt2-124m decode, host time per call over {tokens} tokens, "
                          f"graphs padded={padding}", ours_steps)
    exe.graphs.padding = "pow2"


def kernel_times(table: Path, heading: str, run, rows: int = 25) -> None:
    """The GPU's own time per kernel while ``run`` replays our graphs (torch.profiler's CUDA
    activity sees the kernels a graph launches), largest first, to ``gpu_kernels.txt`` beside
    the table: where a decode token's GPU time goes, kernel by kernel, which the per-step
    timer (``runtime/steps.py``: graphs off, each step synchronized) cannot show."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            run()
            torch.cuda.synchronize()
        averages = prof.key_averages()
        for key in ("self_device_time_total", "self_cuda_time_total"):  # newer, older torch
            try:
                text = averages.table(sort_by=key, row_limit=rows)
                break
            except (AttributeError, KeyError, ValueError):
                text = None
        text = text or "(no sort key this torch knows)"
    except Exception as exc:  # noqa: BLE001 - the timings above matter more
        text = f"(profile failed: {type(exc).__name__}: {exc})"
    with open(table.with_name("gpu_kernels.txt"), "a") as f:
        f.write(f"## {heading}\n{text}\n\n")


def host_times(table: Path, heading: str, run, rows: int = 30) -> None:
    """The host's own time per call (torch.profiler's CPU activity: the CUDA runtime's
    calls, cudaEventSynchronize and cudaStreamSynchronize among them, and torch's ops) while
    ``run`` decodes, largest first, to ``gpu_kernels.txt``: a wait for the GPU in the host's
    path shows as a synchronize taking a share of each token."""
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            run()
            torch.cuda.synchronize()
        text = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    except Exception as exc:  # noqa: BLE001 - the timings above matter more
        text = f"(profile failed: {type(exc).__name__}: {exc})"
    with open(table.with_name("gpu_kernels.txt"), "a") as f:
        f.write(f"## {heading}\n{text}\n\n")


def split_rows(table, rows: int = 4, width: int = 50257) -> None:
    """log-softmax over a vocabulary row: the one-program-per-row Triton kernels (2.99x
    torch on an H200) against the split kernels (kernels/triton/splitrows.py) and torch,
    each configuration checked against float64 first, in fp32 and fp16."""
    import tensor_graphs as tg
    from tensor_graphs.ir.graph import use_counts
    from tensor_graphs.kernels.triton import gallery, generate, splitrows
    from tensor_graphs.numerics import relative_error

    lines = [f"\n## log-softmax ({rows}, {width}): Triton one program a row vs split, "
             "ms (median of 50, synchronized)"]
    for dt, tdt in (("float32", torch.float32), ("float16", torch.float16)):
        y = tg.log_softmax(tg.input("x", (rows, width), dt))
        expand = gallery._expand()  # noqa: SLF001 - one node per composite, as planning has
        root = y
        while not root.op.is_atomic:
            root = expand(root)
        _, region, _, rendered = generate.row_region(root, use_counts([y]), expand)
        x = torch.randn(rows, width, device="cuda").to(tdt) * 4
        ref = tg.evaluate(y, {"x": x.float().cpu().numpy().astype(dt)}, dtype="float64")
        times = {"torch": statistics.median(timed(lambda x=x: torch.log_softmax(x, -1))
                                            for _ in range(50))}
        split = splitrows.render(region)
        for config in generate.ROW_CONFIGS:
            for label, k in (("rows", generate.build_rows(region, rendered, config)),
                             ("split", generate.build_split(region, split, config))):
                err = relative_error(k.fn(x).float().cpu().numpy(), ref)
                times[f"{label} {config.label} (err {err:.1e})"] = statistics.median(
                    timed(lambda k=k, x=x: k.fn(x)) for _ in range(50))
        base = times["torch"]
        lines += [f"  {dt} {name:48s} {t:8.4f} ms  {t / base:5.2f}x torch"
                  for name, t in times.items()]
    report(table, "\n".join(lines))


def plans(table: Path, heading: str, program) -> None:
    """The plan ``program`` ran (``explain()``: each step's kernel, time and whether it was
    measured), appended to ``gpu_plans.txt`` beside the table: what a lease's next run looks
    at first."""
    try:
        text = program.explain()
    except Exception as exc:  # noqa: BLE001 - the figures matter more than the plan's text
        text = f"(explain failed: {type(exc).__name__}: {exc})"
    with open(table.with_name("gpu_plans.txt"), "a") as f:
        f.write(f"## {heading}\n{text}\n\n")


def report(table: Path, text: str) -> None:
    print(text, flush=True)
    with open(table, "a") as f:
        f.write(text + "\n")


def run_tests(out: Path) -> int:
    env = {k: v for k, v in os.environ.items() if k not in ("TG_SIMULATED_CUDA",
                                                            "TRITON_INTERPRET")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    tests = [t for t in ("tests/gpu", "tests/kernels/triton", "tests/kernels/test_torch.py")
             if (ROOT / t).exists()]
    with open(out / "gpu_tests.log", "w") as log:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *tests], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    tail = (out / "gpu_tests.log").read_text().strip().splitlines()[-1:]
    print(f"# GPU tests ({', '.join(tests)}): {tail[0] if tail else '?'}", flush=True)
    return done.returncode


def main(argv=None) -> int:
    global PROFILE
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Workloads: " + "; ".join(WORKLOADS) + "; gpt2 decode.")
    ap.add_argument("--out", default=os.environ.get("OUT", "gpu-results"),
                    help="folder for the table, the test log and the database (default $OUT)")
    ap.add_argument("--only", default="", help="run workloads whose name contains this text "
                    "('decode' for the decode run)")
    ap.add_argument("--dtypes", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--repeats", type=int, default=20, help="interleaved timed calls each")
    ap.add_argument("--no-tests", action="store_true", help="skip the GPU tests")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile runners")
    ap.add_argument("--profile", choices=("missing", "never"), default="missing")
    ap.add_argument("--budget", type=float, default=0.0,
                    help="seconds: start no workload after this much time has passed (a device "
                         "lease is short; the table keeps every row finished); 0: no limit")
    args = ap.parse_args(argv)
    start = time.monotonic()
    PROFILE = args.profile
    if not torch.cuda.is_available() or os.environ.get("TG_SIMULATED_CUDA"):
        print("benchmarks/gpu.py needs a real GPU (torch.cuda.is_available() is False, or "
              "TG_SIMULATED_CUDA is set)", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table, db = out / "gpu_table.md", str(out / "gpu.sqlite")
    props = torch.cuda.get_device_properties(0)
    report(table, f"# benchmarks/gpu.py: {props.name}, {props.total_memory >> 30} GiB, torch "
                  f"{torch.__version__}, tensor_graphs at {_revision()}, "
                  f"{time.strftime('%Y-%m-%d %H:%M')}")
    failed = 0 if args.no_tests else run_tests(out)
    runners = {k: v for k, v in RUNNERS.items() if not (args.no_compile and "compile" in k)}
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    work = [(f"{name}, {dtype}", lambda n=name, m=make, d=dtype: bench(
        n, m, d, runners, args.repeats, db, table))
        for name, make in WORKLOADS.items() if args.only in name for dtype in dtypes]
    if args.only in "gpt2-124m decode":  # after GPT-2's prefill, whose rows it reuses
        work.insert(min(len(dtypes), len(work)), ("gpt2-124m decode", lambda: decode(
            db, table, compile_too=not args.no_compile)))
    if args.only in "log-softmax split":  # seconds: first, so a short lease measures it
        work.insert(0, ("log-softmax split", lambda: split_rows(table)))
    for label, run in work:
        if args.budget and time.monotonic() - start > args.budget:
            report(table, f"\n## {label}: not run (--budget {args.budget:.0f} s spent)")
            continue
        run()
    return 1 if failed else 0


def _revision() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True).stdout.strip() or "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
