"""A write the server refused for a missing grant asks which grants are missing (a query that
may retry with backoff, ``_attempt``) before taking the database's lock: holding it there
stalled every other thread's record for the whole retry. No server needed: the query is
stood in for."""

from __future__ import annotations

import threading

import pytest

from tensor_graphs.db import postgres
from tensor_graphs.errors import DatabaseError


def test_the_missing_grants_are_asked_for_outside_the_lock():
    db = object.__new__(postgres.PostgresDatabase)  # no server: only what _refused reads
    db.path, db.readonly, db.readonly_reason = "postgresql://server/db", False, None
    db._lock, db._fallback = threading.RLock(), False
    free = []

    def attempt(work, what, transaction=False, locks=()):
        taken = []  # another thread's record takes the lock while the query runs
        t = threading.Thread(target=lambda: taken.append(db._lock.acquire(timeout=5)
                                                         and db._lock.release() is None))
        t.start()
        t.join()
        free.append(taken == [True])
        return "GRANT INSERT ON measurements TO reader"

    db._attempt = attempt
    with pytest.raises(DatabaseError, match="GRANT INSERT ON measurements"):
        db._refused(postgres._RefusedError("refused"))
    assert free == [True]
    assert db.readonly and db.readonly_reason == "GRANT INSERT ON measurements TO reader"
