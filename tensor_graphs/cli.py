"""The ``tg`` command line."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from tensor_graphs import demo

    return demo.main(batch=args.batch, seq=args.seq, show=args.show)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tg",
        description="tensor_graphs: write a tensor program as a graph of a few atomic ops, "
                    "evaluate it exactly with the numpy reference, and (in later releases) run "
                    "the fastest verified plan for this machine.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    demo = sub.add_parser(
        "demo", help="build a small transformer block, print its graph and evaluate it",
        description="Builds one pre-norm transformer block (d_model 64, 4 heads, symbolic "
                    "batch and seq) with the fluent API, prints its graph, and evaluates it "
                    "with random weights in float32 and float64, reporting the difference.")
    demo.add_argument("--batch", type=int, default=2, help="batch size to evaluate (default 2)")
    demo.add_argument("--seq", type=int, default=16, help="sequence length (default 16)")
    demo.add_argument("--show", type=int, default=40,
                      help="how many lines of the graph listing to print (default 40)")
    demo.set_defaults(run=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "run", None):
        parser.print_help()
        return 0
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
