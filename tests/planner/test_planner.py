"""The planner: options, paths, counts, tolerance, the database deciding, lock files, caching."""

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db.features import features
from tensor_graphs.db.store import Measurement, open_db
from tensor_graphs.ir.graph import nodes
from tensor_graphs.kernels import registry
from tensor_graphs.planner import cache
from tensor_graphs.planner.search import signature

RNG = np.random.default_rng(0)


def rows_for_tanh(db, shape, times: dict[str, float]):
    """Record a measured time for each named tanh kernel on a float32 ``shape``."""
    x = tg.input("x", shape)
    node = tg.tanh(x)
    sig = signature([x], node.attrs)
    for name, seconds in times.items():
        k = registry.get(name)
        db.record(Measurement(name, k.source_hash, sig, 5, seconds, seconds, seconds, 1e-8))


def test_tanh_has_numpy_c_torch_and_decomposition_paths():
    x = tg.input("x", (4, 16))
    y = tg.tanh(x)
    seen = set()
    decomposed = 0
    # the registered kernels' paths (generated ones: tests/planner/test_generated.py)
    for i, p in enumerate(tg.paths(y, db=":memory:", generate=False)):
        assert p.cost >= 0 and p.kernels
        if len(p.kernels) == 1:
            seen.add(p.kernels[0])
        else:
            decomposed += 1
        if i > 400:
            break
    assert {"numpy_tanh", "c_tanh", "c_tanh_fast"} <= seen
    if any(k.backend == "torch" for k in tg.kernels.all()):
        assert "torch_tanh" in seen
    assert decomposed > 0  # the decomposition's own sub-paths
    assert tg.count_paths(y, db=":memory:") > 400


@pytest.mark.parametrize("build", [
    lambda x, y: x * y,
    lambda x, y: tg.exp(x) + y,
    lambda x, y: (x * y) + tg.exp(x * y),  # a shared value
    lambda x, y: tg.sigmoid(x) * y,
])
def test_count_equals_enumeration(build):
    x, y = tg.input("x", (3, 5)), tg.input("y", (3, 5))
    g = build(x, y)
    listed = list(tg.paths(g, db=":memory:", backends=("numpy", "c")))
    assert tg.count_paths(g, db=":memory:", backends=("numpy", "c")) == len(listed)
    assert len({tuple(p.decisions) for p in listed}) == len(listed)  # all distinct


def test_the_first_path_is_the_plan():
    x = tg.input("x", (8, 8))
    g = tg.sigmoid(x) * x
    db = open_db(":memory:")
    first = next(iter(tg.paths(g, db=db, tolerance=1e-5)))
    prog = tg.compile(g, db=db, tolerance=1e-5)
    assert first.kernels == prog.plan.kernels


def test_the_database_decides_and_swapping_rows_flips_the_plan():
    shape = (32, 64)
    x = tg.input("x", shape)
    fast, slow = 1e-7, 1e-5
    db = open_db(":memory:")
    others = {"torch_tanh": slow} if "torch_tanh" in {k.name for k in tg.kernels.all()} else {}
    rows_for_tanh(db, shape, {"numpy_tanh": fast, "c_tanh": 100 * fast, **others})
    cache.clear()
    assert tg.compile(tg.tanh(x), db=db).plan.kernels == ["numpy_tanh"]
    step = tg.compile(tg.tanh(x), db=db).plan.steps[0]
    assert step.source == "measured" and step.cost == pytest.approx(fast)
    rows_for_tanh(db, shape, {"numpy_tanh": 100 * fast, "c_tanh": fast})  # newer rows win
    assert tg.compile(tg.tanh(x), db=db).plan.kernels == ["c_tanh"]


def test_the_fastest_sample_decides_not_a_median_raised_by_load():
    shape = (32, 64)
    x = tg.input("x", shape)
    node = tg.tanh(x)
    sig = signature([x], node.attrs)
    db = open_db(":memory:")
    for name, (median, fastest) in {"numpy_tanh": (3e-6, 2.5e-6), "c_tanh": (4e-6, 1e-6)}.items():
        k = registry.get(name)
        db.record(Measurement(name, k.source_hash, sig, 5, median, fastest, 2 * median, 1e-8))
    cache.clear()
    step = tg.compile(tg.tanh(x), db=db, backends=("numpy", "c")).plan.steps[0]
    assert step.kernel.name == "c_tanh" and step.cost == pytest.approx(1e-6)


