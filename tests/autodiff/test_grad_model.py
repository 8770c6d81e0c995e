"""tg.grad on whole programs: a GPT-2-style block's loss (embeddings, layer_norm, causal
attention, a gelu MLP, tied head, cross-entropy) against torch.autograd, evaluated by the
reference interpreter and compiled by tg.compile (the planner runs the backward); symbolic
dims; the embedding gradient as a scatter-add; and the errors users see.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")

V, T, C, H = 37, 6, 16, 2  # vocabulary, tokens, width, heads
SHAPES = {"wte": (V, C), "wpe": (T, C), "ln1_w": (C,), "ln1_b": (C,), "qkv_w": (3 * C, C),
          "qkv_b": (3 * C,), "proj_w": (C, C), "proj_b": (C,), "ln2_w": (C,), "ln2_b": (C,),
          "fc_w": (4 * C, C), "fc_b": (4 * C,), "out_w": (C, 4 * C), "out_b": (C,),
          "lnf_w": (C,), "lnf_b": (C,)}


def _weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: rng.standard_normal(s) * (0.3 if len(s) == 2 else 0.1) for k, s in SHAPES.items()}
    for k in ("ln1_w", "ln2_w", "lnf_w"):
        out[k] = out[k] + 1.0
    return out


def _batch(seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"ids": rng.integers(0, V, (2, T)), "targets": rng.integers(0, V, (2, T))}


def tg_loss(dtype: str):
    """The block and its loss; returns (loss, weights by name)."""
    w = {k: tg.weight(k, s, dtype) for k, s in SHAPES.items()}
    ids, targets = tg.input("ids", (2, T), "int64"), tg.input("targets", (2, T), "int64")
    x = tg.embedding(ids, w["wte"]) + w["wpe"]
    h = tg.layer_norm(x, w["ln1_w"], w["ln1_b"])
    qkv = tg.linear(h, w["qkv_w"], w["qkv_b"]).reshape(2, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
    att = tg.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    x = x + tg.linear(att.permute(0, 2, 1, 3).reshape(2, T, C), w["proj_w"], w["proj_b"])
    h = tg.layer_norm(x, w["ln2_w"], w["ln2_b"])
    x = x + tg.linear(tg.gelu(tg.linear(h, w["fc_w"], w["fc_b"]), approximate="tanh"),
                      w["out_w"], w["out_b"])
    logits = tg.layer_norm(x, w["lnf_w"], w["lnf_b"]) @ w["wte"].T
    return tg.cross_entropy(logits.reshape(2 * T, V), targets.reshape(2 * T)), w


def torch_grads(weights: dict, batch: dict, dtype) -> tuple[float, dict]:
    F = torch.nn.functional  # noqa: N806
    w = {k: torch.tensor(v, dtype=dtype, requires_grad=True) for k, v in weights.items()}
    ids, targets = (torch.tensor(batch[k]) for k in ("ids", "targets"))
    x = F.embedding(ids, w["wte"]) + w["wpe"]
    h = F.layer_norm(x, (C,), w["ln1_w"], w["ln1_b"])
    qkv = F.linear(h, w["qkv_w"], w["qkv_b"]).reshape(2, T, 3, H, C // H).permute(2, 0, 3, 1, 4)
    att = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
    x = x + F.linear(att.permute(0, 2, 1, 3).reshape(2, T, C), w["proj_w"], w["proj_b"])
    h = F.layer_norm(x, (C,), w["ln2_w"], w["ln2_b"])
    x = x + F.linear(F.gelu(F.linear(h, w["fc_w"], w["fc_b"]), approximate="tanh"),
                     w["out_w"], w["out_b"])
    logits = F.layer_norm(x, (C,), w["lnf_w"], w["lnf_b"]) @ w["wte"].T
    loss = F.cross_entropy(logits.reshape(2 * T, V), targets.reshape(2 * T))
    grads = torch.autograd.grad(loss, list(w.values()))
    return float(loss), {k: g.double().numpy() for k, g in zip(w, grads)}


def test_gpt2_block_gradients_match_torch_float64():
    loss, w = tg_loss("float64")
    names = list(SHAPES)
    grads = tg.grad(loss, [w[k] for k in names])
    weights, batch = _weights(), _batch()
    got = tg.evaluate([loss, *grads], {**weights, **batch})
    ref_loss, ref = torch_grads(weights, batch, torch.float64)
    assert abs(float(got[0]) - ref_loss) <= 1e-12 * abs(ref_loss)
    for k, g in zip(names, got[1:]):
        assert relative_error(g, ref[k]) <= 1e-10, k


def test_backward_reads_the_forward_as_built():
    """The gradients read the forward's own nodes: one attention, three layer norms and the
    forward's linear nodes in loss + gradients together (no lowered second copy of the
    forward for the backward to read)."""
    loss, w = tg_loss("float32")
    grads = tg.grad(loss, list(w.values()))
    forward = [n.op.name for n in tg.nodes(loss)]
    both = [n.op.name for n in tg.nodes([loss, *grads])]
    for op in ("scaled_dot_product_attention", "layer_norm", "linear", "embedding"):
        assert both.count(op) == forward.count(op) >= 1, op


@pytest.mark.slow
def test_gpt2_block_gradients_compiled():
    """tg.compile plans the forward and backward together (float32) and matches torch."""
    loss, w = tg_loss("float32")
    names = list(SHAPES)
    grads = tg.grad(loss, [w[k] for k in names])
    weights, batch = _weights(), _batch()
    prog = tg.compile([loss, *grads], db=":memory:")
    prog.bind(**{k: v.astype(np.float32) for k, v in weights.items()})
    got = prog(**batch)
    ref_loss, ref = torch_grads(weights, batch, torch.float64)
    assert abs(float(got[0]) - ref_loss) <= 1e-5 * abs(ref_loss)
    for k, g in zip(names, got[1:]):
        assert g.dtype == np.float32 and g.shape == SHAPES[k]
        assert relative_error(g, ref[k]) <= 1e-4, k


def test_compiled_mlp_gradients_match_the_interpreter():
    x, y = tg.input("x", ("batch", 7)), tg.input("y", ("batch", 3))
    w1, b1, w2 = tg.weight("w1", (7, 5)), tg.weight("b1", (5,)), tg.weight("w2", (5, 3))
    loss = tg.mse_loss(tg.relu(x @ w1 + b1) @ w2, y)
    grads = tg.grad(loss, [w1, b1, w2])
    rng = np.random.default_rng(3)
    weights = {"w1": rng.standard_normal((7, 5)), "b1": rng.standard_normal(5),
               "w2": rng.standard_normal((5, 3))}
    feeds = {"x": rng.standard_normal((9, 7)), "y": rng.standard_normal((9, 3))}
    prog = tg.compile(grads, db=":memory:", bounds={"batch": 16})
    prog.bind(**{k: v.astype(np.float32) for k, v in weights.items()})
    got = prog(**{k: v.astype(np.float32) for k, v in feeds.items()})
    ref = tg.evaluate(grads, {**weights, **feeds}, dtype="float64")
    for g, r in zip(got, ref):
        assert relative_error(g, r) <= 1e-5


# ---------------------------------------------------------------------------- symbolic dims
def test_symbolic_batch_broadcasts_sum_back():
    """sum_to over a symbolic broadcast: the bias gradient sums over "batch" and "seq"."""
    x = tg.input("x", ("batch", "seq", 4), "float64")
    w, b = tg.weight("w", (4, 3), "float64"), tg.weight("b", (1, 3), "float64")
    loss = tg.mean(tg.softmax(x @ w + b, axis=-1) * tg.layer_norm(x @ w))
    gw, gb, gx = tg.grad(loss, [w, b, x])
    assert gx.shape == x.shape
    rng = np.random.default_rng(4)
    X, W, B = rng.standard_normal((2, 5, 4)), rng.standard_normal((4, 3)), rng.standard_normal(
        (1, 3))
    got = tg.evaluate([gw, gb, gx], {"x": X, "w": W, "b": B})
    ts = [torch.tensor(a, requires_grad=True) for a in (W, B, X)]
    z = ts[2] @ ts[0]
    ref_loss = torch.mean(torch.softmax(z + ts[1], -1) * torch.nn.functional.layer_norm(z, (3,)))
    for g, r in zip(got, torch.autograd.grad(ref_loss, ts)):
        assert relative_error(g, r.numpy()) <= 1e-12


# ---------------------------------------------------------------------------- embeddings
def test_embedding_gradient_is_a_scatter_add_not_a_one_hot():
    """GPT-2's 50,257 rows: the table's gradient is one scatter-add; no value of the backward
    is larger than the table (a one-hot would be tokens x 50,257)."""
    table = tg.weight("wte", (50257, 8))
    ids = tg.input("ids", (64,), "int64")
    (g,) = tg.grad(tg.embedding(ids, table).sum(), [table])
    nodes = tg.nodes(tg.decompose(g))
    assert any(n.op.name == "scatter" for n in nodes)
    assert max(int(np.prod(n.shape)) for n in nodes) <= 50257 * 8
    rng = np.random.default_rng(0)
    index = rng.integers(0, 50257, 64)
    index[:8] = 7  # repeated ids all count
    got = tg.evaluate(g, {"ids": index})
    ref = np.zeros((50257, 8))
    np.add.at(ref, index, 1.0)
    assert np.array_equal(got, ref)


# ---------------------------------------------------------------------------- what users see
def test_int_wrt_is_an_argument_error_naming_the_node_and_dtype():
    ids = tg.input("ids", (3,), "int64")
    table = tg.weight("table", (5, 2))
    loss = tg.embedding(ids, table).sum()
    with pytest.raises(tg.ArgumentError, match=r"ids.*int64.*float"):
        tg.grad(loss, [table, ids])
    with pytest.raises(tg.ArgumentError, match=r"bool"):
        tg.grad(loss, [tg.input("m", (3,), "bool")])


def test_non_scalar_loss_needs_a_seed():
    x = tg.input("x", (3, 4))
    with pytest.raises(tg.ShapeError, match=r"\(3, 4\).*seed="):
        tg.grad(x * 2.0, [x])
    with pytest.raises(tg.ShapeError, match=r"seed"):
        tg.grad(x * 2.0, [x], seed=np.ones((4, 3), np.float32))
    (g,) = tg.grad(x * 2.0, [x], seed=np.ones((3, 4), np.float32))
    assert np.array_equal(tg.evaluate(g, {}), np.full((3, 4), 2.0, np.float32))


def test_unused_wrt_gets_zeros_of_its_shape_and_dtype():
    x, unused = tg.input("x", (3,)), tg.weight("u", (2, 5), "float64")
    gx, gu = tg.grad((x * x).sum(), [x, unused])
    assert gu.shape == (2, 5) and gu.dtype == tg.float64
    assert np.array_equal(tg.evaluate(gu, {}), np.zeros((2, 5)))
    assert np.array_equal(tg.evaluate(gx, {"x": np.arange(3, dtype=np.float32)}),
                          np.array([0, 2, 4], np.float32))


def test_gradient_through_an_int_path_is_zero():
    """A cast to int stops the flow: x.astype(int) has no gradient."""
    x = tg.input("x", (4,), "float64")
    (g,) = tg.grad(tg.cast(tg.cast(x, "int64"), "float64").sum() + x.sum(), [x])
    assert np.array_equal(tg.evaluate(g, {}), np.ones(4))


def test_intermediate_wrt_and_shared_uses_sum():
    """wrt may be an inner node; a node used twice gets both cotangents."""
    x = tg.input("x", (3,), "float64")
    h = tg.exp(x)
    gh, gx = tg.grad((h * h + h).sum(), [h, x])
    X = np.array([0.0, 1.0, -1.0])
    got_h, got_x = tg.evaluate([gh, gx], {"x": X})
    assert np.allclose(got_h, 2 * np.exp(X) + 1, rtol=1e-15)
    assert np.allclose(got_x, (2 * np.exp(X) + 1) * np.exp(X), rtol=1e-15)


def test_gradient_graphs_save_and_load(tmp_path):
    """The rules build nodes the builders would (pads, slices, scatters): tg.load rebuilds
    every gradient graph through the builders and gets the same nodes back."""
    loss, w = tg_loss("float32")
    x = tg.input("x", ("n", 6))
    extra = (tg.pad(x[1::2, ::-2], (1, 2)) ** 2).sum() + tg.concat([x, x], 0).max()
    grads = tg.grad(loss + extra, [*w.values(), x])
    tg.save(grads, tmp_path / "grads.json")
    back = tg.load(tmp_path / "grads.json")
    assert len(back) == len(grads) and all(a is b for a, b in zip(back, grads))
