"""What only a server does to the store: connections that drop mid-batch, writers in other
processes sending the same rows, batches resent after an unknown outcome, databases that are
not ours, and rows moved between an SQLite file and the server with `tg db export/import`.
All on a real PostgreSQL server (conftest.py's ``pg_server``)."""

from __future__ import annotations

import math
import multiprocessing
import threading
import time

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.cli import main
from tensor_graphs.db import Database, Measurement, open_db
from tensor_graphs.db import postgres as pg
from tensor_graphs.errors import DatabaseError

from .conftest import measurement

CTX = multiprocessing.get_context("fork")


def _many(count: int, kernel: str = "numpy_add") -> list[Measurement]:
    """``count`` distinct rows with fixed times, so a resend is the same rows."""
    return [measurement(kernel=kernel, n=i + 1, median=(i + 1) * 1e-6, when=1000.0 + i)
            for i in range(count)]


def _count(url: str) -> tuple[int, int]:
    import psycopg

    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*), count(DISTINCT (kernel, signature, \"when\")) "
                            "FROM measurements").fetchone()


def _terminate(admin_url: str, database: str, query: str, timeout: float = 30.0) -> bool:
    """End the backend of ``database`` running a statement starting with ``query`` inside a
    transaction, as soon as one shows; True once one was ended."""
    import psycopg

    deadline = time.monotonic() + timeout
    with psycopg.connect(admin_url, autocommit=True) as admin:
        while time.monotonic() < deadline:
            row = admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s "
                "AND xact_start IS NOT NULL AND query LIKE %s LIMIT 1",
                (database, query + "%")).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.001)
    return False


def test_a_connection_dropped_mid_batch_is_retried_with_nothing_lost_or_doubled(pg_server,
                                                                                pg_url):
    db = Database(pg_url)
    rows = _many(40 * pg.BATCH)  # 40 statements in one transaction
    errors: list[BaseException] = []

    def write() -> None:
        try:
            db.record_many(rows)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    writer = threading.Thread(target=write)
    writer.start()
    ended = _terminate(f"{pg_server}/postgres", pg_url.rsplit("/", 1)[1],
                       "INSERT INTO measurements")
    writer.join(120)
    assert ended, "the batch finished before its backend could be ended"
    assert not errors, errors
    assert _count(pg_url) == (len(rows), len(rows))
    assert db.revision == 1  # the ended transaction rolled back whole; the retry committed
    db.close()


def test_a_pooled_connection_ended_between_calls_is_replaced(pg_server, pg_url):
    import psycopg

    db = Database(pg_url)
    db.record(measurement())
    with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as admin:
        ended = admin.execute("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                              "WHERE datname = %s AND pid <> pg_backend_pid()",
                              (pg_url.rsplit("/", 1)[1],)).fetchone()[0]
    assert ended >= 1
    assert db.lookup("numpy_add", measurement().signature).ok
    db.close()


def test_a_batch_resent_after_it_committed_adds_nothing(pg_url):
    """A COMMIT whose answer was lost with the connection is resent whole by the retry: the
    natural key keeps the rows single and the revision where the first send left it."""
    db = Database(pg_url)
    rows = _many(2500)
    assert db.record_many(rows) == len(rows) and db.revision == 1
    db.record_many(rows)
    db.record(rows[7])
    assert _count(pg_url) == (len(rows), len(rows)) and db.revision == 1
    db.close()


def _send(url: str, rows: list[Measurement], reverse: bool, go) -> None:
    go.wait()
    with Database(url) as db:
        order = rows[::-1] if reverse else rows
        for start in range(0, len(order), 100):
            db.record_many(order[start:start + 100])


def test_two_processes_upserting_the_same_keys_store_each_once(pg_url):
    Database(pg_url).close()  # migrated once, before they race
    rows = _many(3000)
    go = CTX.Event()
    procs = [CTX.Process(target=_send, args=(pg_url, rows, reverse, go))
             for reverse in (False, True)]  # opposite orders: they meet on every key
    for p in procs:
        p.start()
    go.set()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert _count(pg_url) == (len(rows), len(rows))


def _backends(pg_server: str, url: str) -> set[int]:
    import psycopg

    with psycopg.connect(f"{pg_server}/postgres") as admin:
        return {r[0] for r in admin.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s",
                                            (url.rsplit("/", 1)[1],))}


def _use_in_child(db: Database, results) -> None:
    db.record(measurement(n=77))
    with db._read() as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
    results.put((len(db.rows()), backend))
    db.close()


