"""tg.from_onnx on op forms users' models hold that the importer refused: MaxPool,
AveragePool and LpPool over 3-D windows (pads, strides, dilations, ceil_mode,
count_include_pad, MaxPool's Indices), dilated AveragePool and LpPool and LpPool's
ceil_mode in 1-D and 2-D, LSTM with peephole weights, BatchNormalization with
training_mode=1. Each a tiny graph against ONNX Runtime on random inputs, the batch
symbolic where the op allows it."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed "
                                          "(pip install -e '.[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed "
                                                "(pip install -e '.[onnx]')")

from onnx import TensorProto, helper  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tensor_graphs.frontend.onnx_import import UnsupportedOpError  # noqa: E402
from tests.frontend.onnx_graphs import against_ort, vi  # noqa: E402
from tests.frontend.onnx_graphs import model as checked_model  # noqa: E402

I64 = TensorProto.INT64
RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs, **kw):
    """A model whose outputs' shapes are left to ONNX Runtime (onnx's checker wants them)."""
    return checked_model(nodes, inputs, outputs, check=False, **kw)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def pooled(op, shape, attrs, outputs=("y",)):
    """A one-``op`` model over x of ``shape`` with its batch symbolic, checked against ONNX
    Runtime at two batch sizes."""
    node = helper.make_node(op, ["x"], list(outputs), **attrs)
    outs = [vi(o, None, I64 if o == "i" else TensorProto.FLOAT) for o in outputs]
    m = model([node], [vi("x", ["n", *shape[1:]])], outs, opset=22)
    against_ort(m, [{"x": rand(n, *shape[1:])} for n in (shape[0], 3)], {"n": 4})


# --- 3-D windows --------------------------------------------------------------------------

WINDOWS_3D = {
    "default": {"kernel_shape": [2, 2, 2]},
    "pads-strides": {"kernel_shape": [3, 2, 2], "pads": [1, 0, 1, 1, 1, 0],
                     "strides": [2, 1, 2]},
    "dilated-ceil": {"kernel_shape": [2, 3, 2], "dilations": [2, 1, 2], "strides": [2, 2, 1],
                     "ceil_mode": 1},
    "uneven-pads-ceil": {"kernel_shape": [2, 2, 3], "pads": [0, 1, 2, 1, 0, 1],
                         "strides": [2, 2, 2], "ceil_mode": 1},
    "same-upper": {"kernel_shape": [3, 3, 2], "strides": [2, 1, 2], "auto_pad": "SAME_UPPER"},
}


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
@pytest.mark.parametrize("window", list(WINDOWS_3D))
def test_3d_pools_match_onnxruntime(op, window):
    """A 3-D window (video and volumetric models) was refused: the max is 2-D pools of the
    depth slices each window offset meets, and their maximum; the sums of AveragePool and
    LpPool a convolution with a kernel of ones, divided by the elements counted."""
    attrs = dict(WINDOWS_3D[window])
    if op == "LpPool":
        attrs["p"] = 3
    pooled(op, (2, 2, 5, 6, 7), attrs)


@pytest.mark.parametrize("window", ["pads-strides", "dilated-ceil", "uneven-pads-ceil"])
def test_3d_average_pool_counting_pads_matches_onnxruntime(window):
    """count_include_pad=1 counts the declared pads in each window's divisor, never the
    cells ceil_mode adds past them."""
    pooled("AveragePool", (2, 2, 5, 6, 7), {**WINDOWS_3D[window], "count_include_pad": 1})


@pytest.mark.parametrize("order", [0, 1], ids=["row-major", "column-major"])
@pytest.mark.parametrize("window", ["default", "pads-strides", "dilated-ceil"])
def test_3d_max_pool_indices_match_onnxruntime(window, order):
    """MaxPool's Indices in 3-D: the first maximum in window order, as a flat index into the
    whole input in either storage order."""
    pooled("MaxPool", (2, 2, 5, 6, 7), {**WINDOWS_3D[window], "storage_order": order},
           outputs=("y", "i"))


# --- dilations and ceil_mode in 1-D and 2-D -------------------------------------------------

WINDOWS_DILATED = {
    "2d": ((2, 3, 7, 8), {"kernel_shape": [2, 3], "dilations": [2, 2]}),
    "2d-pads-ceil": ((2, 3, 7, 8), {"kernel_shape": [3, 2], "dilations": [2, 3],
                                    "strides": [2, 2], "pads": [1, 1, 2, 0], "ceil_mode": 1}),
    "1d": ((2, 3, 9), {"kernel_shape": [3], "dilations": [2], "strides": [2],
                       "pads": [1, 2], "ceil_mode": 1}),
}


@pytest.mark.parametrize("counted", [0, 1], ids=["pads-not-counted", "pads-counted"])
@pytest.mark.parametrize("case", list(WINDOWS_DILATED))
def test_dilated_average_pool_matches_onnxruntime(case, counted):
    """Dilations in AveragePool (opset 19) were refused: a dilated convolution with ones."""
    shape, attrs = WINDOWS_DILATED[case]
    pooled("AveragePool", shape, {**attrs, "count_include_pad": counted})


@pytest.mark.parametrize("case", list(WINDOWS_DILATED))
def test_dilated_lp_pool_matches_onnxruntime(case):
    """Dilations and ceil_mode in LpPool (opset 18) were refused."""
    shape, attrs = WINDOWS_DILATED[case]
    pooled("LpPool", shape, {**attrs, "p": 2})


def test_lp_pool_ceil_mode_matches_onnxruntime():
    """LpPool's ceil_mode alone: the last partial window summed over what it covers."""
    pooled("LpPool", (2, 3, 7, 8), {"kernel_shape": [2, 3], "strides": [2, 2], "ceil_mode": 1,
                                    "p": 1})