def test_tolerance_picks_the_approximation_only_when_allowed():
    shape = (64, 256)
    x = tg.input("x", shape)
    db = open_db(":memory:")
    rows_for_tanh(db, shape, {"c_tanh_fast": 1e-6, "c_tanh": 4e-6, "numpy_tanh": 8e-6})
    loose = tg.compile(tg.tanh(x), db=db, tolerance=1e-2)
    assert loose.plan.kernels == ["c_tanh_fast"]
    tight = tg.compile(tg.tanh(x), db=db, tolerance=1e-7)
    assert "c_tanh_fast" not in tight.plan.kernels and tight.plan.kernels
    assert tight.plan.error <= 1e-7
    X = RNG.standard_normal(shape).astype(np.float32)
    ref = np.tanh(X.astype(np.float64))
    assert tg.numerics.relative_error(tight(x=X), ref) <= 1e-7
    assert tg.numerics.relative_error(loose(x=X), ref) <= 1e-2


def test_no_path_within_tolerance_names_the_node_and_the_best_error():
    x = tg.input("x", (4, 4))
    with pytest.raises(tg.NoPathError, match=r"tanh.*\(4, 4\).*1\.0e-07"):
        tg.compile(tg.tanh(x), db=":memory:", tolerance=1e-12)


@pytest.mark.parametrize("kwargs, error", [
    ({"device": "tpu"}, tg.DeviceError),
    ({"tolerance": -1e-3}, tg.ArgumentError),
    ({"tolerance": 0}, tg.ArgumentError),
    ({"profile": "always"}, tg.ArgumentError),
    ({"bounds": {"nope": 3}}, tg.ArgumentError),
])
def test_bad_arguments(kwargs, error):
    x = tg.input("x", (4, 4))
    with pytest.raises(error):
        tg.compile(tg.tanh(x), db=":memory:", **kwargs)


def test_reassociation_is_planned_when_much_cheaper():
    a = tg.input("a", (400, 8))
    b = tg.weight("b", (8, 400))
    c = tg.weight("c", (400, 8))
    y = (a @ b) @ c  # 2*400*400*8*2 flops; a @ (b @ c) is ~100x fewer
    prog = tg.compile(y, db=":memory:")
    shapes = [tuple(s.node.shape) for s in prog.plan.steps]
    assert (8, 8) in shapes and (400, 400) not in shapes
    A, B, C = (RNG.standard_normal(s).astype(np.float32) for s in ((400, 8), (8, 400), (400, 8)))
    prog.bind(b=B, c=C)
    ref = (A.astype(np.float64) @ B) @ C
    assert tg.numerics.relative_error(prog(a=A), ref) < 1e-5


def test_plans_are_deterministic_and_lock_files_replay(tmp_path):
    x = tg.input("x", ("batch", 16))
    w = tg.weight("w", (16, 8))
    y = tg.softmax(tg.gelu(x @ w), axis=-1)
    db = open_db(":memory:")
    cache.clear()
    first = tg.compile(y, db=db, bounds={"batch": 4})
    cache.clear()
    second = tg.compile(y, db=db, bounds={"batch": 4})
    assert first.plan.decisions == second.plan.decisions
    path = tmp_path / "plan.json"
    first.save_plan(path)
    cache.clear()
    third = tg.compile(y, db=db, bounds={"batch": 4}, plan=str(path))
    assert third.stats["planner_runs"] == 0 and third.stats["replayed"] == 1
    assert third.plan.kernels == first.plan.kernels
    other = tg.tanh(tg.input("z", (3,)))
    with pytest.raises(tg.TensorGraphsError, match="plan file"):
        tg.compile(other, db=db, plan=str(path))


