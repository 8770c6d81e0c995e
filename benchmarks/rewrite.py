"""Rewrite benchmarks, as a table: canonicalize + simplify and repeated-block discovery on a
12-layer GPT-2-style graph (GPT-2 small's sizes), and equivalents per second on a 50-node
expression.

    python benchmarks/rewrite.py [--repeats N]

Each benchmark is a small function that takes the repeat count and returns rows; add new ones
to BENCHMARKS. Times are medians over the repeats, after one warm-up run (the first run also
pays for imports and caches that every later call shares).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import tensor_graphs as tg
from tensor_graphs.demo import gpt2_style
from tensor_graphs.rewrite import find_repeated_blocks


@dataclass
class Row:
    benchmark: str
    graph: str
    nodes: int
    seconds: float  # median
    target: float | None = None  # seconds; None: no target
    detail: str = ""


@cache
def gpt2_graphs() -> dict[str, tg.Node]:
    """The 12-layer GPT-2-style graph as built (composites) and fully decomposed."""
    g = gpt2_style(12)
    return {"gpt2-12 composite": g, "gpt2-12 decomposed": tg.decompose(g)}


def median_time(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    """Median wall time of ``fn()`` over ``repeats`` runs after one warm-up, and its result."""
    result = fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def bench_repeated_blocks(repeats: int) -> list[Row]:
    """tg.rewrite.find_repeated_blocks: target < 1 s; expect one group of 12 whole layers."""
    rows = []
    for name, graph in gpt2_graphs().items():
        seconds, groups = median_time(lambda g=graph: find_repeated_blocks(g), repeats)
        total = len(tg.nodes(graph))
        shown = ", ".join(f"{len(g.instances)} x {g.size} nodes" for g in groups) or "no group"
        covered = sum(g.covered for g in groups) / total
        rows.append(Row("repeated blocks", name, total, seconds, 1.0,
                        f"{shown}; {covered:.1%} of nodes covered"))
    return rows


def bench_canonicalize_simplify(repeats: int) -> list[Row]:
    """tg.canonicalize then tg.simplify: target < 0.5 s."""
    rows = []
    for name, graph in gpt2_graphs().items():
        seconds, out = median_time(lambda g=graph: tg.simplify(tg.canonicalize(g)), repeats)
        rows.append(Row("canonicalize+simplify", name, len(tg.nodes(graph)), seconds, 0.5,
                        f"{len(tg.nodes(out))} nodes after"))
    return rows


def fifty_node_expression():
    """An expression of about 50 nodes on which every equivalence rule applies somewhere."""
    x = tg.input("x", (16, 64))
    w = [tg.weight(f"w{i}", s) for i, s in enumerate([(64, 64), (64, 8), (8, 64), (64, 16)])]
    h = x
    for m in w:
        h = h @ m  # a left-deep chain of four matmuls: reassociation matters here
    a, b, c, d, e = (tg.input(n, (16, 16)) for n in "abcde")
    s = a * (b + c) + tg.exp(a) * tg.exp(d) + b * c * e + a * b * d + c + e
    t = tg.transpose(h @ tg.weight("wt", (16, 16)))
    return (s * h + t + tg.maximum(tg.maximum(a, b), tg.maximum(c, d))
            + tg.exp(h + e) * (d + e * b) + a * c + b * tg.exp(c) * d).sum(axis=-1)


def bench_equivalents(repeats: int, limit: int = 300) -> list[Row]:
    """tg.rewrite.equivalents breadth-first over all rules: equivalents per second."""
    y = fifty_node_expression()
    seconds, count = median_time(
        lambda: sum(1 for _ in tg.rewrite.equivalents(y, limit=limit, time_limit=30.0)),
        min(repeats, 3))
    return [Row("equivalents", "50-node expression", len(tg.nodes(y)), seconds, None,
                f"{count} equivalents: {count / seconds:.0f} per second")]


BENCHMARKS: list[Callable[[int], list[Row]]] = [
    bench_canonicalize_simplify,
    bench_repeated_blocks,
    bench_equivalents,
]


def format_table(rows: list[Row]) -> str:
    header = ("benchmark", "graph", "nodes", "median", "target", "ok", "detail")
    lines = [header]
    for r in rows:
        ok = "" if r.target is None else ("yes" if r.seconds < r.target else "NO")
        target = "" if r.target is None else f"< {r.target:g} s"
        lines.append((r.benchmark, r.graph, str(r.nodes), f"{1e3 * r.seconds:.1f} ms", target,
                      ok, r.detail))
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    out = [" | ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per benchmark")
    args = parser.parse_args(argv)
    rows = [row for bench in BENCHMARKS for row in bench(args.repeats)]
    print(format_table(rows))
    return 0 if all(r.target is None or r.seconds < r.target for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
