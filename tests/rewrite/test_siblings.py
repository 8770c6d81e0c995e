"""Sibling products of one activation by static weights become one product over the
concatenated weights, read back as slices: the same values (float64 reference), the forms the
kernels match (attention over the slices, quantized weights still quantize(w) per channel),
and tg.compile planning both forms."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.compiler import prepare
from tensor_graphs.ir.graph import nodes
from tensor_graphs.numerics import relative_error
from tensor_graphs.rewrite.siblings import fuse_siblings, join, sibling_groups, side_by_side

RNG = np.random.default_rng(0)


def _ops(graph) -> list[str]:
    return [n.op.name for n in nodes(graph)]


def _feeds(graph, **given) -> dict:
    feeds = dict(given)
    for n in nodes(graph):
        if n.op.name in ("input", "weight") and n.name not in feeds:
            feeds[n.name] = RNG.normal(size=n.shape).astype(np.float32)
    return feeds


def _same(a, b, feeds, tol=1e-12):
    got = tg.evaluate(b, feeds, dtype="float64")
    ref = tg.evaluate(a, feeds, dtype="float64")
    for g, r in zip(got, ref):
        assert relative_error(np.asarray(g), np.asarray(r)) <= tol


def _qkv(rows=(2, 5), d=16, bias=True):
    """BERT's Q, K and V: three linears of one normed activation, each viewed as heads."""
    x = tg.input("x", (*rows, d))
    outs = []
    for name in "qkv":
        w = tg.weight(f"{name}.weight", (d, d))
        b = tg.weight(f"{name}.bias", (d,)) if bias else None
        outs.append(tg.linear(x, w, b))
    return x, outs


def test_q_k_v_linears_become_one_linear_and_three_slices():
    _, outs = _qkv()
    fused = fuse_siblings(outs)
    ops = _ops(fused)
    assert ops.count("linear") == 1 and ops.count("slice") == 3 and ops.count("concat") == 2
    product = next(n for n in nodes(fused) if n.op.name == "linear")
    assert product.shape == (2, 5, 48)
    _same(outs, fused, _feeds(outs))


@pytest.mark.parametrize("rows", [(1, 16), (7, 16), (2, 3, 16)])  # one row: decode's GEMV
def test_matmul_and_bias_add_siblings_fuse(rows):
    """GPT-2's and the quantize rewrite's spelling: x @ w (+ b), two different widths."""
    x = tg.input("x", rows)
    w1, w2 = tg.weight("w1", (16, 8)), tg.weight("w2", (16, 24))
    b1, b2 = tg.weight("b1", (8,)), tg.weight("b2", (24,))
    outs = [tg.exp(x @ w1 + b1), (x @ w2 + b2) * 2.0]
    fused = fuse_siblings(outs)
    ops = _ops(fused)
    assert ops.count("matmul") == 1 and ops.count("slice") == 2 and ops.count("add") == 1
    _same(outs, fused, _feeds(outs))


def test_swiglu_gate_and_up_fuse():
    """Llama's MLP: silu(x @ Wg^T) * (x @ Wu^T), no biases."""
    x = tg.input("x", (4, 16))
    gate = tg.linear(x, tg.weight("gate", (32, 16)))
    up = tg.linear(x, tg.weight("up", (32, 16)))
    y = tg.linear(tg.silu(gate) * up, tg.weight("down", (16, 32)))
    fused = fuse_siblings(y)
    assert _ops(fused).count("linear") == 2  # gate+up as one, down alone
    _same([y], [fused], _feeds([y]))


def test_what_is_not_a_sibling_is_left_alone():
    x, y = tg.input("x", (4, 16)), tg.input("y", (4, 16))
    w1, w2 = tg.weight("w1", (8, 16)), tg.weight("w2", (8, 16))
    single = [tg.linear(x, w1)]
    assert fuse_siblings(single) is single  # one product: nothing to fuse, the same graph
    other_inputs = [tg.linear(x, w1), tg.linear(y, w2)]
    assert fuse_siblings(other_inputs) is other_inputs
    activations = [x @ tg.transpose(y, 0, 1), x @ tg.transpose(x * 2.0, 0, 1)]
    assert fuse_siblings(activations) is activations  # attention's scores: no static weight
    mixed = [tg.linear(x, w1, tg.weight("b1", (8,))), tg.linear(x, w2)]
    assert not sibling_groups(mixed)  # a bias on one only: separate
    assert fuse_siblings([tg.linear(x, w1) * 1.0, tg.linear(x, tg.weight("w3", (8, 16),
                                                                       "float64"))])


