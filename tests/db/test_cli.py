"""`tg db stats | show | export | import | prune`."""

from __future__ import annotations

import io
import math
import subprocess
import sys
import time

import pytest

from tensor_graphs import kernels
from tensor_graphs.cli import main
from tensor_graphs.db import Database, Measurement


@pytest.fixture
def filled(tmp_path, mk):
    measurement = mk
    path = tmp_path / "cli.sqlite"
    k = kernels.all()[0]
    with Database(path) as db:
        db.record(measurement(kernel=k.name, source_hash=k.source_hash, n=4))
        db.record(measurement(kernel=k.name, source_hash="edited-long-ago", n=8))
        db.record(measurement(kernel="user_mul", n=4, when=time.time() - 40 * 86400))
        db.record(Measurement("user_mul", "h", measurement(n=16).signature, 0, math.nan,
                              math.nan, math.nan, None, failure="RuntimeError: boom\ntrace"))
    return path, k.name


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_stats(filled, capsys):
    path, _ = filled
    code, out, _ = run(capsys, "db", "stats", "--db", str(path))
    assert code == 0 and str(path) in out
    assert "4 (2 kernels, 1 failures, 1 stale)" in out and "hardware" in out


def test_show(filled, capsys):
    path, name = filled
    code, out, _ = run(capsys, "db", "show", "--db", str(path))
    assert code == 0 and name in out and "user_mul" in out and "FAILED" in out
    assert "RuntimeError: boom" in out and "trace" not in out and "4 of 4 rows" in out
    assert "10us" in out  # the median, for people
    code, out, _ = run(capsys, "db", "show", "--db", str(path), "--kernel", "user_mul",
                       "--limit", "1")
    assert code == 0 and name not in out.split("\n\n")[0] and "1 of 2 rows" in out


def test_export_import(filled, tmp_path, capsys, monkeypatch):
    path, _ = filled
    target = tmp_path / "out.jsonl"
    code, out, _ = run(capsys, "db", "export", "--db", str(path), str(target))
    assert code == 0 and "exported 4 rows" in out
    code, out, _ = run(capsys, "db", "export", "--db", str(path), "-")
    assert code == 0 and out == target.read_text()
    other = tmp_path / "other.sqlite"
    code, out, _ = run(capsys, "db", "import", "--db", str(other), str(target))
    assert code == 0 and "imported 4 new rows" in out
    monkeypatch.setattr(sys, "stdin", io.StringIO(target.read_text()))
    code, out, _ = run(capsys, "db", "import", "--db", str(other), "-")
    assert code == 0 and "imported 0 new rows" in out
    assert len(Database(other).rows()) == 4


def test_export_never_writes_over_a_database_nor_empties_its_target_on_failure(
        filled, tmp_path, capsys):
    """Naming the database itself (or another) as the export's file emptied it: the file was
    truncated before the rows were read."""
    path, _ = filled
    for target in (path, tmp_path / "other.sqlite"):
        with Database(target) as db:
            count = len(db.rows())
        code, _, err = run(capsys, "db", "export", "--db", str(path), str(target))
        assert code == 1 and "is an SQLite database" in err and "tg db import --db" in err
        with Database(target) as db:
            assert len(db.rows()) == count
    kept = tmp_path / "kept.jsonl"
    kept.write_text("the rows of an earlier export\n")
    broken = tmp_path / "broken.sqlite"
    broken.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)  # a damaged database
    code, _, err = run(capsys, "db", "export", "--db", str(broken), str(kept))
    assert code == 1 and ("malformed" in err or "not a database" in err), err
    assert kept.read_text() == "the rows of an earlier export\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".kept")]


def test_prune(filled, capsys):
    path, _ = filled
    code, _, err = run(capsys, "db", "prune", "--db", str(path))
    assert code == 2 and "--stale" in err
    assert run(capsys, "db", "prune", "--db", str(path), "--stale")[1].startswith("pruned 1 ")
    assert run(capsys, "db", "prune", "--db", str(path), "--failures")[1].startswith("pruned 1 ")
    code, out, _ = run(capsys, "db", "prune", "--db", str(path), "--older-than", "30")
    assert code == 0 and out.startswith("pruned 1 ")
    assert len(Database(path).rows()) == 1


def test_errors_and_env(tmp_path, capsys, monkeypatch):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"not a database at all" * 100)
    code, _, err = run(capsys, "db", "stats", "--db", str(bad))
    assert code == 1 and "error:" in err and str(bad) in err
    monkeypatch.setenv("TG_DB", str(tmp_path / "env.sqlite"))
    code, out, _ = run(capsys, "db", "show")
    assert code == 0 and "0 of 0 rows" in out and (tmp_path / "env.sqlite").exists()


def test_help_from_the_command_line():
    out = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "db", "--help"],
                         capture_output=True, text=True, check=True).stdout
    for word in ("stats", "show", "export", "import", "prune"):
        assert word in out


def test_a_misspelt_database_is_refused_not_made(filled, tmp_path, capsys):
    """`tg db export --db typo.sqlite out.jsonl` made an empty database at the typo and
    exported 0 rows, exit 0; importing into a new database still makes it."""
    typo = tmp_path / "typo.sqlite"
    for argv in (["db", "export", "--db", str(typo), str(tmp_path / "out.jsonl")],
                 ["db", "stats", "--db", str(typo)], ["db", "show", "--db", str(typo)]):
        code, _, err = run(capsys, *argv)
        assert code == 1 and "no such measurement database" in err, (argv, err)
        assert not typo.exists() and not (tmp_path / "out.jsonl").exists()
    path, _ = filled
    run(capsys, "db", "export", "--db", str(path), str(tmp_path / "rows.jsonl"))
    code, out, _ = run(capsys, "db", "import", "--db", str(typo), str(tmp_path / "rows.jsonl"))
    assert code == 0 and "imported 4 new rows" in out and typo.exists()


def test_a_database_named_with_a_tilde_is_found(filled, tmp_path, capsys, monkeypatch):
    """`tg db stats --db=~/m.sqlite` (no shell expands a ~ after "=") opens ~/m.sqlite, as
    the database does; it was refused as missing."""
    path, _ = filled
    monkeypatch.setenv("HOME", str(path.parent))
    code, out, err = run(capsys, "db", "stats", f"--db=~/{path.name}")
    assert code == 0 and "rows       4" in out, err
