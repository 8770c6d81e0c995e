"""A fixed gallery of regions as models make them, rendered as Triton modules.

``tg kernels compile`` compiles every kernel of these for a GPU; the tests render and run the
same ones. Each entry builds a graph with the public builders at a model's shapes, finds its
region the way the planner does (``generate.elementwise_region``/``row_region`` at the graph's
root, with the graph's use counts and one decomposition per composite) and renders it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from tensor_graphs.ir.node import Node

B, T, C = 4, 128, 768  # GPT-2 small's activations (batch, sequence, channels)
HEADS = 12


class Entry(NamedTuple):
    name: str
    kind: str  # "elementwise", "rows" or "split_rows" (several programs a row)
    dtype: str
    region: object  # codegen.Region or rowgen.RowRegion
    rendered: object  # render.Rendered


def _builders() -> dict[str, tuple[str, Callable[[str], Node]]]:
    """name -> (kind, graph at one dtype): the gallery's regions."""
    from tensor_graphs.ir import api as tg

    def gelu_tanh(dt):  # GPT-2's MLP activation after the bias add
        x, b = tg.input("x", (B, T, 4 * C), dt), tg.input("b", (4 * C,), dt)
        return tg.gelu(x + b, approximate="tanh")

    def gelu_erf(dt):  # BERT's GELU, scaled and shifted: a chain of 20+ ops
        x = tg.input("x", (B, T, 4 * C), dt)
        return tg.gelu(x) * 1.5 + 0.25

    def bias_residual(dt):  # a broadcast add: bias per channel, residual per sequence
        x, b = tg.input("x", (B, T, C), dt), tg.input("b", (C,), dt)
        r = tg.input("r", (B, 1, C), dt)
        return tg.relu(x + b) + r

    def softmax(dt):  # attention probabilities
        return tg.softmax(tg.input("s", (B, HEADS, T, T), dt), axis=-1)

    def log_softmax(dt):  # a language model's log-probabilities over a vocabulary
        return tg.log_softmax(tg.input("logits", (B, 50257), dt))

    def layer_norm_residual(dt):  # GPT-2's ln after the residual add
        x, r = tg.input("x", (B, T, C), dt), tg.input("r", (B, T, C), dt)
        w, b = tg.input("w", (C,), dt), tg.input("b", (C,), dt)
        return tg.layer_norm(x + r, w, b)

    def rms_norm(dt):  # Llama's and Qwen's norm
        x, w = tg.input("x", (B, T, 2048), dt), tg.input("w", (2048,), dt)
        return tg.rms_norm(x, w)

    return {
        "gelu_tanh": ("elementwise", gelu_tanh),
        "gelu_erf": ("elementwise", gelu_erf),
        "bias_relu_residual": ("elementwise", bias_residual),
        "softmax": ("rows", softmax),
        "log_softmax": ("rows", log_softmax),
        "log_softmax_split": ("split_rows", log_softmax),  # the vocabulary row, split
        "layer_norm_residual": ("rows", layer_norm_residual),
        "rms_norm": ("rows", rms_norm),
    }


NAMES = tuple(_builders())  # the gallery's regions, in order


def _expand() -> Callable[[Node], Node | None]:
    """The planner's decomposition: one node object per composite."""
    from tensor_graphs.ir.node import expand_composite

    memo: dict[Node, Node | None] = {}

    def expand(n: Node) -> Node | None:
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]

    return expand


def entry(name: str, dtype: str) -> Entry:
    """One gallery region at one dtype, rendered."""
    from tensor_graphs.ir.graph import use_counts
    from tensor_graphs.kernels.triton import generate

    kind, build = _builders()[name]
    y = build(dtype)
    expand = _expand()
    root = y
    while not root.op.is_atomic:
        root = expand(root)
    find = {"elementwise": generate.elementwise_region, "rows": generate.row_region,
            "split_rows": generate.split_region}[kind]
    found = find(root, use_counts([y]), expand)
    if found is None:
        raise AssertionError(f"gallery {name} {dtype}: no {kind} region at its root")
    _covers, region, _top, rendered = found
    return Entry(name, kind, dtype, region, rendered)


def entries(names=NAMES, dtypes=("float32", "float16")) -> Iterator[Entry]:
    for name in names:
        for dt in dtypes:
            yield entry(name, dt)


__all__ = ["NAMES", "Entry", "entries", "entry"]
