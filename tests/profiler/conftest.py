"""Shared setup of the profiler tests."""

from __future__ import annotations

import secrets

import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.kernels import generated
from tensor_graphs.profiler import shared_verify


@pytest.fixture
def elementwise_candidate(tmp_path, monkeypatch):
    """``make(base)`` -> (candidate, database, its sharing scope, this machine's hardware):
    the generated elementwise kernel of ``(x * salt + 0.3) * x`` (a salt near ``base`` that no
    earlier run used, so its outcome is never on file yet), with a private cache folder and
    a database file of its own."""
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path / "cache"))

    def make(base: float):
        salt = base + secrets.randbelow(10**6) / 1e7
        x = tg.input("x", (8, 16))
        y = (x * salt + 0.3) * x
        cand = next(c for c in generated.candidates(y, use_counts([y]), lambda n: None, "cpu")
                    if c.generator == "elementwise")
        db = tg.db.Database(tmp_path / "db.sqlite")
        return cand, db, shared_verify.scope_of(db), tg.db.current()

    return make
