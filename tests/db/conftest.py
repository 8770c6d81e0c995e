"""Shared helpers for the measurement database tests."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from tensor_graphs.db import Hardware, Measurement, current, signature_text

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
