"""Shared helpers for the measurement database tests."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tensor_graphs.db import Database, Hardware, Measurement, current, signature_text

OTHER_MACHINE = "another-box"


def measurement(kernel: str = "numpy_add", n: int = 4, median: float = 1e-5,
                source_hash: str = "h1", **kw) -> Measurement:
    """A successful measurement of ``kernel`` on a (n, n) float32 pair."""
    sig = signature_text([((n, n), "float32"), ((n, n), "float32")], {})
    return Measurement(kernel, source_hash, sig, runs=10, median=median, min=median * 0.9,
                       max=median * 1.5, error=1e-7, **kw)


@pytest.fixture
def mk():
    return measurement


@pytest.fixture
def elsewhere() -> Hardware:
    """This device and libs on another machine: its timings transfer here."""
    hw = current()
    return Hardware(OTHER_MACHINE, hw.device, hw.libs)


# Root ignores file permissions, so as root the checks run in a forked child that drops to
# uid/gid 65534 ("nobody"); files made by root are then read-only to it, like any user's.
NOBODY = 65534


def run_as_reader(fn, *args):
    """``fn(*args)`` as a user for whom root's files are read-only; returns its result."""
    if os.geteuid() != 0:
        return fn(*args)
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)

    def child():
        try:
            os.setgroups([])
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            send.send(("ok", fn(*args)))
        except BaseException as exc:  # noqa: BLE001 - report anything to the parent
            send.send(("error", f"{type(exc).__name__}: {exc}"))

    proc = ctx.Process(target=child)
    proc.start()
    status, value = recv.recv()
    proc.join(30)
    assert status == "ok", value
    return value


@pytest.fixture
def as_reader():
    return run_as_reader


@pytest.fixture
def shared_dir():
    """A directory outside pytest's root-only tmp tree, so the 'nobody' child can reach it."""
    path = Path(tempfile.mkdtemp(prefix="tg-db-ro-"))
    path.chmod(0o755)
    yield path
    path.chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------- PostgreSQL
# A throwaway server for the session: Debian's postgresql package (.ci/run installs it), a
# cluster made by initdb in a temporary folder, listening on a free loopback port, stopped at
# the end. PostgreSQL refuses to run as root, so as root it runs as the package's `postgres`
# user. Without the package (or psycopg) the PostgreSQL cases skip saying why, unless
# TG_TEST_POSTGRES=required (CI), where that is a failure.
PG_REQUIRED = os.environ.get("TG_TEST_POSTGRES") == "required"


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit()
                   else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unavailable(reason: str):
    if PG_REQUIRED:
        pytest.fail(f"TG_TEST_POSTGRES=required but {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server():
    """The base URL (no database name) of a PostgreSQL server private to this test run."""
    import subprocess

    try:
        import psycopg  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError as exc:
        _unavailable(f"no psycopg ({exc}): pip install -e '.[postgres]'")
    pgbin = _pg_bin()
    if pgbin is None:
        _unavailable("no PostgreSQL server binaries (apt-get install postgresql)")
    folder = Path(tempfile.mkdtemp(prefix="tg-pg-"))
    prefix: list[str] = []
    if os.geteuid() == 0:
        import pwd

        try:
            user = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(folder, ignore_errors=True)
            _unavailable("running as root and there is no `postgres` user to run the server")
        os.chown(folder, user.pw_uid, user.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    port = _free_port()
    data = folder / "data"

    def run(*args: str) -> None:
        done = subprocess.run([*prefix, *args], capture_output=True, text=True, timeout=120)
        if done.returncode:
            shutil.rmtree(folder, ignore_errors=True)
            _unavailable(f"{args[0]} failed: {done.stderr.strip()[-500:]}")

    run(str(pgbin / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync",
        "-E", "UTF8")
    run(str(pgbin / "pg_ctl"), "-D", str(data), "-l", str(folder / "log"), "-w", "-o",
        f"-c listen_addresses=127.0.0.1 -p {port} -k {folder} -c fsync=off "
        "-c max_connections=300", "start")
    # a watchdog stops the server and removes its folder should this run be killed before
    # the teardown below (a CI timeout): no server outlives the tests that started it
    stop = " ".join([*prefix, str(pgbin / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"])
    subprocess.Popen(["sh", "-c", f"while kill -0 {os.getpid()} 2>/dev/null; do sleep 1; done; "
                      f"{stop} >/dev/null 2>&1; rm -rf {folder}"], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}"
    finally:
        subprocess.run([*prefix, str(pgbin / "pg_ctl"), "-D", str(data), "-m", "fast", "stop"],
                       capture_output=True, timeout=120)
        shutil.rmtree(folder, ignore_errors=True)


_databases = iter(range(1, 1 << 30))


@pytest.fixture
def pg_databases(pg_server):
    """A function returning the URL of a fresh, empty database on the session's server each
    call (all dropped afterwards, their connections ended)."""
    import psycopg

    made: list[str] = []

    def new() -> str:
        name = f"tg_test_{next(_databases)}"
        with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as admin:
            admin.execute(f"CREATE DATABASE {name}")
        made.append(name)
        return f"{pg_server}/{name}"

    yield new
    with psycopg.connect(f"{pg_server}/postgres", autocommit=True) as admin:
        for name in made:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_url(pg_databases) -> str:
    """A fresh, empty database on the session's server."""
    return pg_databases()


@pytest.fixture(params=["sqlite", "postgresql"])
def new_db(request):
    """A function opening a new, empty store each call, for the store's contract tests: an
    in-memory SQLite database, or a fresh PostgreSQL database (the same tests on both)."""
    opened: list[Database] = []
    fresh = (lambda: ":memory:") if request.param == "sqlite" \
        else request.getfixturevalue("pg_databases")

    def new() -> Database:
        opened.append(Database(fresh()))
        return opened[-1]

    yield new
    for db in opened:
        db.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def shared_target(request, tmp_path) -> str:
    """One database that several connections (or processes) open by name: an SQLite file, or
    a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "shared.sqlite")
    return request.getfixturevalue("pg_url")
