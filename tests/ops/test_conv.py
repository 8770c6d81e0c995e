"""conv2d, pooling, interpolate and the channel norms against the op table
(tests/ops/optable.py): float64 evaluation to 1e-9 and float32 evaluation to ~1e-5 (norm-wise
relative error) against an independent numpy oracle, the same against torch.nn.functional in a
separate test that skips alone without torch; fully atomic decompositions, symbolic batch dims
and one bad input per op."""

import numpy as np
import pytest

import tensor_graphs as tg
from tests.ops import optable as ot

CONV2D = ot.BY_NAME["conv2d"].oracle
MAX_POOL2D = ot.BY_NAME["max_pool2d"].oracle
ADAPTIVE = ot.BY_NAME["adaptive_avg_pool2d"].oracle
INTERPOLATE = ot.BY_NAME["interpolate"].oracle
BATCH_NORM = ot.BY_NAME["batch_norm"].oracle
GROUP_NORM = ot.BY_NAME["group_norm"].oracle


@pytest.mark.parametrize("row,dtype", ot.params("conv"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("row,dtype", ot.params("conv", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


# ---------------------------------------------------------------------------- conv2d
def test_conv2d_symbolic_batch():
    rng = np.random.default_rng(1)
    W, B = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    x = tg.input("x", ("batch", 3, 7, 5))
    y = tg.conv2d(x, tg.weight("w", (4, 3, 3, 3)), tg.weight("b", (4,)), padding=1, stride=2)
    assert y.shape[1:] == (4, 4, 3) and str(y.shape[0]) == "batch"
    for n in (1, 3):
        X = rng.standard_normal((n, 3, 7, 5))
        ot.check_graph(y, {"x": X, "w": W, "b": B}, CONV2D(X, W, B, padding=1, stride=2))


def test_conv2d_decomposition_is_im2col():
    x, w = tg.input("x", (1, 2, 5, 5)), tg.weight("w", (4, 2, 3, 3))
    ops = [n.op.name for n in tg.nodes(tg.decompose(tg.conv2d(x, w, padding=1)))]
    assert ops.count("matmul") == 1 and ops.count("pad") == 1 and ops.count("slice") == 9
    assert "gather" not in ops


@pytest.mark.parametrize("x_shape, w_shape, kwargs, match", [
    ((1, 3, 5, 5), (4, 2, 3, 3), {}, "channels"),                       # wrong channels
    ((1, 4, 5, 5), (3, 2, 3, 3), {"groups": 2}, "not divisible by groups"),
    ((1, 3, 5, 5), (4, 1, 3, 3), {"groups": 2}, "channels"),            # 3 % 2
    ((1, 3, 5, 5), (4, 3, 3, 3), {"groups": 0}, "groups"),
    ((1, 3, 2, 2), (4, 3, 3, 3), {}, "smaller than the kernel"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"padding": "same", "stride": 2}, "same"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"padding": "full"}, "padding"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"stride": 0}, "stride"),
    ((1, 3, 5, 5), (4, 3, 3, 3), {"padding": (1, 2, 3)}, "padding"),
    ((3, 5, 5, 1, 1), (4, 3, 3, 3), {}, r"\(N, C, H, W\)"),
    ((1, 3, "h", "w"), (4, 3, 3, 3), {}, "concrete"),
    ((1, 3, 5, 5), (4, 3, 3), {}, "weight"),
])
def test_conv2d_bad_input(x_shape, w_shape, kwargs, match):
    with pytest.raises(tg.ShapeError, match=match):
        tg.conv2d(tg.input("x", x_shape), tg.weight("w", w_shape), **kwargs)


def test_conv2d_bad_bias_and_dtype():
    x, w = tg.input("x", (1, 3, 5, 5)), tg.weight("w", (4, 3, 3, 3))
    with pytest.raises(tg.ShapeError, match="bias"):
        tg.conv2d(x, w, tg.weight("b", (3,)))
    with pytest.raises(tg.DTypeError, match="float"):
        tg.conv2d(tg.input("xi", (1, 3, 5, 5), "int64"), w)


# ---------------------------------------------------------------------------- pooling
def test_max_pool2d_extreme_values_and_symbolic_batch():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((3, 2, 7, 7)) * 1e30
    X[0, 0] = -np.inf                       # whole plane -inf: windows stay -inf
    X[1, 1, 2, 3] = np.inf
    X[2, 0, :3, :3] = -3e38
    x = tg.input("x", ("batch", 2, 7, 7))
    for kw in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True)):
        y = tg.max_pool2d(x, **kw)
        ref = MAX_POOL2D(X, **kw)
        np.testing.assert_array_equal(tg.evaluate(y, {"x": X}, dtype="float64"), ref)
        np.testing.assert_array_equal(tg.evaluate(y, {"x": X}), ref.astype(np.float32))
    Xn = X.copy()
    Xn[1, 0, 4, 4] = np.nan
    y = tg.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    ref = MAX_POOL2D(Xn, kernel_size=3, stride=2, padding=1)
    assert np.isnan(ref).any()
    np.testing.assert_array_equal(tg.evaluate(y, {"x": Xn}, dtype="float64"), ref)


