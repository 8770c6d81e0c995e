"""Plans across devices: where each step runs, how values reach it, what a call pays for.

A second device kind is simulated here (``second_device``): "cuda" kernels and the
host<->cuda copies are host functions registered for planning only (nothing runs), and each
plan follows from database rows the test writes (``tests/planner/rows.py``), so every test
states the times that should decide. ``tests/gpu/test_planner_gpu.py`` plans with the real GPU
kernels on the simulated GPU.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db.store import open_db
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.ir.node import expand_composite
from tensor_graphs.kernels import copy as copies
from tensor_graphs.kernels import generated, registry
from tests.planner import rows

# op -> the host function standing for its CUDA kernel (planned, never run here)
SIMULATED = {
    "tanh": np.tanh, "exp": np.exp, "neg": np.negative, "abs": np.abs,  # unary
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,  # binary
    "less": np.less, "matmul": np.matmul,
    "where": np.where,  # where(cond, a, b)
}
COPIES = (("copy_host_to_cuda", "cpu", "cuda"), ("copy_cuda_to_host", "cuda", "cpu"),
          ("copy_same_memory_cuda", "cuda", "cuda"))


def _sim_name(op: str) -> str:
    return f"test_sim_cuda_{op}"


def _register(op: str, fn) -> None:
    arity = {"where": 3}.get(op, 1 if fn in (np.tanh, np.exp, np.negative, np.abs) else 2)
    params = ", ".join("abc"[:arity])
    namespace = {"fn": fn}
    exec(f"def kernel({params}):\n    return fn({params})", namespace)  # a fixed arity
    tg.kernel(op, backend="torch", device="cuda", name=_sim_name(op))(namespace["kernel"])


@pytest.fixture
def second_device():
    """Registers the simulated "cuda" kernels (and the copies, where this machine has no GPU
    kernels of its own) and removes them after the test."""
    made = []
    for op, fn in SIMULATED.items():
        _register(op, fn)
        made.append(_sim_name(op))
    real = {k.name for k in tg.kernels.all()}
    for name, src, dst in COPIES:
        if name not in real:
            copies.copy_kernel(name, src, dst, same_memory=src == dst)(lambda x: np.array(x))
            made.append(name)
    try:
        yield
    finally:
        for name in made:
            registry.unregister(name)
            copies.ROUTES.pop(name, None)
            copies.SAME_MEMORY.discard(name)


def _names(plan) -> list[str]:
    return [s.kernel.name for s in plan.steps]


# ------------------------------------------------------------------------ the seed's example
SEED = {  # rows under which each of the seed example's three choices wins
    # the CUDA kernel: the host's tanh is 100x faster, but the round trip costs more
    "cuda kernel": {_sim_name("tanh"): 1e-4, "numpy_tanh": 1e-6,
                    "copy_cuda_to_host": 6e-5, "copy_host_to_cuda": 6e-5},
    # copy to the host, numpy's tanh, copy back: the CUDA kernel is slow, copies cheap
    "host round trip": {_sim_name("tanh"): 1e-2, "numpy_tanh": 1e-6,
                        "copy_cuda_to_host": 1e-6, "copy_host_to_cuda": 1e-6},
    # decomposed into lower-level CUDA kernels: both tanh kernels are slow
    "decomposed": {_sim_name("tanh"): 1e-2, "numpy_tanh": 1e-2,
                   "copy_cuda_to_host": 1e-6, "copy_host_to_cuda": 1e-6,
                   **{_sim_name(op): 1e-7 for op in SIMULATED if op != "tanh"}},
}


@pytest.mark.parametrize("winner", list(SEED))
def test_the_seeds_tanh_on_the_gpu_takes_each_choice_its_rows_favour(second_device, winner):
    """tanh on (cuda, (4, 16), float32): the CUDA kernel, or copy to the host + numpy + copy
    back, or the decomposition into lower-level CUDA kernels, whichever the rows make fastest.
    The value lives on the GPU (a kept state) and is wanted there."""
    x = tg.state("x", (4, 16))
    y = tg.tanh(x)
    plan = rows.plan(open_db(":memory:"), [y], SEED[winner], output_device="cuda")
    if winner == "cuda kernel":
        assert _names(plan) == [_sim_name("tanh")]
    elif winner == "host round trip":
        assert _names(plan) == ["copy_cuda_to_host", "numpy_tanh", "copy_host_to_cuda"]
        assert [s.device for s in plan.steps] == ["cpu", "cpu", "cuda"]
        assert "2 copies" in plan.explain()
    else:
        assert len(plan.steps) > 3 and all(s.device == "cuda" for s in plan.steps)
        assert all(n.startswith("test_sim_cuda_") and n != _sim_name("tanh")
                   for n in _names(plan))
        assert {s.node.op.name for s in plan.steps} >= {"exp", "where"}


def test_values_that_live_elsewhere_get_copies(second_device):
    """An input and a result on the host: without rows the copies cost more than a GPU
    kernel saves; rows that make the GPU's tanh fast and copies cheap move it there."""
    x = tg.input("x", (4, 8))
    y = tg.tanh(x)
    db = open_db(":memory:")
    unmeasured = rows.planner([y], db).plan()
    assert [s.device for s in unmeasured.steps] == ["cpu"], unmeasured.explain()
    plan = rows.plan(db, [y], {_sim_name("tanh"): 1e-8, "torch_tanh": 1e-3, "numpy_tanh": 1e-3,
                               "copy_host_to_cuda": 1e-7, "copy_cuda_to_host": 1e-7})
    assert plan.kernels == ["copy_host_to_cuda", _sim_name("tanh"), "copy_cuda_to_host"]
    assert [s.device for s in plan.steps] == ["cuda", "cuda", "cpu"]
    assert "2 copies" in plan.explain()


