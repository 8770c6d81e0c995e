"""Every torch CUDA kernel and copy to or from the GPU passes verification against the float64
reference, on the GPU (or the simulated one in CI, where these kernels are registered: the
main process's tests/kernels/test_verify_all.py has none of them). Triton's templates and
generated kernels are verified in their own folders."""

from __future__ import annotations

import zlib

import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import copy as copies

GPU_KERNELS = [k for k in tg.kernels.all() if k.backend in ("torch", "copy")
               and "cuda" in copies.placement(k)]


def test_the_gpu_kernels_are_registered():
    names = {k.name for k in GPU_KERNELS}
    assert {"torch_cuda_matmul", "torch_cuda_state_update", "copy_host_to_cuda",
            "copy_cuda_to_host"} <= names


@pytest.mark.parametrize("kernel", GPU_KERNELS, ids=[k.name for k in GPU_KERNELS])
def test_gpu_kernel_matches_reference(kernel):
    report = tg.kernels.verify(kernel, seed=zlib.crc32(kernel.name.encode()))
    assert not report.skipped, report.skipped
    assert report.ok, str(report)
    assert report.results, f"{kernel.name}: no case ran"