def test_plan_cache_hits_for_the_same_structure_with_other_names():
    cache.clear()
    db = open_db(":memory:")
    g1 = tg.relu(tg.input("a", (5, 7)) * tg.input("b", (5, 7)))
    g2 = tg.relu(tg.input("c", (5, 7)) * tg.input("d", (5, 7)))
    p1 = tg.compile(g1, db=db)
    p2 = tg.compile(g2, db=db)
    assert p1.stats["planner_runs"] == 1 and p2.stats["plan_cache_hits"] == 1
    a, b = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(p2(c=a, d=b), np.maximum(a * b, 0), rtol=1e-6)


def test_a_cached_plan_that_no_longer_replays_is_planned_again():
    """The plan cache is a shortcut: a cached decision that is gone (a generated kernel refused
    since; int32 right_shift did this) plans again instead of failing the compile."""
    cache.clear()
    db = open_db(":memory:")
    g = tg.relu(tg.input("a", (5, 7)) * tg.input("b", (5, 7)))
    tg.compile(g, db=db)
    ((k, decisions),) = cache._plans.items()
    cache._plans[k] = ("generated:c_fused_refused_since",) + decisions[1:]
    again = tg.compile(g, db=db)
    assert again.stats["planner_runs"] == 1 and again.stats["plan_cache_hits"] == 0
    a, b = RNG.standard_normal((2, 5, 7)).astype(np.float32)
    np.testing.assert_allclose(again(a=a, b=b), np.maximum(a * b, 0), rtol=1e-6)
    assert cache.get(k) == again.plan.decisions


def test_symbolic_dims_plan_on_first_call_and_validate_feeds():
    x = tg.input("x", ("n", 4))
    w = tg.weight("w", (4, 3))
    prog = tg.compile([x @ w, tg.exp(x).sum(axis=0)], db=":memory:")
    with pytest.raises(tg.ArgumentError):
        prog.plan  # noqa: B018 - nothing planned yet
    W = RNG.standard_normal((4, 3)).astype(np.float32)
    with pytest.raises(tg.FeedError, match="not bound"):
        prog(x=np.ones((2, 4), np.float32))
    prog.bind(w=W)
    for n in (2, 5, 2):
        X = RNG.standard_normal((n, 4)).astype(np.float32)
        got = prog(x=X)
        ref = tg.evaluate([x @ w, tg.exp(x).sum(axis=0)], {"x": X, "w": W}, dtype="float64")
        for g, r in zip(got, ref):
            assert tg.numerics.relative_error(g, r) < 1e-5
    assert prog.stats["plans"] == 2
    with pytest.raises(tg.FeedError):
        prog(x=np.ones((2, 4), np.float32), y=1)
    with pytest.raises(tg.ShapeError):
        prog(x=np.ones((2, 5), np.float32))
    with pytest.raises(tg.ShapeError):
        prog.bind(w=np.ones((3, 3), np.float32))


def test_outputs_never_alias_inputs_or_each_other():
    x = tg.input("x", (4,))
    prog = tg.compile([x.reshape(2, 2), x.reshape(2, 2)], db=":memory:")
    X = np.arange(4, dtype=np.float32)
    a, b = prog(x=X)
    a[0, 0] = 99
    assert X[0] == 0 and b[0, 0] == 0


def test_profile_missing_records_rows_and_failures():
    calls = []

    @tg.kernel("tanh", backend="numpy", name="test_broken_tanh", dtypes=("float32",))
    def broken(x):
        calls.append(1)
        raise RuntimeError("broken on purpose")

    try:
        db = open_db(":memory:")
        x = tg.input("x", (8, 8))
        prog = tg.compile(tg.tanh(x), db=db, profile="missing", backends=("numpy",))
        assert prog.stats["measured"] > 0
        rows = {m.kernel: m for m in db.rows()}
        assert rows["numpy_tanh"].ok and rows["numpy_tanh"].error < 1e-6
        assert not rows["test_broken_tanh"].ok
        assert "test_broken_tanh" not in prog.plan.kernels
        X = RNG.standard_normal((8, 8)).astype(np.float32)
        np.testing.assert_allclose(prog(x=X), np.tanh(X), rtol=1e-6)
        assert all(s.source == "measured" for s in prog.plan.steps)
    finally:
        registry.unregister("test_broken_tanh")


def _small_gpt(layers):
    from tensor_graphs.demo import gpt2_style

    return gpt2_style(layers, d_model=64, heads=4, vocab=97, n_ctx=32)


