"""``tg quality gpt2 --quantize SCHEME``: ``tg.quality`` from the command line, a quantized
GPT-2 against the same weights in float32.

No GPT-2 weights or tokenizer ship offline, so the model is transformers' GPT-2 architecture
with random weights from a fixed seed (``jobs/gpt2.py``, as ``tg run gpt2``), and the text's
token ids are its UTF-8 bytes: the tokens mean nothing, the comparison is still exact (both
models score the same ids). The report's rows: each output's norm-wise error (the first
step's logits), the greedy tokens that agree, and the next-token agreement and perplexities on
the text.
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


def _quality(args: argparse.Namespace) -> int:
    import numpy as np

    from tensor_graphs.jobs.gpt2 import random_gpt2, random_prompt
    from tensor_graphs.nn.generate import Generator
    from tensor_graphs.nn.quality import quality

    if args.text is not None:
        with open(args.text, encoding="utf-8") as f:
            text = f.read()[:args.chars]
    else:
        text = _default_text(args.chars)
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
    output.info(f"building float32 and {args.quantize} generators ({args.layers} layers)")
    low = Generator.from_transformers(lm, quantize=args.quantize, **options)
    ref = Generator.from_transformers(lm, **options)
    prompt = random_prompt(args.prompt, lm.config.vocab_size)
    report = quality(low, ref, prompt, tokens=args.tokens, text=ids.astype(np.int64),
                     show=False)
    output.emit(_rows(report), args.output_format, COLUMNS, shown=_shown)
    output.note(f"\n{args.quantize} (a) against float32 (b), GPT-2 {args.layers} layers with "
                f"random weights; text: {ids.size} UTF-8 bytes as token ids",
                args.output_format)
    return 0


def add_quality_command(sub) -> None:
    from tensor_graphs.rewrite.quantize import SCHEMES

    p = sub.add_parser(
        "quality", help="a quantized model's accuracy against float32 (tg.quality)",
        description="Builds GPT-2 (transformers' architecture, random weights from a fixed "
                    "seed: nothing is downloaded) twice, in float32 and with every "
                    "matmul/linear weight in SCHEME (tg.quantize), and compares them as "
                    "tg.quality does: the norm-wise error ||a - b|| / ||b|| of the first "
                    "step's logits, how many greedy tokens agree from a random prompt, and on "
                    "a text (its UTF-8 bytes as token ids: no tokenizer ships offline) the "
                    "next-token agreement and each model's perplexity. The error is the "
                    "scheme's, the user's choice of model; the planner's tolerance bounds only "
                    "what kernels add to the quantized model itself.",
        epilog="example: tg quality gpt2 --quantize int8-weight --layers 2")
    p.add_argument("model", choices=("gpt2",), help="the model (gpt2: GPT-2 124M sizes)")
    p.add_argument("--quantize", choices=sorted(SCHEMES), required=True, metavar="SCHEME",
                   help="the scheme compared with float32: " + ", ".join(sorted(SCHEMES)))
    p.add_argument("--layers", type=cli_args.positive_int, default=12,
                   help="transformer layers (default 12)")
    p.add_argument("--prompt", type=cli_args.positive_int, default=16,
                   help="prompt length in tokens (default 16)")
    p.add_argument("--tokens", type=cli_args.positive_int, default=32,
                   help="greedy tokens compared (default 32)")
    p.add_argument("--text", type=cli_args.existing_file, default=None,
                   help="a UTF-8 text file to score (default: the 'assert' entry of "
                        "pydoc_data.topics, Python's own documentation)")
    p.add_argument("--chars", type=cli_args.positive_int, default=256,
                   help="characters of the text scored (default 256)")
    p.add_argument("--db", default=None,
                   help="measurement database (default $TG_DB or "
                        "~/.cache/tensor_graphs/measurements.sqlite; ':memory:' for none)")
    p.add_argument("--profile", choices=("missing", "never"), default="never",
                   help="plan from what the database has (default), or first measure the "
                        "kernels it lacks")
    output.add_output_option(p)
    p.set_defaults(run=_quality)
