"""Profilers of one database verify each generated candidate once (profiler/shared_verify.py
``sharing``): the first to build one (measuring it, or compiling a plan that picks it) checks it
and files the outcome; the others take its unchecked build with the tolerance it declared.
Real processes on one SQLite file, every verification logged."""

from __future__ import annotations

import collections
import json
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

import tensor_graphs as tg
from tensor_graphs.kernels import generated
from tensor_graphs.profiler import shared_verify

pytestmark = pytest.mark.skipif(not tg.kernels.c.available(), reason="no C compiler")


# A profiler process (a fresh interpreter: a forked child of a process whose OpenMP team ran
# hangs in its first parallel region): every generated renderer's admission, its checks,
# appends the kernel's name to the log; it starts when the go file appears.
CHILD = """
import json, os, sys, time
import numpy as np
import tensor_graphs as tg
from tensor_graphs.kernels.c import codegen
from tensor_graphs.numerics import relative_error

db, salt, log, go = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
admitted = codegen.admitted

def logging_admitted(kernel, report, source=""):
    with open(log, "a") as f:
        f.write(f"{kernel.name} {os.getpid()}\\n")
    return admitted(kernel, report, source)

codegen.admitted = logging_admitted
x = tg.input("x", (128, 256))  # an elementwise chain whose kernels no earlier run built
y = tg.tanh(x * salt + 0.1)    # (salt is in their source, so in their names)
y = tg.sigmoid(y * 0.9 + 0.05) * y
y = tg.tanh(y * 1.01 - 0.2)
while not os.path.exists(go):
    time.sleep(0.01)
prog = tg.compile(y, db=db, profile="missing")
x = np.random.default_rng(0).standard_normal((128, 256)).astype(np.float32)
error = relative_error(prog(x=x), tg.evaluate(y, {"x": x}, dtype="float64"))
used = sorted({s.kernel.name: s.kernel.tolerance for s in prog.plan.steps
               if getattr(s.kernel, "generated", False)}.items())
print(json.dumps([used, sorted({s.source for s in prog.plan.steps}), error]))
"""


def _run(db: Path, salt: float, log: Path, count: int, env: dict) -> list:
    go = db.with_suffix(".go")
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(db), repr(salt), str(log),
                               str(go)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(count)]
    go.touch()
    found = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        found.append(json.loads(out.strip().splitlines()[-1]))
    return found


def _counts(log: Path) -> collections.Counter:
    return collections.Counter(line.split()[0] for line in log.read_text().splitlines())


@pytest.mark.slow
def test_profilers_of_one_database_verify_each_generated_candidate_once(tmp_path, child_env):
    env = dict(child_env, TG_CACHE_DIR=str(tmp_path / "cache"))  # no outcome filed before
    log = tmp_path / "verified.log"
    salt = 1.0 + secrets.randbelow(10**6) / 1e7
    found = _run(tmp_path / "db.sqlite", salt, log, 3, env)
    counts = _counts(log)
    assert counts and set(counts.values()) == {1}, counts  # each verified by one process
    for used, sources, error in found:
        assert used, "the plan picked no generated kernel: nothing was shared"
        assert {name for name, _ in used} <= set(counts)  # every one it ran was verified
        assert set(sources) <= {"measured", "free"}
        assert error <= 1e-5
    # the same kernels with the same declared tolerance in every process, whoever checked them
    assert len({json.dumps(used) for used, _, _ in found}) == 1, found
    # a second database verifies afresh (an outcome is its database's)
    found = _run(tmp_path / "other.sqlite", salt, log, 2, env)
    again = _counts(log)
    assert all(again[name] == 2 for name, _ in found[0][0]), again


def test_a_refusal_is_shared_and_a_private_database_shares_nothing(elementwise_candidate):
    """A candidate another profiler's checks refused is refused here too, with its reason,
    without building it; ``sharing`` of an in-memory database turns sharing off inside it."""
    cand, db, scope, hw = elementwise_candidate(2.0)
    key = shared_verify.candidate_key(cand, hw, scope)
    assert key is not None
    shared_verify._filed(key, lambda: {"reason": "wrong on purpose"})  # as another profiler
    built = []
    real_build = cand.build
    object.__setattr__(cand, "build", lambda: built.append(1) or real_build())
    try:
        with shared_verify.sharing(db, {"cpu": hw}):
            reason = shared_verify.shared(cand, hw, lambda: "unused", scope)
            assert reason and "wrong on purpose" in reason and not built
            assert cand.name in generated.refused
            with shared_verify.sharing(tg.db.Database(":memory:")):
                assert generated._sharing.get() is None
            assert generated._sharing.get() is not None
        assert generated._sharing.get() is None
    finally:
        generated.refused.pop(cand.name, None)