def test_a_gpu_step_pays_for_copying_its_input_up(second_device):
    """An input read once on the GPU arrives by a copy, which the GPU step pays: the host's
    kernel 10 us slower than the GPU's loses to it only when the copy up costs less."""
    x = tg.input("x", (64, 64))
    y = tg.tanh(x)
    for up, expected in ((1e-6, _sim_name("tanh")), (1e-4, "numpy_tanh")):
        plan = rows.plan(open_db(":memory:"), [y],
                         {_sim_name("tanh"): 1e-6, "numpy_tanh": 2e-5,
                          "copy_host_to_cuda": up, "copy_cuda_to_host": 1e-6})
        assert expected in plan.kernels, (up, plan.explain())


# ------------------------------------------------------------------------ static copies
@pytest.mark.parametrize("weights_on", ["cuda", "cpu"])
def test_a_weights_copy_runs_once_per_binding_and_is_not_paid_per_call(second_device,
                                                                          weights_on):
    """The matmul is 100x faster on the side where the weight does not live; the weight's
    copy there (5 ms) runs once per binding, in the prelude, so a call does not pay it."""
    x = tg.input("x", (8, 64))
    w = tg.weight("w", (64, 64))
    y = x @ w
    away = "cpu" if weights_on == "cuda" else "cuda"
    fast, slow = 1e-5, 1e-3
    times = {_sim_name("matmul"): fast if away == "cuda" else slow,
             "numpy_matmul": fast if away == "cpu" else slow,
             "copy_host_to_cuda": 1e-6, "copy_cuda_to_host": 1e-6,
             ("copy_cuda_to_host", w): 5e-3, ("copy_host_to_cuda", w): 5e-3}
    plan = rows.plan(open_db(":memory:"), [y], times, weights_on=weights_on)
    (mm,) = [s for s in plan.steps if s.node is y and not s.is_copy]
    assert mm.device == away, plan.explain()
    (weight_copy,) = [s for s in plan.steps if s.is_copy and s.node is w]
    assert weight_copy.static and not any(s.static for s in plan.steps if s is not weight_copy)
    per_call = [s for s in plan.steps if not s.static]
    assert plan.cost == pytest.approx(sum(s.cost for s in per_call)
                                      + plan.dispatch * len(per_call))
    assert plan.cost < 5e-4 and plan.binding_cost == pytest.approx(5e-3)
    assert "(once per binding)" in plan.explain()
    assert "1 static steps once per binding" in plan.explain()


def test_a_static_step_is_weighed_at_a_share_of_its_time(second_device):
    """Among static options, the fastest still wins: each is weighed at its time over
    AMORTIZED_CALLS calls, not as free."""
    w = tg.weight("w", (64, 64))
    y = tg.tanh(w) + tg.input("x", (64, 64))
    for host_tanh, expected in ((1e-6, "cpu"), (1e-2, "cuda")):
        times = {_sim_name("tanh"): 1e-4, "numpy_tanh": host_tanh, "numpy_add": 1e-6,
                 "copy_host_to_cuda": 1e-6, "copy_cuda_to_host": 1e-6}
        plan = rows.plan(open_db(":memory:"), [y], times)
        (tanh,) = [s for s in plan.steps if s.node.op.name == "tanh" and not s.is_copy]
        assert tanh.static and tanh.device == expected, plan.explain()


# ------------------------------------------------------------------------ shared values
def _two_device_reads():
    """exp(x + z) read by a tanh the GPU must run and a sin only the host has (the inputs
    broadcast: their copies are rows of other shapes than h's)."""
    h = tg.exp(tg.input("x", (32, 1)) + tg.input("z", (1, 32)))
    return h, [tg.tanh(h), tg.sin(h)]


