"""docs/ops.md is generated from the op table and must not go stale."""

from __future__ import annotations

from tensor_graphs.ir.ops import OPS
from tensor_graphs.tools import opdocs


def test_ops_md_is_up_to_date():
    assert opdocs.DOCS_PATH.exists(), \
        f"docs/ops.md is missing; run `{opdocs.COMMAND}` to generate it"
    committed = opdocs.DOCS_PATH.read_text(encoding="utf-8")
    assert committed == opdocs.render(), \
        f"docs/ops.md is stale (the op table changed); run `{opdocs.COMMAND}` and commit it"


def test_every_library_op_is_documented():
    text = opdocs.render()
    for name, op in OPS.items():
        if op.kind != "composite" or opdocs._module(op) is not None:
            assert f"| `{name}` |" in text, f"op '{name}' is missing from docs/ops.md"


def test_check_mode_reports_stale_files(tmp_path, capsys):
    target = tmp_path / "ops.md"
    assert opdocs.main(["--check", "--output", str(target)]) == 1
    assert "run `python -m tensor_graphs.tools.opdocs`" in capsys.readouterr().err
    assert opdocs.main(["--output", str(target)]) == 0
    assert opdocs.main(["--check", "--output", str(target)]) == 0
    assert target.read_text(encoding="utf-8") == opdocs.render()
