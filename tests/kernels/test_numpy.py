"""The numpy backend: the seed example, coverage, exact kernels, dtype semantics, errors."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import EvaluationError, KernelConstraintError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.numpy._util import erf
from tensor_graphs.numerics import relative_error


def test_seed_example_tanh_has_numpy_and_exact_kernels():
    x = tg.input("x", (4, 16))
    y = tg.tanh(x)
    found = {k.name: m for k, m in tg.kernels.matching(y)}
    assert {"numpy_tanh", "numpy_exact_tanh"} <= set(found)
    X = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    ref = tg.evaluate(y, {"x": X}, dtype="float64")
    for name in ("numpy_tanh", "numpy_exact_tanh"):
        k = registry.get(name)
        got = k(*[X for _ in k.inputs])
        assert got.dtype == np.float32 and got.shape == (4, 16)
        assert relative_error(got, ref) <= k.tolerance
    exact = registry.get("numpy_exact_tanh")(X)
    np.testing.assert_array_equal(exact, ref.astype(np.float32))  # one rounding of float64


def test_exact_kernels_round_once():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((7, 33)).astype(np.float32)
    w = rng.standard_normal(33).astype(np.float32)
    b = rng.standard_normal(33).astype(np.float32)
    k = registry.get("numpy_exact_layer_norm")
    got = k(x, w, b, eps=1e-5)
    leaves = [tg.input(n, a.shape) for n, a in zip("xwb", (x, w, b))]
    ref = tg.evaluate(tg.layer_norm(*leaves, eps=1e-5), dict(zip("xwb", (x, w, b))),
                      dtype="float64")
    np.testing.assert_array_equal(got, ref.astype(np.float32))
    assert relative_error(got, ref) <= 2.0 ** -24


def test_exact_kernel_with_absent_optional_tensor():
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    k = registry.get("numpy_exact_layer_norm_no_weight_bias")
    assert k.inputs == ("x",)
    node = tg.layer_norm(tg.input("x", (3, 8)))
    assert k.match(node) is not None
    assert registry.get("numpy_exact_layer_norm").match(node) is None
    ref = tg.evaluate(node, {"x": x}, dtype="float64")
    assert relative_error(k(x, eps=1e-5), ref) <= 1e-7


def test_optional_tensor_variants_match_their_nodes():
    x, w, b = tg.input("x", (2, 5)), tg.input("w", (3, 5)), tg.input("b", (3,))
    names = {k.name for k, _ in tg.kernels.matching(tg.linear(x, w))}
    assert "numpy_linear_no_bias" in names and "numpy_linear" not in names
    names = {k.name for k, _ in tg.kernels.matching(tg.linear(x, w, b))}
    assert "numpy_linear" in names and "numpy_linear_no_bias" not in names


@pytest.mark.parametrize("count", [2, 3, 9])
def test_one_variadic_concat_kernel_covers_every_arity(count):
    parts = [tg.input(f"p{i}", (2, i + 1)) for i in range(count)]
    node = tg.concat(parts, axis=1)
    found = {k.name: (k, m) for k, m in tg.kernels.matching(node)}
    assert {"numpy_concat", "numpy_exact_concat", "torch_concat"} <= set(found)
    arrays = [np.full((2, i + 1), float(i), np.float32) for i in range(count)]
    feeds = {f"p{i}": a for i, a in enumerate(arrays)}
    for name in ("numpy_concat", "numpy_exact_concat", "torch_concat"):
        k, m = found[name]
        assert k.inputs == ("xs",) and k.variadic == "xs" and k.attrs == ("axis",)
        assert m.bindings["xs"] == tuple(parts) and k.arguments(m) == parts
        # the planner's call: positional arguments from arguments(), attributes by name
        got = k.fn(*[feeds[n.name] for n in k.arguments(m)],
                   **{a: node.attrs[a] for a in k.attrs})
        np.testing.assert_array_equal(got, np.concatenate(arrays, axis=1))
    with pytest.raises(KernelConstraintError, match="share one dtype"):
        registry.get("numpy_concat")(arrays[0], arrays[1].astype(np.float64), axis=1)


def test_the_fixed_arity_concat_kernels_are_gone():
    names = {k.name for k in tg.kernels.all()}
    assert not {"numpy_concat_3", "numpy_concat_4", "numpy_exact_concat_3"} & names


def test_low_precision_computes_in_float32_and_rounds_once():
    x = np.array([0.1, 1.0, 3.0, -2.5], dtype=ml_dtypes.bfloat16)
    got = registry.get("numpy_exp")(x)
    assert got.dtype == x.dtype
    np.testing.assert_array_equal(got, np.exp(x.astype(np.float32)).astype(x.dtype))
    h = np.array([60000.0, 2.0], dtype=np.float16)
    got = registry.get("numpy_add")(h, h)  # overflows float16 after one rounding
    assert np.isinf(got[0]) and got[1] == 4.0


def test_int_semantics_wrap_like_the_reference():
    a = np.array([-128, 127, 5], dtype=np.int8)
    np.testing.assert_array_equal(registry.get("numpy_neg")(a), np.array([-128, -127, -5],
                                                                          np.int8))
    got = registry.get("numpy_add")(a, a)
    ref = tg.evaluate(tg.input("a", (3,), "int8") + tg.input("b", (3,), "int8"),
                      {"a": a, "b": a})
    np.testing.assert_array_equal(got, ref)


def test_erf_is_accurate_in_float64():
    xs = np.concatenate([np.linspace(-7, 7, 20001), [0.0, -0.0, 1e-300, np.inf, -np.inf]])
    got = erf(xs)
    ref = np.array([math.erf(v) for v in xs])
    assert np.max(np.abs(got - ref) / np.maximum(np.abs(ref), 1e-300)) < 1e-13
    assert np.isnan(erf(np.array([np.nan])))[0]


def test_views_are_declared():
    for name in ("numpy_reshape", "numpy_permute", "numpy_expand", "numpy_slice"):
        assert registry.get(name).view
    x = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    assert np.shares_memory(registry.get("numpy_permute")(x, perm=(1, 0)), x)


def test_constraint_errors_name_the_kernel_and_the_constraint():
    k = registry.get("numpy_add")
    with pytest.raises(KernelConstraintError) as info:
        k(np.ones(3, np.float32), np.ones(3, np.float64))
    assert "numpy_add" in str(info.value) and "share one dtype" in str(info.value)
    k = registry.get("numpy_exp")
    with pytest.raises(KernelConstraintError) as info:
        k(np.ones(3, np.int32))
    assert "numpy_exp" in str(info.value) and "int32" in str(info.value)
    with pytest.raises(KernelConstraintError) as info:
        registry.get("numpy_copy_to")(np.ones(3, np.float32), device="cuda:0")
    assert "numpy_copy_to" in str(info.value) and "cuda:0" in str(info.value)


def test_out_of_range_indices_raise():
    with pytest.raises(EvaluationError, match="out of range"):
        registry.get("numpy_gather")(np.ones((3, 2), np.float32), np.array([0, 3]), axis=0)
    with pytest.raises(EvaluationError, match="out of range"):
        registry.get("numpy_embedding")(np.array([[5]]), np.ones((3, 2), np.float32))


def test_attention_matches_reference_with_gqa_mask_and_causal():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 5, 8)).astype(np.float32)
    k = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
    v = rng.standard_normal((2, 2, 6, 8)).astype(np.float32)
    mask = rng.random((5, 6)) < 0.5
    mask[0] = False  # a fully masked row gives 0, as the reference's safe softmax
    kern = registry.get("numpy_scaled_dot_product_attention")
    got = kern(q, k, v, mask, is_causal=True, scale=None)
    leaves = [tg.input("q", q.shape), tg.input("k", k.shape), tg.input("v", v.shape),
              tg.input("m", mask.shape, "bool")]
    ref = tg.evaluate(tg.scaled_dot_product_attention(*leaves, is_causal=True),
                      {"q": q, "k": k, "v": v, "m": mask}, dtype="float64")
    assert relative_error(got, ref) <= kern.tolerance
    assert not got[:, :, 0].any()
