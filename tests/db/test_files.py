"""Files: schema migrations, foreign and corrupt files (refused, never touched), read-only
files and directories (opened read-only: reads work, record says why it cannot)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from tensor_graphs.db import SCHEMA_VERSION, Database, current
from tensor_graphs.db.store import APPLICATION_ID
from tensor_graphs.errors import DatabaseError

V1_SCHEMA = [  # the schema as version 1 wrote it, frozen here on purpose
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT INTO meta (key, value) VALUES ('revision', 7)",
    """CREATE TABLE measurements (id INTEGER PRIMARY KEY, machine TEXT NOT NULL,
       device TEXT NOT NULL, libs TEXT NOT NULL, kernel TEXT NOT NULL,
       source_hash TEXT NOT NULL, signature TEXT NOT NULL, runs INTEGER NOT NULL,
       median REAL, min REAL, max REAL, error REAL, "when" REAL NOT NULL)""",
]


def make_v1(path: Path) -> None:
    hw = current()
    conn = sqlite3.connect(path)
    for statement in V1_SCHEMA:
        conn.execute(statement)
    conn.execute("INSERT INTO measurements VALUES (NULL, ?, ?, ?, 'numpy_add', 'h1', 'sig', "
                 "5, 1.0, 0.5, 2.0, 1e-7, 123.0)", (hw.machine, hw.device, hw.libs))
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 1")
    conn.commit()
    conn.close()


def pragmas(path: Path) -> tuple[int, int, str]:
    conn = sqlite3.connect(path)
    try:
        return tuple(conn.execute(f"PRAGMA {p}").fetchone()[0]
                     for p in ("application_id", "user_version", "journal_mode"))
    finally:
        conn.close()


def test_new_file_is_versioned_and_in_wal_mode(tmp_path, mk):
    path = tmp_path / "sub" / "new.sqlite"
    with Database(path) as db:
        assert db.open_mode == "rw" and not db.readonly
        db.record(mk())
    assert pragmas(path) == (APPLICATION_ID, SCHEMA_VERSION, "wal")
    with Database(path) as db:
        assert len(db.rows()) == 1 and db.revision == 1


@pytest.mark.parametrize("kind", ["empty file", "empty sqlite"])
def test_version_0_files_are_initialised(tmp_path, kind, mk):
    path = tmp_path / "v0.sqlite"
    if kind == "empty file":
        path.write_bytes(b"")
    else:  # a valid SQLite file with user_version 0 and no tables
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA user_version = 0")
        conn.execute("VACUUM")
        conn.close()
    with Database(path) as db:
        db.record(mk())
        assert db.revision == 1
    assert pragmas(path)[:2] == (APPLICATION_ID, SCHEMA_VERSION)


def test_v1_file_is_migrated_keeping_its_rows(tmp_path, mk):
    path = tmp_path / "v1.sqlite"
    make_v1(path)
    with Database(path) as db:
        (old,) = db.rows()
        assert (old.kernel, old.median, old.when, old.failure) == ("numpy_add", 1.0, 123.0, None)
        assert db.revision == 7
        db.set_calibration(None, {"flops": 1.0})  # a v2 table
        db.record(mk(failure="boom"))  # a v2 column
        assert db.revision == 9
    assert pragmas(path)[:2] == (APPLICATION_ID, SCHEMA_VERSION)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'index' "
                        "AND name = 'measurements_lookup'").fetchone()[0] == 1
    conn.close()


def test_foreign_sqlite_file_is_refused_and_untouched(tmp_path):
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError) as info:
        Database(path)
    msg = str(info.value)
    assert str(path) in msg and "another application" in msg and "users" in msg
    assert "TG_DB" in msg
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.sqlite"]


def test_foreign_application_id_without_tables_is_refused(tmp_path):
    path = tmp_path / "other.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA application_id = 1234")
    conn.execute("VACUUM")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="application_id 1234"):
        Database(path)
    assert path.read_bytes() == before


def test_newer_schema_is_refused_and_untouched(tmp_path):
    path = tmp_path / "future.sqlite"
    make_v1(path)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.commit()
    conn.close()
    before = path.read_bytes()
    with pytest.raises(DatabaseError, match="newer tensor_graphs"):
        Database(path)
    assert path.read_bytes() == before


@pytest.mark.parametrize("kind", ["random bytes", "damaged sqlite", "text"])
def test_corrupt_file_is_refused_and_untouched(tmp_path, kind, mk):
    path = tmp_path / "bad.sqlite"
    if kind == "random bytes":
        path.write_bytes(b"\x00garbage" + os.urandom(8192))
    elif kind == "text":
        path.write_text("measurements, but as CSV\n1,2,3\n")
    else:  # a real header followed by garbage pages
        with Database(path) as db:
            db.record(mk())
        data = bytearray(path.read_bytes())
        data[100:] = os.urandom(len(data) - 100)
        path.write_bytes(bytes(data))
    before = path.read_bytes()
    with pytest.raises(DatabaseError) as info:
        Database(path)
    assert str(path) in str(info.value) and "untouched" in str(info.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.sqlite"]


def test_a_directory_is_refused(tmp_path):
    with pytest.raises(DatabaseError, match="is a directory"):
        Database(tmp_path)


# --------------------------------------------------------------------- read-only
def _read_and_try_to_write(path: str, record) -> dict:
    db = Database(path)
    out = {"readonly": db.readonly, "reason": db.readonly_reason, "mode": db.open_mode,
           "rows": len(db.rows()), "revision": db.revision,
           "lookup": db.lookup(record.kernel, record.signature) is not None}
    try:
        db.record(record)
        out["record"] = "recorded"
    except DatabaseError as exc:
        out["record"] = str(exc)
    db.close()
    return out


def _filled(directory: Path, mk, name: str = "m.sqlite") -> Path:
    path = directory / name
    with Database(path) as db:
        db.record(mk())
        db.record(mk(n=8))
    path.chmod(0o644)
    return path


def test_read_only_file(shared_dir, as_reader, mk):
    path = _filled(shared_dir, mk)
    path.chmod(0o444)
    shared_dir.chmod(0o777)
    before = path.read_bytes()
    out = as_reader(_read_and_try_to_write, str(path), mk())
    assert out["readonly"] and out["rows"] == 2 and out["lookup"] and out["revision"] == 2
    assert "not writable" in out["reason"]
    assert "read-only" in out["record"] and str(path) in out["record"]
    assert path.read_bytes() == before


def test_read_only_directory_falls_back_to_immutable(shared_dir, as_reader, mk):
    path = _filled(shared_dir, mk)  # WAL mode, no -shm left: mode=ro cannot open it
    assert not (shared_dir / "m.sqlite-shm").exists()
    shared_dir.chmod(0o555)
    before = path.read_bytes()
    out = as_reader(_read_and_try_to_write, str(path), mk())
    assert out["readonly"] and out["rows"] == 2 and out["lookup"]
    assert out["mode"] == "immutable" and "directory" in out["reason"]
    assert "read-only" in out["record"]
    assert path.read_bytes() == before


def test_read_only_directory_without_a_file_plans_with_an_empty_database(shared_dir, as_reader, mk):
    shared_dir.chmod(0o555)
    out = as_reader(_read_and_try_to_write, str(shared_dir / "missing.sqlite"), mk())
    assert out["readonly"] and out["rows"] == 0 and not out["lookup"]
    assert "read-only" in out["record"]
    assert not (shared_dir / "missing.sqlite").exists()


def test_read_only_old_schema_is_read_through_a_migrated_copy(shared_dir, as_reader, mk):
    path = shared_dir / "v1.sqlite"
    make_v1(path)
    path.chmod(0o444)
    before = path.read_bytes()
    out = as_reader(_read_and_try_to_write, str(path), mk())
    assert out["readonly"] and out["rows"] == 1 and out["revision"] == 7
    assert path.read_bytes() == before and pragmas(path)[1] == 1