def test_a_quantized_models_layers_are_planned_once_too():
    """int8-dynamic gives each product its own run-time quantization of its input, named
    after its weight without the layer index: with the index every layer's block differed
    and each was searched (MiniLM: 12 of 12, 39 s; now 2 of 12, 26 s). q, k and v, or a
    layer's products that read one input, keep one node each."""
    cache.clear()
    q = tg.quantize(_small_gpt(4), "int8-dynamic")
    own = sorted(n.name for n in nodes(q) if n.op.name == "dynamic_quant")
    assert len(own) == 4 * 4 + 1  # a node per product: four a layer, and the head's
    assert set(own) == {f"h.#.{w}.weight:rows" for w in ("attn.qkv", "attn.proj", "mlp.fc",
                                                          "mlp.proj")} | {"wte.weight:rows"}
    prog = tg.compile(q, db=open_db(":memory:"), bounds={"batch": 2, "seq": 8})
    searches = prog.stats["blocks_planned"]  # one per form the compile planned (1 or 2)
    assert searches >= 1 and prog.stats["blocks"] == 4 * searches
    assert prog.stats["block_cache_hits"] == 3 * searches  # each form: 1 of its 4 searched


def test_repeated_blocks_are_planned_once_and_run_correctly():
    from tensor_graphs.demo import random_feeds

    cache.clear()
    y = _small_gpt(4)
    dims = {"batch": 2, "seq": 8}
    db = open_db(":memory:")
    prog = tg.compile(y, db=db, bounds=dims)
    assert prog.stats["blocks"] == 4
    assert prog.stats["blocks_planned"] == 1 and prog.stats["block_cache_hits"] == 3
    kernels = prog.plan.kernels
    assert kernels.count("c_layer_norm") >= 4
    assert kernels.count("c_attention_causal") + kernels.count("c_attention_causal_bshd") >= 4
    feeds = random_feeds(y, dims)
    feeds["ids"] = RNG.integers(0, 97, (2, 8))
    prog.bind(**{k: v for k, v in feeds.items() if k != "ids"})
    ref = tg.evaluate(y, feeds, dtype="float64")
    assert tg.numerics.relative_error(prog(ids=feeds["ids"]), ref) < 1e-4
    # the same kernels as planning every node on its own, but for the last block's output: a
    # boundary of the block plan, so its residual add fuses into ln_f (c_add_layer_norm) there
    # and into the GEMM (c_packed_linear_add) in the flat plan, at about the same cost; and the
    # first block's input: the flat plan stores the embedding sum beside ln_1 (one generated
    # row kernel, Step.also), where the block plan reads it (c_embedding_add, c_layer_norm)
    from collections import Counter

    from tensor_graphs.compiler import cost_model, prepare
    from tensor_graphs.planner.prepare import as_symbols
    from tensor_graphs.planner.search import Planner

    flat = Planner(prepare([y], {}), target="cpu", cost=cost_model(db, ("cpu",)),
                   tolerance=1e-5, dims=as_symbols(dims)).plan()
    assert sum((Counter(flat.kernels) - Counter(kernels)).values()) <= 3
    assert prog.plan.cost <= flat.cost * 1.005
    # a lock file replays the blocks too
    cache.clear()
    again = tg.compile(y, db=db, bounds=dims)
    assert again.stats["plan_cache_hits"] == 0 and again.plan.decisions == prog.plan.decisions


def test_lock_files_replay_blocks(tmp_path):
    y = _small_gpt(3)
    dims = {"batch": 1, "seq": 4}
    db = open_db(":memory:")
    prog = tg.compile(y, db=db, bounds=dims)
    prog.save_plan(tmp_path / "p.json")
    cache.clear()
    again = tg.compile(y, db=db, bounds=dims, plan=str(tmp_path / "p.json"))
    assert again.stats["planner_runs"] == 0 and again.stats["blocks_planned"] == 1
    assert again.plan.kernels == prog.plan.kernels