def _made(plan, h) -> list[str]:
    """The devices where ``h`` is computed (not copied)."""
    return sorted(s.device for s in plan.steps if s.node is h and not s.is_copy)


def test_a_value_two_devices_read_is_made_once_and_copied(second_device):
    """Before, each device's copy of a shared value looked free where it was made (shared
    values are costed where they are made), so exp ran on both devices."""
    h, outs = _two_device_reads()
    times = {_sim_name("tanh"): 1e-6, "numpy_tanh": 1e-2, "numpy_sin": 1e-6,
             _sim_name("exp"): 1e-4, "numpy_exp": 1e-4, _sim_name("add"): 1e-6,
             "numpy_add": 1e-6, "copy_host_to_cuda": 1e-6, "copy_cuda_to_host": 1e-6}
    plan = rows.plan(open_db(":memory:"), outs, times)
    assert len(_made(plan, h)) == 1, plan.explain()
    assert [s for s in plan.steps if s.is_copy and s.node is h], plan.explain()


def test_a_value_cheaper_to_make_twice_than_to_copy_is_made_on_both(second_device):
    """The cost model's call: exp at 0.1 us a device against a 1 ms copy of its result."""
    h, outs = _two_device_reads()
    times = {_sim_name("tanh"): 1e-6, "numpy_tanh": 1e-1, "numpy_sin": 1e-6,
             _sim_name("exp"): 1e-7, "numpy_exp": 1e-7, _sim_name("add"): 1e-7,
             "numpy_add": 1e-7, "copy_host_to_cuda": 1e-7, "copy_cuda_to_host": 1e-7,
             ("copy_host_to_cuda", h): 1e-3, ("copy_cuda_to_host", h): 1e-3}
    plan = rows.plan(open_db(":memory:"), outs, times)
    assert _made(plan, h) == ["cpu", "cuda"], plan.explain()
    assert not [s for s in plan.steps if s.is_copy and s.node is h]


def test_a_value_only_the_gpu_reads_is_made_there_when_that_is_cheaper(second_device):
    """exp is cheapest to make on the host once its input's copy up is counted (20 us against
    10 + 50), so the DP takes the GPU's copy of it for the copy's price alone, its making
    left to the host's readers; there are none, so the plan makes it on the GPU instead
    (10 + 50 us against 20 + 50)."""
    h = tg.exp(tg.input("x", (32, 32)))
    y = tg.tanh(h) + tg.neg(h)
    times = {_sim_name("exp"): 1e-5, "numpy_exp": 2e-5, "copy_host_to_cuda": 5e-5,
             "copy_cuda_to_host": 1e-6, **{_sim_name(op): 1e-6 for op in ("tanh", "neg", "add")}}
    plan = rows.plan(open_db(":memory:"), [y], times)
    assert _made(plan, h) == ["cuda"], plan.explain()
    assert plan.kernels.count("copy_host_to_cuda") == 1, plan.explain()


def test_one_device_wins_where_the_dp_settles_on_copies_around_each_matmul(second_device):
    """A residual stream whose cheap steps are faster on the host (5.5 us against an 8.4 us
    launch) and whose matmuls are not (126 against 8.6 us): value by value, the DP keeps the
    stream and the cheap steps on the host and copies each matmul's operand up and result
    down (16.4 us each way). Everything on the GPU, with one copy each way, is predicted
    faster: the plan computes on the target all it can when that is no slower (GPT-2 at
    width 256 on a GPU planned so, 13 copies a call)."""
    h = tg.exp(tg.input("x", (16, 16)))
    for i in range(4):
        t = h
        for _ in range(7):
            t = tg.tanh(t)
        h = h + t @ tg.weight(f"w{i}", (16, 16))
    times = {"numpy_exp": 5.5e-6, "numpy_tanh": 5.5e-6, "numpy_add": 5.5e-6,
             "numpy_matmul": 126e-6, _sim_name("exp"): 8.4e-6, _sim_name("tanh"): 8.4e-6,
             _sim_name("add"): 8.4e-6, _sim_name("matmul"): 8.6e-6,
             "copy_host_to_cuda": 16.4e-6, "copy_cuda_to_host": 16.4e-6}
    db = open_db(":memory:")
    plan = rows.plan(db, [h], times)
    assert {s.device for s in plan.steps if not s.is_copy} == {"cuda"}, plan.explain()
    assert [s.kernel.name for s in plan.steps if s.is_copy and not s.static] == [
        "copy_host_to_cuda", "copy_cuda_to_host"], plan.explain()
    mixed = rows.planner([h], db)._extracted()  # noqa: SLF001 - the DP's plan alone
    assert sum(s.is_copy and not s.static for s in mixed.steps) > 2
    assert plan.cost < mixed.cost


