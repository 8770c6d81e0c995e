"""N profilers at once on one database: the work split (each (kernel, signature, hardware)
measured once) and the wall time against one profiler alone.

    OMP_NUM_THREADS=2 python benchmarks/profilers.py [--graph gpt2-2] [--profilers 4]
                                                     [--stores sqlite,postgresql]
                                                     [--phases] [--cold]

Each profiler is a forked process doing what ``tg profile`` does before it runs paths: plan the
graph (batch=1, seq=128) against the shared database, list the calls without a row
(``missing.calls_to_measure``: every candidate, generated kernels included) and measure them
window by window through the claims (``missing.Work``), recording each row. All start
together (a barrier after their imports and the graph's preparation); the wall time runs from
the barrier to the last one's end. One untimed warm-up profile first (the C and
generated-kernel caches on disk warm, so no run pays compiles another does not); then per
store one profiler alone on a fresh database, then N on another fresh database. PostgreSQL: a
private server started like the tests' (Debian's initdb and pg_ctl, loopback, fsync=off).
Prints rows, distinct calls, each profiler's share, wall times, their ratio and the load
average around each run; ``--phases``: each profiler's seconds per phase (planning, listing,
claims, C compiles, verification and the wait for another's, timing, recording, the wait for
rows others hold), each timed by wrapping the function that does it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CTX = multiprocessing.get_context("fork")
DIMS = {"batch": 1, "seq": 128}


class Phases:
    """Seconds per phase of one profiler (``--phases``): each named function wrapped in a timer
    that charges its time to one phase (an inner phase's time is taken out of the outer's)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}
        self._stack: list[list] = []

    def wrap(self, owner, attr: str, phase: str, outermost: bool = False) -> None:
        """``outermost``: charged only when no other phase is running (a sleep inside one is
        that phase's)."""
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            if outermost and self._stack:
                return inner(*args, **kwargs)
            frame = [phase, time.perf_counter(), 0.0]
            self._stack.append(frame)
            try:
                return inner(*args, **kwargs)
            finally:
                self._stack.pop()
                spent = time.perf_counter() - frame[1]
                self.seconds[phase] = self.seconds.get(phase, 0.0) + spent - frame[2]
                self.calls[phase] = self.calls.get(phase, 0) + 1
                if self._stack:
                    self._stack[-1][2] += spent
        setattr(owner, attr, timed)

    def install(self) -> None:
        """The phases of a profiler: planning, listing, claims (and waits for others' rows),
        C compiles, verification (and the wait for another profiler's, ``shared_verify``),
        measuring, recording, and the wait for the rows of calls others hold."""
        import types

        from tensor_graphs.db.store import Database
        from tensor_graphs.kernels.c import build
        from tensor_graphs.planner.search import Planner
        from tensor_graphs.profiler import missing, shared_verify

        self.wrap(Planner, "plan", "plan")
        self.wrap(missing, "calls_to_measure", "list")
        stores = [Database]
        try:
            from tensor_graphs.db.postgres import PostgresDatabase

            stores.append(PostgresDatabase)  # its own claim and record
        except ImportError:
            pass
        for store in stores:
            self.wrap(store, "claim", "claim")
            self.wrap(store, "record", "record")
        self.wrap(build, "_compile_to", "compile")
        self.wrap(missing, "verified", "verify")
        self.wrap(missing, "measure_together", "measure")
        self.wrap(shared_verify, "_lock", "wait for a verification")
        clock = types.SimpleNamespace(**{k: getattr(time, k) for k in dir(time)
                                         if not k.startswith("_")})
        self.wrap(clock, "sleep", "wait for others", outermost=True)
        missing.time = clock


def _profiler(graph: str, db: str, barrier, results, phases: bool = False) -> None:
    from tensor_graphs.commands.profile import load_graph
    from tensor_graphs.compiler import Pipeline, prepare
    from tensor_graphs.ir.graph import _as_list
    from tensor_graphs.profiler import missing

    settings = Pipeline(_as_list(load_graph(graph)), "cpu", 1e-5, db, "never", None)
    prepared = prepare(settings.outputs, DIMS)
    clock = Phases()
    if phases:
        clock.install()
    barrier.wait()
    start = time.time()
    planner = settings.planner(prepared, blocks=False)
    planner.plan()  # lists every option of every slot
    work = missing.Work(settings.db, missing.calls_to_measure(planner),
                        hardware=planner.cost.hardware)
    measured = 0
    for window in work:
        for _, m in window:
            settings.db.record(m)
            measured += 1
    results.put((os.getpid(), measured, work.by_others, start, time.time(), clock.seconds,
                 clock.calls))


