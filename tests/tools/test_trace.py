"""prog.trace: a Trace Event Format file of real calls, one slice per step per call."""

import json

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError


def gemm_chain(n: int = 96, layers: int = 3, backends=None):
    x = tg.input("x", (n, n))
    h = x
    for i in range(layers):
        h = tg.tanh(h @ tg.weight(f"w{i}", (n, n)))
    prog = tg.compile(h, db=":memory:", **({"backends": backends} if backends else {}))
    rng = np.random.default_rng(0)
    prog.bind(**{f"w{i}": (rng.standard_normal((n, n)) / n).astype(np.float32)
                 for i in range(layers)})
    return prog, {"x": rng.standard_normal((n, n)).astype(np.float32)}


def slices(trace, cat=None):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"
            and (cat is None or (e["cat"] == "call") == (cat == "call"))]


@pytest.mark.parametrize("backends", [None, ("numpy",)], ids=["native", "python"])
def test_trace_has_a_slice_per_step_per_run(tmp_path, backends):
    prog, feeds = gemm_chain(backends=backends)
    before = prog(**feeds)
    path = tmp_path / "trace.json"
    runs = 4
    returned = prog.trace(path, feeds, runs=runs)
    trace = json.loads(path.read_text())
    assert trace == json.loads(json.dumps(returned))
    instructions = prog._last.instructions  # noqa: SLF001
    steps = slices(trace, "step")
    calls = slices(trace, "call")
    assert len(calls) == runs
    assert len(steps) == runs * len(instructions)
    per_call = [s.kernel.name for s in prog.plan.steps if not s.static]
    for run in range(runs):  # each run's slices are the plan's steps, in its order
        names = [e["name"] for e in sorted((e for e in steps if e["args"]["run"] == run),
                                           key=lambda e: e["ts"])]
        assert names == per_call
    for e in steps:
        assert {"kernel", "input_shapes", "dtype", "device"} <= set(e["args"])
        assert e["args"]["kernel"] == e["name"] and e["args"]["device"] == "cpu"
        assert e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    # each step reads the (96, 96) activation (and a GEMM a (96, 96) weight)
    assert all(e["args"]["input_shapes"][0] == "(96, 96)" for e in steps)
    assert all(sh == "(96, 96)" for e in steps if "matmul" in e["name"] or "gemm" in e["name"]
               for sh in e["args"]["input_shapes"])
    assert all(e["args"]["dtype"] == "float32" for e in steps)
    shares = []
    for call in calls:  # the steps lie inside their call and take most of it
        inside = [e for e in steps if e["args"]["run"] == call["args"]["run"]]
        assert all(call["ts"] <= e["ts"] and e["ts"] + e["dur"] <= call["ts"] + call["dur"]
                   + 1e-3 for e in inside)
        total = sum(e["dur"] for e in inside)
        assert total <= call["dur"] + 1e-3
        shares.append(total / call["dur"])
    # in the best run: one run can lose its core partway (77 us of steps in a 263 us call
    # on a clean-clone CI run), which says nothing of the runner's own overhead
    assert max(shares) >= 0.3, shares
    loop = "python loop" if backends else "native loop"  # (numpy steps: not native)
    assert trace["otherData"]["loop"].startswith(loop)
    assert trace["otherData"]["loop_outside_trace"].startswith(loop)
    assert trace["otherData"]["steps_per_run"] == len(instructions)
    np.testing.assert_array_equal(prog(**feeds), before)  # the program is as it was
    assert prog.native is True


def test_native_trace_gives_views_a_slice_of_no_length(tmp_path):
    x = tg.input("x", (8, 16))
    w = tg.weight("w", (16, 16))
    y = tg.reshape(tg.tanh(x @ w), (4, 32)) * 2.0
    prog = tg.compile(y, db=":memory:")
    prog.bind(w=np.eye(16, dtype=np.float32))
    feeds = {"x": np.ones((8, 16), np.float32)}
    expected = prog(**feeds)
    trace = prog.trace(tmp_path / "t.json", feeds, runs=2)
    assert trace["otherData"]["loop"].startswith("native loop"), trace["otherData"]
    steps = slices(trace, "step")
    instructions = prog._last.instructions  # noqa: SLF001
    assert len(steps) == 2 * len(instructions)
    views = [e for e in steps if "note" in e["args"]]
    assert views and all(e["dur"] == 0 and "reshape" in e["name"] for e in views)
    assert all(e["dur"] > 0 for e in steps if "note" not in e["args"])
    np.testing.assert_array_equal(prog(**feeds), expected)
    assert prog.loop.startswith("native loop")  # the recording runs whole again


def test_trace_of_a_program_run_once_warms_the_native_loop_up(tmp_path):
    prog, feeds = gemm_chain(16, 2)
    trace = prog.trace(tmp_path / "t.json", feeds, runs=1)  # (never called before)
    assert trace["otherData"]["loop_outside_trace"].startswith("native loop")
    assert len(slices(trace, "step")) == len(prog._last.instructions)  # noqa: SLF001


@pytest.mark.parametrize("runs", [0, -1, 1.5, True])
def test_trace_refuses_a_bad_run_count(tmp_path, runs):
    prog, feeds = gemm_chain(8, 1)
    with pytest.raises(ArgumentError, match="runs="):
        prog.trace(tmp_path / "t.json", feeds, runs=runs)
    assert not (tmp_path / "t.json").exists()


def test_trace_of_a_symbolic_program_shows_the_calls_shapes(tmp_path):
    x = tg.input("x", ("seq", 16))
    w = tg.weight("w", (16, 16))
    prog = tg.compile(tg.tanh(x @ w) * 2.0, db=":memory:", bounds={"seq": 32})
    prog.bind(w=np.eye(16, dtype=np.float32))
    for seq in (5, 9):
        trace = prog.trace(tmp_path / "t.json", {"x": np.ones((seq, 16), np.float32)}, runs=1)
        steps = slices(trace, "step")
        assert steps and all(e["args"]["input_shapes"][0] == f"({seq}, 16)" for e in steps), \
            [e["args"] for e in steps]