def test_max_pool2d_int_and_unbatched_input():
    X = np.random.default_rng(7).integers(-100, 100, (2, 5, 5))
    y = tg.max_pool2d(tg.input("x", (2, 5, 5), "int64"), kernel_size=2, padding=1)
    got = tg.evaluate(y, {"x": X})
    assert got.dtype == np.int64
    ot.check_exact(got, MAX_POOL2D(X, kernel_size=2, padding=1))


@pytest.mark.parametrize("fn, kwargs, match", [
    (tg.max_pool2d, dict(kernel_size=2, padding=2), "at most half"),
    (tg.max_pool2d, dict(kernel_size=0), "kernel_size"),
    (tg.max_pool2d, dict(kernel_size=9), "smaller"),
    (tg.avg_pool2d, dict(kernel_size=3, padding=2), "at most half"),
    (tg.avg_pool2d, dict(kernel_size=2, stride=(1, 2, 3)), "stride"),
    (tg.avg_pool2d, dict(kernel_size=2, divisor_override=0), "divisor_override"),
    (tg.adaptive_avg_pool2d, dict(output_size=(0, 2)), "positive"),
    (tg.adaptive_avg_pool2d, dict(output_size=(1, 2, 3)), "output_size"),
])
def test_pool_bad_input(fn, kwargs, match):
    with pytest.raises(tg.ShapeError, match=match):
        fn(tg.input("x", (1, 2, 5, 5)), **kwargs)


def test_pool_bad_rank_and_symbolic_spatial():
    with pytest.raises(tg.ShapeError, match="concrete"):
        tg.max_pool2d(tg.input("x", (1, 2, "h", 5)), kernel_size=2)
    # the refusal says what to do: a diffusion UNet exported with a named height stops here
    with pytest.raises(tg.ShapeError, match=r"conv2d: .*keep the height and width static"):
        tg.conv2d(tg.input("x", ("b", 2, "h", "w")), tg.weight("w", (3, 2, 3, 3)))
    with pytest.raises(tg.ShapeError, match=r"\(N, C, H, W\)"):
        tg.avg_pool2d(tg.input("x", (5, 5)), kernel_size=2)
    with pytest.raises(TypeError):
        tg.max_pool2d(tg.input("x", (1, 2, 5, 5)))  # kernel_size is required


def test_adaptive_avg_pool2d_symbolic_batch_is_two_matmuls():
    x = tg.input("x", ("batch", 4, 7, 5))
    y = tg.adaptive_avg_pool2d(x, output_size=(2, 3))
    ops = [n.op.name for n in tg.nodes(tg.decompose(y))]
    assert ops.count("matmul") == 2 and ops.count("constant") == 2
    X = np.random.default_rng(9).standard_normal((3, 4, 7, 5))
    ot.check_graph(y, {"x": X}, ADAPTIVE(X, output_size=(2, 3)))


# ---------------------------------------------------------------------------- interpolate
def _nearest_cases():
    """Every (in, out) pair up to 24 in both nearest modes."""
    for n_in in range(1, 25):
        x = tg.input("x", (1, 1, 1, n_in))
        for n_out in range(1, 25):
            for mode in ("nearest", "nearest-exact"):
                yield n_in, n_out, mode, tg.interpolate(x, size=(1, n_out), mode=mode)


def test_interpolate_nearest_index_rule():
    """torch's index rule (float32 scale) for every (in, out) pair up to 24."""
    for n_in, n_out, mode, y in _nearest_cases():
        X = np.arange(n_in, dtype=np.float64).reshape(1, 1, 1, n_in)
        got = tg.evaluate(y, {"x": X}, dtype="float64")
        ot.check_exact(got, INTERPOLATE(X, size=(1, n_out), mode=mode), f"{n_in}->{n_out}")