def test_3d_pool_over_a_symbolic_depth_is_refused_naming_the_node():
    """The depth of a 3-D window is unrolled at import: a symbolic one stays refused."""
    node = helper.make_node("MaxPool", ["x"], ["y"], name="pool3", kernel_shape=[2, 2, 2])
    m = model([node], [vi("x", [1, 2, "d", 4, 4])], [vi("y", None)], opset=22)
    with pytest.raises(UnsupportedOpError, match=r"MaxPool node 'pool3'.*symbolic depth"):
        tg.from_onnx(m)


# --- LSTM peepholes -----------------------------------------------------------------------

@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_lstm_with_peepholes_matches_onnxruntime(direction):
    """Peephole weights P (the cell state feeding the input, forget and output gates) were
    refused: the recurrence is unrolled here with them."""
    seq, batch, size, hidden = 4, 2, 3, 5
    dirs = 2 if direction == "bidirectional" else 1
    weights = {"W": (dirs, 4 * hidden, size), "R": (dirs, 4 * hidden, hidden),
               "B": (dirs, 8 * hidden), "h0": (dirs, batch, hidden),
               "c0": (dirs, batch, hidden), "P": (dirs, 3 * hidden)}
    node = helper.make_node("LSTM", ["x", "W", "R", "B", "", "h0", "c0", "P"],
                            ["y", "y_h", "y_c"], hidden_size=hidden, direction=direction)
    inputs = [vi("x", [seq, batch, size])] + [vi(k, list(s)) for k, s in weights.items()]
    m = model([node], inputs, [vi("y", None), vi("y_h", None), vi("y_c", None)], opset=22)
    feeds = {"x": rand(seq, batch, size), **{k: rand(*s) for k, s in weights.items()}}
    against_ort(m, [feeds])


def test_lstm_with_peepholes_over_a_symbolic_sequence_matches_onnxruntime():
    """A dynamic sequence axis unrolls to dynamic_dims' bound, as without peepholes."""
    batch, size, hidden = 2, 3, 4
    node = helper.make_node("LSTM", ["x", "W", "R", "", "", "", "", "P"], ["y", "y_h", "y_c"],
                            hidden_size=hidden)
    shapes = {"W": (1, 4 * hidden, size), "R": (1, 4 * hidden, hidden), "P": (1, 3 * hidden)}
    inputs = [vi("x", ["seq", batch, size])] + [vi(k, list(s)) for k, s in shapes.items()]
    m = model([node], inputs, [vi("y", None), vi("y_h", None), vi("y_c", None)], opset=22)
    weights = {k: rand(*s) for k, s in shapes.items()}
    against_ort(m, [{"x": rand(n, batch, size), **weights} for n in (3, 5)], {"seq": 5})


# --- BatchNormalization training_mode -----------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 3, 5, 2), (4, 3, 6)], ids=["4d", "3d"])
def test_batch_norm_training_mode_matches_onnxruntime(shape):
    """training_mode=1 (a training graph's export) was refused: Y normalized by the batch's
    own mean and population variance, and the running statistics moved toward them by
    1 - momentum."""
    ch = shape[1]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], training_mode=1, momentum=0.8, epsilon=1e-3)
    stats = {k: vi(k, [ch]) for k in "sbmv"}
    m = model([node], [vi("x", ["n", *shape[1:]]), *stats.values()],
              [vi("y", None), vi("rm", None), vi("rv", None)], opset=15)
    feeds = []
    for n in (shape[0], 2):
        x = (rand(n, *shape[1:]) * 2 + 1).astype(np.float32)
        feeds.append({"x": x, "s": rand(ch), "b": rand(ch), "m": rand(ch),
                      "v": np.abs(rand(ch)) + 0.5})
    against_ort(m, feeds, {"n": 8})


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_2d_pools_with_uneven_pads_and_ceil_mode_match_onnxruntime(op):
    """Pads torch's pooling does not take (uneven) under ceil_mode=1: AveragePool refused
    them, MaxPool counted its windows by torch's rule over the padded plane, one more than
    ONNX's where a window would start in the end pad only."""
    pooled(op, (2, 3, 5, 6), {"kernel_shape": [3, 3], "strides": [3, 3], "pads": [0, 1, 2, 0],
                              "ceil_mode": 1})


def test_batch_norm_training_mode_in_float16_matches_onnxruntime():
    """A float16 input: the statistics in float32 (ONNX's rule), Y in float16, the running
    statistics in their own dtype (float32 here)."""
    f16 = TensorProto.FLOAT16
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"],
                            ["y", "rm", "rv"], training_mode=1)
    m = model([node], [vi("x", ["n", 3, 5], f16), *[vi(k, [3]) for k in "sbmv"]],
              [vi("y", None, f16), vi("rm", None), vi("rv", None)], opset=15)
    stats = {k: (np.abs(rand(3)) + 0.5).astype(np.float32) for k in "sbmv"}
    against_ort(m, [{"x": rand(n, 3, 5).astype(np.float16), **stats} for n in (4, 2)],
                {"n": 8}, tol=1e-3)
