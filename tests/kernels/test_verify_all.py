"""Every registered kernel passes verification against the float64 reference.

The list is taken at collection time (every backend registers its kernels on import), so C,
torch and copy kernels are checked here too. Seeds are fixed per kernel name so a failure
reproduces; TG_VERIFY_SEED=<int> shifts them (fresh draws), e.g. in a soak run.
"""

from __future__ import annotations

import os
import zlib

import pytest

import tensor_graphs as tg

KERNELS = tg.kernels.all()
SHIFT = int(os.environ.get("TG_VERIFY_SEED", "0"))


@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_kernel_matches_reference(kernel):
    report = tg.kernels.verify(kernel, seed=zlib.crc32(kernel.name.encode()) + SHIFT)
    if report.skipped:
        pytest.skip(report.skipped)
    assert report.ok, str(report)
    assert report.results, f"{kernel.name}: no case ran"


def test_every_atomic_op_has_a_numpy_kernel():
    from tensor_graphs.ir.ops.atomic import ATOMIC_OPS

    names = {k.name for k in KERNELS}
    missing = [op for op in ATOMIC_OPS
               if f"numpy_{op}" not in names and f"numpy_{op}_2" not in names]
    assert not missing


def test_every_op_has_an_exact_kernel_within_1e7():
    """Any tolerance >= 1e-7 on float32 outputs has a path: every op, every combination of
    its optional tensors (a variadic op: every number of inputs), has an exact kernel declared
    at 1e-7 or better."""
    from tensor_graphs.ir.ops import OPS
    from tensor_graphs.kernels.numpy._util import variants

    names = {k.name: k for k in KERNELS}
    for op in OPS.values():
        if op.is_leaf:
            continue
        suffixes = [""] if op.variadic else [s for _, s in variants(op)]  # one: any arity
        for suffix in suffixes:
            k = names.get(f"numpy_exact_{op.name}{suffix}")
            assert k is not None, f"no exact kernel for {op.name}{suffix}"
            assert k.tolerance <= 1e-7
            if op.variadic:
                assert k.variadic is not None, f"{k.name} has a fixed arity"
