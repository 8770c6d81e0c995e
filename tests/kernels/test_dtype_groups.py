"""The dtype groups (FLOATS, INTS, NUMBERS, ALL) are defined once, in tensor_graphs/ir/dtypes.py,
in ALL's order; the numpy, torch and C kernels declare dtypes with those tuples, and
verification keeps only its own order (kernels/signatures.py: the first dtype a kernel accepts
gets every case, and all cases share one random stream)."""

from __future__ import annotations

import pytest

from tensor_graphs.ir import dtypes
from tensor_graphs.kernels import signatures
from tensor_graphs.kernels.numpy import atomic as numpy_atomic
from tensor_graphs.kernels.numpy import composite as numpy_composite

GROUPS = {"FLOATS": dtypes.FLOATS, "INTS": dtypes.INTS, "NUMBERS": dtypes.NUMBERS,
          "ALL": dtypes.ALL}


def test_the_groups_partition_all_in_its_order():
    assert dtypes.FLOATS + dtypes.INTS + (dtypes.bool_,) == tuple(
        sorted(dtypes.ALL, key=lambda d: ("float", "int", "bool").index(d.kind)))
    for name, group in GROUPS.items():
        assert group == tuple(d for d in dtypes.ALL if d in group), f"{name} out of ALL's order"
    assert dtypes.NUMBERS == tuple(d for d in dtypes.ALL if not d.is_bool)


@pytest.mark.parametrize("module", [numpy_atomic, numpy_composite], ids=lambda m: m.__name__)
def test_numpy_kernels_use_the_one_definition(module):
    for name in ("FLOATS", "NUMBERS", "ALL"):
        assert getattr(module, name) is GROUPS[name], f"{module.__name__}.{name} is a copy"


def test_torch_kernels_use_the_one_definition():
    pytest.importorskip("torch")
    from tensor_graphs.kernels.torch import base, ops

    assert base.FLOATS is dtypes.FLOATS
    for mine, name in ((ops.FLOATS, "FLOATS"), (ops.INTS, "INTS"), (ops.NUMERIC, "NUMBERS"),
                       (ops.ALL, "ALL")):
        assert mine is GROUPS[name], f"torch/ops.py's {name} is a copy"


def test_torch_leading_dtype_check_takes_the_groups():
    pytest.importorskip("torch")
    from tensor_graphs.kernels.torch import base

    check = base._leading_dtypes(dtypes.FLOATS, 1, None)
    assert check([(2,), (2,)], [dtypes.float32, dtypes.int64], {}) is True
    assert check([(2,)], [dtypes.int64], {}) == (
        "dtype int64; accepts float16, bfloat16, float32, float64")
    names = base._leading_dtypes(("bool",) + dtypes.INTS, 1, None)  # names mix in
    assert names([(2,)], [dtypes.bool_], {}) is True
    assert names([(2,)], [dtypes.float32], {}) == (
        "dtype float32; accepts bool, uint8, int8, int32, int64")


def test_c_gather_takes_the_float_group():
    from tensor_graphs.kernels.c import gather

    assert gather._embedding_fits([(3,), (4, 2)], [dtypes.int64, dtypes.int32], {}) in (
        "the table must be a float tensor (float16, bfloat16, float32, float64), got int32",
        gather.lib.failure(gather.LIB))


def test_verification_keeps_its_order_over_the_same_members():
    assert sorted(signatures.VERIFY_ORDER) == sorted(d.name for d in dtypes.ALL)
    for name, group in GROUPS.items():
        mine = getattr(signatures, name)
        assert set(mine) == {d.name for d in group}, name
        assert list(mine) == sorted(mine, key=signatures.VERIFY_ORDER.index), name
    # the order every stored verification drew its values in (float32 first)
    assert signatures.NUMBERS == ("float32", "float64", "float16", "bfloat16",
                                  "int32", "int64", "int8", "uint8")
    assert signatures.ALL == signatures.NUMBERS + ("bool",)
