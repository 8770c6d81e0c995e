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
    """An elementwise and a row region in float16: 3 configurations each, so 6 kernels x
    configurations, compiled at 2 extremes each for the elementwise kernel and 3 for the rows
    (one long row, many short ones, looped): 15 compiles."""
    res = subprocess.run(
        [sys.executable, "-m", "tensor_graphs.cli", "kernels", "compile", "--arch", "sm_90",
         "--region", "bias_relu_residual", "--region", "layer_norm_residual", "--dtype",
         "float16", "--no-templates"],
        cwd=ROOT, env=compiled_env(child_env, tmp_path), capture_output=True, text=True,
        timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.startswith("sm_90: 6 Triton kernels x configurations compiled (15 "
                                 "compiles; shared memory at most "), res.stdout


def test_a_kernel_over_the_shared_memory_limit_fails_the_command(child_env, tmp_path):
    """The row kernels reduce across warps through shared memory: with the limit set below
    what they use (sm_75's 64 KiB patched to 16 bytes) each compile over it is a failure
    line, a kernel x configuration with one such compile is not compiled, and the command
    exits 1."""
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
    fails = [line for line in res.stdout.splitlines() if line.startswith("FAIL softmax")]
    last = res.stdout.strip().splitlines()[-1]
    assert last.startswith("sm_75: 0 of 3 Triton kernels x configurations compiled, 3 failed "
                           f"({len(fails)} of 9 compiles failed"), last


def test_a_kernel_counts_as_compiled_only_when_all_its_compiles_pass():
    from tensor_graphs.commands.kernels_compile import summary
    from tensor_graphs.kernels.triton.aot import Compiled

    results = [Compiled("a flat", True, 0, kernel="a"), Compiled("a rank4", False, 99, 0.0,
                                                                 "uses 99 bytes", "a"),
               Compiled("b flat", True, 64, kernel="b"), Compiled("c", True, 8)]
    assert summary(90, results) == ("sm_90: 2 of 3 Triton kernels x configurations compiled, "
                                    "1 failed (1 of 4 compiles failed; shared memory at most "
                                    "64 of 232448 bytes a block)")
    assert summary(90, results[2:]).startswith("sm_90: 2 Triton kernels x configurations "
                                               "compiled (2 compiles; ")


@pytest.mark.skipif(package.interpreted(), reason="compiles need triton without its interpreter")
def test_a_template_compiles_with_the_alignment_its_launch_specialises(tmp_path, monkeypatch):
    """The templates' targets carry 16-byte divisibility (``attrs``); compiled without it an
    fp16 GEMM tile is not pipelined through shared memory and the check passes on a quarter
    of what a GPU allocates. ``compile_target`` must hand the attrs to ASTSource."""
    from tensor_graphs.kernels.triton.aot import SHARED_MEMORY, compile_target
    from tensor_graphs.kernels.triton.templates.targets import compile_targets

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    gemm = next(t for t in compile_targets() if t.name.startswith("gemm_")
                and t.name.endswith("_float16"))
    assert gemm.attrs and gemm.kernel and gemm.name.startswith(gemm.kernel)
    aligned = compile_target(gemm, 90)
    unaligned = compile_target(gemm._replace(attrs=None), 90)
    assert aligned.ok and unaligned.ok, (aligned.error, unaligned.error)
    assert unaligned.shared < aligned.shared <= SHARED_MEMORY[90], (unaligned, aligned)


def test_the_command_refuses_a_process_running_the_interpreter(monkeypatch, capsys):
    """Triton's own library functions are decorated for the interpreter when it is on, and
    then no kernel compiles: the command says so and how to run it (exit 2), instead of a
    failure line per compile."""
    from tensor_graphs.cli import main

    monkeypatch.setenv(package.INTERPRET, "1")
    assert main(["kernels", "compile", "--arch", "sm_90", "--region", "softmax"]) == 2
    err = capsys.readouterr().err
    assert "TRITON_INTERPRET is set" in err and "env -u TG_SIMULATED_CUDA" in err, err
    assert "FAIL" not in err


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
    text = " ".join(res.stdout.split())
    assert "shared memory" in text and "--arch ARCH" in text and "sm_90" in text
    assert "kernels x configurations compiled" in text and "16-byte aligned" in text
    assert "exits 0 when all compiled, 1 when any compile failed, 2 when" in text, text
