"""docs/kernels.md is generated from the kernel registry and must not go stale."""

from __future__ import annotations

import pytest

from tensor_graphs.tools import kerneldocs as docs


def _backends_complete() -> bool:
    """The committed page lists the torch kernels; without torch they are not registered."""
    from tensor_graphs.kernels import torch as torch_backend

    return torch_backend.available()


def test_kernels_md_is_up_to_date():
    assert docs.DOCS_PATH.exists(), f"docs/kernels.md is missing; run `{docs.COMMAND}`"
    if not _backends_complete():
        pytest.skip("torch is not installed: its kernels are missing from the registry")
    assert docs.DOCS_PATH.read_text(encoding="utf-8") == docs.render(), \
        f"docs/kernels.md is stale (the kernel registry changed); run `{docs.COMMAND}`"


def test_coverage_table_lists_every_op_and_the_seed_example():
    from tensor_graphs.ir.ops import OPS

    text = docs.render()
    for name, op in OPS.items():
        if op.kind == "atomic" or (op.kind == "composite"
                                   and op.decompose.__module__.startswith("tensor_graphs.")):
            assert f"| `{name}` | {op.kind} |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `tanh` |"))
    assert "`numpy_tanh`" in row and "`numpy_exact_tanh` 1e-07" in row


def test_check_mode_reports_stale_files(tmp_path, capsys):
    target = tmp_path / "kernels.md"
    assert docs.main(["--check", "--output", str(target)]) == 1
    assert docs.COMMAND in capsys.readouterr().err
    assert docs.main(["--output", str(target)]) == 0
    assert docs.main(["--check", "--output", str(target)]) == 0