def test_repeated_blocks_take_their_inputs_on_the_device_they_run_on(second_device):
    """A repeated block's inputs were placeholder inputs, homed on the host: every block
    input was made on the host and copied up (GPT-2 on a GPU: each residual add on the host,
    between two copies). They now arrive where the block's steps read them."""
    x = tg.input("x", (16, 32))
    h = x
    for i in range(4):
        h = h + tg.tanh(h @ tg.weight(f"w{i}", (32, 32)))
    times = {**{_sim_name(op): 1e-6 for op in ("matmul", "tanh", "add")},
             "numpy_matmul": 1e-3, "numpy_tanh": 1e-3, "numpy_add": 1e-5,
             "copy_host_to_cuda": 1e-5, "copy_cuda_to_host": 1e-5}
    plan = rows.plan(open_db(":memory:"), [h], times, blocks=True)
    assert plan.kernels.count("copy_host_to_cuda") == 1, plan.explain()
    assert plan.kernels.count("copy_cuda_to_host") == 1, plan.explain()
    assert [s.device for s in plan.steps if not s.is_copy] == ["cuda"] * 12, plan.explain()


# ------------------------------------------------------------------------ homes
def test_a_kept_state_lives_on_the_target_even_when_the_host_reads_it(second_device):
    """The rule (planner/search.py HOMES): weights and states live on the target device,
    whoever reads them; a host step reading a state gets it by a copy every call."""
    s = tg.state("s", (8, 8))
    y = tg.tanh(s)
    plan = rows.plan(open_db(":memory:"), [y], {_sim_name("tanh"): 1e-2, "numpy_tanh": 1e-6,
                                                 "copy_cuda_to_host": 1e-6})
    assert plan.kernels == ["copy_cuda_to_host", "numpy_tanh"]
    assert not plan.steps[0].static  # a state changes between calls: copied per call
    assert [s.device for s in plan.leaves] == ["cuda"]


# ------------------------------------------------------------------------ generators
def _spy_rows(calls):
    def spy(kind):
        def generator(root, uses, expand):
            calls.append((kind, root))
            return None
        return generator

    return (("host_spy", "cpu", spy("cpu")), ("gpu_spy", "cuda", spy("cuda")))


def test_only_the_generators_of_a_slots_device_are_asked(second_device, monkeypatch):
    """Each row of generators() says which device kind it renders for; the planner asks a
    slot's kind only (before, every generator ran on every slot and the planner dropped the
    other device's candidates afterwards)."""
    calls: list = []
    monkeypatch.setattr(generated, "generators", lambda: _spy_rows(calls))
    x = tg.input("x", (16, 16))
    y = tg.exp(x) * 2.0 + 1.0
    tg.compile(y, db=":memory:", backends=("numpy",))
    assert calls and {kind for kind, _ in calls} == {"cpu"}
    calls.clear()
    rows.planner([y], open_db(":memory:"), backends=None).solve()
    assert {kind for kind, _ in calls} == {"cpu", "cuda"}
    for kind in ("cpu", "cuda"):  # once per node and kind
        roots = [root for k, root in calls if k == kind]
        assert len(roots) == len(set(roots))
    calls.clear()
    root = tg.sin(x) + 1.0
    generated.candidates(root, use_counts([root]), lambda n: expand_composite(
        n.op, n.inputs, n.attrs), "cuda")
    assert [kind for kind, _ in calls] == ["cuda"]


def test_the_generators_table_names_the_device_of_its_candidates():
    """Every row's candidates have the row's device (C on the host; Triton rows are checked
    on the simulated GPU, tests/gpu/test_planner_gpu.py)."""
    x = tg.input("x", (8, 32))
    w = tg.weight("w", (32, 16))
    graphs = [tg.tanh(x) * 2.0 + 1.0, tg.exp(x * 2.0) * tg.sum(x, axis=-1, keepdims=True),
              (x @ w) * 2.0 + 1.0]
    found = {}
    for g in graphs:
        uses = use_counts([g])
        for name, kind, fn in generated.generators():
            assert kind in registry.DEVICE_KINDS and "device" not in inspect.signature(
                fn).parameters
            cand = fn(g, uses, lambda n: expand_composite(n.op, n.inputs, n.attrs))
            if cand is not None:
                found[name] = (kind, cand.device)
    assert {"elementwise", "rows", "gemm_epilogue"} <= set(found)
    assert all(kind == device for kind, device in found.values())