def test_siblings_after_a_rebuilt_layer_read_the_rebuilt_activation():
    """Two layers, both fused: the second layer's products must read the first layer's new
    output, not the old graph (which would then be computed twice)."""
    h = tg.input("x", (3, 8))
    for layer in range(2):
        a = tg.linear(h, tg.weight(f"{layer}.a", (8, 8)))
        b = tg.linear(h, tg.weight(f"{layer}.b", (8, 8)))
        h = tg.tanh(a) + b
    fused = fuse_siblings(h)
    assert _ops(fused).count("linear") == 2 and "concat" in _ops(fused)
    _same([h], [fused], _feeds([h]))


@pytest.mark.parametrize("scheme", ["int8-weight", "int8-dynamic", "bf16-weight"])
def test_quantized_siblings_fuse_as_the_scheme_of_the_joined_weight(scheme):
    """Per output channel, the scheme of the concatenated weight is the concatenation of the
    schemes: the join goes below quantize/dequantize/bf16_round, so the fused graph is the
    quantized product the kernels match (one quantize, one scale), with the same values."""
    _, outs = _qkv(rows=(6,), d=16)
    q = tg.quantize(outs, scheme)
    fused = fuse_siblings(q)
    ops = _ops(fused)
    assert ops.count("matmul") == 1
    if scheme != "bf16-weight":
        assert ops.count("quantize") == 1 and ops.count("quant_scale") == 1
        assert ops.count("concat") == 2  # the float weights and the biases, once each
    _same(q, fused, _feeds(q))


def test_quantized_and_float_siblings_do_not_join():
    """A skipped (float) weight beside quantized ones: one concatenation of both would turn
    the quantized ones into a float weight; they are fused among themselves only."""
    _, outs = _qkv(rows=(6,), d=16, bias=False)
    q = tg.quantize(outs, "int8-weight", skip=["v.weight"])
    fused = fuse_siblings(q)
    ops = _ops(fused)  # q and k as one quantized product, v its own float linear
    assert ops.count("matmul") == 1 and ops.count("linear") == 1 and ops.count("quantize") == 1
    _same(q, fused, _feeds(q))


def test_join_falls_back_to_concat_for_a_reduction_over_the_joined_axis():
    a, b = tg.weight("a", (4, 3)), tg.weight("b", (4, 5))
    over_rows = join([tg.quant_scale(a, axis=0), tg.quant_scale(b, axis=0)], 1)
    assert over_rows.op.name == "quant_scale"  # per column: joined below
    over_cols = join([tg.quant_scale(a, axis=1), tg.quant_scale(b, axis=1)], 1)
    assert over_cols.op.name == "concat"  # max over the joined axis: one per part, (4, 2)
    assert over_cols.shape == (4, 2)
    feeds = _feeds([over_rows, over_cols])
    ref = np.concatenate([np.abs(feeds["a"]).max(0), np.abs(feeds["b"]).max(0)]) / 127
    assert np.allclose(tg.evaluate(over_rows, feeds).ravel(), ref)


def _bert_attention(batch=2, seq=8, heads=2, dim=8):
    d = heads * dim
    x = tg.input("x", (batch, seq, d))
    mask = tg.input("mask", (batch, 1, seq, seq), "bool")
    qkv = []
    for name in "qkv":
        y = tg.linear(x, tg.weight(f"{name}.weight", (d, d)), tg.weight(f"{name}.bias", (d,)))
        qkv.append(tg.permute(tg.reshape(y, (batch, seq, heads, dim)), (0, 2, 1, 3)))
    o = tg.scaled_dot_product_attention(*qkv, mask)
    return tg.reshape(tg.permute(o, (0, 2, 1, 3)), (batch, seq, d))


