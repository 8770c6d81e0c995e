"""The database under odd conditions: a FIFO or device instead of a file, a WAL left in a
read-only folder, the default folder's permissions, profiling against a read-only file."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import tensor_graphs as tg
import tensor_graphs.kernels.verify  # noqa: F401  (imported before forking a 'nobody' reader,
import tensor_graphs.profiler.missing  # noqa: F401  which may not read the interpreter's files)
from tensor_graphs.db import Database, Measurement, default_path, open_db
from tensor_graphs.errors import DatabaseError, UntrustedPathError


# --------------------------------------------------------------------- not a regular file
@pytest.mark.parametrize("kind", ["fifo", "device", "wal-fifo"])
def test_a_path_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = tmp_path / "m.sqlite"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    else:  # a real database whose -wal is a FIFO: SQLite would block reading it
        with Database(path) as db:
            db.record_many([])
        os.mkfifo(f"{path}-wal")
    what = {"fifo": "FIFO", "device": "character device", "wal-fifo": "FIFO"}[kind]
    with pytest.raises(DatabaseError, match=what) as info:
        Database(path)
    assert str(path) in str(info.value) and "TG_DB" in str(info.value)


def test_tg_db_stats_on_a_fifo_exits_with_one_line_instead_of_hanging(tmp_path, child_env):
    fifo = tmp_path / "pipe.sqlite"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "db", "stats"],
                         env=dict(child_env, TG_DB=str(fifo)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 1, out
    assert out.stderr.count("\n") == 1 and "FIFO" in out.stderr and str(fifo) in out.stderr
    assert "Traceback" not in out.stderr


def test_importing_from_a_fifo_is_refused_instead_of_waiting(tmp_path, child_env):
    # the CLI refuses it in its argument parser; the API opened it and waited for a writer
    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    code = ("import sys\nfrom tensor_graphs.db import Database\nfrom tensor_graphs.errors "
            "import DatabaseError\ntry:\n    Database(':memory:').import_jsonl(sys.argv[1])\n"
            "except DatabaseError as exc:\n    print(exc)")
    out = subprocess.run([sys.executable, "-c", code, str(fifo)], env=child_env,
                         capture_output=True, text=True, timeout=60)
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in out.stdout, out
    assert "tg db export" in out.stdout


# --------------------------------------------------------------------- WAL, read-only folder
def _crashed_writer(path: Path, before: int, after: int) -> None:
    """A writer that checkpoints ``before`` rows, commits ``after`` more to the WAL, and dies
    without closing: the -wal (and -shm) stay behind, as after a SIGKILL."""
    pid = os.fork()
    if pid == 0:
        try:
            db = Database(path)
            for i in range(before):
                db.record(_row(i))
            db._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            for i in range(before, before + after):
                db.record(_row(i))
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _row(i: int) -> Measurement:
    return Measurement("numpy_add", "h1", f'{{"n":{i}}}', 5, 1e-5, 1e-5, 1e-5, 0.0)


def _read_rows(path: str) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = Database(path)
        out = {"rows": len(db.rows()), "mode": db.open_mode, "readonly": db.readonly,
               "revision": db.revision, "warnings": [str(w.message) for w in caught]}
        db.close()
    return out


@pytest.mark.parametrize("shm", ["kept", "gone"])
def test_wal_in_a_read_only_folder_shows_every_committed_row(shared_dir, as_reader, shm):
    path = shared_dir / "m.sqlite"
    _crashed_writer(path, before=3, after=7)
    assert Path(f"{path}-wal").stat().st_size > 0
    if shm == "gone":  # without it SQLite cannot map the WAL in a folder it cannot write
        Path(f"{path}-shm").unlink()
    for f in shared_dir.iterdir():
        f.chmod(0o644)
    shared_dir.chmod(0o555)
    before = {f.name: f.read_bytes() for f in shared_dir.iterdir()}
    out = as_reader(_read_rows, str(path))
    assert out["rows"] == 10 and out["revision"] == 10 and out["readonly"], out
    assert out["mode"] == ("ro" if shm == "kept" else "memory")
    assert not out["warnings"]
    assert {f.name: f.read_bytes() for f in shared_dir.iterdir()} == before


def test_an_unreadable_wal_is_warned_about_naming_the_file(shared_dir, as_reader):
    path = shared_dir / "m.sqlite"
    _crashed_writer(path, before=3, after=7)
    Path(f"{path}-shm").unlink()
    path.chmod(0o644)
    Path(f"{path}-wal").chmod(0o600)  # only its owner may read it
    shared_dir.chmod(0o555)
    out = as_reader(_read_rows, str(path))
    if os.geteuid() != 0 and os.access(f"{path}-wal", os.R_OK):
        pytest.skip("this user can read any file")
    assert out["rows"] == 3 and out["mode"] == "immutable"
    (message,) = out["warnings"]
    assert f"{path}-wal" in message and "missing" in message


# --------------------------------------------------------------------- the default folder
@pytest.fixture
def cache_home(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("TG_DB", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "tensor_graphs"


def test_the_default_folder_is_created_private(cache_home, mk):
    assert default_path().parent == cache_home and not cache_home.exists()
    db = open_db()
    db.record(mk())
    assert cache_home.stat().st_mode & 0o777 == 0o700
    assert Path(db.path) == cache_home / "measurements.sqlite"
    db.close()


def test_a_default_folder_others_can_write_is_refused(cache_home):
    cache_home.mkdir(parents=True)
    cache_home.chmod(0o777)
    with pytest.raises(UntrustedPathError) as info:
        open_db()
    assert str(cache_home) in str(info.value) and "chmod 700" in str(info.value)
    assert not (cache_home / "measurements.sqlite").exists()


def test_a_named_database_folder_is_the_users_choice(tmp_path, monkeypatch, mk):
    folder = tmp_path / "team"
    folder.mkdir()
    folder.chmod(0o777)
    monkeypatch.setenv("TG_DB", str(folder / "shared.sqlite"))
    with Database(default_path()) as db:
        db.record(mk())
        assert len(db.rows()) == 1


# --------------------------------------------------------------------- profiling, read-only
def _profile_read_only(path: str) -> dict:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        db = Database(path)
        x = tg.input("x", (8, 8))
        prog = tg.compile(tg.tanh(x) + x, db=db, profile="missing", backends=("numpy",))
        again = tg.compile(tg.exp(x) * x, db=db, profile="missing", backends=("numpy",))
        X = np.linspace(-1, 1, 64, dtype=np.float32).reshape(8, 8)
        out = {"measured": prog.stats["measured"] + again.stats["measured"],
               "rows": len(db.rows()), "sources": sorted({s.source for p in (prog, again)
                                                          for s in p.plan.steps}),
               "ok": bool(np.allclose(prog(x=X), np.tanh(X) + X, rtol=1e-5)),
               "warnings": [str(w.message) for w in caught
                            if issubclass(w.category, RuntimeWarning)]}
        db.close()
    return out


def test_profile_missing_on_a_read_only_database_measures_into_memory(shared_dir, as_reader,
                                                                       mk):
    path = shared_dir / "m.sqlite"
    with Database(path) as db:
        db.record(mk(kernel="kept"))
    path.chmod(0o444)
    shared_dir.chmod(0o555)
    before = path.read_bytes()
    out = as_reader(_profile_read_only, str(path))
    assert out["measured"] > 0 and out["rows"] == out["measured"] + 1, out
    assert out["sources"] == ["measured"] and out["ok"]
    (message,) = out["warnings"]  # once, for both compiles
    assert str(path) in message and "lost when it exits" in message and "TG_DB" in message
    assert path.read_bytes() == before
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    assert conn.execute("SELECT count(*) FROM measurements").fetchone()[0] == 1
    conn.close()
