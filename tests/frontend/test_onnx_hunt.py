"""tg.from_onnx on exports of models users bring (transformers vision and audio models,
hand-written CNNs, float16 graphs), each against ONNX Runtime: every case here was found
by exporting such a model and reduced to the few nodes that went wrong."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed "
                                          "(pip install -e '.[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed "
                                                "(pip install -e '.[onnx]')")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tests.frontend.onnx_graphs import against_ort, init, model, vi  # noqa: E402

I64 = TensorProto.INT64
RNG = np.random.default_rng(0)


def const(name, values, dtype=None):
    return helper.make_node("Constant", [], [name],
                            value=numpy_helper.from_array(np.asarray(values, dtype=dtype)))


def test_a_reshape_to_a_root_of_constants_folds():
    """DINOv2 exported by the TorchScript exporter sizes its position grid as
    ``int(num_positions ** 0.5)``: Pow of two Constants -> Cast -> Concat -> Reshape. Pow
    was never folded, so the Reshape's shape was a run-time value and the model refused."""
    nodes = [
        const("n", np.float32(16.0)), const("half", np.float32(0.5)),
        helper.make_node("Pow", ["n", "half"], ["root"]),
        helper.make_node("Cast", ["root"], ["side"], to=I64),
        const("zero", [0], np.int64),
        helper.make_node("Unsqueeze", ["side", "zero"], ["side1"]),
        const("lead", [1, -1], np.int64),
        helper.make_node("Concat", ["lead", "side1", "side1"], ["shape"], axis=0),
        helper.make_node("Reshape", ["x", "shape"], ["y"]),
    ]
    m = model(nodes, [vi("x", [2, 16, 3])], [vi("y", [1, None, 4, 4])])
    against_ort(m, [{"x": RNG.standard_normal((2, 16, 3)).astype(np.float32)}])


@pytest.mark.parametrize("attrs", [{}, {"pads": [1, 1, 1, 1]}, {"auto_pad": "SAME_LOWER"}])
def test_a_conv_transpose_cut_to_its_output_shape_matches_onnxruntime(attrs):
    """A ConvTranspose whose output_shape is shorter than its full output (what converters
    write instead of pads) is cut at both ends, the larger half at the start, as ONNX's spec
    and ONNX Runtime cut it: it was cut at the end only (every pixel shifted by one), and
    an explicit pads attribute, which output_shape overrides, was applied as well."""
    w = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], strides=[2, 2],
                            output_shape=[8, 10], **attrs)
    m = model([node], [vi("x", [1, 4, 5, 5])], [vi("y", [1, 3, 8, 10])],
              inits=[init("w", w), init("b", RNG.standard_normal(3), np.float32)])
    against_ort(m, [{"x": RNG.standard_normal((1, 4, 5, 5)).astype(np.float32)}])


@pytest.mark.parametrize("dtype, axes", [(TensorProto.INT32, [1]), (I64, None)],
                         ids=["int32-one-axis", "int64-every-axis"])
def test_an_int_reduce_mean_keeps_its_dtype_and_truncates(dtype, axes):
    """ReduceMean of ints is of their dtype, truncated toward zero as ONNX Runtime divides
    (a mean of token counts or positions): it came out as floats, so the declared int
    output (and any int op after it) got float32."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    attrs = {"axes": axes} if axes else {}
    node = helper.make_node("ReduceMean", ["x"], ["y"], keepdims=0, **attrs)
    m = model([node], [vi("x", ["n", 4], dtype)], [vi("y", None, dtype)], opset=13,
              check=False)
    feeds = [{"x": RNG.integers(-9, 9, (n, 4)).astype(np_dtype)} for n in (3, 5)]
    against_ort(m, feeds)


def test_a_squeeze_without_axes_refuses_a_call_where_its_symbolic_dim_is_one():
    """Squeeze with no axes squeezes every dim of size 1, so over a symbolic batch the
    output's rank depends on the call: imported as not 1, a batch of 1 came back (1, 3, 4)
    where ONNX Runtime gives (3, 4). Larger batches match; a batch of 1 is refused, naming
    the node and the fix."""
    m = model([helper.make_node("Squeeze", ["x"], ["y"], name="sq")],
              [vi("x", ["batch", 1, 3, 4])], [vi("y", ["batch", 3, 4])])
    against_ort(m, [{"x": RNG.standard_normal((b, 1, 3, 4)).astype(np.float32)}
                    for b in (2, 5)], {"batch": 8})
    prog = tg.from_onnx(m, {"batch": 8})
    with pytest.raises(tg.ShapeError,
                       match=r"'x' has batch=1, which Squeeze node 'sq'.*batch >= 2"):
        prog(x=np.zeros((1, 1, 3, 4), np.float32))
