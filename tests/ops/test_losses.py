"""Loss composites against torch.nn.functional: float64 evaluation to 1e-9 and float32
evaluation to ~1e-5 (norm-wise relative error), every reduction, fully atomic decompositions,
symbolic batch dims and bad inputs."""

import warnings

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error as rel_err

torch = pytest.importorskip("torch")
F = torch.nn.functional

REDUCTIONS = ["none", "mean", "sum"]




def t(a):
    return torch.from_numpy(np.array(a))  # a copy; 0-d stays 0-d


def check(y, feeds: dict, torch_fn, tol32: float = 1e-5):
    """y in float64 vs torch float64 (1e-9) and in float32 vs torch float32 (tol32)."""
    got64 = tg.evaluate(y, feeds, dtype="float64")
    ref64 = torch_fn(**{k: t(v) for k, v in feeds.items()}).numpy()
    assert np.isfinite(ref64).all()
    assert rel_err(got64, ref64) <= 1e-9
    feeds32 = {k: v.astype(np.float32) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    got32 = tg.evaluate(y, feeds32)
    assert got32.dtype == np.float32
    ref32 = torch_fn(**{k: t(v) for k, v in feeds32.items()}).numpy()
    assert rel_err(got32, ref32) <= tol32
    assert_atomic(y)
    return got64


def assert_atomic(y):
    bad = {n.op.name for n in tg.nodes(tg.decompose(y)) if not n.op.is_atomic}
    assert not bad, f"decomposition still holds composites {bad}"


def randn(rng, shape, scale=1.0):
    return rng.standard_normal(shape) * scale


# ---------------------------------------------------------------------------- mse / l1
PAIR_SHAPES = [((1,), (1,)), ((7,), (7,)), ((3, 33), (3, 33)), ((2, 7, 5), (7, 1)), ((), ())]


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
@pytest.mark.parametrize("ishape,tshape", PAIR_SHAPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_pointwise_losses(name, ishape, tshape, reduction):
    rng = np.random.default_rng(0)
    y = getattr(tg, name)(tg.input("input", ishape), tg.input("target", tshape),
                          reduction=reduction)
    feeds = {"input": randn(rng, ishape), "target": randn(rng, tshape)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about broadcasting
        check(y, feeds, lambda input, target: getattr(F, name)(input, target,
                                                               reduction=reduction))


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_pointwise_losses_weighted(name, reduction):
    rng = np.random.default_rng(1)
    y = getattr(tg, name)(tg.input("input", (4, 7)), tg.input("target", (4, 7)),
                          weight=tg.weight("weight", (4, 7)), reduction=reduction)
    feeds = {"input": randn(rng, (4, 7)), "target": randn(rng, (4, 7)),
             "weight": rng.random((4, 7))}
    check(y, feeds, lambda **kw: getattr(F, name)(**kw, reduction=reduction))


@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
def test_pointwise_losses_large_and_symbolic(name):
    rng = np.random.default_rng(2)
    y = getattr(tg, name)(tg.input("input", ("batch", 33)), tg.input("target", ("batch", 33)))
    for batch in (1, 7):
        feeds = {"input": randn(rng, (batch, 33), 1e15), "target": randn(rng, (batch, 33), 1e15)}
        got = check(y, feeds, lambda input, target: getattr(F, name)(input, target))
        assert np.isfinite(got)


def test_pointwise_losses_bad_input():
    x = tg.input("x", (3, 4))
    with pytest.raises(tg.TensorGraphsError, match="mse_loss: reduction must be one of"):
        tg.mse_loss(x, x, reduction="avg")
    with pytest.raises(tg.ShapeError, match="l1_loss: weight"):
        tg.l1_loss(x, x, weight=tg.weight("w", (4,)))
    with pytest.raises(tg.ShapeError, match="do not broadcast"):
        tg.mse_loss(x, tg.input("y", (3, 5)))


# ---------------------------------------------------------------------------- cross entropy
def _class_case(rng, ishape, ignore_index=-100, ignore_frac=0.0):
    axis = 1 if len(ishape) >= 2 else 0
    c = ishape[axis]
    tshape = ishape[:axis] + ishape[axis + 1:]
    target = rng.integers(0, c, tshape)
    if ignore_frac:
        target = np.where(rng.random(tshape) < ignore_frac, ignore_index, target)
    return np.asarray(target, np.int64), tshape


CLASS_SHAPES = [(1, 1), (7, 3), (5, 33), (2, 7, 4), (3, 5, 2, 3), (7,), (1, 7)]


@pytest.mark.parametrize("ishape", CLASS_SHAPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
def test_cross_entropy(ishape, reduction, label_smoothing):
    rng = np.random.default_rng(3)
    target, tshape = _class_case(rng, ishape)
    y = tg.cross_entropy(tg.input("input", ishape), tg.input("target", tshape, "int64"),
                         reduction=reduction, label_smoothing=label_smoothing)
    feeds = {"input": randn(rng, ishape, 2.0), "target": target}
    check(y, feeds, lambda **kw: F.cross_entropy(**kw, reduction=reduction,
                                                 label_smoothing=label_smoothing))


@pytest.mark.parametrize("ignore_index", [-100, 2])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_ignore_index_and_weight(ignore_index, reduction, label_smoothing,
                                               weighted):
    rng = np.random.default_rng(4)
    ishape = (9, 5, 3)
    target, tshape = _class_case(rng, ishape, ignore_index, ignore_frac=0.3)
    feeds = {"input": randn(rng, ishape), "target": target}
    weight = None
    if weighted:
        weight = tg.weight("weight", (5,))
        feeds["weight"] = rng.random(5) + 0.1
    y = tg.cross_entropy(tg.input("input", ishape), tg.input("target", tshape, "int64"), weight,
                         reduction=reduction, ignore_index=ignore_index,
                         label_smoothing=label_smoothing)
    check(y, feeds, lambda **kw: F.cross_entropy(**kw, reduction=reduction,
                                                 ignore_index=ignore_index,
                                                 label_smoothing=label_smoothing))


@pytest.mark.parametrize("ishape", [(7, 3), (2, 5, 4), (5,)])
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("label_smoothing", [0.0, 0.3])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_probability_targets(ishape, reduction, label_smoothing, weighted):
    rng = np.random.default_rng(5)
    axis = 1 if len(ishape) >= 2 else 0
    probs = rng.random(ishape)
    probs /= probs.sum(axis=axis, keepdims=True)
    feeds = {"input": randn(rng, ishape), "target": probs}
    weight = None
    if weighted:
        weight = tg.weight("weight", (ishape[axis],))
        feeds["weight"] = rng.random(ishape[axis]) + 0.1
    y = tg.cross_entropy(tg.input("input", ishape), tg.input("target", ishape), weight,
                         reduction=reduction, label_smoothing=label_smoothing)
    check(y, feeds, lambda **kw: F.cross_entropy(**kw, reduction=reduction,
                                                 label_smoothing=label_smoothing))


def test_cross_entropy_large_logits():
    rng = np.random.default_rng(6)
    target, _ = _class_case(rng, (7, 33))
    y = tg.cross_entropy(tg.input("input", (7, 33)), tg.input("target", (7,), "int64"),
                         reduction="none", label_smoothing=0.1)
    feeds = {"input": randn(rng, (7, 33), 1e4), "target": target}
    got = check(y, feeds, lambda **kw: F.cross_entropy(**kw, reduction="none",
                                                       label_smoothing=0.1))
    assert np.isfinite(got).all()
    # a -inf logit of another class must not turn the picked term into nan
    logits = np.zeros((2, 3))
    logits[:, 2] = -np.inf
    got = tg.evaluate(tg.cross_entropy(tg.input("input", (2, 3)),
                                       tg.input("target", (2,), "int64")),
                      {"input": logits, "target": np.array([0, 1])})
    assert np.isclose(got, np.log(2.0))


def test_cross_entropy_symbolic_batch():
    rng = np.random.default_rng(7)
    y = tg.cross_entropy(tg.input("input", ("batch", 5, "seq")),
                         tg.input("target", ("batch", "seq"), "int64"), label_smoothing=0.1)
    assert_atomic(y)
    for batch, seq in ((1, 1), (3, 7)):
        target, _ = _class_case(rng, (batch, 5, seq), ignore_frac=0.2)
        feeds = {"input": randn(rng, (batch, 5, seq)), "target": target}
        got = tg.evaluate(y, feeds, dtype="float64")
        ref = F.cross_entropy(t(feeds["input"]), t(target), label_smoothing=0.1).numpy()
        assert rel_err(got, ref) <= 1e-9


def test_cross_entropy_all_ignored_mean_is_nan_like_torch():
    y = tg.cross_entropy(tg.input("input", (2, 3)), tg.input("target", (2,), "int64"))
    feeds = {"input": np.zeros((2, 3)), "target": np.array([-100, -100])}
    got = tg.evaluate(y, feeds, dtype="float64")
    ref = F.cross_entropy(t(feeds["input"]), t(feeds["target"])).numpy()
    assert np.isnan(got) and np.isnan(ref)


def test_cross_entropy_bad_input():
    x = tg.input("x", (4, 5))
    labels = tg.input("labels", (4,), "int64")
    with pytest.raises(tg.ShapeError, match="cross_entropy: class-index targets must have shape"):
        tg.cross_entropy(x, tg.input("bad", (5,), "int64"))
    with pytest.raises(tg.ShapeError, match="probability targets"):
        tg.cross_entropy(x, tg.input("p", (4, 3)))
    with pytest.raises(tg.DTypeError, match="bool"):
        tg.cross_entropy(x, tg.input("b", (4,), "bool"))
    with pytest.raises(tg.ShapeError, match="one entry per class"):
        tg.cross_entropy(x, labels, tg.weight("w", (4,)))
    with pytest.raises(tg.TensorGraphsError, match="label_smoothing"):
        tg.cross_entropy(x, labels, label_smoothing=1.5)
    with pytest.raises(tg.TensorGraphsError, match="reduction must be one of"):
        tg.cross_entropy(x, labels, reduction="batchmean")
    with pytest.raises(tg.TensorGraphsError, match="ignore_index must be an int"):
        tg.cross_entropy(x, labels, ignore_index=0.5)
    with pytest.raises(tg.ShapeError, match="0-d"):
        tg.cross_entropy(tg.input("s", ()), tg.input("st", (), "int64"))


# ---------------------------------------------------------------------------- nll
# ignore_index=0 with a single class would ignore every target (tested on its own above)
NLL_CASES = [(s, i) for s in [(1, 1), (5, 33), (2, 7, 4), (7,)] for i in (-100, 0)
             if not (s[1 if len(s) > 1 else 0] == 1 and i == 0)]


@pytest.mark.parametrize("ishape,ignore_index", NLL_CASES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_nll_loss(ishape, ignore_index, reduction, weighted):
    rng = np.random.default_rng(8)
    axis = 1 if len(ishape) >= 2 else 0
    target, tshape = _class_case(rng, ishape, ignore_index, ignore_frac=0.2)
    if ishape[0] == 1 or len(ishape) == 1:
        target = np.where(target == ignore_index, 1 if ignore_index == 0 else 0, target)
        target = np.minimum(target, ishape[axis] - 1)  # keep some target counted
    logp = torch.log_softmax(t(randn(rng, ishape)), axis).numpy()
    feeds = {"input": logp, "target": target}
    weight = None
    if weighted:
        weight = tg.weight("weight", (ishape[axis],))
        feeds["weight"] = rng.random(ishape[axis]) + 0.1
    y = tg.nll_loss(tg.input("input", ishape), tg.input("target", tshape, "int64"), weight,
                    reduction=reduction, ignore_index=ignore_index)
    check(y, feeds, lambda **kw: F.nll_loss(**kw, reduction=reduction,
                                            ignore_index=ignore_index))


def test_nll_loss_int32_target_symbolic():
    rng = np.random.default_rng(9)
    y = tg.nll_loss(tg.input("input", ("batch", 7)), tg.input("target", ("batch",), "int32"))
    for batch in (1, 33):
        feeds = {"input": randn(rng, (batch, 7)),
                 "target": rng.integers(0, 7, batch).astype(np.int32)}
        got = tg.evaluate(y, feeds, dtype="float64")
        ref = F.nll_loss(t(feeds["input"]), t(feeds["target"]).long()).numpy()
        assert rel_err(got, ref) <= 1e-9


def test_nll_loss_bad_input():
    x = tg.input("x", (4, 5))
    with pytest.raises(tg.DTypeError, match="nll_loss: target must hold integer"):
        tg.nll_loss(x, tg.input("f", (4,)))
    with pytest.raises(tg.ShapeError, match="class-index targets"):
        tg.nll_loss(x, tg.input("t", (5,), "int64"))
    with pytest.raises(tg.TensorGraphsError, match="reduction"):
        tg.nll_loss(x, tg.input("t2", (4,), "int64"), reduction="max")


# ---------------------------------------------------------------------------- kl_div
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (2, 7, 5)])
@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(shape, reduction, log_target):
    rng = np.random.default_rng(10)
    logits_in, logits_tg = randn(rng, shape), randn(rng, shape)
    input_ = torch.log_softmax(t(logits_in), -1).numpy()
    target = torch.log_softmax(t(logits_tg), -1).numpy()
    if not log_target:
        target = np.exp(target)
        target.flat[0] = 0.0  # 0 * log(0) counts as 0
    y = tg.kl_div(tg.input("input", shape), tg.input("target", shape), reduction=reduction,
                  log_target=log_target)
    feeds = {"input": input_, "target": target}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # torch warns about reduction="mean"
        check(y, feeds, lambda **kw: F.kl_div(**kw, reduction=reduction, log_target=log_target))


def test_kl_div_symbolic_batchmean():
    rng = np.random.default_rng(11)
    y = tg.kl_div(tg.input("input", ("batch", 7)), tg.input("target", ("batch", 7)),
                  reduction="batchmean")
    assert_atomic(y)
    for batch in (1, 5):
        inp = torch.log_softmax(t(randn(rng, (batch, 7))), -1).numpy()
        tgt = torch.softmax(t(randn(rng, (batch, 7))), -1).numpy()
        got = tg.evaluate(y, {"input": inp, "target": tgt}, dtype="float64")
        ref = F.kl_div(t(inp), t(tgt), reduction="batchmean").numpy()
        assert rel_err(got, ref) <= 1e-9


def test_kl_div_bad_input():
    x = tg.input("x", (3, 4))
    with pytest.raises(tg.TensorGraphsError, match="kl_div: reduction must be one of"):
        tg.kl_div(x, x, reduction="average")
    with pytest.raises(tg.ShapeError):
        tg.kl_div(x, tg.input("y", (3, 5)))
