"""A generated kernel's admitted accuracy lives in the database with its measurement.

A candidate declares only its float floor until it is built and verified; its checks may admit
it at a larger error (``codegen.admitted``). That figure was kept per process: a second
process on the same database chose the kernel on its floor, built and verified it, found it
above a tight tolerance and planned again. Now the profiler's row keeps it
(``profiler/measure.py``) and the planner reads it (``CostModel.accuracy``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

SCRIPT = r"""
import json, sys
import numpy as np
import tensor_graphs as tg
from tensor_graphs.kernels import generated

mode, db = sys.argv[1], sys.argv[2]
x, y = tg.input("x", (64, 256)), tg.input("y", (64, 256))
out = tg.log(x * x + 1.0) * y  # admitted at ~5e-6, above the float32 floor 1e-6

def chosen(plan):
    return {s.kernel.name: s.error for s in plan.steps
            if getattr(s.kernel, "generated", False) and len(s.nodes) > 1}

if mode == "profile":
    prog = tg.compile(out, db=db, profile="missing")
    steps = [s for s in prog.plan.steps if s.kernel.name in chosen(prog.plan)]
    print(json.dumps({s.kernel.name: s.kernel.tolerance for s in steps}))
else:
    name, tol = sys.argv[3], float(sys.argv[4])
    first = next(iter(tg.paths(out, db=db, tolerance=1.0)))
    planned = chosen(first).get(name)
    prog = tg.compile(out, db=db, tolerance=tol)
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32),
             "y": np.random.default_rng(1).standard_normal((64, 256)).astype(np.float32)}
    ref = tg.evaluate(out, feeds, dtype="float64")
    print(json.dumps({"planned": planned, "built": name in generated._built,
                      "refused": prog.stats.get("generated_refused", 0),
                      "error": float(np.linalg.norm(prog(**feeds) - ref) / np.linalg.norm(ref))}))
"""


def _run(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_fresh_process_plans_with_the_accuracy_another_one_measured(tmp_path):
    db = str(tmp_path / "shared.sqlite")
    admitted = _run("profile", db)
    assert len(admitted) == 1, admitted  # the region is one generated kernel
    (name, accuracy), = admitted.items()
    assert accuracy > 1e-6  # above its floor: what the fresh process must learn
    # a tolerance between the floor and that accuracy: the kernel is not for this plan
    fresh = _run("plan", db, name, str(accuracy / 2))
    assert fresh["planned"] is not None and fresh["planned"] >= accuracy
    assert not fresh["built"] and fresh["refused"] == 0  # not built, verified and refused
    assert fresh["error"] <= accuracy / 2
