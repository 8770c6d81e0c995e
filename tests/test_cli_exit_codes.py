"""``tg``'s exit statuses are one table (cli.EXIT_CODES): every status main returns is in it, and
``tg --help`` and the README show all of it. (Ctrl-C's 130 runs in test_cli_errors.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tensor_graphs import cli

README = Path(__file__).resolve().parents[1] / "README.md"


def tg(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensor_graphs.cli", *argv],
                          capture_output=True, text=True, timeout=120)


def test_every_failure_exits_with_a_status_of_the_table():
    statuses = {code for code, _, _ in cli.EXIT_CODES}
    assert len(statuses) == len(cli.EXIT_CODES)
    assert {status for _, _, status in cli.FAILURES} | {cli.OK} == statuses


def test_help_and_readme_show_the_table():
    helped = " ".join(tg("--help").stdout.split())
    readme = README.read_text(encoding="utf-8")
    for code, name, _ in cli.EXIT_CODES:
        assert f"{code} {name}" in helped
        assert f"| {code} | {name} |" in readme, f"README's exit status table lacks {code}"


@pytest.mark.parametrize("argv, status", [
    (["env"], cli.OK),
    (["env", "-o", "yaml"], cli.USAGE),  # the parser refuses
    (["paths", "block", "--dim", "nosuch=4"], cli.USAGE),  # the command refuses
    (["db", "stats", "--db", "{garbage}"], cli.FAILURE),
])
def test_statuses(argv, status, tmp_path):
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"\x00\x01 not a database" * 50)
    proc = tg(*(a.format(garbage=garbage) for a in argv))
    assert proc.returncode == status, proc.stderr
    if status != cli.OK:
        assert proc.stderr.count("\n") == 1 and ": error: " in proc.stderr
