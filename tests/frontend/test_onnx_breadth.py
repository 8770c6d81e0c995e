"""tg.from_onnx on ONNX operators users' models hold that the importer refused: Einsum,
Pad's reflect, edge and wrap modes, 3-D (and 1-D) ConvTranspose, the deprecated Upsample,
MaxPool's Indices output and GatherND with batch_dims, each a tiny graph against ONNX
Runtime on random inputs, a symbolic dim where the op allows one."""

from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed "
                                          "(pip install -e '.[onnx]')")
ort = pytest.importorskip("onnxruntime", reason="the onnx extra is not installed "
                                                "(pip install -e '.[onnx]')")

from onnx import TensorProto, helper  # noqa: E402

import tensor_graphs as tg  # noqa: E402
from tests.frontend.onnx_graphs import against_ort, init, vi  # noqa: E402
from tests.frontend.onnx_graphs import model as checked_model  # noqa: E402

I64 = TensorProto.INT64
RNG = np.random.default_rng(0)


def model(nodes, inputs, outputs, **kw):
    """A model whose outputs' shapes are left to ONNX Runtime (onnx's checker wants them);
    ONNX Runtime's session checks the rest."""
    return checked_model(nodes, inputs, outputs, check=False, **kw)


def rand(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# --- Einsum -------------------------------------------------------------------------------

# (equation, operand shapes); a str dim is symbolic, fed at the sizes in SIZES
EINSUM_CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("bij,bjk->bik", [("n", 3, 4), ("n", 4, 2)]),
    ("bhid,bhjd->bhij", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ii->i", [(4, 4)]),
    ("ii", [(4, 4)]),
    ("bii->b", [("n", 3, 3)]),
    ("ij->", [(3, 4)]),
    ("ij->i", [("n", 4)]),
    ("i,j->ij", [(3,), (4,)]),
    ("ij,ij->i", [(3, 4), (3, 4)]),
    ("ij,jk", [(3, 4), (4, 5)]),
    ("ba,ca", [(3, 4), (5, 4)]),
    ("i,i", [(5,), (5,)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (1, 3, 4, 2)]),
    ("...ij->...ji", [("n", 3, 4)]),
    ("i...,i->...", [(3, 2, 4), (3,)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("iij,jk->ik", [(3, 3, 4), (4, 2)]),
]
SIZES = {"n": (2, 5)}


@pytest.mark.parametrize("equation, shapes", EINSUM_CASES,
                         ids=[case[0] for case in EINSUM_CASES])
def test_einsum_matches_onnxruntime(equation, shapes):
    """Einsum, which exporters write for attention scores, bilinear forms and tensor
    contractions, was refused as an unmapped op: it is now transposes, diagonal masks,
    sums and batched matmuls."""
    names = [f"x{i}" for i in range(len(shapes))]
    node = helper.make_node("Einsum", names, ["y"], equation=equation)
    m = model([node], [vi(n, list(s)) for n, s in zip(names, shapes)], [vi("y", None)],
              opset=12)
    symbolic = any(isinstance(d, str) for s in shapes for d in s)
    sizes = SIZES["n"] if symbolic else (None,)
    feeds = [{n: rand(*[size if isinstance(d, str) else d for d in s])
              for n, s in zip(names, shapes)} for size in sizes]
    against_ort(m, feeds, {"n": 8} if symbolic else None)


def test_einsum_refuses_a_malformed_equation_naming_the_node():
    """An equation whose labels do not match its operands' ranks is named with the node."""
    node = helper.make_node("Einsum", ["a"], ["y"], equation="ijk->i", name="ein")
    m = model([node], [vi("a", [3, 4])], [vi("y", None)], opset=12)
    with pytest.raises(tg.ShapeError, match=r"Einsum node 'ein'.*'ijk->i'"):
        tg.from_onnx(m)


# --- Pad ----------------------------------------------------------------------------------

PAD_CASES = [  # (mode, opset, pads, axes)
    ("reflect", 11, [0, 1, 2, 0, 2, 1], None),
    ("edge", 11, [0, 2, 1, 0, 0, 3], None),
    ("reflect", 18, [1, 2, 2, 1], [-1, 1]),
    ("edge", 18, [3, 1], [2]),
    ("reflect", 18, [-1, 2, 1, -2], [1, 2]),
    ("edge", 18, [2, -1, -1, 3], [1, 2]),
    ("wrap", 19, [0, 2, 3, 0, 1, 2], None),
    ("wrap", 19, [-1, 1, 2, -1], [1, 2]),
    ("reflect", 18, [1, 1], [0]),
    ("edge", 18, [2, 1], [0]),
    ("wrap", 19, [3, 2], [0]),
]


@pytest.mark.parametrize("mode, opset, pads, axes", PAD_CASES,
                         ids=[f"{c[0]}-{c[1]}-{i}" for i, c in enumerate(PAD_CASES)])
def test_pad_modes_match_onnxruntime(mode, opset, pads, axes):
    """Pad's reflect and edge (and, from opset 19, wrap) modes, which image models' padding
    layers export to, were refused: each padded axis is now a gather of itself, mirrored
    for reflect, clamped for edge, modulo its length for wrap; negative pads crop first, as
    ONNX Runtime does. The batch is symbolic, padded in the last cases."""
    inits = [init("p", pads, np.int64)]
    ins = ["x", "p"]
    if axes is not None:
        inits.append(init("a", axes, np.int64))
        ins += ["", "a"]
    node = helper.make_node("Pad", ins, ["y"], mode=mode)
    m = model([node], [vi("x", ["n", 4, 5])], [vi("y", None)], opset=opset, inits=inits)
    against_ort(m, [{"x": rand(n, 4, 5)} for n in (2, 3)], {"n": 4})


def test_pad_attribute_form_reflects_as_onnxruntime():
    """Before opset 11 the pads are an attribute."""
    node = helper.make_node("Pad", ["x"], ["y"], mode="reflect", pads=[0, 0, 1, 2, 0, 0, 2, 1])
    m = model([node], [vi("x", [1, 2, 4, 5])], [vi("y", None)], opset=10)
    against_ort(m, [{"x": rand(1, 2, 4, 5)}])


def test_pad_reflect_wider_than_the_axis_is_refused_naming_the_node():
    node = helper.make_node("Pad", ["x", "p"], ["y"], mode="reflect", name="pd")
    m = model([node], [vi("x", [2, 3])], [vi("y", None)], opset=13,
              inits=[init("p", [0, 3, 0, 0], np.int64)])
    with pytest.raises(tg.ShapeError, match=r"Pad node 'pd'.*reflect.*3"):
        tg.from_onnx(m)


# --- ConvTranspose ------------------------------------------------------------------------

CONV_T_CASES = [  # (input shape, weight shape, attributes)
    ((1, 2, 3, 4, 3), (2, 3, 2, 3, 2), {}),
    ((2, 4, 3, 3, 4), (4, 2, 3, 2, 3), {"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1],
                                         "group": 2}),
    ((1, 2, 3, 3, 3), (2, 2, 2, 2, 2), {"strides": [2, 2, 2], "dilations": [1, 2, 1],
                                         "output_padding": [1, 0, 1]}),
    ((1, 2, 3, 4, 3), (2, 3, 3, 3, 3), {"strides": [2, 2, 2], "output_shape": [6, 8, 7]}),
    ((1, 2, 3, 4, 3), (2, 3, 3, 3, 3), {"strides": [2, 1, 2], "auto_pad": "SAME_UPPER"}),
]


@pytest.mark.parametrize("shape, wshape, attrs", CONV_T_CASES,
                         ids=[f"3d-{i}" for i in range(len(CONV_T_CASES))])
def test_conv_transpose_3d_matches_onnxruntime(shape, wshape, attrs):
    """A 3-D ConvTranspose (volumetric decoders, video upsampling) was refused: it is the
    input spread by the stride on each axis, convolved with the flipped kernel, the 3-D
    convolution a sum of 2-D ones over the kernel's depth."""
    b = rand(wshape[1] * attrs.get("group", 1))
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], **attrs)
    m = model([node], [vi("x", ["n", *shape[1:]])], [vi("y", None)],
              inits=[init("w", rand(*wshape)), init("b", b)])
    against_ort(m, [{"x": rand(*shape)}], {"n": 4})


def test_conv_3d_matches_onnxruntime():
    """The 3-D convolution ConvTranspose is built on serves Conv as well."""
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], strides=[1, 2, 1],
                            pads=[1, 0, 1, 1, 1, 0], dilations=[2, 1, 1], group=2)
    m = model([node], [vi("x", [1, 4, 5, 5, 4])], [vi("y", None)],
              inits=[init("w", rand(6, 2, 2, 3, 2)), init("b", rand(6))])
    against_ort(m, [{"x": rand(1, 4, 5, 5, 4)}])


