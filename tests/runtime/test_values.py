"""runtime/values.py: which memory holds a value decides what the runtime does with it. A
torch tensor is "on" a GPU only in that GPU's memory: a host tensor fed to a GPU program is
moved by the copy step like an array, never used as if it were on the GPU (on the simulated
GPU, whose memory is the host's, it is on it)."""

from __future__ import annotations

import numpy as np
import pytest

from tensor_graphs.runtime import values as dv

torch = pytest.importorskip("torch")


def test_a_host_tensor_is_on_the_gpu_only_when_the_gpu_is_simulated(simulate_gpu):
    t = torch.zeros(3)
    simulate_gpu(None)
    assert not dv.is_on(t, "cuda:0") and not dv.is_on(np.zeros(3), "cuda:0")
    simulate_gpu("1")
    assert dv.is_on(t, "cuda:0")


def test_arena_views_and_questions_on_both_kinds_of_memory():
    host = dv.new_arena("cpu", 1024)
    gpu = torch.zeros(1024, dtype=torch.uint8)  # a tensor arena, as on a GPU
    for arena in (host, gpu):
        v = dv.arena_view(arena, 256, (4, 8), np.dtype(np.float32))
        assert tuple(v.shape) == (4, 8) and dv.inside(v, arena) and not dv.fresh(v)
        assert dv.is_dense(v) and not dv.is_dense(v.T)
        assert not dv.inside(dv.copy(v), arena) and dv.fresh(dv.copy(v))
        assert dv.is_dense(dv.dense(v.T))
    assert dv.arena_view(gpu, 256, (4, 8), np.dtype(np.float32)).data_ptr() \
        == gpu.data_ptr() + 256
    stand_in = dv.placeholder(torch.ones((2, 5), dtype=torch.bfloat16))
    assert stand_in.shape == (2, 5) and stand_in.dtype.name == "bfloat16"
    assert stand_in.strides == (0, 0)  # no memory of its own
