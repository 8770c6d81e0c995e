"""Repeated-block discovery: whole transformer layers found without knowing any block type, on
composite, fully decomposed and canonicalised graphs; two kinds of block give two groups; no
repetition gives no group; digests are structural (names abstracted) and stable across
processes."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.demo import gpt2_style, random_feeds, transformer_block
from tensor_graphs.rewrite import find_repeated_blocks

SMALL = dict(d_model=32, heads=4, vocab=50, n_ctx=64)


# ------------------------------------------------------------------------------ model builders
def llama_block(x, prefix, cos, sin, heads=4, kv_heads=2, d_ff=None):
    """A Llama-style block: rms_norm, grouped-query attention with rotary embeddings, SwiGLU."""
    batch, seq, d = x.shape
    hd = d // heads
    d_ff = 3 * d if d_ff is None else d_ff

    def w(name, *shape):
        return tg.weight(prefix + name, shape)

    def heads_of(t, n):
        return t.reshape(batch, seq, n, hd).permute(0, 2, 1, 3)

    h = tg.rms_norm(x, w("input_norm.weight", d))
    q = tg.rotary_embedding(heads_of(tg.linear(h, w("q.weight", d, d)), heads), cos, sin)
    k = tg.rotary_embedding(heads_of(tg.linear(h, w("k.weight", kv_heads * hd, d)), kv_heads),
                            cos, sin)
    v = heads_of(tg.linear(h, w("v.weight", kv_heads * hd, d)), kv_heads)
    att = tg.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + tg.linear(att.permute(0, 2, 1, 3).reshape(batch, seq, d), w("o.weight", d, d))
    h = tg.rms_norm(x, w("post_norm.weight", d))
    gated = tg.silu(tg.linear(h, w("gate.weight", d_ff, d))) * tg.linear(h, w("up.weight", d_ff, d))
    return x + tg.linear(gated, w("down.weight", d, d_ff))


def lm(kinds: list[str], d_model=32, heads=4, vocab=50):
    """Token embedding, blocks of the given kinds ("gpt" or "llama"), final norm, LM head."""
    ids = tg.input("ids", ("batch", "seq"), "int64")
    x = tg.embedding(ids, tg.weight("embed", (vocab, d_model)))
    hd = d_model // heads
    cos, sin = tg.input("cos", ("seq", hd)), tg.input("sin", ("seq", hd))
    for i, kind in enumerate(kinds):
        if kind == "gpt":
            x = transformer_block(x, f"gpt.{i}.", heads=heads)
        else:
            x = llama_block(x, f"llama.{i}.", cos, sin, heads=heads)
    x = tg.rms_norm(x, tg.weight("norm.weight", (d_model,)))
    return tg.linear(x, tg.weight("lm_head.weight", (vocab, d_model)))


def layer_of(instance) -> str:
    """The one layer prefix ("h.3", "llama.5") that all of an instance's weights share."""
    prefixes = {".".join(leaf.name.split(".")[:2]) for leaf in instance.leaves}
    assert len(prefixes) == 1, prefixes
    return prefixes.pop()


def check_group(graph, group, count: int, weights_per_layer: int):
    """Disjoint instances, each one whole layer (all of its weights, no other), chained through
    the residual stream; equal structural digests, distinct named digests; closed regions."""
    assert len(group.instances) == count
    seen: set = set()
    for inst in group.instances:
        assert not (inst.nodes & seen), "instances overlap"
        seen |= inst.nodes
        assert len(inst.nodes) == group.size
        assert inst.digest == group.digest
        assert len(inst.leaves) == weights_per_layer
        assert all(leaf.op.name == "weight" for leaf in inst.leaves)
        # a region is closed: every input of a region node is inside, a boundary input or a
        # literal (constant) leaf; its placeholders are exactly its inputs and leaves
        for n in inst.nodes:
            for i in n.inputs:
                assert i in inst.nodes or i in inst.inputs or i.op.name in ("constant", "dim")
        assert set(inst.placeholders) == set(inst.inputs) | set(inst.leaves)
        assert set(inst.leaves) <= inst.nodes and not set(inst.inputs) & inst.nodes
        assert set(inst.outputs) <= inst.nodes
    layers = [layer_of(inst) for inst in group.instances]
    assert len(set(layers)) == count
    for prev, nxt in zip(group.instances, group.instances[1:]):  # the residual stream
        assert set(prev.outputs) & set(nxt.inputs)
    assert len({inst.named_digest() for inst in group.instances}) == count
    # positional correspondence: the same placeholder position holds the same kind of value
    first = group.instances[0]
    for inst in group.instances[1:]:
        assert [(a.shape, a.dtype) for a in first.inputs] == [(b.shape, b.dtype)
                                                            for b in inst.inputs]
        for a, b in zip(first.leaves, inst.leaves):
            assert a.name.split(".", 2)[2] == b.name.split(".", 2)[2]  # same weight role
    return seen


