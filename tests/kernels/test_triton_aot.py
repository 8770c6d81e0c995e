"""Ahead-of-time compiles of the generated Triton kernels for an H100 (sm_90), without a GPU:
what the interpreter cannot show (the GPU compiler accepts the code, shared memory fits)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensor_graphs.errors import ArgumentError
from tensor_graphs.kernels import triton as package

pytestmark = pytest.mark.skipif(not package.installed(), reason="needs triton and torch")
ROOT = Path(__file__).resolve().parents[2]


def compiled_env(child_env, tmp_path) -> dict:
    """A child's environment with compiled, not interpreted, Triton kernels."""
    env = dict(child_env, TG_CACHE_DIR=str(tmp_path / "cache"),
               TRITON_CACHE_DIR=str(tmp_path / "triton"))
    for name in ("TG_SIMULATED_CUDA", package.INTERPRET):
        env.pop(name, None)
    return env


def test_tg_kernels_compile_compiles_every_kernel_and_configuration(child_env, tmp_path):
    """An elementwise and a row region in float16: 3 configurations, 2 compiles each for
    the elementwise kernel and 3 for the rows (one long row, many short ones, looped)."""
    res = subprocess.run(
        [sys.executable, "-m", "tensor_graphs.cli", "kernels", "compile", "--arch", "sm_90",
         "--region", "bias_relu_residual", "--region", "layer_norm_residual", "--dtype",
         "float16", "--no-templates"],
        cwd=ROOT, env=compiled_env(child_env, tmp_path), capture_output=True, text=True,
        timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "15 of 15 Triton kernel compiles for sm_90 succeeded" in res.stdout, res.stdout


def test_a_kernel_over_the_shared_memory_limit_fails_the_command(child_env, tmp_path):
    """The row kernels reduce across warps through shared memory: with the limit set below
    what they use (sm_75's 64 KiB patched to 16 bytes) each compile is a failure line and
    the command exits 1."""
    script = (
        "import sys\n"
        "from tensor_graphs.kernels.triton import aot\n"
        "aot.SHARED_MEMORY[75] = 16\n"
        "from tensor_graphs.cli import main\n"
        "sys.exit(main(['kernels', 'compile', '--arch', 'sm_75', '--region', 'softmax',\n"
        "               '--dtype', 'float32', '--no-templates']))\n")
    res = subprocess.run([sys.executable, "-c", script], cwd=ROOT,
                         env=compiled_env(child_env, tmp_path), capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "bytes of shared memory; sm_75 allows 16 a block" in res.stdout, res.stdout
    assert "failed" in res.stdout.strip().splitlines()[-1]


def test_architectures_are_named_as_nvcc_names_them():
    from tensor_graphs.kernels.triton.aot import parse_arch

    assert parse_arch("sm_90") == parse_arch("90") == parse_arch("SM90") == 90
    with pytest.raises(ArgumentError, match="sm_90"):
        parse_arch("sm_91")
    with pytest.raises(ArgumentError, match="unknown GPU architecture"):
        parse_arch("hopper")


def test_the_command_explains_itself(child_env):
    res = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "kernels", "compile",
                          "--help"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=child_env)
    assert res.returncode == 0
    assert "shared" in res.stdout and "--arch ARCH" in res.stdout and "sm_90" in res.stdout