def test_measuring_a_kernel_that_takes_one_value_twice():
    from tensor_graphs.profiler.measure import Call, measure

    x = tg.input("x", (8, 8))
    node = x * x
    k = registry.get("numpy_mul")
    m = measure(Call(k, node, (x, x), {}, signature([x, x], node.attrs)), repeats=2)
    assert m.ok and m.error < 1e-6 and m.median > 0


def test_alternatives_are_timed_in_interleaved_rounds(monkeypatch):
    """measure_together: after each call's warm-up and calibration, one sample of every call
    per round, so a burst of other work slows all alternatives alike (every sample comes
    from a round: the calibration is not one); a failing call is a failure row."""
    import dataclasses

    from tensor_graphs.profiler import measure
    from tensor_graphs.profiler.measure import Call, measure_together

    # no sample retaken for contention (tests/profiler/test_contended_samples.py): a retake
    # repeats a call inside its round
    monkeypatch.setattr(measure, "_run_delay", lambda: None)

    x = tg.input("x", (8, 8))
    order: list[str] = []

    def spy(name):
        k = registry.get(name)

        def fn(*a, **kw):
            order.append(name)
            return k.fn(*a, **kw)
        return dataclasses.replace(k, fn=fn)

    calls = [Call(spy(n), op(x), (x, x) if n != "numpy_exp" else (x,), {},
                  signature([x, x] if n != "numpy_exp" else [x], {}))
             for n, op in (("numpy_mul", lambda v: v * v), ("numpy_add", lambda v: v + v),
                           ("numpy_exp", tg.exp))]
    broken = Call(dataclasses.replace(registry.get("numpy_exp"), fn=lambda *a: 1 / 0),
                  tg.exp(x), (x,), {}, signature([x], {}))
    rows = measure_together([*calls, broken], repeats=4, min_sample=0.0)
    assert [r.runs for r in rows] == [4, 4, 4, 0] and "ZeroDivisionError" in rows[3].failure
    assert all(r.ok and r.median > 0 for r in rows[:3])
    rounds = order[-12:]  # four rounds, one per sample: each call once per round, rotating
    assert all(sorted(rounds[i:i + 3]) == ["numpy_add", "numpy_exp", "numpy_mul"]
               for i in (0, 3, 6, 9)), order
    assert rounds[0:3] != rounds[3:6]


def test_a_slow_call_in_the_window_leaves_the_others_their_samples():
    """max_seconds bounds the time spent calling each kernel: a call that is slow to check and
    calibrate (created after the fast one) does not use up the fast one's budget."""
    import dataclasses
    import time

    from tensor_graphs.profiler.measure import Call, measure_together

    x = tg.input("x", (8, 8))
    k = registry.get("numpy_add")

    def slow_fn(*a, **kw):
        time.sleep(0.02)
        return k.fn(*a, **kw)

    fast = Call(k, x + x, (x, x), {}, signature([x, x], {}))
    slow = Call(dataclasses.replace(k, fn=slow_fn), x + x, (x, x), {}, signature([x, x], {}))
    rows = measure_together([fast, slow], repeats=4, max_seconds=0.05)
    assert rows[0].runs == 4 and rows[1].runs >= 1
    assert [r.runs for r in measure_together([fast], repeats=0)] == [1]


def test_a_kv_cache_append_is_measured_on_a_state_leaf():
    """state_update accepts only a state as its first operand: the profiler's leaf for it is
    a state, so the in-place append is measured (it was recorded as a failure, and decode
    planned numpy_exact_state_update)."""
    from tensor_graphs.profiler.measure import Call, measure

    cache_ = tg.state("cache", (1, 2, 9, 4))
    new = tg.input("new", (1, 2, 1, 4))
    node = tg.state_update(cache_, new, offset=9, axis=2)
    m = measure(Call(registry.get("numpy_state_update"), node, (cache_, new), dict(node.attrs),
                     signature([cache_, new], node.attrs)), repeats=2)
    assert m.ok and m.runs == 2 and m.error == 0.0, m.failure


