"""``profile="missing"``: measure every kernel call a plan considered that has no row.

The planner has already listed every option of every slot it visited; the calls worth
measuring are its kernel options whose estimate is not a measurement on this hardware (one per
kernel and signature). The float64-reference kernels (numpy_exact_*) are measured only where a
slot has nothing else. Each kernel is verified (``tg.kernels.verify``) before its first
measurement; one that fails verification is recorded as a failure and never measured.

The calls go in the graph's order (a slot's options, and those of the slots next to it, side by
side) and are timed ``WINDOW`` at a time in interleaved rounds (``measure_together``), so a
fused kernel and the unfused steps it competes with are measured under the same load.

Profilers sharing a database file split the work: before measuring a window each claims its
calls in the database (``Database.claim``), skipping calls another live profiler holds, and
waits at the end for those to be recorded. A claim is a lease its owner renews from a thread
every third of ``LEASE_SECONDS`` while alive; a killed profiler's claims expire and are taken
over, so no one waits on a dead one. Three profilers on one file used to measure everything
three times (600 rows for 200 calls). On a read-only database the rows go into a private
in-memory copy (``Database.record_in_memory``, warned once): plans of this process use them,
nothing is kept.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator, Sequence

from tensor_graphs.db.cost import is_exact_kernel
from tensor_graphs.db.store import Database, Measurement
from tensor_graphs.errors import DatabaseError
from tensor_graphs.kernels import generated
from tensor_graphs.planner.plan import KERNEL, Option
from tensor_graphs.planner.search import Planner
from tensor_graphs.profiler.measure import Call, measure_together
from tensor_graphs.profiler.progress import Progress

_verified: dict[str, str | None] = {}  # kernel name -> None when it passed, else the reason
WINDOW = 8  # calls timed together in interleaved rounds (their arrays are alive together)
LEASE_SECONDS = 30.0  # a claim's life unless renewed: how long a dead profiler's work waits


def calls_to_measure(planner: Planner) -> list[Option]:
    """The planner's kernel options without a measurement, one per (kernel, signature), in the
    order of the slots (bottom-up: a node's options next to those of its inputs)."""
    found: dict[tuple[str, str], Option] = {}
    for options in planner._options.values():
        alternatives = [o for o in options if o.how == KERNEL]
        for o in alternatives:
            if o.estimate.source in ("measured", "free") or o.kernel.device != "cpu":
                continue
            if is_exact_kernel(o.kernel) and len(alternatives) > 1:
                continue
            found.setdefault((o.kernel.name, o.signature), o)
    return list(found.values())


def verified(kernel) -> str | None:
    """None when ``kernel`` passes verification (cached per process), else why not. A
    generated kernel is built first (``generated.realize``: compiled, then checked against the
    float64 reference); one that fails is never timed."""
    if kernel.name not in _verified:
        from tensor_graphs.kernels.verify import verify

        try:
            report = verify(generated.realize(kernel))
            _verified[kernel.name] = None if report.ok else report.summary()
        except Exception as exc:  # noqa: BLE001 - a broken kernel is recorded, not fatal
            _verified[kernel.name] = f"{type(exc).__name__}: {exc}"
    return _verified[kernel.name]


def call_of(o: Option) -> Call:
    """The option's kernel call (a generated kernel already built: see ``verified``)."""
    args = tuple(n.node for n in o.needs)
    node = getattr(o.kernel, "computes", None) or o.slot.node
    return Call(generated.realize(o.kernel), node, args, dict(o.attrs), o.signature,
                o.features.flops, o.features.bytes)


def measure_options(options: list[Option]):
    """Verify each option's kernel (once per process), then measure the calls ``WINDOW`` at a
    time in interleaved rounds; yields (option, Measurement) per window, in order. A kernel
    that fails verification gives a failure row and is never timed."""
    nan = float("nan")
    for i in range(0, len(options), WINDOW):
        window = options[i:i + WINDOW]
        failures = {id(o): verified(o.kernel) for o in window}
        timed = [o for o in window if failures[id(o)] is None]
        rows = dict(zip(map(id, timed), measure_together([call_of(o) for o in timed])))
        yield [(o, rows.get(id(o)) or Measurement(
            o.kernel.name, o.kernel.source_hash, o.signature, 0, nan, nan, nan, None,
            f"verification failed: {failures[id(o)]}")) for o in window]


class Claims:
    """This process's claims in ``db``: taken a window at a time, renewed by a daemon thread
    every third of ``lease`` while the process lives, released by ``record`` (row by row) or
    by ``release``. The owner id (host, pid, random) is new per instance, so a reused pid
    never inherits a dead process's claims."""

    def __init__(self, db: Database, lease: float):
        self.db, self.lease = db, float(lease)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def take(self, options: Sequence[Option], limit: int) -> list[str]:
        """``Database.claim`` for the options' calls, in order."""
        states = self.db.claim([(o.kernel.name, o.kernel.source_hash, o.signature)
                                for o in options], self.owner, self.lease, limit)
        if "claimed" in states and self._thread is None:
            self._thread = threading.Thread(target=self._renew, name="tg-profiler-claims",
                                            daemon=True)
            self._thread.start()
        return states

    def _renew(self) -> None:
        while not self._stop.wait(self.lease / 3):
            try:
                self.db.renew(self.owner, self.lease)
            except DatabaseError:  # closed under us: the claims die with their lease
                return

    def release(self) -> None:
        self.db.release(self.owner)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            self.release()
        except DatabaseError:
            pass


class Work:
    """``options`` measured window by window (iterate: one list of (option, Measurement) per
    window, which the caller records), split with the other profilers of ``db``. The calls
    another profiler holds are waited for (polled, each poll a quarter lease or 0.5 s) until
    recorded or their lease expires; ``deadline`` (a ``time.monotonic()``) stops the walk
    after the window that passes it. Afterwards ``pending`` is what no one recorded (out of
    time) and ``by_others`` how many calls others recorded."""

    def __init__(self, db: Database, options: Sequence[Option], lease: float | None = None,
                 deadline: float | None = None):
        self.db, self.deadline = db, deadline
        self.lease = LEASE_SECONDS if lease is None else float(lease)
        self.pending = list(options)
        self.by_others = 0

    def __iter__(self) -> Iterator[list[tuple[Option, Measurement]]]:
        claims = Claims(self.db, self.lease)
        started = False
        try:
            while self.pending:
                if started and self.deadline is not None and time.monotonic() > self.deadline:
                    return
                states = claims.take(self.pending, WINDOW)
                window = [o for o, s in zip(self.pending, states) if s == "claimed"]
                self.by_others += states.count("done")
                self.pending = [o for o, s in zip(self.pending, states) if s in ("held", "later")]
                started = True
                if not window:  # all held by live profilers: wait for their rows
                    time.sleep(min(0.5, self.lease / 4))
                    continue
                yield from measure_options(window)
                claims.release()  # what the caller did not record
        finally:
            claims.close()


def profile_missing(planner: Planner, db: Database, progress: bool = True,
                    lease: float | None = None) -> int:
    """Measure and record what the planner's options miss, split with other profilers of the
    same file (see the module doc; ``lease`` defaults to ``LEASE_SECONDS``); on a read-only
    database into memory for this process, with a warning. Returns how many rows this process
    added."""
    todo = calls_to_measure(planner)
    if not todo:
        return 0
    db.record_in_memory()  # a read-only database: keep the rows for this process's plans
    bar = Progress(len(todo), "profiling") if progress else None
    added = 0
    for window in Work(db, todo, lease):
        for o, m in window:
            db.record(m)
            added += 1
            if bar is not None:
                bar.step(o.kernel.name)
    if bar is not None:
        bar.close()
    return added
