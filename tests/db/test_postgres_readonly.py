"""A profiler whose PostgreSQL role may not record (a team's read-only account, or a grant
revoked while it runs) keeps what it measures in memory for its process, as on a read-only
SQLite file: its plans use those rows, the server gets nothing, and one warning names the
grants missing. On the session's real server (conftest.py's ``pg_server``)."""

from __future__ import annotations

import warnings

import pytest

import tensor_graphs as tg
from tensor_graphs.db import Database

from .conftest import measurement


def _server(url: str) -> dict:
    """What the server holds: rows, claims and the revision counter."""
    import psycopg

    with psycopg.connect(url) as conn:
        return {"rows": conn.execute("SELECT count(*) FROM measurements").fetchone()[0],
                "claims": conn.execute("SELECT count(*) FROM claims").fetchone()[0],
                "revision": conn.execute("SELECT value FROM meta WHERE key = 'revision'"
                                         ).fetchone()[0]}


@pytest.fixture
def role(pg_url):
    """A function making a login role on ``pg_url``'s database with the given grants on its
    tables (the schema made first, by the owner, with one row); returns the role's URL."""
    import psycopg

    with Database(pg_url) as db:
        db.record(measurement())
    made: list[str] = []
    suffix = pg_url.rsplit("/", 1)[1]

    def make(name: str, grants: str) -> str:
        who = f"{name}_{suffix}"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"DROP ROLE IF EXISTS {who}")
            conn.execute(f"CREATE ROLE {who} LOGIN")
            conn.execute(f"GRANT {grants} ON ALL TABLES IN SCHEMA public TO {who}")
        made.append(who)
        return pg_url.replace("postgres@", f"{who}@")

    yield make
    with psycopg.connect(pg_url, autocommit=True) as conn:
        for who in made:
            conn.execute(f"DROP OWNED BY {who}")
            conn.execute(f"DROP ROLE {who}")


def _graph():
    xs = [tg.input(f"x{n}", (n, 8)) for n in (3, 5, 7)]
    return [x * x + x for x in xs]


def _profile(db: Database) -> tuple[tg.Program, list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prog = tg.compile(_graph(), db=db, profile="missing", backends=("numpy",))
    return prog, [w for w in caught if "kept in memory" in str(w.message)]


def test_a_read_only_role_profiles_into_memory_and_the_server_gets_nothing(role, pg_url):
    reader = Database(role("reader", "SELECT"))
    before = _server(pg_url)
    try:
        assert reader.readonly
        prog, warned = _profile(reader)
        assert len(warned) == 1, [str(w.message) for w in warned]
        text = str(warned[0].message)
        assert "GRANT INSERT ON measurements TO reader_" in text  # the fix, named
        assert "GRANT INSERT, UPDATE, DELETE ON claims" in text
        measured = prog.stats["measured"]
        assert measured > 0
        assert {s.source for s in prog.plan.steps} == {"measured"}  # planned on its rows
        kernel = prog.plan.steps[0].kernel.name
        assert reader.rows(kernel)  # read back beside the server's rows
        assert reader.stats()["in_memory"] == measured
        assert reader.lookup("numpy_add", measurement().signature).ok  # the server's still
        assert _server(pg_url) == before  # nothing written, no claim left
        again, warned = _profile(reader)  # the same process plans from them: nothing to do
        assert again.stats["measured"] == 0 and not warned
    finally:
        reader.close()
    assert _server(pg_url) == before


def test_a_grant_revoked_mid_run_switches_to_memory_and_leaves_nothing_half_written(
        role, pg_url):
    import psycopg

    url = role("writer", "SELECT, INSERT, UPDATE, DELETE")
    writer = Database(url)
    try:
        assert not writer.readonly  # may write when opened
        who = url.split("://", 1)[1].split("@", 1)[0]
        with psycopg.connect(pg_url, autocommit=True) as conn:  # then it may not
            conn.execute(f"REVOKE INSERT ON measurements FROM {who}")
        before = _server(pg_url)
        prog, warned = _profile(writer)  # the first record is refused: no row, no claim kept
        assert len(warned) == 1 and f"GRANT INSERT ON measurements TO {who}" in \
            str(warned[0].message)
        assert prog.stats["measured"] > 0
        assert {s.source for s in prog.plan.steps} == {"measured"}
        assert writer.stats()["in_memory"] == prog.stats["measured"]
        assert _server(pg_url) == before
    finally:
        writer.close()