def test_a_database_opened_before_a_fork_works_in_the_child_and_stays_the_parents(pg_server,
                                                                                  pg_url):
    """A child sending on its parent's sockets would interleave with the parent's session,
    and closing them would end it: the child gets connections of its own."""
    db = Database(pg_url)
    db.record(measurement(n=1))
    parents = _backends(pg_server, pg_url)
    results = CTX.Queue()
    child = CTX.Process(target=_use_in_child, args=(db, results))
    child.start()
    rows, backend = results.get(timeout=60)
    child.join(30)
    assert child.exitcode == 0 and rows == 2
    assert backend not in parents
    assert parents <= _backends(pg_server, pg_url)  # the parent's sessions live on
    assert len(db.rows()) == 2 and db.revision == 2
    db.close()


def test_a_database_of_another_application_or_a_newer_version_is_refused(pg_url):
    import psycopg

    with Database(pg_url) as db:
        db.record(measurement())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema'")
    with pytest.raises(DatabaseError, match="newer tensor_graphs.*schema version 99"):
        Database(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP TABLE meta, measurements, calibration, claims")
        conn.execute("CREATE TABLE measurements (x int)")
        conn.execute("INSERT INTO measurements VALUES (1)")
    with pytest.raises(DatabaseError, match="did not make") as info:
        Database(pg_url)
    assert "measurements" in str(info.value)
    with psycopg.connect(pg_url) as conn:  # left untouched
        assert conn.execute("SELECT * FROM measurements").fetchall() == [(1,)]


def test_a_role_that_may_only_read_plans_from_the_rows_and_refuses_records(pg_url):
    """(Unless a profiler keeps its rows in memory: test_postgres_readonly.py.)"""
    import psycopg

    with Database(pg_url) as db:
        db.record(measurement())
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"DROP ROLE IF EXISTS reader_{name}")
        conn.execute(f"CREATE ROLE reader_{name} LOGIN")
        conn.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader_{name}")
    reader = Database(pg_url.replace("postgres@", f"reader_{name}@"))
    try:
        assert reader.readonly and f"GRANT INSERT ON measurements TO reader_{name}" in \
            reader.readonly_reason
        assert reader.lookup("numpy_add", measurement().signature).ok
        with pytest.raises(DatabaseError, match="read-only .*GRANT INSERT ON measurements"):
            reader.record(measurement(n=9))
        with pytest.raises(DatabaseError, match="read-only"):
            reader.claim([("k", "h", "s")], "me", 10)
    finally:
        reader.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY reader_{name}")
            conn.execute(f"DROP ROLE reader_{name}")