def test_fused_attention_block_still_plans_the_c_attention_kernel():
    """The slices are views whose last axis is dense, so the attention kernel that reads
    heads by stride still covers the fused form (no copy of Q, K or V)."""
    y = _bert_attention()
    fused = fuse_siblings(prepare([y], {}))
    prog = tg.compile(fused, db=":memory:")
    kernels = [s.kernel.name for s in prog.plan.steps if s.kernel is not None]
    assert any(k.startswith("c_") and "attention" in k for k in kernels), kernels
    assert sum(k.endswith("linear") or "linear_" in k for k in kernels) == 1, kernels
    feeds = _feeds([y], mask=RNG.random((2, 1, 8, 8)) < 0.8)
    feeds["mask"][..., 0] = True
    got = prog(**feeds)[0]  # (a list of outputs: the prepared graph)
    ref = tg.evaluate(y, feeds, dtype="float64")
    assert relative_error(got, ref) <= 1e-5


def test_compile_plans_both_forms_and_runs_one(tmp_path):
    y = _bert_attention()
    prog = tg.compile(y, db=":memory:")
    assert prog.stats["planner_runs"] == 1  # one build
    assert prog.stats["sibling_runs"] == 1  # also planned with Q, K and V fused
    feeds = _feeds([y], mask=np.ones((2, 1, 8, 8), bool))
    ref = tg.evaluate(y, feeds, dtype="float64")
    assert relative_error(prog(**feeds), ref) <= 1e-5
    prog.save_plan(tmp_path / "plan.json")  # whichever form won, its lock file replays
    again = tg.compile(y, db=":memory:", plan=str(tmp_path / "plan.json"))
    assert relative_error(again(**feeds), ref) <= 1e-5
    assert len(again.plan.steps) == len(prog.plan.steps)


def test_fused_int8_siblings_plan_one_int8_gemm():
    """The joined weight keeps the quantized product's form, so the int8 kernel (with the
    joined bias in its epilogue) still covers it: one c_q8 GEMM, not a float GEMM on a
    dequantized concatenation."""
    _, outs = _qkv(rows=(4,), d=64)
    fused = fuse_siblings(prepare(tg.quantize(outs, "int8-weight"), {}))
    prog = tg.compile(fused, db=":memory:")
    per_call = [s.kernel.name for s in prog.plan.per_call if s.kernel is not None]
    gemms = [k for k in per_call if "matmul" in k or "linear" in k]
    assert gemms == ["c_q8_matmul_bias"], per_call


def test_side_by_side_lists_each_fused_product_beside_its_siblings():
    """The profiling order for both forms: a group's one GEMM, then the GEMMs it replaces."""
    _, outs = _qkv()
    listed = side_by_side(outs)
    assert [n.op.name for n in listed] == ["linear"] * 4
    assert listed[0].shape == (2, 5, 48) and listed[1:] == outs
    assert side_by_side([outs[0]]) == []


def test_each_form_search_is_counted_where_it_ran(monkeypatch, tmp_path):
    """planner_runs counts searches of the graph and sibling_runs those of its fused form,
    together every search that ran: the second form's search was once hidden by taking one
    off planner_runs after the fact."""
    from tensor_graphs.planner.search import Planner

    searches = []
    plan = Planner.plan
    monkeypatch.setattr(Planner, "plan", lambda self, *a, **k: searches.append(1)
                        or plan(self, *a, **k))
    y, db = _bert_attention(seq=5), str(tmp_path / "m.db")
    prog = tg.compile(y, db=db)
    assert len(searches) == 2  # the graph and its fused form
    assert (prog.stats["planner_runs"], prog.stats["sibling_runs"]) == (1, 1)
    again = tg.compile(y, db=db)  # both forms' plans come from the plan cache
    assert (again.stats["planner_runs"], again.stats["sibling_runs"]) == (0, 0)
    assert again.stats["plan_cache_hits"] == 2 and len(searches) == 2
    lone = tg.compile(tg.relu(tg.input("x", (4, 4))) * 2.0, db=":memory:")  # no siblings
    assert (lone.stats["planner_runs"], lone.stats["sibling_runs"]) == (1, 0)