def test_weight_only_steps_run_once_per_binding():
    x = tg.input("x", (3, 4))
    w = tg.weight("w", (5, 4))
    y = x @ tg.exp(w).permute(1, 0)  # exp(w) and its transpose depend on weights only
    prog = tg.compile([y, tg.exp(w)], db=":memory:")
    exe = prog._executable({})
    assert len(exe.prelude) >= 1 and all("exp" not in i.name for i in exe.instructions)
    W = RNG.standard_normal((5, 4)).astype(np.float32)
    X = RNG.standard_normal((3, 4)).astype(np.float32)
    prog.bind(w=W)
    out, ew = prog(x=X)
    np.testing.assert_allclose(out, X @ np.exp(W).T, rtol=1e-5)
    ew[:] = 0  # an output never aliases what later calls reuse
    np.testing.assert_allclose(prog(x=X)[1], np.exp(W), rtol=1e-6)
    prog.bind(w=2 * W)  # a new binding recomputes the prelude
    np.testing.assert_allclose(prog(x=X)[0], X @ np.exp(2 * W).T, rtol=1e-5)


def test_bounds_plan_once_for_every_value_below_them():
    y = _small_gpt(2)
    from tensor_graphs.demo import random_feeds

    db = open_db(":memory:")
    prog = tg.compile(y, db=db, bounds={"batch": 1, "seq": 16})
    feeds = random_feeds(y, {"batch": 1, "seq": 16})
    prog.bind(**{k: v for k, v in feeds.items() if k != "ids"})
    for seq in (4, 9, 16, 4):
        ids = RNG.integers(0, 97, (1, seq))
        ref = tg.evaluate(y, {**feeds, "ids": ids}, dtype="float64")
        assert tg.numerics.relative_error(prog(ids=ids), ref) < 1e-4
    # one plan, one executable, one arena for every seq up to the bound
    assert prog.stats["planner_runs"] == 1 and prog.stats["plans"] == 1
    assert prog.stats["replayed"] == 0
    with pytest.raises(tg.ShapeError, match="seq=17 .bound 16."):
        prog(ids=RNG.integers(0, 97, (1, 17)))


def test_bind_safetensors_binds_every_weight_by_name(tmp_path):
    from tensor_graphs.runtime.weights import write_safetensors

    x = tg.input("x", (2, 4))
    w = tg.weight("w", (4, 3))
    b = tg.weight("b", (3,))
    prog = tg.compile(x @ w + b, db=":memory:")
    W = RNG.standard_normal((4, 3)).astype(np.float32)
    B = RNG.standard_normal(3).astype(np.float32)
    write_safetensors(tmp_path / "m.safetensors", {"model.w": W, "model.b": B})
    with pytest.raises(tg.FeedError, match="rename"):
        prog.bind_safetensors(tmp_path / "m.safetensors")
    with pytest.raises(tg.FeedError, match="not bound"):
        prog(x=np.ones((2, 4), np.float32))  # nothing was half-bound
    prog.bind_safetensors(tmp_path / "m.safetensors", rename=lambda n: n.removeprefix("model."))
    X = RNG.standard_normal((2, 4)).astype(np.float32)
    np.testing.assert_allclose(prog(x=X), X @ W + B, rtol=1e-5)


