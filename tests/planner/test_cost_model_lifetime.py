"""A database's cost model lives as long as the database: every compile against one database
reuses one model (its cached estimates), and a database nobody holds any more is freed, cost
model and all (a process-wide table of models kept every ":memory:" database alive)."""

from __future__ import annotations

import gc
import weakref

import numpy as np

import tensor_graphs as tg
from tensor_graphs import compiler
from tensor_graphs.db.store import Database


def _databases() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Database)  # type(): no proxy's hooks


def _graph():
    x = tg.input("x", (4, 8))
    return x, tg.relu(x) * 2.0 + 1.0


def test_an_in_memory_database_is_freed_after_compile():
    x, y = _graph()
    db = Database(":memory:")
    prog = tg.compile(y, db=db)
    assert np.allclose(prog(x=np.ones((4, 8), np.float32)), 3.0)
    freed = weakref.ref(db)
    model = weakref.ref(compiler.cost_model(db, ("cpu",)))
    del db, prog
    gc.collect()
    assert freed() is None, "a compiled-and-dropped in-memory database is still alive"
    assert model() is None


def test_databases_compiled_by_path_are_freed_too():
    _, y = _graph()
    before = _databases()
    for _ in range(5):
        tg.compile(y, db=":memory:")  # a new database each time
    assert _databases() <= before


def test_one_model_per_live_database_across_compiles():
    _, y = _graph()
    db = Database(":memory:")
    first = compiler.cost_model(db, ("cpu",))
    tg.compile(y, db=db)
    assert compiler.cost_model(db, ("cpu",)) is first
    assert compiler.cost_model(Database(":memory:"), ("cpu",)) is not first
