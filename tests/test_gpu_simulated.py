"""The GPU path in CI: ``tests/gpu`` run in a child process on the simulated GPU.

``TG_SIMULATED_CUDA=1`` makes cuda:0 a device in host memory (its tensors are torch CPU
tensors; see ``devices.simulated_cuda``); it must be set before tensor_graphs is imported, so
the folder runs in its own pytest process, in the background (``tests/children.py``). On a
machine with a real GPU the main run also runs ``tests/gpu`` directly, on the GPU."""

from __future__ import annotations

import pytest

from tests import children

pytest.importorskip("torch")


@pytest.mark.child("gpu")
def test_the_gpu_tests_pass_on_the_simulated_gpu(child_env):
    children.finish("gpu", child_env).assert_all_passed()
