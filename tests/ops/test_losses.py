"""Loss composites against the op table (tests/ops/optable.py): float64 evaluation to 1e-9 and
float32 evaluation to ~1e-5 (norm-wise relative error) against an independent numpy oracle,
every reduction, the same against torch.nn.functional in a separate test that skips alone
without torch; fully atomic decompositions, symbolic batch dims and bad inputs."""

import numpy as np
import pytest

import tensor_graphs as tg
from tests.ops import optable as ot

CROSS_ENTROPY = ot.BY_NAME["cross_entropy"].oracle
NLL_LOSS = ot.BY_NAME["nll_loss"].oracle
KL_DIV = ot.BY_NAME["kl_div"].oracle


@pytest.mark.parametrize("row,dtype", ot.params("losses"))
def test_matches_oracle(row, dtype):
    ot.check_oracle(row, dtype)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch warns on broadcasting, kl_div mean
@pytest.mark.parametrize("row,dtype", ot.params("losses", torch=True))
def test_matches_torch(row, dtype):
    torch = pytest.importorskip("torch")
    ot.check_torch(row, dtype, torch)


def randn(rng, shape, scale=1.0):
    return rng.standard_normal(shape) * scale


# ---------------------------------------------------------------------------- mse / l1
@pytest.mark.parametrize("name", ["mse_loss", "l1_loss"])
def test_pointwise_losses_large_and_symbolic(name):
    rng = np.random.default_rng(2)
    y = getattr(tg, name)(tg.input("input", ("batch", 33)), tg.input("target", ("batch", 33)))
    for batch in (1, 7):
        feeds = {"input": randn(rng, (batch, 33), 1e15), "target": randn(rng, (batch, 33), 1e15)}
        ref = ot.BY_NAME[name].oracle(feeds["input"], feeds["target"])
        assert np.isfinite(ref)
        ot.check_graph(y, feeds, ref)


def test_pointwise_losses_bad_input():
    x = tg.input("x", (3, 4))
    with pytest.raises(tg.TensorGraphsError, match="mse_loss: reduction must be one of"):
        tg.mse_loss(x, x, reduction="avg")
    with pytest.raises(tg.ShapeError, match="l1_loss: weight"):
        tg.l1_loss(x, x, weight=tg.weight("w", (4,)))
    with pytest.raises(tg.ShapeError, match="do not broadcast"):
        tg.mse_loss(x, tg.input("y", (3, 5)))


# ---------------------------------------------------------------------------- cross entropy
def test_cross_entropy_minus_inf_logit_of_another_class():
    """A -inf logit of another class must not turn the picked term into nan."""
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
    for batch, seq in ((1, 1), (3, 7)):
        spec = ot.S((batch, 5, seq), (batch, seq), ignore_index=-100)
        target = ot.classes(0.2)(rng, (batch, seq), "int64", spec)
        feeds = {"input": randn(rng, (batch, 5, seq)), "target": target}
        ot.check_graph(y, feeds, CROSS_ENTROPY(feeds["input"], target, label_smoothing=0.1))


def test_cross_entropy_all_ignored_mean_is_nan():
    y = tg.cross_entropy(tg.input("input", (2, 3)), tg.input("target", (2,), "int64"))
    feeds = {"input": np.zeros((2, 3)), "target": np.array([-100, -100])}
    with np.errstate(invalid="ignore"):  # the oracle's 0 / 0
        assert np.isnan(CROSS_ENTROPY(feeds["input"], feeds["target"]))
    assert np.isnan(tg.evaluate(y, feeds, dtype="float64"))


def test_cross_entropy_all_ignored_mean_is_nan_in_torch():
    torch = pytest.importorskip("torch")
    ref = torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([-100, -100]))
    assert torch.isnan(ref)


@pytest.mark.parametrize("op", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("bad", [5, 7, -1])
@pytest.mark.parametrize("generate", [True, False])
def test_a_class_index_outside_the_classes_is_refused_as_torch_refuses_it(op, bad, generate):
    """torch raises "Target 7 is out of bounds"; such a target picked no class here and
    counted 0 toward the loss, in the reference and every plan alike."""
    y = getattr(tg, op)(tg.input("x", (4, 5, 3)), tg.input("t", (4, 3), "int64"))
    prog = tg.compile(y, db=":memory:", generate=generate)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 5, 3)).astype(np.float32)
    good = rng.integers(0, 5, (4, 3))
    good[1, 2] = -100  # ignore_index stays allowed
    want = {"cross_entropy": CROSS_ENTROPY, "nll_loss": NLL_LOSS}[op](x.astype(np.float64), good)
    assert np.isclose(prog(x=x, t=good), want, rtol=1e-5)
    wrong = good.copy()
    wrong[2, 1] = bad
    with pytest.raises(tg.EvaluationError, match=rf"index {bad} is out of range for axis 0 of "
                                                 r"size 5"):
        prog(x=x, t=wrong)
    with pytest.raises(tg.EvaluationError, match=rf"index {bad} is out of range"):
        tg.evaluate(y, {"x": x, "t": wrong})


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
def test_nll_loss_int32_target_symbolic():
    rng = np.random.default_rng(9)
    y = tg.nll_loss(tg.input("input", ("batch", 7)), tg.input("target", ("batch",), "int32"))
    for batch in (1, 33):
        feeds = {"input": randn(rng, (batch, 7)),
                 "target": rng.integers(0, 7, batch).astype(np.int32)}
        ot.check_graph(y, feeds, NLL_LOSS(feeds["input"], feeds["target"]))


def test_nll_loss_bad_input():
    x = tg.input("x", (4, 5))
    with pytest.raises(tg.DTypeError, match="nll_loss: target must hold integer"):
        tg.nll_loss(x, tg.input("f", (4,)))
    with pytest.raises(tg.ShapeError, match="class-index targets"):
        tg.nll_loss(x, tg.input("t", (5,), "int64"))
    with pytest.raises(tg.TensorGraphsError, match="reduction"):
        tg.nll_loss(x, tg.input("t2", (4,), "int64"), reduction="max")


# ---------------------------------------------------------------------------- kl_div
def test_kl_div_symbolic_batchmean():
    rng = np.random.default_rng(11)
    y = tg.kl_div(tg.input("input", ("batch", 7)), tg.input("target", ("batch", 7)),
                  reduction="batchmean")
    for batch in (1, 5):
        inp = ot.log_softmax(randn(rng, (batch, 7)), -1)
        tgt = np.exp(ot.log_softmax(randn(rng, (batch, 7)), -1))
        ot.check_graph(y, {"input": inp, "target": tgt},
                       KL_DIV(inp, tgt, reduction="batchmean"))


def test_kl_div_bad_input():
    x = tg.input("x", (3, 4))
    with pytest.raises(tg.TensorGraphsError, match="kl_div: reduction must be one of"):
        tg.kl_div(x, x, reduction="average")
    with pytest.raises(tg.ShapeError):
        tg.kl_div(x, tg.input("y", (3, 5)))
