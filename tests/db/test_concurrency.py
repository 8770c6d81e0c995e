"""Several writer processes at once lose nothing; a writer killed with SIGKILL loses nothing
it committed and leaves no lock behind."""

from __future__ import annotations

import multiprocessing
import os
import signal
import sqlite3
import time

from tensor_graphs.db import Database, Measurement, current

CTX = multiprocessing.get_context("fork")  # children reuse the imported package: fast


def measurement(kernel: str = "numpy_add", n: int = 1) -> Measurement:
    return Measurement(kernel, "h1", f'{{"n":{n}}}', 10, 1e-5, 1e-5, 2e-5, 1e-7)


def _writer(path: str, worker: int, rows: int, barrier) -> None:
    barrier.wait()  # all open the (not yet existing) file at once
    db = Database(path)
    for i in range(rows):
        db.record(measurement(kernel=f"k{worker}", n=i + 1))
    db.close()


def test_concurrent_writers_lose_nothing(tmp_path):
    current()  # compute the hardware key once, before forking
    path = str(tmp_path / "shared.sqlite")
    workers, rows = 4, 200
    barrier = CTX.Barrier(workers)
    procs = [CTX.Process(target=_writer, args=(path, w, rows, barrier)) for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    with Database(path) as db:
        assert len(db.rows()) == workers * rows
        assert db.revision == workers * rows
        assert db.stats()["kernels"] == workers
        for w in range(workers):
            assert len(db.rows_for(f"k{w}")) == rows


def _endless_writer(path: str, committed) -> None:
    db = Database(path)
    i = 0
    while True:  # single rows and batches, so the kill may land inside a transaction
        if i % 2:
            db.record(measurement(n=i))
            n = 1
        else:
            n = db.record_many(measurement(kernel="batch", n=i * 100 + j) for j in range(50))
        committed.value += n  # the only writer; unlocked, so a kill cannot leave a lock held
        i += 1


def test_sigkilled_writer_loses_nothing_committed_and_leaves_no_lock(tmp_path):
    current()
    path = str(tmp_path / "killed.sqlite")
    # a RawValue: a locked Value's lock, held by the writer as it was killed, hung `.value`
    committed = CTX.RawValue("i", 0)
    proc = CTX.Process(target=_endless_writer, args=(path, committed))
    proc.start()
    deadline = time.monotonic() + 30
    while committed.value < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert proc.exitcode == -signal.SIGKILL
    seen = committed.value
    assert seen >= 300
    conn = sqlite3.connect(path, timeout=1.0)  # no lock left: a write starts at once
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ROLLBACK")
    conn.close()
    with Database(path) as db:
        n = len(db.rows())
        assert seen <= n <= seen + 50  # at most the one commit not yet counted
        db.record(measurement(kernel="after"))
        assert len(db.rows()) == n + 1 and db.lookup("after", measurement().signature)
