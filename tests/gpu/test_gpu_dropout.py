"""Dropout on a GPU: the mask drawn there (torch_cuda_dropout, Philox in int64 tensor
arithmetic), the generator's state kept and advanced on the GPU, nothing of it copied to the
host, and the masks the reference's bit for bit. Runs on a real GPU, and in CI on the simulated
one (see conftest)."""

from __future__ import annotations

import numpy as np
import torch

import tensor_graphs as tg
from tensor_graphs.devices import torch_device
from tensor_graphs.ir.ops.random import bits_reference, threshold

GPU = torch.device(torch_device("cuda"))


def test_masks_are_drawn_on_the_gpu_from_a_state_kept_there(copies):
    r = tg.rng(seed=7)
    x = tg.input("x", (256, 512))
    w = tg.weight("w", (512, 512))
    h = tg.dropout(tg.tanh(x @ w), 0.25, r)
    prog = tg.compile([h, r.advance()], device="cuda", db=":memory:", outputs="device")
    kernels = {s.kernel.name for s in prog.plan.steps}
    assert "torch_cuda_dropout" in kernels, sorted(kernels)
    assert "copy_cuda_to_host" not in kernels  # the key never goes to the host
    prog.bind(w=np.eye(512, dtype=np.float32), **r.init())
    xs = np.full((256, 512), 0.5, np.float32)
    for step in range(3):
        got, key = prog(x=torch.from_numpy(xs).to(GPU))
        assert got.device == GPU and key.device == GPU
        want = (bits_reference(np.array([7, step]), xs.size, 0) < threshold(0.25))
        assert np.array_equal(got.cpu().numpy().reshape(-1) == 0, want), step
    assert copies["to_host"] == 0
    assert prog.state("rng").tolist() == [7, 3]
