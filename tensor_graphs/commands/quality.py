"""``tg quality MODEL --quantize SCHEME``: ``tg.quality`` from the command line, a quantized
language model against the same weights in float32.

``gpt2``: no GPT-2 weights or tokenizer ship offline, so the model is transformers' GPT-2
architecture with random weights from a fixed seed (``jobs/gpt2.py``, as ``tg run gpt2``), and
the text's token ids are its UTF-8 bytes: the tokens mean nothing, the comparison is still
exact (both models score the same ids), but the logits are nearly flat and near-ties decide
the greedy tokens. ``train-char``: the character model of ``tg run train-char``, trained here
(or loaded from a safetensors file this command saved), so the figures are a trained model's;
scored on several held-out windows of its text, pooled (``nn.quality.pooled``). The report's
rows: each output's norm-wise error (the first step's logits), the greedy tokens that agree,
and the next-token agreement and perplexities on the text.
"""

from __future__ import annotations

import argparse

from tensor_graphs import cli_args
from tensor_graphs.commands import output
from tensor_graphs.errors import ArgumentError

COLUMNS = ("measure", "value")
DEFAULT_TEXT = "assert"  # the pydoc_data.topics entry scored when no --text is given


def _default_text(chars: int) -> str:
    from pydoc_data.topics import topics

    return topics[DEFAULT_TEXT][:chars]


def _rows(report) -> list[dict]:
    rows = [{"measure": f"output {i} {list(shape)} relative error", "value": err}
            for i, (err, shape) in enumerate(zip(report.errors, report.shapes))]
    if report.tokens is not None:
        rows += [{"measure": "greedy tokens", "value": report.tokens},
                 {"measure": "greedy tokens agreeing", "value": report.agree},
                 {"measure": "first difference at token", "value": report.first_difference}]
    if report.text_tokens is not None:
        rows += [{"measure": "text predictions", "value": report.text_tokens},
                 {"measure": "next-token agreement", "value": report.next_agree},
                 {"measure": "perplexity (quantized)", "value": report.perplexity_a},
                 {"measure": "perplexity (float32)", "value": report.perplexity_b},
                 {"measure": "perplexity difference", "value": report.perplexity_difference}]
    return rows


def _shown(row: dict) -> dict:
    value = row["value"]
    return {**row, "value": "-" if value is None else
            f"{value:.4g}" if isinstance(value, float) else str(value)}


def _scheme(args: argparse.Namespace) -> str:
    return args.quantize + ("" if args.group is None else f" (groups of {args.group})")


def _gpt2(args: argparse.Namespace) -> int:
    import numpy as np

    from tensor_graphs.jobs.gpt2 import random_gpt2, random_prompt
    from tensor_graphs.nn.generate import Generator
    from tensor_graphs.nn.quality import quality

    chars = args.chars or 256
    if args.text is not None:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()[:chars]
    else:
        text = _default_text(chars)
    ids = np.frombuffer(text.encode("utf-8"), np.uint8)
    lm = random_gpt2(args.layers)
    max_len = max(args.prompt + args.tokens, ids.size)
    if max_len > lm.config.n_positions:
        raise ArgumentError(f"the prompt and tokens, or the text ({ids.size} bytes), "
                                     f"need {max_len} positions; GPT-2 has "
                                     f"{lm.config.n_positions}: lower --chars, --prompt or "
                                     "--tokens")
    options = {"max_len": max_len, "max_prompt": args.prompt, "db": args.db,
               "profile": args.profile}
    output.info(f"building float32 and {_scheme(args)} generators ({args.layers} layers)")
    low = Generator.from_transformers(lm, quantize=args.quantize, group_size=args.group,
                                      **options)
    ref = Generator.from_transformers(lm, **options)
    prompt = random_prompt(args.prompt, lm.config.vocab_size)
    report = quality(low, ref, prompt, tokens=args.tokens, text=ids.astype(np.int64),
                     show=False)
    output.emit(_rows(report), args.output_format, COLUMNS, shown=_shown)
    output.note(f"\n{_scheme(args)} (a) against float32 (b), GPT-2 {args.layers} layers with "
                f"random weights; text: {ids.size} UTF-8 bytes as token ids",
                args.output_format)
    return 0