# ------------------------------------------------------------------------------ GPT-2 style
def test_gpt2_style_builds_and_runs():
    graph = gpt2_style(2, **SMALL)
    assert graph.ndim == 3 and graph.shape[-1] == 50  # (batch, seq, vocab) logits
    feeds = random_feeds(graph, {"batch": 2, "seq": 5})
    feeds["ids"] = np.random.default_rng(0).integers(0, 50, (2, 5))
    out = tg.evaluate(graph, feeds)
    assert out.shape == (2, 5, 50) and np.isfinite(out).all()


@pytest.mark.parametrize("form", ["composite", "decomposed", "canonical"])
def test_gpt2_twelve_layers_one_group(form):
    graph = gpt2_style(12, **SMALL)
    if form != "composite":
        graph = tg.decompose(graph)
    if form == "canonical":
        graph = tg.canonicalize(graph)
    groups = find_repeated_blocks(graph)  # its speed: benchmarks/rewrite.py (target < 1 s)
    assert len(groups) == 1
    [group] = groups
    covered = check_group(graph, group, 12, weights_per_layer=12)
    assert [layer_of(i) for i in group.instances] == [f"h.{i}" for i in range(12)]
    assert len(covered) >= 0.9 * len(tg.nodes(graph))


def test_structural_digest_ignores_operand_order_and_names():
    """Canonicalisation reorders chain operands by *named* digest, differently in every layer;
    the block digest is the same as on the graph before."""
    graph = tg.decompose(gpt2_style(4, **SMALL))
    canonical = tg.canonicalize(graph)
    # the residual stream is shared: canonicalising must not re-add it inside every layer
    assert len(tg.nodes(canonical)) == len(tg.nodes(graph))
    [before] = find_repeated_blocks(graph)
    [after] = find_repeated_blocks(canonical)
    assert before.digest == after.digest


@pytest.mark.slow
@pytest.mark.parametrize("decomposed", [False, True])
def test_gpt2_default_size(decomposed):
    graph = gpt2_style()
    if decomposed:
        graph = tg.decompose(graph)
    [group] = find_repeated_blocks(graph)  # its speed: benchmarks/rewrite.py (target < 1 s)
    covered = check_group(graph, group, 12, weights_per_layer=12)
    assert len(covered) >= 0.9 * len(tg.nodes(graph))


# ------------------------------------------------------------------------------ other models
@pytest.mark.parametrize("decomposed", [False, True])
def test_llama_style(decomposed):
    graph = lm(["llama"] * 6)
    if decomposed:
        graph = tg.decompose(graph)
    [group] = find_repeated_blocks(graph)
    covered = check_group(graph, group, 6, weights_per_layer=9)
    assert len(covered) >= 0.8 * len(tg.nodes(graph))
    # the rotary tables are shared by every layer: boundary inputs, not part of a layer
    names = {i.name for i in group.instances[0].inputs if i.op.name == "input"}
    assert {"cos", "sin"} <= names


@pytest.mark.parametrize("decomposed", [False, True])
def test_two_kinds_of_block_give_two_groups(decomposed):
    graph = lm(["gpt"] * 3 + ["llama"] * 4)
    if decomposed:
        graph = tg.decompose(graph)
    groups = find_repeated_blocks(graph)
    assert len(groups) == 2
    by_count = {len(g.instances): g for g in groups}
    assert set(by_count) == {3, 4}
    check_group(graph, by_count[3], 3, weights_per_layer=12)
    check_group(graph, by_count[4], 4, weights_per_layer=9)
    assert {layer_of(i) for i in by_count[3].instances} == {f"gpt.{i}" for i in range(3)}
    assert {layer_of(i) for i in by_count[4].instances} == {f"llama.{i}" for i in range(3, 7)}
    assert by_count[3].digest != by_count[4].digest