def test_an_unreachable_server_names_the_url_without_its_password(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for opener in (Database, open_db):
        with pytest.raises(DatabaseError) as info:
            opener("postgresql://someone:secret@127.0.0.1:1/tg")
        msg = str(info.value)
        assert "postgresql://someone:***@127.0.0.1:1/tg" in msg and "secret" not in msg
        assert "TG_DB" in msg
    assert list(tmp_path.iterdir()) == []  # never taken for a file path ("postgresql:/...")


@pytest.mark.parametrize("url, says", [
    ("postgresql://someone:secret@[::1/tg", 'in URI: "postgresql://someone:***@[::1/tg"'),
    ("postgresql://someone:se%zzcret@127.0.0.1:1/tg", 'percent-encoded token: "***"'),
    ("postgresql://someone:secret@127.0.0.1:1/tg", "Connection refused Is the server"),
])
def test_what_libpq_says_is_one_line_without_the_password(url, says, capsys, monkeypatch):
    """libpq quotes a URL it cannot parse, password and all, or the password itself, and its
    "Connection refused" ends in a second, tab-indented line: `tg db stats --db URL` printed
    the password on the terminal, and an error of two lines."""
    monkeypatch.delenv("TG_DEBUG", raising=False)
    assert main(["db", "stats", "--db", url]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err, err
    assert "secret" not in err and "se%zzcret" not in err, err


def test_tg_db_names_a_server_database(pg_url, monkeypatch):
    monkeypatch.setenv("TG_DB", pg_url)
    db = open_db()
    assert isinstance(db, pg.PostgresDatabase) and db.path == pg_url
    assert open_db(pg_url) is db  # once per process, like a file
    db.close()


def _all(db: Database) -> set[tuple]:
    def nan(x):
        return None if x is None or math.isnan(x) else x

    return {(m.kernel, m.source_hash, m.signature, m.runs, nan(m.median), nan(m.min),
             nan(m.max), m.error, m.failure, m.hardware, m.when, m.flops, m.bytes)
            for m in db.rows()}


def test_export_sqlite_to_postgresql_and_back_is_equal(pg_url, tmp_path, elsewhere, capsys):
    first, second = tmp_path / "first.sqlite", tmp_path / "second.sqlite"
    with Database(first) as db:
        db.record_many(_many(50))
        db.record(measurement(n=99, hardware=elsewhere, flops=1e6, bytes=4e3))
        db.record(Measurement("numpy_mul", "h", measurement(n=3).signature, 0, math.nan,
                              math.nan, math.nan, None, failure="RuntimeError: boom\ntrace"))
        want = _all(db)
    assert main(["db", "export", "--db", str(first), pg_url]) == 0
    assert "exported 52 new rows" in capsys.readouterr().out
    assert main(["db", "export", "--db", str(first), pg_url]) == 0  # again: nothing new
    assert "exported 0 new rows" in capsys.readouterr().out
    assert main(["db", "import", "--db", str(second), pg_url]) == 0
    assert "imported 52 new rows" in capsys.readouterr().out
    with Database(pg_url) as server, Database(second) as back:
        assert _all(server) == want and _all(back) == want
    assert main(["db", "stats", "--db", pg_url]) == 0
    out = capsys.readouterr().out
    assert f"database   {pg_url}" in out and "rows       52 (" in out
    assert main(["db", "prune", "--failures", "--db", pg_url]) == 0
    assert "pruned 1 rows" in capsys.readouterr().out
    jsonl = tmp_path / "rows.jsonl"  # and through a file, as between machines
    assert main(["db", "export", "--db", pg_url, str(jsonl)]) == 0
    with Database(tmp_path / "third.sqlite") as third:
        assert third.import_jsonl(jsonl) == 51
        assert _all(third) == {r for r in want if r[8] is None}  # all but the pruned failure
    open_db(pg_url).close()


def _graph():
    x = tg.input("x", (8, 16))
    return x, tg.tanh(x) * 2.0


def _compile_elsewhere(url: str, results) -> None:
    """A second process (no plan cache of the first): what it had to measure, and its plan."""
    x, graph = _graph()
    prog = tg.compile(graph, db=url, profile="missing", backends=("numpy",))
    X = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32)
    results.put((prog.stats["measured"], sorted({s.source for s in prog.plan.steps}),
                 float(np.max(np.abs(prog(x=X) - np.tanh(X) * 2.0)))))


def test_a_profile_run_writes_to_the_server_and_a_second_compile_reads_it(pg_url):
    _, graph = _graph()
    first = tg.compile(graph, db=pg_url, profile="missing", backends=("numpy",))
    assert first.stats["measured"] > 0
    open_db(pg_url).close()  # no pool threads across the fork
    with Database(pg_url) as server:
        stored = len(server.rows())
    assert stored >= first.stats["measured"]
    results = CTX.Queue()
    proc = CTX.Process(target=_compile_elsewhere, args=(pg_url, results))
    proc.start()
    measured, sources, error = results.get(timeout=120)
    proc.join(30)
    assert proc.exitcode == 0
    assert measured == 0 and sources == ["measured"] and error < 1e-5
    with Database(pg_url) as server:
        assert len(server.rows()) == stored


def test_a_server_gone_for_good_fails_a_write_in_seconds(pg_server, pg_url, monkeypatch,
                                                          capfd):
    """Connections refused from the first retry on: the write ends with the one error after
    RETRY_SECONDS, not after 8 attempts of the pool's own 30 s each (8 minutes for a
    profile), and the pool's failed connects are not printed line by line."""
    import psycopg

    monkeypatch.setattr(pg, "RETRY_SECONDS", 3.0)
    monkeypatch.setattr(pg, "CONNECT_TIMEOUT", 2)
    db = Database(pg_url)
    db.record(measurement())
    name = pg_url.rsplit("/", 1)[1]
    with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS false")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (name,))
    try:
        start = time.monotonic()
        with pytest.raises(tg.DatabaseError, match="failed .* times.*check that the server"):
            db.record(measurement(n=8))
        assert time.monotonic() - start < 20
        assert "error connecting" not in capfd.readouterr().err
    finally:
        with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE {name} ALLOW_CONNECTIONS true")
        db.close()
