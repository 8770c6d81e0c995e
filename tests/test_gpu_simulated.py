"""The GPU path in CI: ``tests/gpu`` run in a child process on the simulated GPU.

``TG_SIMULATED_CUDA=1`` makes cuda:0 a device in host memory (its tensors are torch CPU
tensors; see ``devices.simulated_cuda``); it must be set before tensor_graphs is imported, so
the folder runs in its own pytest process. On a machine with a real GPU the main run also
runs ``tests/gpu`` directly, on the GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_tests_pass_on_the_simulated_gpu(child_env, tmp_path):
    env = dict(child_env, TG_SIMULATED_CUDA="1", TG_DB=str(tmp_path / "gpu.sqlite"),
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    res = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-W",
         "ignore::RuntimeWarning", str(ROOT / "tests" / "gpu")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    tail = (res.stdout + res.stderr)[-6000:]
    assert res.returncode == 0, tail
    summary = res.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary and "failed" not in summary, tail
