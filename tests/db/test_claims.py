"""Profilers sharing one database split the work through claims: a lease its owner renews
while alive, taken over once it expires. Real processes on a real file and a real PostgreSQL
server: three profilers record each call once, and a profiler killed with SIGKILL mid-claim has
its calls taken over."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time
from pathlib import Path

import tensor_graphs as tg
from tensor_graphs.db import Database, current
from tensor_graphs.profiler import missing

WORK = [("numpy_add", "h1", '{"n":1}'), ("numpy_add", "h1", '{"n":2}'),
        ("numpy_mul", "h1", '{"n":1}')]


def _done(db: Database, item) -> None:
    from tensor_graphs.db import Measurement

    kernel, shash, sig = item
    db.record(Measurement(kernel, shash, sig, 5, 1e-5, 1e-5, 1e-5, 0.0))


def test_a_claim_is_held_until_recorded_or_expired(shared_target):
    path = shared_target
    a, b = Database(path), Database(path)  # two connections, as two processes have
    assert a.claim(WORK, "a", lease=1.0, limit=2) == ["claimed", "claimed", "later"]
    assert a.revision == 0  # claims change no estimate: cached plans stay valid
    assert b.claim(WORK, "b", lease=30) == ["held", "held", "claimed"]
    _done(a, WORK[0])  # recording releases the claim
    assert [c[0:2] for c in b.claims()] == [("numpy_add", '{"n":2}'), ("numpy_mul", '{"n":1}')]
    time.sleep(1.1)  # a's lease on the second call expires: its owner stopped renewing
    assert b.claim(WORK, "b", lease=30) == ["done", "claimed", "claimed"]
    assert a.claim(WORK, "a", lease=30) == ["done", "held", "held"]
    assert b.release("b") == 2 and not a.claims()
    a.close()
    b.close()


def test_claims_are_per_device_and_source_hash(shared_target, elsewhere):
    from tensor_graphs.db import Hardware

    with Database(shared_target) as db:
        assert db.claim(WORK[:1], "a", 30) == ["claimed"]
        other_device = Hardware("m", "another cpu", current().libs)
        assert db.claim(WORK[:1], "b", 30, hardware=other_device) == ["claimed"]
        assert db.claim([("numpy_add", "h2", '{"n":1}')], "b", 30) == ["claimed"]
        assert db.claim(WORK[:1], "b", 30, hardware=elsewhere) == ["held"]  # same device


def test_a_live_owner_renews_its_lease(shared_target):
    path = shared_target
    mine, other = Database(path), Database(path)
    claims = missing.Claims(mine, lease=0.8)
    assert claims.take([], 8) == []
    from types import SimpleNamespace

    option = SimpleNamespace(kernel=SimpleNamespace(name="numpy_add", source_hash="h1"),
                             signature='{"n":1}')
    assert claims.take([option], 8) == ["claimed"]
    time.sleep(2.0)  # two and a half leases: held only because the thread renews it
    assert other.claim(WORK[:1], "other", 30) == ["held"]
    claims.close()  # stops renewing and releases
    assert other.claim(WORK[:1], "other", 30) == ["claimed"]
    mine.close()
    other.close()


def test_an_old_file_gets_the_claims_table(tmp_path):
    path = tmp_path / "v3.sqlite"
    conn = sqlite3.connect(path)  # a v3 file: every migration but the last
    from tensor_graphs.db.store import APPLICATION_ID, MIGRATIONS

    for step in MIGRATIONS[:3]:
        for statement in step:
            conn.execute(statement)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    with Database(path) as db:
        assert db.claim(WORK[:1], "a", 30) == ["claimed"]


# --------------------------------------------------------------------- real profilers
CTX = multiprocessing.get_context("fork")  # children reuse the imported package: fast


def _profile(db: str, lease: float, go, results) -> None:
    """A profiler process: 24 calls (an add and a multiply on 12 shapes: 3 windows, 2 kernels
    to verify), measured with ``profile="missing"`` once ``go`` is set."""
    missing.LEASE_SECONDS = lease
    xs = [tg.input(f"x{n}", (n, 8)) for n in range(2, 14)]
    go.wait()
    prog = tg.compile([x * x + x for x in xs], db=db, profile="missing", backends=("numpy",))
    results.put((os.getpid(), prog.stats["measured"],
                 sorted({s.source for s in prog.plan.steps})))


def _start(db: Path | str, lease: float, go, results):
    proc = CTX.Process(target=_profile, args=(str(db), lease, go, results))
    proc.start()
    return proc


def _rows(db: Path | str) -> list[tuple]:
    if not isinstance(db, Path):  # a PostgreSQL URL
        with Database(db) as store:
            return [(m.kernel, m.signature, m.hardware.device, m.hardware.libs, m.when)
                    for m in store.rows()]
    conn = sqlite3.connect(db)
    try:
        return conn.execute('SELECT kernel, signature, device, libs, "when" FROM measurements'
                            ).fetchall()
    finally:
        conn.close()


def test_three_profilers_record_each_call_once(shared_target):
    db = Path(shared_target) if "://" not in shared_target else shared_target
    Database(db).close()  # created (and migrated) once, before they race
    go, results = CTX.Event(), CTX.Queue()
    procs = [_start(db, 10.0, go, results) for _ in range(3)]
    go.set()
    found = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    rows = _rows(db)
    distinct = {r[:4] for r in rows}
    assert len(distinct) == 24  # three windows of work to split
    assert len(rows) == len(distinct), f"{len(rows)} rows for {len(distinct)} calls"
    assert sum(measured for _, measured, _ in found) == len(rows)
    for _, _, sources in found:  # each waited for the others' rows before planning
        assert sources == ["measured"]
    with Database(db) as check:
        assert not check.claims()


def _claims_reader(db: Path | str):
    """A plain connection to read the claims table while a profiler works."""
    if isinstance(db, Path):
        return sqlite3.connect(db, timeout=10)
    import psycopg

    return psycopg.connect(db, autocommit=True)


def test_a_killed_profilers_claims_are_taken_over(shared_target):
    db = Path(shared_target) if "://" not in shared_target else shared_target
    Database(db).close()
    go, results = CTX.Event(), CTX.Queue()
    go.set()
    lease = 1.0
    victim = _start(db, lease, go, results)
    held: list[tuple] = []
    deadline = time.monotonic() + 60
    conn = _claims_reader(db)
    while not held and time.monotonic() < deadline:  # catch it holding claims, then kill it
        if conn.execute("SELECT count(*) FROM claims").fetchone()[0]:
            os.kill(victim.pid, signal.SIGSTOP)
            held = conn.execute("SELECT kernel, signature, expires FROM claims").fetchall()
            if not held:
                os.kill(victim.pid, signal.SIGCONT)
        time.sleep(0.002)
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(30)
    conn.close()
    assert held, "the profiler never held a claim"
    recorded_before = len(_rows(db))
    start = time.monotonic()
    taker = _start(db, lease, go, results)
    _, measured, sources = results.get(timeout=120)
    took = time.monotonic() - start
    taker.join(30)
    assert taker.exitcode == 0
    rows = _rows(db)
    assert len(rows) == len({r[:4] for r in rows}) == recorded_before + measured == 24
    assert sources == ["measured"]
    when = {(k, s): t for k, s, _, _, t in rows}
    for kernel, sig, expires in held:  # taken over, and only once the lease had run out
        assert when[kernel, sig] >= expires
    assert took < 30 * lease  # waited out one lease, not forever
    with Database(db) as check:
        assert not check.claims()