def test_plain_mlp_stack_without_residuals():
    """No residual adds: every node is a cut and the period search assembles the layers."""
    x = tg.input("x", ("batch", 16))
    for i in range(8):
        x = tg.relu(tg.linear(x, tg.weight(f"l.{i}.weight", (16, 16)), tg.weight(f"l.{i}.bias",
                                                                                  (16,))))
    for graph in (x, tg.decompose(x)):
        [group] = find_repeated_blocks(graph)
        assert len(group.instances) == 8
        assert [layer_of(i) for i in group.instances] == [f"l.{i}" for i in range(8)]


def test_interchangeable_looking_weights_numbered_by_role():
    """w1 + w2 with both weights of one shape, written in alternating order, w1 also used
    elsewhere: placeholders are numbered by how the block uses them, not by operand order."""
    x = tg.input("x", ("batch", 16))
    for i in range(6):
        w1, w2 = tg.weight(f"l.{i}.a", (16,)), tg.weight(f"l.{i}.b", (16,))
        s = w1 + w2 if i % 2 else w2 + w1
        x = x + tg.relu(x + s) @ tg.weight(f"l.{i}.w", (16, 16)) - w1
    digests = set()
    for graph in (x, tg.decompose(x), tg.canonicalize(tg.decompose(x))):
        [group] = find_repeated_blocks(graph)
        assert [layer_of(i) for i in group.instances] == [f"l.{i}" for i in range(6)]
        assert [leaf.name.split(".")[2] for leaf in group.instances[0].leaves] == \
            [leaf.name.split(".")[2] for leaf in group.instances[1].leaves]
        digests.add(group.digest)
    assert len(digests) == 2  # composite and decomposed differ; canonicalising changes nothing


def test_mask_built_from_the_ids_stays_outside_the_layers():
    """A padding mask computed from the token ids feeds every layer; it depends on no weight,
    so it is a boundary value and the layers are still cut apart."""
    ids = tg.input("ids", ("batch", "seq"), "int64")
    x = tg.embedding(ids, tg.weight("embed", (50, 32)))
    mask = tg.not_equal(ids, 0).reshape("batch", 1, 1, "seq")
    for i in range(4):
        h = tg.layer_norm(x, tg.weight(f"b.{i}.ln", (32,)))
        qkv = tg.linear(h, tg.weight(f"b.{i}.qkv", (96, 32))).reshape("batch", "seq", 3, 4, 8)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        att = tg.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=mask)
        x = x + tg.linear(att.permute(0, 2, 1, 3).reshape("batch", "seq", 32),
                          tg.weight(f"b.{i}.out", (32, 32)))
    for graph in (x, tg.decompose(x)):
        [group] = find_repeated_blocks(graph)
        assert [layer_of(i) for i in group.instances] == [f"b.{i}" for i in range(4)]


def test_no_repetition_no_group():
    assert find_repeated_blocks(transformer_block()) == []
    assert find_repeated_blocks(tg.decompose(transformer_block())) == []
    x = tg.input("x", (4, 8))
    y = tg.softmax(tg.linear(tg.relu(x), tg.weight("w", (8, 8))), axis=-1).sum()
    assert find_repeated_blocks(y) == []
    assert find_repeated_blocks(tg.decompose(y)) == []
    assert find_repeated_blocks(tg.weight("w", (3,))) == []


# ------------------------------------------------------------------------------ stability
_DIGEST_SCRIPT = """
import tensor_graphs as tg
from tensor_graphs.demo import gpt2_style
from tensor_graphs.rewrite import find_repeated_blocks
for g in (gpt2_style(3, d_model=32, heads=4, vocab=50, n_ctx=64),
          tg.decompose(gpt2_style(3, d_model=32, heads=4, vocab=50, n_ctx=64))):
    [group] = find_repeated_blocks(g)
    print(group.digest, group.instances[0].named_digest())
"""


def test_digests_stable_across_processes():
    here = []
    for g in (gpt2_style(3, **SMALL), tg.decompose(gpt2_style(3, **SMALL))):
        [group] = find_repeated_blocks(g)
        here.append(f"{group.digest} {group.instances[0].named_digest()}")
    out = subprocess.run([sys.executable, "-c", _DIGEST_SCRIPT], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert out.stdout.split("\n")[:2] == here