def run(graph: str, db: str, n: int, phases: bool = False) -> dict:
    """``n`` profilers of ``graph`` on ``db`` at once; their figures and the rows made."""
    from tensor_graphs.db import Database

    Database(db).close()  # created and migrated once, before they race
    barrier, results = CTX.Barrier(n), CTX.Queue()
    procs = [CTX.Process(target=_profiler, args=(graph, db, barrier, results, phases))
             for _ in range(n)]
    load = os.getloadavg()[0]
    for p in procs:
        p.start()
    done = [results.get(timeout=3600) for _ in procs]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, p.exitcode
    with Database(db) as store:
        rows = [(m.kernel, m.signature, m.hardware.device, m.hardware.libs) for m in store.rows()]
    return {"n": n, "wall": max(d[4] for d in done) - min(d[3] for d in done),
            "shares": sorted(d[1] for d in done), "rows": len(rows),
            "distinct": len(set(rows)), "load_before": load, "load_after": os.getloadavg()[0],
            "phases": [(d[1], d[4] - d[3], d[5], d[6]) for d in done]}


def start_postgres() -> tuple[str, callable]:
    """A private PostgreSQL server (as in tests/db/conftest.py): its base URL and a stop."""
    import socket

    pgbin = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))[-1].parent
    folder = Path(tempfile.mkdtemp(prefix="tg-pg-bench-"))
    prefix = []
    if os.geteuid() == 0:
        import pwd

        user = pwd.getpwnam("postgres")
        os.chown(folder, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = folder / "data"
    subprocess.run([*prefix, str(pgbin / "initdb"), "-D", str(data), "-A", "trust", "-U",
                    "postgres", "--no-sync", "-E", "UTF8"], check=True, capture_output=True)
    subprocess.run([*prefix, str(pgbin / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"),
                    "-w", "-o", f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} "
                    "-c fsync=off -c max_connections=100", "start"], check=True,
                   capture_output=True)

    def stop() -> None:
        subprocess.run([*prefix, str(pgbin / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True)
        shutil.rmtree(folder, ignore_errors=True)
    return f"postgresql://postgres@127.0.0.1:{port}", stop


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graph", default="gpt2-2", help="a built-in graph of tg profile")
    ap.add_argument("--profilers", type=int, default=4, help="profilers at once (default 4)")
    ap.add_argument("--stores", default="sqlite,postgresql",
                    help="comma-separated: sqlite, postgresql")
    ap.add_argument("--phases", action="store_true",
                    help="print each profiler's seconds per phase (plan, list, claim, compile, "
                    "verify, measure, record, wait for others)")
    ap.add_argument("--cold", action="store_true",
                    help="no warm-up: the first run pays the compiles (see who compiles what)")
    args = ap.parse_args()
    import tensor_graphs  # noqa: F401  (imported once; the forked profilers share it)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed run stops its server
    folder = Path(tempfile.mkdtemp(prefix="tg-profilers-"))
    server, stop = start_postgres() if "postgresql" in args.stores else (None, None)
    made = iter(range(1000))

    def fresh(store: str) -> str:
        if store == "sqlite":
            return str(folder / f"db{next(made)}.sqlite")
        import psycopg

        name = f"bench_{next(made)}"
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        return f"{server}/{name}"

    try:
        for i, store in enumerate(args.stores.split(",")):
            if i == 0 and not args.cold:  # the caches on disk are shared by every store
                warm = run(args.graph, fresh(store), 1)
                print(f"warm-up ({store}) {warm['wall']:.1f} s, {warm['rows']} rows", flush=True)
            one = run(args.graph, fresh(store), 1, args.phases)
            many = run(args.graph, fresh(store), args.profilers, args.phases)
            for r in (one, many):
                print(f"{store}: {r['n']} profiler(s): wall {r['wall']:.1f} s, {r['rows']} rows "
                      f"for {r['distinct']} calls, shares {r['shares']}, load "
                      f"{r['load_before']:.1f} -> {r['load_after']:.1f}", flush=True)
                for share, wall, seconds, calls in r["phases"] if args.phases else ():
                    parts = ", ".join(f"{k} {v:.1f} s ({calls[k]})" for k, v in
                                      sorted(seconds.items(), key=lambda kv: -kv[1]))
                    print(f"    {share} calls in {wall:.1f} s: {parts}", flush=True)
            print(f"{store}: {args.profilers} profilers / 1 = {many['wall'] / one['wall']:.2f}x "
                  f"wall; measured once: {many['rows'] == many['distinct']}", flush=True)
    finally:
        if stop is not None:
            stop()
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
