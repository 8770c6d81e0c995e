"""The demo job: build a small pre-norm transformer block with the fluent API, print its
graph, and evaluate it with random weights in float32 and in float64."""

from __future__ import annotations

import time

import numpy as np

import tensor_graphs as tg


def transformer_block(d_model: int = 64, heads: int = 4, d_ff: int = 256) -> tg.Node:
    """One GPT-style block: x + attn(ln1(x)), then + mlp(ln2(.)); batch and seq are symbolic."""
    x = tg.input("x", ("batch", "seq", d_model))

    def w(name, *shape):
        return tg.weight(name, shape)

    h = tg.layer_norm(x, w("ln1.weight", d_model), w("ln1.bias", d_model))
    qkv = tg.linear(h, w("attn.qkv.weight", 3 * d_model, d_model), w("attn.qkv.bias", 3 * d_model))
    head_dim = d_model // heads
    qkv = qkv.reshape("batch", "seq", 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = tg.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = att.permute(0, 2, 1, 3).reshape("batch", "seq", d_model)
    x = x + tg.linear(att, w("attn.proj.weight", d_model, d_model), w("attn.proj.bias", d_model))
    h = tg.layer_norm(x, w("ln2.weight", d_model), w("ln2.bias", d_model))
    h = tg.gelu(tg.linear(h, w("mlp.fc.weight", d_ff, d_model), w("mlp.fc.bias", d_ff)),
                approximate="tanh")
    return x + tg.linear(h, w("mlp.proj.weight", d_model, d_ff), w("mlp.proj.bias", d_model))


def random_feeds(y: tg.Node, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every leaf of ``y``: weights scaled like an initialised model."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for leaf in tg.nodes(y):
        if leaf.op.name not in ("input", "weight", "state"):
            continue
        shape = tuple(d if isinstance(d, int) else dims[str(d)] for d in leaf.shape)
        scale = 1.0 if leaf.op.name == "input" else 0.02 if len(shape) > 1 else 0.1
        feeds[leaf.name] = (rng.standard_normal(shape) * scale).astype(np.float32)
    return feeds


def main(batch: int = 2, seq: int = 16, show: int = 40) -> int:
    y = transformer_block()
    order = tg.nodes(y)
    atomic = tg.nodes(tg.decompose(y))
    print(f"A transformer block: {len(order)} nodes, {len(atomic)} once fully decomposed into "
          f"atomic ops (output {y.shape} {y.dtype.name}).\n")
    listing = tg.format_graph(y).splitlines()
    print("\n".join(listing[:show]))
    if len(listing) > show:
        print(f"... ({len(listing) - show} more lines)")
    feeds = random_feeds(y, {"batch": batch, "seq": seq})
    start = time.perf_counter()
    out32 = tg.evaluate(y, feeds)
    mid = time.perf_counter()
    out64 = tg.evaluate(y, feeds, dtype="float64")
    end = time.perf_counter()
    err = np.linalg.norm(out32 - out64) / np.linalg.norm(out64)
    print(f"\nEvaluated with batch={batch}, seq={seq}: output {out32.shape} {out32.dtype}, "
          f"mean {out32.mean():+.5f}, std {out32.std():.5f}")
    print(f"float32 vs float64 reference: norm-wise relative error {err:.2e}")
    print(f"reference interpreter time: float32 {1e3 * (mid - start):.1f} ms, "
          f"float64 {1e3 * (end - mid):.1f} ms")
    return 0
