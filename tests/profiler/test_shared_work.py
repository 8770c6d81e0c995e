"""Profilers on one machine share what is not measurement: a C library several processes need
is compiled once (the others wait for it), and a kernel is verified once by the profilers of
one database. Real processes."""

from __future__ import annotations

import multiprocessing
import os
import secrets
import time

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db import Database, current
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.profiler import missing, shared_verify

CTX = multiprocessing.get_context("fork")


def _together(target, args: list[tuple]) -> list:
    """What ``target(*a, go, out)`` put on ``out``, a process per ``a``, all released at once
    (``go``) so they contend; each process must exit cleanly."""
    go, out = CTX.Event(), CTX.Queue()
    procs = [CTX.Process(target=target, args=(*a, go, out)) for a in args]
    for p in procs:
        p.start()
    go.set()
    found = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return found


def _build(source: str, go, out) -> None:
    before = build.stats["compiled"]
    go.wait()
    build.load_library("tg_test_shared_build", source)
    out.put(build.stats["compiled"] - before)


def test_processes_needing_one_library_compile_it_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))
    if not build.available():
        pytest.skip(f"no C backend: {build.unavailable_reason()}")
    # a source nobody has compiled, slow enough to compile that unlocked builds overlap
    body = "".join(f"double f{i}(double x) {{ return x * {i}.5 + {i}; }}\n" for i in range(300))
    source = f"/* {secrets.token_hex(8)} */\n{body}int tg_shared(int x) {{ return x + 1; }}\n"
    compiled = _together(_build, [(source,)] * 3)
    assert sorted(compiled) == [0, 0, 1]  # one compiled, two waited and loaded its file
    assert not list((tmp_path / "cache" / "c").glob(".*.c"))  # no build left behind


# ------------------------------------------------------------- verification, once
def _logged_tanh(x):
    with open(os.environ["TG_TEST_VERIFY_LOG"], "a") as f:
        f.write(f"{os.getpid()}\n")
    wrong = float(os.environ.get("TG_TEST_VERIFY_WRONG", "0"))
    return np.tanh(x) + wrong if wrong else np.tanh(x)


@pytest.fixture
def logged_tanh(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TG_TEST_VERIFY_LOG", str(tmp_path / "calls.log"))
    name = f"test_logged_tanh_{secrets.token_hex(4)}"
    tg.kernel("tanh", backend="numpy", name=name)(_logged_tanh)
    try:
        yield registry.get(name), tmp_path / "calls.log"
    finally:
        registry.unregister(name)


def _verify_in_child(kernel, scope, go, out) -> None:
    go.wait()
    out.put((scope, missing.verified(kernel, current(), scope)))


def _verify_together(kernel, scopes: list[str]) -> list[tuple[str, str | None]]:
    """(scope, outcome) of a process per scope, all verifying at once, sorted."""
    return sorted(_together(_verify_in_child, [(kernel, s) for s in scopes]), key=str)


def test_profilers_of_one_database_verify_a_kernel_once(logged_tanh, tmp_path):
    kernel, log = logged_tanh
    scope = shared_verify.scope_of(Database(tmp_path / "db.sqlite"))
    assert _verify_together(kernel, [scope] * 3) == [(scope, None)] * 3
    assert len(set(log.read_text().split())) == 1  # one process called it; two read its outcome


def test_a_failed_verification_is_shared_and_other_databases_verify_afresh(
        logged_tanh, tmp_path, monkeypatch):
    kernel, log = logged_tanh
    monkeypatch.setenv("TG_TEST_VERIFY_WRONG", "0.5")
    first = shared_verify.scope_of(Database(tmp_path / "a.sqlite"))
    second = shared_verify.scope_of(Database(tmp_path / "b.sqlite"))
    found = set(_verify_together(kernel, [first, first, second, second]))
    assert {scope for scope, _ in found} == {first, second}
    assert len(found) == 2, found  # a database's two processes got one outcome (its errors)
    assert all(reason and kernel.name in reason for _, reason in found), found
    assert len(set(log.read_text().split())) == 2  # once per database
    assert shared_verify.scope_of(Database(":memory:")) is None  # a private one shares nothing


def test_old_outcomes_are_pruned(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(shared_verify, "_pruned", set())
    folder = shared_verify._folder()
    old, new = folder / "old.json", folder / "new.json"
    for f in (old, new):
        f.write_text("{}")
    day_ago = time.time() - shared_verify.KEEP_SECONDS - 60
    os.utime(old, (day_ago, day_ago))
    monkeypatch.setattr(shared_verify, "_pruned", set())  # as a new process
    assert shared_verify._folder() == folder
    assert not old.exists() and new.exists()