def test_interpolate_nearest_index_rule_matches_torch():
    """The same pairs equal torch's float32 kernels and its 2-d float64 kernel."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    for n_in, n_out, mode, y in _nearest_cases():
        X = np.arange(n_in, dtype=np.float64).reshape(1, 1, 1, n_in)
        got = tg.evaluate(y, {"x": X}, dtype="float64")
        ref = F.interpolate(torch.from_numpy(X), size=(1, n_out), mode=mode).numpy()
        np.testing.assert_array_equal(got, ref)
        ref32 = F.interpolate(torch.from_numpy(X[0]).float(), size=n_out, mode=mode).numpy()
        np.testing.assert_array_equal(got[0], ref32)


def test_interpolate_2x_nearest_is_expand_and_symbolic_batch():
    x = tg.input("x", ("batch", 3, 4, 5))
    y = tg.interpolate(x, scale_factor=2)
    ops = {n.op.name for n in tg.nodes(tg.decompose(y))}
    assert "expand" in ops and "gather" not in ops
    X = np.random.default_rng(11).standard_normal((2, 3, 4, 5))
    ref = INTERPOLATE(X, scale_factor=2)
    np.testing.assert_array_equal(ref, X.repeat(2, 2).repeat(2, 3))
    ot.check_graph(y, {"x": X}, ref, tol64=0.0)
    Xi = np.random.default_rng(12).integers(0, 9, (1, 1, 3, 3))
    yi = tg.interpolate(tg.input("xi", (1, 1, 3, 3), "int64"), size=(4, 5))
    ot.check_exact(tg.evaluate(yi, {"xi": Xi}), INTERPOLATE(Xi, size=(4, 5)))


@pytest.mark.parametrize("shape, kwargs, error, match", [
    ((1, 2, 4, 5), dict(), tg.ShapeError, "exactly one"),
    ((1, 2, 4, 5), dict(size=3, scale_factor=2), tg.ShapeError, "exactly one"),
    ((1, 2, 4, 5), dict(size=(3, 4, 5)), tg.ShapeError, "size"),
    ((1, 2, 4, 5), dict(size=3, mode="cubic"), tg.TensorGraphsError, "not supported"),
    ((1, 2, 4, 5), dict(size=3, mode="linear"), tg.ShapeError, "spatial dims"),
    ((1, 2, 4, 5), dict(size=3, align_corners=True), tg.TensorGraphsError, "align_corners"),
    ((1, 2, 4, 5), dict(scale_factor=0.1), tg.ShapeError, "positive"),
    ((4, 5), dict(size=3), tg.ShapeError, "spatial dims"),
    ((1, 2, "h", 5), dict(size=3), tg.ShapeError, "concrete"),
])
def test_interpolate_bad_input(shape, kwargs, error, match):
    with pytest.raises(error, match=match):
        tg.interpolate(tg.input("x", shape), **kwargs)


# ---------------------------------------------------------------------------- channel norms
def test_batch_norm_symbolic_batch_and_bad_input():
    rng = np.random.default_rng(14)
    X, M, V = rng.standard_normal((3, 4, 5, 5)), rng.standard_normal(4), rng.uniform(1, 2, 4)
    y = tg.batch_norm(tg.input("x", ("batch", 4, 5, 5)), tg.weight("m", (4,)),
                      tg.weight("v", (4,)))
    ot.check_graph(y, {"x": X, "m": M, "v": V}, BATCH_NORM(X, M, V))
    with pytest.raises(tg.ShapeError, match="running_mean"):
        tg.batch_norm(tg.input("x", (2, 4, 5)), tg.weight("m", (3,)), tg.weight("v", (4,)))
    with pytest.raises(tg.ShapeError, match="weight"):
        tg.batch_norm(tg.input("x", (2, 4)), tg.weight("m", (4,)), tg.weight("v", (4,)),
                      tg.weight("w", (4, 1)))
    with pytest.raises(tg.ShapeError, match=r"\(N, C, ...\)"):
        tg.batch_norm(tg.input("x", (4,)), tg.weight("m", (4,)), tg.weight("v", (4,)))


def test_group_norm_symbolic_dims_and_bad_input():
    rng = np.random.default_rng(16)
    y = tg.group_norm(tg.input("x", ("batch", 6, "len")), num_groups=3, eps=1e-6)
    for shape in ((2, 6, 5), (1, 6, 9)):
        X = rng.standard_normal(shape)
        ot.check_graph(y, {"x": X}, GROUP_NORM(X, num_groups=3, eps=1e-6))
    with pytest.raises(tg.ShapeError, match="num_groups"):
        tg.group_norm(tg.input("x", (2, 6, 4)), num_groups=4)
    with pytest.raises(tg.ShapeError, match="num_groups"):
        tg.group_norm(tg.input("x", (2, 6, 4)), num_groups=0)
    with pytest.raises(tg.ShapeError, match="bias"):
        tg.group_norm(tg.input("x", (2, 6, 4)), None, tg.weight("b", (4,)), num_groups=2)
    with pytest.raises(tg.DTypeError, match="float"):
        tg.group_norm(tg.input("x", (2, 6, 4), "int32"), num_groups=2)
