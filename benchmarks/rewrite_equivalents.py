"""Equivalents per second: ``tg.rewrite.equivalents`` breadth-first over a ~50-node expression
(a matmul chain, sums of products, exp products, a long sum), all rules, no time pressure.

    python benchmarks/rewrite_equivalents.py
"""

from __future__ import annotations

import time

import tensor_graphs as tg


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


def equivalents_per_second(limit: int = 300, time_limit: float = 10.0) -> dict:
    """Enumerate up to ``limit`` equivalents; report the node count and the rate."""
    y = fifty_node_expression()
    list(tg.rewrite.equivalents(y, limit=10))  # warm up imports and caches
    t = time.perf_counter()
    count = sum(1 for _ in tg.rewrite.equivalents(y, limit=limit, time_limit=time_limit))
    seconds = time.perf_counter() - t
    return {"nodes": len(tg.nodes(y)), "equivalents": count, "seconds": seconds,
            "per_second": count / seconds}


def main() -> None:
    r = equivalents_per_second()
    print(f"equivalents per second ({r['nodes']}-node expression): {r['per_second']:.0f} "
          f"({r['equivalents']} in {r['seconds']:.2f} s)")


if __name__ == "__main__":
    main()
