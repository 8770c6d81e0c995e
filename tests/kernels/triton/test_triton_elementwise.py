"""The Triton elementwise renderer: codegen's regions as Triton kernels, checked against the
float64 reference (fp32 and fp16) before use, with numpy's semantics where they matter."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import KernelConstraintError
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.kernels.triton import build, generate
from tensor_graphs.kernels.triton.build import Config
from tests.kernels.triton.common import DTYPES, agrees, atomic_root, run, within

BIG = Config(4096, 4)  # few programs: the interpreter runs them one by one
SMALL = Config(256, 2)


def found(y, expand):
    return generate.elementwise_region(atomic_root(y, expand), use_counts([y]), expand)


def kernel(y, expand, config=BIG, verify=True):
    got = found(y, expand)
    assert got is not None, "no elementwise region"
    _covers, region, _top, rendered = got
    return generate.build_elementwise(region, rendered, config, verify=verify), region


def gelu_tanh(dt):
    x, b = tg.input("x", (4, 33), dt), tg.input("b", (33,), dt)
    return tg.gelu(x + b, approximate="tanh") * 1.5


def gelu_erf(dt):
    x = tg.input("x", (2, 3, 17), dt)
    return tg.gelu(x) + tg.exp(-x) * tg.sin(x)


def broadcast_relu(dt):
    x, b = tg.input("x", (2, 5, 7), dt), tg.input("b", (7,), dt)
    r = tg.input("r", (2, 1, 7), dt)
    return tg.relu(x + b) + r


def logs_and_roots(dt):
    x = tg.input("x", (3, 9), dt)
    return tg.log(x * x + 1.0) + tg.sqrt(tg.abs(x)) + 1.0 / (x + 3.0)


GALLERY = {"gelu_tanh": gelu_tanh, "gelu_erf": gelu_erf, "broadcast_relu": broadcast_relu,
           "logs_and_roots": logs_and_roots}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(GALLERY))
def test_gallery_regions_pass_their_checks_in_fp32_and_fp16(name, dtype, expand):
    """Building runs the renderer's check (broadcast, strided, NaN/inf inputs, last axes 1,
    7, 33, 1025) and tg.kernels.verify(strict=True); the kernel then agrees with the float64
    reference on fresh inputs."""
    y = GALLERY[name](dtype)
    k, region = kernel(y, expand)
    assert (k.backend, k.device, k.writes_out) == ("triton", "cuda", True)
    rng = np.random.default_rng(1)
    arrays = [rng.standard_normal(tuple(n.shape)).astype(n.dtype.np_dtype)
              for n in region.inputs]
    leaves = {n.name: a for n, a in zip(region.inputs, arrays)}
    ref = tg.evaluate(y, leaves, dtype="float64")
    got = run(k, *arrays)
    assert got.dtype == region.root.dtype.np_dtype and got.shape == ref.shape
    within(k, got, ref, dtype)


def test_fp16_ops_round_as_the_reference_does(expand):
    """Every float16 op is computed in float32 and rounded once, as numpy computes float16:
    (x * 300) * 300 overflows to inf in float16 where one float32 product would not."""
    x = tg.input("x", (40,), "float16")
    y = (x * 300.0) * 300.0 + 1.0
    k, _ = kernel(y, expand)
    xs = np.linspace(-2, 2, 40).astype(np.float16)
    got = run(k, xs)
    want = tg.evaluate(y, {"x": xs})
    assert np.array_equal(got, want) and np.isinf(got).any()


def test_maximum_propagates_nan_and_comparisons_with_nan_are_false(expand):
    a, b = tg.input("a", (6,), "float32"), tg.input("b", (6,), "float32")
    y = tg.maximum(a, b) + tg.where(tg.less(a, b), 1.0, 0.5)
    k, _ = kernel(y, expand)
    av = np.array([np.nan, 1.0, 2.0, -np.inf, 0.0, np.nan], np.float32)
    bv = np.array([1.0, np.nan, 3.0, 1.0, -0.0, np.nan], np.float32)
    got = run(k, av, bv)
    want = tg.evaluate(y, {"a": av, "b": bv})
    np.testing.assert_array_equal(got, want)
    assert np.isnan(got[[0, 1, 5]]).all() and got[4] == 0.5  # max(0, -0) + (0 < -0 is false)


def test_integer_arithmetic_wraps_around_and_bool_ops_are_logical(expand):
    a, b = tg.input("a", (5,), "int32"), tg.input("b", (5,), "int32")
    p, q = tg.input("p", (5,), "bool"), tg.input("q", (5,), "bool")
    wrapped = (a * b + a) * 3 - b
    y = tg.where(p * q + tg.less(a, b), wrapped, tg.maximum(a, b))
    k, region = kernel(y, expand)
    info = np.iinfo(np.int32)
    av = np.array([info.max, info.min, 7, -3, 46341], np.int32)
    bv = np.array([2, -1, info.max, 5, 46341], np.int32)
    pv = np.array([True, False, True, True, False])
    qv = np.array([True, True, False, True, False])
    feeds = {"a": av, "b": bv, "p": pv, "q": qv}
    args = [feeds[n.name] for n in region.inputs]
    with np.errstate(all="ignore"):
        want = tg.evaluate(y, feeds)
    np.testing.assert_array_equal(run(k, *args), want)


def test_casts_between_bool_ints_and_floats(expand):
    x = tg.input("x", (7,), "float32")
    i = tg.input("i", (7,), "int64")
    y = tg.cast(tg.cast(x, "bool"), "float32") + tg.cast(i, "float32") \
        + tg.cast(tg.cast(i, "int32"), "float32") * 0.5
    k, region = kernel(y, expand)
    xv = np.array([0.0, -0.0, np.nan, 2.0, -1e-30, np.inf, 0.5], np.float32)
    iv = np.array([0, 1, -5, 2 ** 40 + 3, -(2 ** 33), 2 ** 31, 7], np.int64)
    feeds = {"x": xv, "i": iv}
    got = run(k, *[feeds[n.name] for n in region.inputs])
    np.testing.assert_array_equal(got, tg.evaluate(y, feeds))


def test_float_to_int_casts_and_general_powers_stay_outside_the_region(expand):
    """Triton cannot give numpy's x86 results for NaN or out-of-range float -> int casts, nor
    check a general pow in the interpreter: those nodes are region inputs."""
    x = tg.input("x", (8,), "float32")
    cut = tg.cast(tg.exp(x) * 2.0, "int32") * 3 + 1
    _c, region, _t, _r = found(cut, expand)
    assert [n.op.name for n in region.nodes] == ["mul", "add"]
    assert [n.op.name for n in region.inputs] == ["cast"]
    general = (tg.pow(tg.exp(x), 2.5) + 1.0) * 2.0
    _c, region, _t, _r = found(general, expand)
    assert [n.op.name for n in region.nodes] == ["add", "mul"]
    assert [n.op.name for n in region.inputs] == ["pow"]


@pytest.mark.parametrize("exponent", [0.5, -1.0, 2.0, 3.0, 4.0])
def test_powers_by_an_inlined_exponent(exponent, expand):
    x = tg.input("x", (9,), "float32")
    y = tg.pow(x + 0.0, exponent) * 1.0
    k, region = kernel(y, expand)
    assert "pow" in region.ops
    xv = np.array([-np.inf, -2.0, -0.0, 0.0, 1e-20, 0.3, 3.0, np.inf, np.nan], np.float32)
    with np.errstate(all="ignore"):
        want = tg.evaluate(y, {"x": xv})
        got = run(k, xv)
    ok = np.isclose(got, want, rtol=3e-7, equal_nan=True) | (got == want)
    assert ok.all(), (got, want)


def test_strided_broadcast_and_transposed_inputs_are_read_through_their_strides(expand):
    y = broadcast_relu("float32")
    k, region = kernel(y, expand, SMALL)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((7, 5, 2)).astype(np.float32).transpose(2, 1, 0)  # (2, 5, 7)
    b = rng.standard_normal(14).astype(np.float32)[::2]
    r = rng.standard_normal((2, 1, 7)).astype(np.float32)
    feeds = {"x": x, "b": b, "r": r}
    got = run(k, *[feeds[n.name] for n in region.inputs])
    agrees(got, tg.evaluate(y, feeds, dtype="float64"))
    assert got.flags.c_contiguous


def test_more_dims_than_the_kernel_indexes_are_read_as_contiguous_copies(expand):
    """Five axes that do not merge: each odd operand is made contiguous first."""
    a, b = tg.input("a", (2, 1, 3, 1, 5), "float32"), tg.input("b", (1, 4, 1, 6, 1), "float32")
    y = tg.exp(a) + b * 2.0
    k, region = kernel(y, expand)
    rng = np.random.default_rng(3)
    feeds = {"a": rng.standard_normal((2, 1, 3, 1, 5)).astype(np.float32),
             "b": rng.standard_normal((1, 4, 1, 6, 1)).astype(np.float32)}
    got = run(k, *[feeds[n.name] for n in region.inputs])
    agrees(got, tg.evaluate(y, feeds, dtype="float64"), k.tolerance)


def test_wide_offsets_compute_the_same_values(expand, monkeypatch):
    """Past 2**31 elements offsets are int64 (WIDE): taken here from 64 elements on."""
    monkeypatch.setattr(build, "WIDE", 64)
    y = broadcast_relu("float32")
    k, region = kernel(y, expand, SMALL, verify=False)
    rng = np.random.default_rng(4)
    feeds = {n.name: rng.standard_normal(tuple(n.shape)).astype(np.float32)
             for n in region.inputs}
    got = run(k, *[feeds[n.name] for n in region.inputs])
    agrees(got, tg.evaluate(y, feeds, dtype="float64"))


def test_out_is_filled_and_returned_and_bad_calls_name_the_kernel(expand):
    import torch

    from tensor_graphs.devices import torch_device

    dev = torch_device("cuda")
    y = gelu_tanh("float32")
    k, region = kernel(y, expand)
    args = {"x": torch.randn(4, 33, device=dev), "b": torch.randn(33, device=dev)}
    ordered = [args[n.name] for n in region.inputs]
    out = torch.empty(4, 33, device=dev)
    assert k.fn(*ordered, out=out) is out
    assert torch.equal(out, k.fn(*ordered))
    with pytest.raises(KernelConstraintError, match=k.name):
        k.fn(*[t.double() for t in ordered])
    elsewhere = "meta" if dev == "cpu" else "cpu"  # memory the kernel cannot read
    with pytest.raises(KernelConstraintError, match="in the GPU's memory"):
        k.fn(*[t.to(elsewhere) for t in ordered])
    with pytest.raises(KernelConstraintError, match="out= must be a contiguous"):
        k.fn(*ordered, out=torch.empty(33, 4, device=dev).t())
    with pytest.raises(KernelConstraintError, match="do not broadcast"):
        k.fn(torch.randn(4, 5, device=dev), torch.randn(33, device=dev))


def test_each_configuration_is_its_own_candidate_and_kernel(expand):
    y = gelu_tanh("float32")
    root = y
    while not root.op.is_atomic:
        root = expand(root)
    uses = use_counts([y])
    cands = [generate.elementwise_candidate(root, uses, expand, config=c)
             for c in generate.ELEMENTWISE_CONFIGS]
    assert len({c.name for c in cands}) == len(cands) == len(generate.ELEMENTWISE_CONFIGS)
    assert all(c.source_hash == c.name and (c.backend, c.device) == ("triton", "cuda")
               for c in cands)
    assert all(c.covers == cands[0].covers for c in cands)  # one region, found once
    k = cands[1].build()
    assert k.name == cands[1].name and k.source_hash == cands[1].source_hash


def test_the_region_is_found_once_for_all_configurations(expand, monkeypatch):
    """The planner asks each configuration's generator in turn with its decomposition as a
    bound method (a new object at every access): one region search serves them all."""

    class Planner:
        def decomposition(self, n):
            return expand(n)

    planner = Planner()
    y = gelu_tanh("float32")
    root = y
    while not root.op.is_atomic:
        root = expand(root)
    uses = use_counts([y])
    searched = []
    real = generate.elementwise_region
    monkeypatch.setattr(generate, "elementwise_region",
                        lambda *args: searched.append(args[0]) or real(*args))
    names = {generate.elementwise_candidate(root, uses, planner.decomposition, config=c).name
             for c in generate.ELEMENTWISE_CONFIGS}
    assert len(names) == len(generate.ELEMENTWISE_CONFIGS) and searched == [root]
