"""`tg kernels list / verify / prompt`."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tensor_graphs import cli
from tensor_graphs.kernels import registry


def test_list(capsys):
    assert cli.main(["kernels", "list", "--op", "tanh"]) == 0
    out = capsys.readouterr().out
    assert "name" in out and "tolerance" in out
    assert "numpy_tanh" in out and "numpy_exact_tanh" in out and "tanh(x)" in out
    assert "numpy_exp" not in out


def test_verify_named_kernels(capsys):
    assert cli.main(["kernels", "verify", "numpy_tanh", "numpy_exact_softmax", "--seed", "3"]) == 0
    out = capsys.readouterr().out
    assert "[1/2] ok" in out and "[2/2] ok" in out and "2 passed, 0 failed" in out


def test_verify_unknown_name(capsys):
    assert cli.main(["kernels", "verify", "no_such_kernel_anywhere"]) == 2
    assert "no kernel named" in capsys.readouterr().err


def test_verify_a_file_with_a_wrong_kernel(tmp_path, capsys):
    path = tmp_path / "k.py"
    path.write_text(textwrap.dedent('''
        import numpy as np
        import tensor_graphs as tg

        @tg.kernel("exp", backend="numpy", name="cli_wrong_exp", dtypes=("float32",))
        def cli_wrong_exp(x):
            return np.exp(x) * np.float32(1.01)
    '''))
    assert cli.main(["kernels", "verify", "--file", str(path)]) == 1
    assert "cli_wrong_exp" in capsys.readouterr().err
    assert "cli_wrong_exp" not in registry._KERNELS


def test_prompt(capsys):
    assert cli.main(["kernels", "prompt", "softmax"]) == 0
    assert "def my_softmax(x, axis):" in capsys.readouterr().out
    assert cli.main(["kernels", "prompt", "frobnicate(x)"]) == 2


def test_help_texts():
    out = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "kernels", "--help"],
                         capture_output=True, text=True, check=True).stdout
    assert "list" in out and "verify" in out and "prompt" in out
    assert cli.main(["kernels"]) == 0