def _char_model(args: argparse.Namespace):
    """The trained character model: its corpus, sizes and weights, from ``--weights`` or
    trained here (``--steps``), saved with ``--save``."""
    from tensor_graphs.jobs import train_char

    if args.weights is not None:
        output.info(f"loading {args.weights}")
        return train_char.load_weights(args.weights)
    o = train_char.Options(steps=args.steps, batch=args.batch, seq=args.seq, seed=args.seed)
    output.info(f"training the character model: {o.steps} steps of {o.batch} x {o.seq} "
                "characters (tg run train-char's model; --weights FILE skips this)")
    corpus, weights = train_char.trained_weights(o, db=args.db, profile=args.profile)
    if args.save is not None:
        train_char.save_weights(args.save, weights, corpus, o)
        output.info(f"saved the weights to {args.save}")
    return corpus, o, weights


def char_windows(valid, prompts: int, chars: int):
    """``prompts`` windows of ``chars`` held-out characters, evenly spaced over the validation
    text: each window's start is a prompt and the whole window the text scored."""
    if len(valid) < prompts * chars:
        raise ArgumentError(f"the validation text ({len(valid)} characters) is shorter than "
                            f"{prompts} windows of {chars}: lower --prompts or --chars")
    stride = len(valid) // prompts
    return [valid[i * stride:i * stride + chars] for i in range(prompts)]


def _fitting_chars(args: argparse.Namespace, seq: int) -> int:
    """The characters a window scores (``--chars``, else the model's ``seq``), refused where
    the prompt, the tokens or the window outrun the model's positions."""
    chars = args.chars or seq
    if max(args.prompt + args.tokens, chars) > seq:
        raise ArgumentError(f"the prompt and tokens ({args.prompt} + {args.tokens}) and the "
                            f"text (--chars {chars}) must fit the model's {seq} positions: "
                            "lower them, or train with a larger --seq")
    return chars


def _train_char(args: argparse.Namespace) -> int:
    import math

    from tensor_graphs.jobs import train_char
    from tensor_graphs.nn.generate import Generator
    from tensor_graphs.nn.quality import pooled, quality

    if args.weights is None:  # checked before the training's minutes, not after them
        _fitting_chars(args, args.seq)
    corpus, o, weights = _char_model(args)
    chars = _fitting_chars(args, o.seq)
    options = {"vocab_size": len(corpus.chars), "max_len": o.seq,
               "max_prompt": args.prompt, "db": args.db, "profile": args.profile}
    output.info(f"building float32 and {_scheme(args)} generators")
    low = Generator(train_char.model(corpus, o), weights, quantize=args.quantize,
                    group_size=args.group, **options)
    ref = Generator(train_char.model(corpus, o), weights, **options)
    reports = [quality(low, ref, window[:args.prompt], tokens=args.tokens, text=window,
                       show=False)
               for window in char_windows(corpus.valid, args.prompts, chars)]
    report = pooled(reports)
    rows = _rows(report)
    rows += [{"measure": f"prompt {i} greedy tokens agreeing", "value": r.agree}
             for i, r in enumerate(reports)]
    rows.append({"measure": "float32 loss on the text (nats/char)",
                 "value": math.log(report.perplexity_b)})
    output.emit(rows, args.output_format, COLUMNS, shown=_shown)
    output.note(f"\n{_scheme(args)} (a) against float32 (b), the character model trained "
                f"{o.steps} steps (width {o.width}, {o.layers} layers, {o.seq} positions); "
                f"{args.prompts} held-out windows of {chars} characters: the first "
                f"{args.prompt} the prompt of {args.tokens} greedy tokens, the whole window "
                "the text (errors: the largest of the windows)", args.output_format)
    return 0


def _quality(args: argparse.Namespace) -> int:
    return _gpt2(args) if args.model == "gpt2" else _train_char(args)


