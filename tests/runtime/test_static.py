"""What is static (computed once per weight binding) has one owner, ``ir.graph.is_static``: the
planner, the memory plan and the runtime agree on it, and the runtime takes its prelude and its
frees from the memory plan.

The case that split them: ``iota(seq)`` in a program planned for bounds has a concrete shape
at the bounds, where the memory plan is made, so the memory plan held it with the weights
while the runtime ran it per call, and (with no arena place) the kernel allocated every call.
"""

from __future__ import annotations

import numpy as np

import tensor_graphs as tg
from tensor_graphs.ir.graph import is_static
from tensor_graphs.planner.plan import Slot


def _compile(y, **kw):
    return tg.compile(y, db=":memory:", backends=("numpy",), **kw)


def _agree(prog) -> None:
    """The runtime's prelude is what the memory plan holds with the weights: a static step's
    value is placed as a weight, and the prelude has exactly the static steps."""
    exe = prog._last  # noqa: SLF001 - the executable of the last call
    live, twin = exe.memory.liveness, exe.twin
    static = []
    for step in twin.steps:
        key = twin.resolve(Slot(step.node, step.device, False))
        assert (key in live.static) == (prog.memory_plan.placements[key].kind == "weight")
        static.append(key in live.static)
    assert len(exe.prelude) == sum(static)
    assert len(exe.instructions) == len(static) - sum(static)


def test_iota_of_seq_runs_per_call_in_the_arena():
    x = tg.input("x", ("seq", 4))
    y = x + tg.cast(tg.iota("seq"), "float32").reshape("seq", 1)
    prog = _compile(y, bounds={"seq": 8})
    iota = next(s for s in prog.concrete_plan.steps if s.node.op.name == "iota")
    place = prog.memory_plan.placements[Slot(iota.node, "cpu", False)]
    assert place.kind == "arena"  # the memory plan held it with the weights: "weight"
    exe = prog._last  # noqa: SLF001
    (ins,) = [i for i in exe.instructions if i.name == "numpy_iota"]
    assert ins.place is not None  # written into its arena place, not allocated per call
    assert not exe.prelude
    _agree(prog)
    for n in (3, 8):
        feed = np.ones((n, 4), np.float32)
        np.testing.assert_array_equal(prog(x=feed), feed + np.arange(n)[:, None])


def test_a_value_of_the_size_of_seq_is_per_call_and_one_of_weights_static():
    x = tg.input("x", ("seq", 4))
    w = tg.weight("w", (4,))
    mean = tg.sum(x, axis=0) * tg.reciprocal(tg.cast(tg.size("seq"), "float32"))
    y = mean + tg.exp(w)  # exp(w): from the weights alone
    prog = _compile(y, bounds={"seq": 8})
    plan = prog.concrete_plan
    kinds = {s.node.op.name: prog.memory_plan.placements[Slot(s.node, "cpu", False)].kind
             for s in plan.steps}
    assert kinds["reciprocal"] == "arena"  # 1 / seq: the old memory rule held it as a weight
    assert kinds["exp"] == "weight"
    _agree(prog)
    assert [i.name for i in prog._last.prelude] == ["numpy_exp"]  # noqa: SLF001
    wv = np.arange(4, dtype=np.float32)
    prog.bind(w=wv)
    for n in (2, 8):
        feed = np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32)
        np.testing.assert_allclose(prog(x=feed), feed.mean(axis=0) + np.exp(wv), rtol=1e-6)


def test_the_one_rule():
    x, w = tg.input("x", ("seq", 3)), tg.weight("w", (3, 3))
    assert is_static(w) and is_static(tg.iota(3)) and is_static(w @ w)
    assert not is_static(tg.iota("seq")) and not is_static(tg.size("seq"))
    assert not is_static(x) and not is_static(x @ w)
    assert not is_static(tg.weight("v", ("seq", 3)))
    # a plan's step: its own dims, and whether what it reads is static
    assert is_static(w @ w, inputs_static=True) and not is_static(w @ w, inputs_static=False)
    assert not is_static(tg.iota("seq"), inputs_static=True)