# --- Upsample -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode, opset, scales", [
    ("nearest", 7, [1.0, 1.0, 2.0, 3.0]), ("linear", 7, [1.0, 1.0, 2.0, 2.0]),
    ("nearest", 9, [1.0, 1.0, 1.5, 2.0]), ("linear", 9, [1.0, 1.0, 2.5, 1.5]),
], ids=["nearest-7", "linear-7", "nearest-9", "linear-9"])
def test_upsample_matches_onnxruntime(mode, opset, scales):
    """The deprecated Upsample (opset 7's scales attribute, opset 9's scales input), which
    old converters still write, was refused: it is Resize with asymmetric coordinates, a
    floor pick for nearest. The batch is symbolic."""
    if opset == 7:
        node = helper.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales)
        inits = []
    else:
        node = helper.make_node("Upsample", ["x", "s"], ["y"], mode=mode)
        inits = [init("s", scales, np.float32)]
    m = model([node], [vi("x", ["n", 2, 3, 4])], [vi("y", None)], opset=opset, inits=inits)
    against_ort(m, [{"x": rand(n, 2, 3, 4)} for n in (1, 3)], {"n": 4})


# --- MaxPool Indices ----------------------------------------------------------------------

@pytest.mark.parametrize("shape, attrs", [
    ((2, 3, 5, 6), {"kernel_shape": [2, 2]}),
    ((2, 3, 5, 6), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}),
    ((2, 3, 5, 6), {"kernel_shape": [2, 3], "dilations": [2, 1], "ceil_mode": 1,
                    "strides": [2, 2]}),
    ((2, 3, 5, 6), {"kernel_shape": [2, 2], "storage_order": 1}),
    ((2, 3, 7), {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}),
], ids=["2d", "2d-pads", "2d-dilated-ceil", "2d-column-major", "1d"])
def test_max_pool_indices_match_onnxruntime(shape, attrs):
    """MaxPool's Indices output (what unpooling decoders read) was refused: it is each
    window maximum's place in the plane, offset by its batch and channel to a flat index
    into the whole input. The batch is symbolic."""
    node = helper.make_node("MaxPool", ["x"], ["y", "i"], **attrs)
    m = model([node], [vi("x", ["n", *shape[1:]])], [vi("y", None), vi("i", None, I64)])
    against_ort(m, [{"x": rand(n, *shape[1:])} for n in (shape[0], 3)], {"n": 4})


