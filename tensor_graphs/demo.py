"""The demo job: build a small pre-norm transformer block with the fluent API, print its
graph, and evaluate it with random weights in float32 and in float64.

``gpt2_style`` stacks the same block into a GPT-2-style language model; tests and benchmarks
of the rewrite passes (repeated blocks, canonical form) use it as their model-sized graph."""

from __future__ import annotations

import time

import numpy as np

import tensor_graphs as tg
from tensor_graphs.ir.graph import FED_LEAVES
from tensor_graphs.ir.ops.names import INPUT


def transformer_block(x: tg.Node | None = None, prefix: str = "", *, d_model: int = 64,
                      heads: int = 4, d_ff: int | None = None) -> tg.Node:
    """One GPT-style pre-norm block: x + attn(ln1(x)), then + mlp(ln2(.)).

    ``x`` is the residual input (batch, seq, d_model); without one, a fresh input "x" with
    symbolic batch and seq is made. Weight names start with ``prefix`` (e.g. "h.3."), so the
    blocks of a model differ only by their weights. ``d_ff`` defaults to 4 * d_model.
    """
    if x is None:
        x = tg.input("x", ("batch", "seq", d_model))
    d_model = x.shape[-1]
    d_ff = 4 * d_model if d_ff is None else d_ff
    batch, seq = x.shape[0], x.shape[1]

    def w(name, *shape):
        return tg.weight(prefix + name, shape)

    h = tg.layer_norm(x, w("ln1.weight", d_model), w("ln1.bias", d_model))
    qkv = tg.linear(h, w("attn.qkv.weight", 3 * d_model, d_model), w("attn.qkv.bias", 3 * d_model))
    head_dim = d_model // heads
    qkv = qkv.reshape(batch, seq, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    att = tg.scaled_dot_product_attention(q, k, v, is_causal=True)
    att = att.permute(0, 2, 1, 3).reshape(batch, seq, d_model)
    x = x + tg.linear(att, w("attn.proj.weight", d_model, d_model), w("attn.proj.bias", d_model))
    h = tg.layer_norm(x, w("ln2.weight", d_model), w("ln2.bias", d_model))
    h = tg.gelu(tg.linear(h, w("mlp.fc.weight", d_ff, d_model), w("mlp.fc.bias", d_ff)),
                approximate="tanh")
    return x + tg.linear(h, w("mlp.proj.weight", d_model, d_ff), w("mlp.proj.bias", d_model))


def gpt2_style(layers: int = 12, d_model: int = 768, heads: int = 12, vocab: int = 50257,
               seq="seq", n_ctx: int = 1024) -> tg.Node:
    """A GPT-2-style language model: logits (batch, seq, vocab) from int64 token ids.

    Token + learned position embeddings, ``layers`` pre-norm blocks with weights ``h.{i}.*``,
    a final layer norm and an LM head tied to the token embedding (as GPT-2 does). The defaults
    are GPT-2 small's sizes; ``seq`` may be a named dim or an int (at most ``n_ctx``).
    """
    ids = tg.input("ids", ("batch", seq), "int64")
    wte = tg.weight("wte.weight", (vocab, d_model))
    wpe = tg.weight("wpe.weight", (n_ctx, d_model))
    x = tg.embedding(ids, wte) + tg.embedding(tg.iota(seq), wpe)
    for i in range(layers):
        x = transformer_block(x, f"h.{i}.", heads=heads)
    x = tg.layer_norm(x, tg.weight("ln_f.weight", (d_model,)), tg.weight("ln_f.bias", (d_model,)))
    return tg.linear(x, wte)


def random_feeds(y: tg.Node, dims: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """Random values for every leaf of ``y``: weights scaled like an initialised model."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for leaf in tg.nodes(y):
        if leaf.op.name not in FED_LEAVES:
            continue
        shape = tuple(d if isinstance(d, int) else dims[str(d)] for d in leaf.shape)
        scale = 1.0 if leaf.op.name == INPUT else 0.02 if len(shape) > 1 else 0.1
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
