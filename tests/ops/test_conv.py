"""conv2d, pooling, interpolate and the channel norms against torch.nn.functional: float64
evaluation to 1e-9 and float32 evaluation to ~1e-5 (norm-wise relative error against torch in
float64), fully atomic decompositions, symbolic batch dims and one bad input per op."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error as rel_err

torch = pytest.importorskip("torch")
F = torch.nn.functional




def t(a):
    return torch.from_numpy(np.asarray(a))


def check(y, feeds, ref, tol64=1e-9, tol32=1e-5):
    """float64 and float32 evaluation against a float64 torch result; atomic decomposition."""
    ref = np.asarray(ref)
    got64 = tg.evaluate(y, feeds, dtype="float64")
    assert got64.dtype == np.float64
    assert rel_err(got64, ref) <= tol64
    got32 = tg.evaluate(y, feeds)
    assert got32.dtype == np.dtype(y.dtype.np_dtype)
    assert rel_err(got32, ref) <= tol32
    assert all(n.op.is_atomic for n in tg.nodes(tg.decompose(y)))
    return got64


# ---------------------------------------------------------------------------- conv2d
# (x shape, out channels, kernel (kh, kw), stride, padding, dilation, groups, bias)
CONV_CASES = [
    ((1, 1, 1, 1), 1, (1, 1), 1, 0, 1, 1, False),           # size 1, 1x1
    ((2, 3, 7, 7), 4, (1, 1), 1, 0, 1, 1, True),            # 1x1
    ((2, 3, 7, 7), 5, (1, 1), 2, 0, 1, 1, False),           # strided 1x1
    ((2, 3, 7, 7), 4, (3, 3), 1, 0, 1, 1, True),            # plain 3x3
    ((2, 3, 7, 7), 4, (3, 3), 1, 1, 1, 1, True),            # "same"-sized by padding
    ((1, 2, 7, 9), 6, (3, 3), 2, 1, 1, 2, True),            # stride 2, groups 2
    ((2, 4, 7, 7), 4, (3, 3), 1, 1, 1, 4, True),            # depthwise
    ((1, 3, 7, 7), 6, (3, 3), 1, 1, 1, 3, False),           # depthwise, multiplier 2
    ((1, 2, 11, 9), 3, (3, 3), 1, 2, 2, 1, True),           # dilation 2
    ((2, 3, 5, 11), 4, (3, 2), (1, 3), (2, 0), (1, 2), 1, True),  # odd everything
    ((1, 4, 13, 6), 8, (5, 3), (3, 2), (1, 2), 1, 2, False),
    ((1, 3, 7, 7), 2, (7, 7), 1, 0, 1, 1, True),            # kernel covers the input
    ((3, 6, 8, 8), 6, (3, 3), 2, 0, 1, 3, True),
    ((1, 2, 6, 6), 4, (2, 4), 1, "same", 1, 1, True),       # even kernel: asymmetric pads
    ((1, 2, 6, 6), 4, (3, 3), 1, "same", 2, 2, False),
    ((1, 2, 6, 7), 4, (3, 3), 1, "valid", 1, 1, True),
]


@pytest.mark.filterwarnings("ignore:Using padding='same'")
@pytest.mark.parametrize("case", CONV_CASES, ids=[str(i) for i in range(len(CONV_CASES))])
def test_conv2d_matches_torch(case):
    shape, cout, (kh, kw), stride, padding, dilation, groups, with_bias = case
    rng = np.random.default_rng(len(str(case)))
    X = rng.standard_normal(shape)
    W = rng.standard_normal((cout, shape[1] // groups, kh, kw))
    B = rng.standard_normal(cout) if with_bias else None
    x, w = tg.input("x", shape), tg.weight("w", W.shape)
    b = tg.weight("b", (cout,)) if with_bias else None
    kw_ = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    y = tg.conv2d(x, w, b, **kw_)
    feeds = {"x": X, "w": W} | ({"b": B} if with_bias else {})
    ref = F.conv2d(t(X), t(W), None if B is None else t(B), **kw_).numpy()
    assert y.shape == ref.shape
    check(y, feeds, ref)


def test_conv2d_symbolic_batch_and_unbatched_input():
    rng = np.random.default_rng(1)
    W, B = rng.standard_normal((4, 3, 3, 3)), rng.standard_normal(4)
    x = tg.input("x", ("batch", 3, 7, 5))
    y = tg.conv2d(x, tg.weight("w", (4, 3, 3, 3)), tg.weight("b", (4,)), padding=1, stride=2)
    assert y.shape[1:] == (4, 4, 3) and str(y.shape[0]) == "batch"
    for n in (1, 3):
        X = rng.standard_normal((n, 3, 7, 5))
        ref = F.conv2d(t(X), t(W), t(B), padding=1, stride=2).numpy()
        check(y, {"x": X, "w": W, "b": B}, ref)
    X3 = rng.standard_normal((3, 7, 5))
    y3 = tg.conv2d(tg.input("x", (3, 7, 5)), tg.weight("w", (4, 3, 3, 3)))
    check(y3, {"x": X3, "w": W}, F.conv2d(t(X3), t(W)).numpy())


def test_conv2d_decomposition_is_im2col():
    x, w = tg.input("x", (1, 2, 5, 5)), tg.weight("w", (4, 2, 3, 3))
    ops = [n.op.name for n in tg.nodes(tg.decompose(tg.conv2d(x, w, padding=1)))]
    assert ops.count("matmul") == 1 and ops.count("pad") == 1 and ops.count("slice") == 9
    assert "gather" not in ops


def test_conv2d_large_magnitude():
    rng = np.random.default_rng(2)
    X, W = rng.standard_normal((1, 2, 6, 6)) * 1e30, rng.standard_normal((3, 2, 3, 3)) * 1e-20
    y = tg.conv2d(tg.input("x", X.shape), tg.weight("w", W.shape), padding=1)
    check(y, {"x": X, "w": W}, F.conv2d(t(X), t(W), padding=1).numpy())


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
# (x shape, kernel_size, stride, padding, dilation, ceil_mode)
POOL_CASES = [
    ((1, 1, 1, 1), 1, None, 0, 1, False),
    ((2, 3, 8, 8), 2, None, 0, 1, False),
    ((2, 3, 7, 7), 3, 2, 1, 1, False),
    ((1, 2, 7, 9), (3, 2), (2, 1), (1, 1), 1, False),
    ((1, 2, 9, 7), 3, 1, 0, 2, False),
    ((1, 2, 7, 7), 3, 2, 0, 1, True),
    ((1, 2, 8, 11), (2, 3), (2, 3), (1, 1), 1, True),
    ((1, 1, 5, 5), 5, None, 2, 1, False),
    ((2, 2, 6, 10), 4, 3, 2, 1, True),
]


@pytest.mark.parametrize("case", POOL_CASES, ids=[str(i) for i in range(len(POOL_CASES))])
def test_max_pool2d_matches_torch(case):
    shape, k, s, p, d, ceil = case
    X = np.random.default_rng(3).standard_normal(shape)
    kw = dict(kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
    y = tg.max_pool2d(tg.input("x", shape), **kw)
    ref = F.max_pool2d(t(X), **kw).numpy()
    got = check(y, {"x": X}, ref, tol64=0.0, tol32=1e-7)
    np.testing.assert_array_equal(got, ref)


AVG_CASES = [c for c in POOL_CASES if c[4] == 1]  # avg_pool2d has no dilation


@pytest.mark.parametrize("case", AVG_CASES, ids=[str(i) for i in range(len(AVG_CASES))])
@pytest.mark.parametrize("count_include_pad", [True, False])
def test_avg_pool2d_matches_torch(case, count_include_pad):
    shape, k, s, p, _, ceil = case
    X = np.random.default_rng(4).standard_normal(shape)
    kw = dict(kernel_size=k, stride=s, padding=p, ceil_mode=ceil,
              count_include_pad=count_include_pad)
    y = tg.avg_pool2d(tg.input("x", shape), **kw)
    check(y, {"x": X}, F.avg_pool2d(t(X), **kw).numpy())


def test_avg_pool2d_divisor_override():
    X = np.random.default_rng(5).standard_normal((2, 3, 7, 7))
    kw = dict(kernel_size=3, stride=2, padding=1, divisor_override=4)
    y = tg.avg_pool2d(tg.input("x", X.shape), **kw)
    check(y, {"x": X}, F.avg_pool2d(t(X), **kw).numpy())


def test_max_pool2d_extreme_values_and_symbolic_batch():
    rng = np.random.default_rng(6)
    X = rng.standard_normal((3, 2, 7, 7)) * 1e30
    X[0, 0] = -np.inf                       # whole plane -inf: windows stay -inf
    X[1, 1, 2, 3] = np.inf
    X[2, 0, :3, :3] = -3e38
    x = tg.input("x", ("batch", 2, 7, 7))
    for kw in (dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, ceil_mode=True)):
        y = tg.max_pool2d(x, **kw)
        ref = F.max_pool2d(t(X), **kw).numpy()
        np.testing.assert_array_equal(tg.evaluate(y, {"x": X}, dtype="float64"), ref)
        np.testing.assert_array_equal(tg.evaluate(y, {"x": X}), ref.astype(np.float32))
    Xn = X.copy()
    Xn[1, 0, 4, 4] = np.nan
    y = tg.max_pool2d(x, kernel_size=3, stride=2, padding=1)
    np.testing.assert_array_equal(tg.evaluate(y, {"x": Xn}, dtype="float64"),
                                  F.max_pool2d(t(Xn), kernel_size=3, stride=2, padding=1).numpy())


def test_max_pool2d_int_and_unbatched_input():
    X = np.random.default_rng(7).integers(-100, 100, (2, 5, 5))
    y = tg.max_pool2d(tg.input("x", (2, 5, 5), "int64"), kernel_size=2, padding=1)
    got = tg.evaluate(y, {"x": X})
    np.testing.assert_array_equal(got, F.max_pool2d(t(X).double(), 2, padding=1).numpy())
    assert got.dtype == np.int64


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
    with pytest.raises(tg.ShapeError, match=r"\(N, C, H, W\)"):
        tg.avg_pool2d(tg.input("x", (5, 5)), kernel_size=2)
    with pytest.raises(TypeError):
        tg.max_pool2d(tg.input("x", (1, 2, 5, 5)))  # kernel_size is required


@pytest.mark.parametrize("shape, output_size", [
    ((2, 3, 7, 7), (3, 5)), ((1, 2, 5, 5), (7, 9)), ((1, 2, 8, 6), 1), ((1, 2, 8, 6), 4),
    ((1, 2, 9, 6), (None, 4)), ((1, 1, 1, 1), (2, 3)), ((3, 10, 10), (3, 7)),
])
def test_adaptive_avg_pool2d_matches_torch(shape, output_size):
    X = np.random.default_rng(8).standard_normal(shape)
    y = tg.adaptive_avg_pool2d(tg.input("x", shape), output_size=output_size)
    check(y, {"x": X}, F.adaptive_avg_pool2d(t(X), output_size).numpy())


def test_adaptive_avg_pool2d_symbolic_batch_is_two_matmuls():
    x = tg.input("x", ("batch", 4, 7, 5))
    y = tg.adaptive_avg_pool2d(x, output_size=(2, 3))
    ops = [n.op.name for n in tg.nodes(tg.decompose(y))]
    assert ops.count("matmul") == 2 and ops.count("constant") == 2
    X = np.random.default_rng(9).standard_normal((3, 4, 7, 5))
    check(y, {"x": X}, F.adaptive_avg_pool2d(t(X), (2, 3)).numpy())


# ---------------------------------------------------------------------------- interpolate
@pytest.mark.parametrize("shape, kwargs", [
    ((2, 3, 4, 5), dict(scale_factor=2)),
    ((2, 3, 4, 5), dict(scale_factor=(3, 1))),
    ((1, 2, 4, 5), dict(size=(7, 13))),
    ((1, 2, 9, 6), dict(size=(4, 5))),
    ((1, 2, 10, 26), dict(size=(6, 22))),
    ((1, 2, 5, 5), dict(scale_factor=1.5)),
    ((1, 2, 7, 9), dict(scale_factor=(0.5, 2.5))),
    ((1, 2, 7, 9), dict(scale_factor=1.7, recompute_scale_factor=True)),
    ((1, 2, 7, 9), dict(size=(10, 4), mode="nearest-exact")),
    ((1, 2, 7, 9), dict(scale_factor=1.3, mode="nearest-exact")),
    ((1, 2, 7), dict(size=12)),
    ((1, 2, 3, 4, 5), dict(scale_factor=2)),
    ((2, 3, 4, 5), dict(scale_factor=2, mode="bilinear", align_corners=False)),
    ((1, 2, 7, 9), dict(size=(11, 4), mode="bilinear", align_corners=False)),
    ((1, 2, 7, 9), dict(scale_factor=1.7, mode="bilinear", align_corners=False)),
    ((1, 2, 7, 9), dict(size=(3, 13), mode="bilinear", align_corners=True)),
    ((1, 2, 1, 9), dict(size=(4, 1), mode="bilinear", align_corners=True)),
    ((1, 2, 7), dict(size=15, mode="linear", align_corners=False)),
    ((1, 2, 3, 4, 5), dict(size=(5, 2, 7), mode="trilinear", align_corners=False)),
    ((1, 2, 9, 7), dict(size=(4, 3), mode="area")),
])
def test_interpolate_matches_torch(shape, kwargs):
    X = np.random.default_rng(10).standard_normal(shape)
    y = tg.interpolate(tg.input("x", shape), **kwargs)
    ref = F.interpolate(t(X), **kwargs).numpy()
    assert y.shape == ref.shape
    check(y, {"x": X}, ref)


def test_interpolate_nearest_index_rule_matches_torch():
    """Every (in, out) pair up to 24: torch's index rule (float32 scale), equal to torch's float32
    kernels and to its 2-d float64 kernel."""
    for n_in in range(1, 25):
        X = np.arange(n_in, dtype=np.float64).reshape(1, 1, 1, n_in)
        x = tg.input("x", (1, 1, 1, n_in))
        for n_out in range(1, 25):
            for mode in ("nearest", "nearest-exact"):
                y = tg.interpolate(x, size=(1, n_out), mode=mode)
                got = tg.evaluate(y, {"x": X}, dtype="float64")
                ref = F.interpolate(t(X), size=(1, n_out), mode=mode).numpy()
                np.testing.assert_array_equal(got, ref)
                ref32 = F.interpolate(t(X[0]).float(), size=n_out, mode=mode).numpy()
                np.testing.assert_array_equal(got[0], ref32)


def test_interpolate_2x_nearest_is_expand_and_symbolic_batch():
    x = tg.input("x", ("batch", 3, 4, 5))
    y = tg.interpolate(x, scale_factor=2)
    ops = {n.op.name for n in tg.nodes(tg.decompose(y))}
    assert "expand" in ops and "gather" not in ops
    X = np.random.default_rng(11).standard_normal((2, 3, 4, 5))
    got = check(y, {"x": X}, F.interpolate(t(X), scale_factor=2).numpy(), tol64=0.0)
    np.testing.assert_array_equal(got, X.repeat(2, 2).repeat(2, 3))
    Xi = np.random.default_rng(12).integers(0, 9, (1, 1, 3, 3))
    yi = tg.interpolate(tg.input("xi", (1, 1, 3, 3), "int64"), size=(4, 5))
    ref = F.interpolate(t(Xi).double(), size=(4, 5)).numpy()
    np.testing.assert_array_equal(tg.evaluate(yi, {"xi": Xi}), ref)


@pytest.mark.parametrize("shape, kwargs, error, match", [
    ((1, 2, 4, 5), dict(), tg.ShapeError, "exactly one"),
    ((1, 2, 4, 5), dict(size=3, scale_factor=2), tg.ShapeError, "exactly one"),
    ((1, 2, 4, 5), dict(size=(3, 4, 5)), tg.ShapeError, "size"),
    ((1, 2, 4, 5), dict(size=3, mode="bicubic"), tg.TensorGraphsError, "not supported"),
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
@pytest.mark.parametrize("shape", [(4, 3), (2, 3, 7), (2, 3, 5, 6), (1, 1, 1, 1), (2, 2, 3, 2, 2)])
@pytest.mark.parametrize("affine", [True, False])
def test_batch_norm_matches_torch(shape, affine):
    rng = np.random.default_rng(13)
    c = shape[1]
    X = rng.standard_normal(shape) * 3 + 1
    M, V = rng.standard_normal(c), rng.uniform(0.1, 2.0, c)
    Wt, B = rng.standard_normal(c), rng.standard_normal(c)
    leaves = [tg.input("x", shape), tg.weight("m", (c,)), tg.weight("v", (c,))]
    feeds = {"x": X, "m": M, "v": V}
    if affine:
        leaves += [tg.weight("w", (c,)), tg.weight("b", (c,))]
        feeds |= {"w": Wt, "b": B}
    y = tg.batch_norm(*leaves, eps=1e-3)
    ref = F.batch_norm(t(X), t(M), t(V), t(Wt) if affine else None, t(B) if affine else None,
                       training=False, eps=1e-3).numpy()
    check(y, feeds, ref)


def test_batch_norm_symbolic_batch_and_bad_input():
    rng = np.random.default_rng(14)
    X, M, V = rng.standard_normal((3, 4, 5, 5)), rng.standard_normal(4), rng.uniform(1, 2, 4)
    y = tg.batch_norm(tg.input("x", ("batch", 4, 5, 5)), tg.weight("m", (4,)),
                      tg.weight("v", (4,)))
    check(y, {"x": X, "m": M, "v": V}, F.batch_norm(t(X), t(M), t(V)).numpy())
    with pytest.raises(tg.ShapeError, match="running_mean"):
        tg.batch_norm(tg.input("x", (2, 4, 5)), tg.weight("m", (3,)), tg.weight("v", (4,)))
    with pytest.raises(tg.ShapeError, match="weight"):
        tg.batch_norm(tg.input("x", (2, 4)), tg.weight("m", (4,)), tg.weight("v", (4,)),
                      tg.weight("w", (4, 1)))
    with pytest.raises(tg.ShapeError, match=r"\(N, C, ...\)"):
        tg.batch_norm(tg.input("x", (4,)), tg.weight("m", (4,)), tg.weight("v", (4,)))


@pytest.mark.parametrize("shape, groups", [
    ((2, 4, 3), 2), ((2, 6, 5, 5), 3), ((1, 6, 5, 5), 1), ((2, 6, 4, 4), 6), ((3, 8), 4),
    ((1, 4, 2, 3, 2), 2),
])
@pytest.mark.parametrize("affine", [True, False])
def test_group_norm_matches_torch(shape, groups, affine):
    rng = np.random.default_rng(15)
    c = shape[1]
    X = rng.standard_normal(shape) * 5 + 3
    Wt, B = rng.standard_normal(c), rng.standard_normal(c)
    x = tg.input("x", shape)
    if affine:
        y = tg.group_norm(x, tg.weight("w", (c,)), tg.weight("b", (c,)), num_groups=groups)
        feeds = {"x": X, "w": Wt, "b": B}
        ref = F.group_norm(t(X), groups, t(Wt), t(B)).numpy()
    else:
        y, feeds, ref = tg.group_norm(x, num_groups=groups), {"x": X}, \
            F.group_norm(t(X), groups).numpy()
    check(y, feeds, ref)


def test_group_norm_symbolic_dims_and_bad_input():
    rng = np.random.default_rng(16)
    y = tg.group_norm(tg.input("x", ("batch", 6, "len")), num_groups=3, eps=1e-6)
    for shape in ((2, 6, 5), (1, 6, 9)):
        X = rng.standard_normal(shape)
        check(y, {"x": X}, F.group_norm(t(X), 3, eps=1e-6).numpy())
    with pytest.raises(tg.ShapeError, match="num_groups"):
        tg.group_norm(tg.input("x", (2, 6, 4)), num_groups=4)
    with pytest.raises(tg.ShapeError, match="num_groups"):
        tg.group_norm(tg.input("x", (2, 6, 4)), num_groups=0)
    with pytest.raises(tg.ShapeError, match="bias"):
        tg.group_norm(tg.input("x", (2, 6, 4)), None, tg.weight("b", (4,)), num_groups=2)
    with pytest.raises(tg.DTypeError, match="float"):
        tg.group_norm(tg.input("x", (2, 6, 4), "int32"), num_groups=2)