# --- GatherND -----------------------------------------------------------------------------

@pytest.mark.parametrize("xshape, ishape, batch", [
    ((2, 3, 4), (2, 1), 1),
    ((2, 3, 4, 5), (2, 6, 2), 1),
    ((2, 3, 4, 5), (2, 3, 2, 1), 2),
], ids=["b1-full", "b1-pairs", "b2"])
@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic-batch"])
def test_gather_nd_with_batch_dims_matches_onnxruntime(xshape, ishape, batch, symbolic):
    """GatherND with batch_dims (a per-example pick of positions, as TF-converted models
    write it) was refused: each batch's index tuples point into its own block of the
    flattened data. Negative indices count from the end."""
    lead = ["n"] if symbolic else [xshape[0]]
    node = helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch)
    m = model([node], [vi("x", lead + list(xshape[1:])), vi("i", lead + list(ishape[1:]), I64)],
              [vi("y", None)])
    feeds = []
    for n in ((2, 3) if symbolic else (xshape[0],)):
        ishape_n = (n, *ishape[1:])
        idx = np.stack([RNG.integers(-xshape[batch + j], xshape[batch + j], ishape_n[:-1])
                        for j in range(ishape[-1])], -1).astype(np.int64)
        feeds.append({"x": rand(n, *xshape[1:]), "i": idx})
    against_ort(m, feeds, {"n": 4} if symbolic else None)