def add_quality_command(sub) -> None:
    from tensor_graphs.rewrite.quantize import GROUPED, SCHEMES

    p = sub.add_parser(
        "quality", help="a quantized model's accuracy against float32 (tg.quality)",
        description="Builds a language model twice, in float32 and with every matmul/linear "
                    "weight in SCHEME (tg.quantize), and compares them as tg.quality does: "
                    "the norm-wise error ||a - b|| / ||b|| of the first step's logits, how "
                    "many greedy tokens agree from a prompt, and on a text the next-token "
                    "agreement and each model's perplexity. gpt2: transformers' GPT-2 with "
                    "random weights from a fixed seed (nothing is downloaded; the text's UTF-8 "
                    "bytes are its token ids), whose nearly flat logits make near-ties decide "
                    "the greedy tokens. train-char: tg run train-char's character model, "
                    "trained (here, or loaded from --weights), scored on held-out windows of "
                    "pydoc_data.topics: a trained model's accuracy. The error is the scheme's, "
                    "the user's choice of model; the planner's tolerance bounds only what "
                    "kernels add to the quantized model itself.",
        epilog="examples: tg quality gpt2 --quantize int8-weight --layers 2; "
               "tg quality train-char --save char.safetensors --quantize int8-weight; "
               "tg quality train-char --weights char.safetensors --quantize int4-weight "
               "--group 128")
    p.add_argument("model", choices=("gpt2", "train-char"),
                   help="gpt2: GPT-2 124M sizes, random weights; train-char: the trained "
                        "character model of tg run train-char")
    p.add_argument("--quantize", choices=sorted(SCHEMES), required=True, metavar="SCHEME",
                   help="the scheme compared with float32: " + ", ".join(sorted(SCHEMES)))
    p.add_argument("--group", type=cli_args.positive_int, default=None,
                   help="int4-weight's and int8-dynamic's values along K per scale (default: "
                        "tg.quantize's, 32)")
    p.add_argument("--prompt", type=cli_args.positive_int, default=16,
                   help="prompt length in tokens (default 16)")
    p.add_argument("--tokens", type=cli_args.positive_int, default=32,
                   help="greedy tokens compared per prompt (default 32)")
    p.add_argument("--chars", type=cli_args.positive_int, default=None,
                   help="characters of each text scored (default: 256 for gpt2, the model's "
                        "positions for train-char)")
    g = p.add_argument_group("gpt2")
    g.add_argument("--layers", type=cli_args.positive_int, default=12,
                   help="transformer layers (default 12)")
    g.add_argument("--text", type=cli_args.existing_file, default=None,
                   help="a UTF-8 text file to score (default: the 'assert' entry of "
                        "pydoc_data.topics, Python's own documentation)")
    c = p.add_argument_group("train-char")
    c.add_argument("--weights", type=cli_args.existing_file, default=None,
                   help="a safetensors file of trained weights (--save wrote it); without "
                        "it the model is trained first")
    c.add_argument("--save", type=cli_args.new_file, default=None, metavar="FILE",
                   help="write the weights trained here to this file (a safetensors file; "
                        "not with --weights, which trains nothing)")
    # --weights skips the training, so --save would have nothing to write: refused, where it
    # was ignored (a copy of the file --weights names is what it would have written)
    p.refuse_together("--weights", "--save", "--weights loads weights trained before, so "
                      "nothing is trained here to save; drop --save (the weights are already "
                      "in the --weights file), or drop --weights to train and save")
    c.add_argument("--steps", type=cli_args.positive_int, default=600,
                   help="training steps without --weights (default 600, tg run train-char's)")
    c.add_argument("--batch", type=cli_args.positive_int, default=16,
                   help="training windows per step (default 16)")
    c.add_argument("--seq", type=cli_args.positive_int, default=128,
                   help="the model's positions, its training window (default 128: a prompt "
                        "and 64 tokens fit)")
    c.add_argument("--seed", type=int, default=0,
                   help="the training's seed (initial weights and windows; default 0)")
    c.add_argument("--prompts", type=cli_args.positive_int, default=4,
                   help="held-out windows scored, each with its own prompt (default 4)")
    # an option the chosen model or scheme never reads is refused, not ignored
    for group, model in ((g, "gpt2"), (c, "train-char")):
        for action in group._group_actions:  # noqa: SLF001 - argparse keeps no public list
            p.only_for(action.option_strings[0], "model", (model,), model)
    p.only_for("--group", "quantize", sorted(GROUPED), " and ".join(sorted(GROUPED)))
    p.add_argument("--db", default=None,
                   help="measurement database (default $TG_DB or "
                        "~/.cache/tensor_graphs/measurements.sqlite; ':memory:' for none)")
    p.add_argument("--profile", choices=("missing", "never"), default="never",
                   help="plan from what the database has (default), or first measure the "
                        "kernels it lacks")
    output.add_output_option(p)
    p.set_defaults(run=_quality)
