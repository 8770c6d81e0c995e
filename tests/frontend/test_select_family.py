"""The selection and scatter families: through ``tg`` against numpy in float64, and through
``tg.from_torch`` against torch (each op wrapped in a module and exported).

Ties, nans and repeated indices are in the data on purpose: sorts must give torch's stable
order, accumulating writes must add every repeat. Plain (non-accumulating) writes are tested
with unique indices only, where torch defines the result."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")

from tensor_graphs.frontend import UnsupportedOpError  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _ties(*shape, seed=0) -> np.ndarray:
    """Rounded normals (ties) with a nan and an inf where there is room."""
    rng = np.random.default_rng(seed)
    x = np.round(rng.standard_normal(shape) * 2).astype(np.float32)
    if x.size >= 6:
        x.reshape(-1)[[1, 4]] = (np.nan, np.inf)
    return x


# ---------------------------------------------------------------------------- through tg
def test_sort_topk_kthvalue_against_numpy():
    xv = _ties(4, 9)
    x = tg.input("x", xv.shape)
    v, i = tg.sort(x, axis=1, descending=True)
    tv, ti = tg.topk(x, 3, axis=1, largest=False)
    kv, ki = tg.kthvalue(x, 2, axis=0, keepdims=True)
    got = tg.evaluate([v, i, tv, ti, kv, ki], {"x": xv}, dtype="float64")
    asc = np.argsort(xv, axis=1, kind="stable")  # nan last, ties in order
    # descending and stable: sort the negation (nan stays last there, so move it first)
    neg = np.where(np.isnan(xv), -np.inf, -xv.astype(np.float64))
    desc = np.argsort(neg, axis=1, kind="stable")
    desc = np.array([np.r_[row[np.isnan(xv[r, row])], row[~np.isnan(xv[r, row])]]
                     for r, row in enumerate(desc)])
    np.testing.assert_array_equal(got[1], desc)
    np.testing.assert_array_equal(got[0], np.take_along_axis(xv, desc, 1))
    np.testing.assert_array_equal(got[3], asc[:, :3])
    np.testing.assert_array_equal(got[2], np.take_along_axis(xv, asc[:, :3], 1))
    order0 = np.argsort(xv, axis=0, kind="stable")[1:2]
    np.testing.assert_array_equal(got[5], order0)
    np.testing.assert_array_equal(got[4], np.take_along_axis(xv, order0, 0))


def test_index_add_accumulates_repeats_and_scales():
    xv = np.arange(12, dtype=np.float64).reshape(4, 3)
    iv = np.array([3, 0, 3, 3])
    uv = np.random.default_rng(1).standard_normal((4, 3))
    y = tg.index_add(tg.input("x", (4, 3), "float64"), tg.input("i", (4,), "int64"),
                     tg.input("u", (4, 3), "float64"), axis=0, alpha=0.5)
    ref = xv.copy()
    np.add.at(ref, iv, 0.5 * uv)
    got = tg.evaluate(y, {"x": xv, "i": iv, "u": uv})
    assert relative_error(got, ref) < 1e-15


def test_scatter_sum_is_the_adjoint_of_gather():
    """<gather(x, i), u> == <x, scatter_add(0, i, u)> for any x and u: the embedding gradient
    (training's use of scatter) needs exactly this."""
    rng = np.random.default_rng(2)
    xv, uv = rng.standard_normal((50, 8)), rng.standard_normal((30, 8))
    iv = rng.integers(0, 50, 30)
    x, i, u = tg.input("x", (50, 8), "float64"), tg.input("i", (30,), "int64"), \
        tg.input("u", (30, 8), "float64")
    gathered, scattered = tg.evaluate(
        [tg.gather(x, i, axis=0), tg.scatter(tg.constant(np.zeros((50, 8))), i, u)],
        {"x": xv, "i": iv, "u": uv})
    assert abs(np.sum(gathered * uv) - np.sum(xv * scattered)) < 1e-10


def test_scatter_out_of_range_index_raises():
    y = tg.scatter(tg.input("x", (3,)), tg.input("i", (2,), "int64"), tg.input("u", (2,)))
    with pytest.raises(tg.EvaluationError, match="out of range"):
        tg.evaluate(y, {"x": np.zeros(3, np.float32), "i": np.array([0, 3]),
                        "u": np.ones(2, np.float32)})


def test_scatter_rejects_mismatched_updates():
    with pytest.raises(tg.ShapeError, match="updates"):
        tg.scatter(tg.input("x", (3, 4)), tg.input("i", (2,), "int64"), tg.input("u", (2, 3)))


# ---------------------------------------------------------------------------- from_torch
class Fn(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _leaves(value) -> list:
    """The tensors of a (nested) output, in order."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]


def _compare(fn, *args, tol=1e-6):
    """Export fn over the example args, run ours and torch's, compare every output (ints
    and bools exactly, floats with their nans in place)."""
    module = Fn(fn)
    prog = tg.from_torch(module, args, db=":memory:")
    with torch.no_grad():
        ref = module(*args)
    got = prog(*args)
    refs, gots = _leaves(ref), _leaves(got)
    assert len(refs) == len(gots)
    for g, r in zip(gots, refs):
        r = r.numpy()
        assert g.shape == r.shape, (g.shape, r.shape)
        if r.dtype.kind in "biu":
            np.testing.assert_array_equal(g, r)
        else:
            fin = np.isfinite(r)
            assert np.array_equal(g[~fin], r[~fin], equal_nan=True)  # nan and inf in place
            assert relative_error(g[fin].astype(np.float64), r[fin].astype(np.float64)) <= tol
    return gots


X = torch.from_numpy(_ties(5, 7))


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [0, -1])
def test_sort_and_argsort(dim, descending):
    _compare(lambda x: torch.sort(x, dim=dim, descending=descending, stable=True), X)
    _compare(lambda x: torch.argsort(x, dim=dim, descending=descending, stable=True), X)


def test_sort_of_unique_values_unstable_call():
    """torch.sort without stable=True: its order of ties is unspecified, so unique values."""
    x = torch.randperm(35).float().reshape(5, 7)
    _compare(lambda x: torch.sort(x, dim=1), x)


@pytest.mark.parametrize("largest", [True, False])
def test_topk(largest):
    x = torch.randn(4, 9)
    _compare(lambda x: torch.topk(x, 3, dim=-1, largest=largest), x)
    _compare(lambda x: torch.topk(x, 2, dim=0, largest=largest), x)


def test_kthvalue_and_cumprod():
    x = torch.randn(4, 9)
    _compare(lambda x: torch.kthvalue(x, 3, dim=1), x)
    _compare(lambda x: torch.kthvalue(x, 2, dim=0, keepdim=True), x)
    _compare(lambda x: torch.cumprod(x, dim=1), x, tol=1e-5)
    _compare(lambda x: torch.cumprod((x > 0).int(), dim=0), x)


def test_any_and_all():
    x = torch.from_numpy(np.round(_ties(4, 5)) * (np.arange(20).reshape(4, 5) % 3 != 0))
    _compare(lambda x: (torch.any(x), torch.all(x), torch.any(x, dim=1),
                        torch.all(x > -5, dim=0, keepdim=True), torch.any(x, dim=(0, 1))), x)


def test_scatter_src_value_and_add():
    x = torch.randn(4, 6)
    idx = torch.tensor([[0, 5, 2], [1, 1, 3], [4, 0, 0], [2, 3, 5]])
    unique = torch.tensor([[0, 5, 2], [1, 4, 3], [4, 0, 1], [2, 3, 5]])
    src = torch.randn(4, 5)
    _compare(lambda x, i, s: x.scatter(1, i, s), x, unique, src)
    _compare(lambda x, i: x.scatter(1, i, -2.5), x, unique)
    _compare(lambda x, i, s: x.scatter_add(1, i, s), x, idx, src)
    _compare(lambda x, i, s: torch.scatter(x, 0, i[:3], s[:3, :3]), x, unique[:3] % 4, src)
    _compare(lambda x, i, s: x.scatter(1, i, s, reduce="add"), x, idx, src)
    _compare(lambda x, i, s: x.scatter(1, i, s, reduce="multiply"), x, idx, src)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce, include_self):
    x = torch.randn(3, 5)
    idx = torch.tensor([[0, 0, 4], [2, 2, 2], [1, 3, 1]])
    src = torch.randn(3, 4)
    _compare(lambda x, i, s: x.scatter_reduce(1, i, s, reduce, include_self=include_self),
             x, idx, src, tol=1e-6)


def test_scatter_reduce_amax_propagates_nan():
    x = torch.tensor([1.0, 5.0, 2.0])
    src = torch.tensor([float("nan"), 3.0, 4.0])
    _compare(lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), x, torch.tensor([0, 0, 1]),
             src)


def test_index_put_accumulates_repeats():
    x = torch.randn(5, 4)
    rows = torch.tensor([0, 3, 0, -1])
    cols = torch.tensor([1, 1, 1, 2])
    vals = torch.randn(4)

    def put(x, r, c, v):
        y = x.clone()
        y.index_put_((r, c), v, accumulate=True)
        return y

    _compare(put, x, rows, cols, vals)
    _compare(lambda x, r, v: x.index_put((r,), v[:, None], accumulate=True), x, rows, vals)


def test_index_put_assigns_unique_places():
    x = torch.randn(3, 4, 5)
    rows = torch.tensor([[2], [0]])  # broadcast with cols: (2, 3) places
    cols = torch.tensor([3, 1, 0])

    def adjacent(x, r, c):  # index dims where dim 1 was
        y = x.clone()
        y[:, r, c] = 7.0
        return y

    def apart(x, r, c):  # non-adjacent advanced indices: index dims first
        y = x.clone()
        y[r, :, c] = torch.arange(4, dtype=y.dtype)
        return y

    def setitem(x, r):
        y = x.clone()
        y[r[:, 0]] = -1.0
        return y

    _compare(adjacent, x, rows % 4, cols)
    _compare(apart, x, rows % 3, cols)
    _compare(setitem, x, rows)


def test_masked_fill_by_index_put_with_a_bool_mask():
    x = torch.randn(4, 6)

    def put(x):
        y = x.clone()
        y[x > 0.5] = 0.0
        return y

    _compare(put, x)


def test_index_add_copy_fill_and_take_along_dim():
    x = torch.randn(6, 3)
    idx = torch.tensor([4, 0, 4, 2])
    unique = torch.tensor([4, 0, 5, 2])
    src = torch.randn(4, 3)
    _compare(lambda x, i, s: x.index_add(0, i, s, alpha=2.0), x, idx, src)
    _compare(lambda x, i, s: x.index_copy(0, i, s), x, unique, src)
    _compare(lambda x, i: x.index_fill(1, i[:2] % 3, -3.0), x, unique)
    _compare(lambda x, i: torch.take_along_dim(x, i, dim=0), x, torch.tensor([[5, 0, 1]]))
    _compare(lambda x, i: torch.gather(x, 1, i), x, torch.tensor([[2, 0], [1, 1]]))


def test_histc_counts_like_torch():
    x = torch.tensor([0.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 5.0, -1.0])
    _compare(lambda x: torch.histc(x, bins=4, min=0, max=3), x)
    _compare(lambda x: torch.histc(x, bins=5), x)


@pytest.mark.parametrize("fn,name", [(lambda x: torch.nonzero(x), "nonzero"),
                                     (lambda x: torch.masked_select(x, x > 0),
                                      "masked_select")])
def test_data_dependent_sizes_are_refused_by_name(fn, name):
    try:
        exported = torch.export.export(Fn(fn), (torch.randn(3, 4),))
    except Exception as e:  # noqa: BLE001 - torch may refuse before us; then nothing to do
        pytest.skip(f"torch.export refuses it itself: {type(e).__name__}")
    del exported
    with pytest.raises(UnsupportedOpError, match=f"{name}.*run time"):
        tg.from_torch(Fn(fn), (torch.randn(3, 4),), db=":memory:")


def test_mask_assignment_of_many_values_is_refused():
    def put(x, v):
        y = x.clone()
        y[x > 0] = v[: 3]
        return y

    x = torch.tensor([1.0, -1.0, 2.0, 3.0])
    with pytest.raises(UnsupportedOpError, match="mask"):
        tg.from_torch(Fn(put), (x, torch.randn(3)), db=":memory:")


def test_median_and_nanmedian_with_nans():
    """median: a nan makes the line's value nan and its index the first nan's; nanmedian
    takes the lower median of the numbers alone."""
    n = float("nan")
    x = torch.tensor([[1.0, n, 2.0, n, 0.5], [3.0, 1.0, 2.0, 5.0, 4.0], [n, 7.0, 1.0, 2.0, 9.0]])
    _compare(lambda x: (torch.median(x), torch.median(x, dim=1), torch.nanmedian(x),
                        torch.nanmedian(x, dim=1, keepdim=True)), x)
    y = torch.randn(4, 6)
    _compare(lambda y: torch.median(y, dim=0), y)


def test_take_and_take_along_dim_count_negative_indices_from_the_end():
    x = torch.arange(6.0).reshape(2, 3)
    _compare(lambda x, i: torch.take(x, i), x, torch.tensor([[-1, 0], [5, 2]]))
    _compare(lambda x, i: torch.take_along_dim(x, i, dim=1), x,
             torch.tensor([[-1, 0], [2, -3]]))


def test_mask_assignment_of_a_row_and_histc_of_nothing():
    x = torch.randn(5, 4)
    mask = torch.tensor([True, False, True, True, False])

    def put(x, m, row):
        y = x.clone()
        y[m] = row
        return y

    _compare(put, x, mask, torch.randn(4))
    _compare(lambda x, m, row: x.index_put((m,), row, accumulate=True), x, mask,
             torch.randn(1, 4))
    _compare(lambda x: (torch.histc(x[:0, 0], bins=3), x.sum()), x)


def test_searchsorted_bucketize_and_masked_scatter():
    seq = torch.tensor([1.0, 2.0, 2.0, 3.0])
    values = torch.tensor([[2.0, float("nan"), 0.0], [5.0, 1.0, 2.5]])
    _compare(lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True),
                           torch.bucketize(v, s, out_int32=True)), seq, values)
    rows = torch.sort(torch.randn(2, 6), dim=1).values
    _compare(lambda s, v: torch.searchsorted(s, v, side="right"), rows, torch.randn(2, 3))
    x = torch.zeros(2, 3)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    _compare(lambda x, m, src: x.masked_scatter(m, src), x, mask, torch.arange(10.0))
    _compare(lambda x, m, src: x.masked_scatter(m, src), x, mask[0], torch.arange(10.0))


def test_cummax_cummin_logcumsumexp_and_mode():
    n = float("nan")
    x = torch.tensor([[1.0, 3.0, 3.0, n, 2.0, n, 5.0], [4.0, 4.0, 1.0, 0.0, 1.0, 7.0, 7.0]])
    _compare(lambda x: (torch.cummax(x, 1), torch.cummin(x, 1), torch.cummax(x, 0)), x)
    _compare(lambda x: torch.logcumsumexp(x, 1), torch.randn(3, 5) * 30, tol=1e-6)
    ties = torch.tensor([[2, 1, 2, 1, 3], [5, 5, 4, 4, 4]])
    _compare(lambda x: (torch.mode(x, 1), torch.mode(x.float(), 0, keepdim=True)), ties)


def test_embedding_gradient_scatter_compiles_to_the_row_kernel():
    """The planner runs an embedding-gradient-shaped scatter-add (ids' rows into a table)
    with the C row kernel where the C backend is available, and the result is the float64
    reference's within float32 rounding."""
    v, d, n = 1000, 64, 300
    y = tg.scatter(tg.input("g", (v, d)), tg.input("ids", (n,), "int64"), tg.input("u", (n, d)))
    prog = tg.compile(y, db=":memory:")
    if tg.kernels.c.available():
        assert prog.plan.kernels == ["c_scatter_add_rows"]
    rng = np.random.default_rng(0)
    g = rng.standard_normal((v, d)).astype(np.float32)
    ids = rng.integers(0, v, n)
    ids[:50] = 3  # one row hit many times
    u = rng.standard_normal((n, d)).astype(np.float32)
    ref = g.astype(np.float64)
    np.add.at(ref, ids, u.astype(np.float64))
    assert relative_error(prog(g=g, ids=ids, u=u).astype(np.float64), ref) < 1e-6