def test_memory_is_known_before_running_and_too_little_raises_early():
    y = _small_gpt(2)
    dims = {"batch": 2, "seq": 8}
    estimate = tg.estimate_memory(y, db=":memory:", **dims)
    prog = tg.compile(y, db=":memory:", bounds=dims)
    assert prog.memory() == estimate and estimate["cpu"] > 0
    calls = []

    @tg.kernel("layer_norm", backend="numpy", name="test_spy_layer_norm", dtypes=("float32",))
    def spy(x, weight, bias, eps):
        calls.append(1)
        raise AssertionError("no kernel may run before the memory check")

    try:
        small = tg.Device("cpu", capacity=estimate["cpu"] // 2)
        with pytest.raises(tg.OutOfMemory, match="cpu.*needs.*available") as info:
            tg.compile(y, db=":memory:", device=small, bounds=dims)
        assert info.value.required == estimate["cpu"] and info.value.largest
        assert not calls
    finally:
        registry.unregister("test_spy_layer_norm")


def test_estimate_memory_and_paths_take_an_empty_dim_as_a_call_does():
    """A compiled call takes n = 0 (an empty batch); tg.estimate_memory, tg.paths and
    tg.count_paths refused it as "an int of 1 to 2**62"."""
    x = tg.input("x", ("n", 4))
    y = (x @ tg.weight("w", (4, 3))).sum(axis=-1)
    prog = tg.compile(y, db=":memory:", bounds={"n": 4})
    prog.bind(w=np.ones((4, 3), np.float32))
    assert prog(x=np.ones((0, 4), np.float32)).shape == (0,)
    empty = tg.estimate_memory(y, db=":memory:", n=0)
    assert 0 < empty["cpu"] < tg.estimate_memory(y, db=":memory:", n=4)["cpu"]  # w still counts
    assert tg.count_paths(y, db=":memory:", n=0) > 0
    assert next(tg.paths(y, db=":memory:", n=0)).steps
    with pytest.raises(tg.ArgumentError, match="int of 0 to"):
        tg.estimate_memory(y, db=":memory:", n=-1)


def test_arena_results_survive_later_calls():
    y = _small_gpt(2)
    dims = {"batch": 1, "seq": 8}
    from tensor_graphs.demo import random_feeds

    prog = tg.compile(y, db=":memory:", bounds=dims)
    exe = prog._last
    assert any(i.place is not None for i in exe.instructions)  # kernels write into the arena
    feeds = random_feeds(y, dims)
    prog.bind(**{k: v for k, v in feeds.items() if k != "ids"})
    a_ids, b_ids = RNG.integers(0, 97, (2, 1, 8))
    first = prog(ids=a_ids)
    kept = first.copy()
    second = prog(ids=b_ids)
    np.testing.assert_array_equal(first, kept)
    assert not np.shares_memory(first, second)
    ref = tg.evaluate(y, {**feeds, "ids": b_ids}, dtype="float64")
    assert tg.numerics.relative_error(second, ref) < 1e-4


def test_a_weight_view_is_made_dense_once_per_binding():
    x = tg.input("x", (4, 16))
    w = tg.weight("w", (8, 16))
    prog = tg.compile(x @ w.permute(1, 0), db=":memory:", backends=("numpy", "c"))
    exe = prog._executable({})
    W = RNG.standard_normal((8, 16)).astype(np.float32)
    X = RNG.standard_normal((4, 16)).astype(np.float32)
    prog.bind(w=W)
    np.testing.assert_allclose(prog(x=X), X @ W.T, rtol=1e-5)
    if any(i.contiguous for i in exe.instructions):  # the plan reads the view densely
        assert exe._dense_static
        assert all(v.flags.c_contiguous for i, v in exe._static_values if i in
                   exe._dense_static)
    np.testing.assert_allclose(prog(x=X), X @ W.T, rtol=1e-5)


def test_summary_names_whole_and_fused_kernels():
    """The summary lists kernels that compute a composite whole (layer_norm, gelu) and leaves
    out those computing one atomic op; its totals are explain's."""
    x = tg.input("x", (4, 16))
    y = tg.layer_norm(tg.gelu(x)) + x
    prog = tg.compile(y, db=":memory:", backends=("numpy",))
    text = prog.plan.summary()
    whole = {s.kernel.name for s in prog.plan.steps if s.node.op.name in ("layer_norm", "gelu")}
    line = text.splitlines()[-1]
    assert line.startswith("fused or whole: ") and whole
    assert all(f"{name} x1" in line for name in whole)
    assert not any(s.kernel.name in line for s in prog.plan.steps if s.node.op.name == "add")
    assert text.splitlines()[0] in prog.explain()


def test_explain_of_a_plan_of_no_steps_says_so():
    """A graph whose output is its input plans no step: explain printed an empty table and
    bare "by backend: " / "by source: " lines."""
    prog = tg.compile(tg.input("x", (2, 3)), db=":memory:")
    assert not prog.plan.steps
    text = prog.explain()
    assert text.startswith("no steps: nothing runs")
    assert "by backend: none (no steps)" in text and "by source:  none (no steps)" in text
    assert "by backend: none (no steps)" in prog.plan.summary()


def test_a_state_append_costs_its_value_not_the_cache():
    """The runtime appends a kept state in place, so the cost model's bytes for a
    state_update grow with the appended value, not with the cache length."""
    value = tg.input("v", (1, 12, 1, 64))
    moved = []
    for past in (16, 1024):
        kv = tg.state("kv", (1, 12, past, 64))
        new = tg.state_update(kv, value, offset=past, axis=2)
        moved.append(features([new], [kv, value], new).bytes)
    assert moved[0] == moved[1] == 2 * 12 * 64 * 4


def test_a_reshape_that_must_copy_is_dense_for_its_consumer():
    """Attention's output, permuted to (batch, seq, heads, d) and reshaped to (batch, seq,
    heads * d), is copied by the reshape: a kernel reading it densely pays no second copy. A
    reshape that keeps the permuted view (splitting the last axis) is still strided, and a
    slice of a slice stays one."""
    from tensor_graphs.planner.search import _strided

    o = tg.input("o", (2, 3, 5, 4))
    merged = o.permute(0, 2, 1, 3).reshape((2, 5, 12))
    assert not _strided(merged)
    split = o.permute(0, 2, 1, 3).reshape((2, 5, 3, 2, 2))
    assert _strided(split)
    assert _strided(o.permute(0, 2, 1, 3))
    assert not _strided(o.reshape((6, 20)))
    s = tg.input("s", (8, 8))[:, 1:5][:, 0:2]
    assert _strided(s)
    x = tg.input("x", (2, 3, 5, 4))
    assert not _strided(tg.exp(x))


def test_view_layouts_allocate_nothing_of_the_tensors_size():
    """The planner replays views on byte strides over no buffer: the same answers as on a
    real buffer, and planning at seq=2**30 asked numpy for 2.25 TiB before."""
    import resource

    from tensor_graphs.planner.search import _strided

    for shape, build, strided in [
        ((2, 3, 5, 4), lambda o: o.permute(0, 2, 1, 3).reshape((2, 5, 12)), False),
        ((2, 3, 5, 4), lambda o: o.permute(0, 2, 1, 3).reshape((2, 5, 3, 2, 2)), True),
        ((2, 0, 5, 4), lambda o: o.permute(0, 2, 1, 3), False),  # no elements: dense
        ((1, 4, 6), lambda o: o.expand((3, 4, 6)), True),
        ((8, 8), lambda o: o[:, 1:5][:, 0:2], True),
        ((8, 8), lambda o: o[2:6], False),
    ]:
        assert _strided(build(tg.input("o", shape))) is strided, (shape, strided)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    qkv = tg.input("qkv", (1, 2**30, 2304))
    assert _strided(qkv[:, :, 0:768].reshape((1, 2**30, 12, 64)).permute(0, 2, 1, 3))
    assert not _strided(tg.input("big", (1, 2**30, 768)).reshape((2**30, 768)))
    assert _strided(tg.input("huge", (2**40, 2**30)).permute(1, 0))  # no index fits: strided
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB


def test_a_fused_epilogue_beats_a_separate_step_on_a_near_tie():
    """The database times a small elementwise step with its operands hot in cache; in a
    program its input comes from the step before. So each step also pays its activations'
    traffic (a decision term, not in the predicted time): a GEMM + bias measured 2 % slower
    than the GEMM alone plus a hot bias add is still chosen over the pair, whose intermediate
    goes through memory twice."""
    x = tg.input("x", (1024, 384))
    w, b = tg.weight("w", (384, 384)), tg.weight("b", (384,))
    mm = x @ w
    y = mm + b
    db = open_db(":memory:")
    times = {"c_matmul_bias": 1.05e-3, "c_matmul": 1.0e-3, "numpy_add": 3e-5,
             "c_packed_matmul_bias": 9e-3, "c_packed_matmul": 9e-3, "numpy_matmul": 9e-3}
    for name, seconds in times.items():
        k = registry.get(name)
        args = [x, w, b] if name.endswith("bias") else [x, w] if "matmul" in name else [mm, b]
        db.record(Measurement(name, k.source_hash, signature(args, {}), 5, seconds, seconds,
                              seconds, 1e-8))
    prog = tg.compile(y, db=db, backends=("numpy", "c"))
    assert prog.plan.kernels == ["c_matmul_bias"]
    assert prog.plan.cost < 1.06e-3  # predicted: the estimates, without the traffic term
