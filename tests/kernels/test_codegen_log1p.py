"""Generated C renders log1p and expm1 (softplus, asinh, atanh decompose to log1p): a
Mish block x * tanh(softplus(x)) is one region over x, not four steps cut at log1p."""

from __future__ import annotations

import math

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.ir.node import expand_composite
from tensor_graphs.kernels import generated
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c import codegen as cg
from tensor_graphs.kernels.verify import verify
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"no C compiler: {build.unavailable_reason()}")


@pytest.fixture(autouse=True, scope="module")
def _forget_generated_kernels():
    """Generated kernels are registered as they are made: take them out after this module."""
    yield
    cg.clear_cache()


def _elementwise_candidates(y):
    memo: dict = {}  # the planner's decompositions are the same nodes every time

    def expand(n):
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]

    return [c for c in generated.candidates(y, use_counts([y]), expand, "cpu")
            if c.generator == "elementwise"]


def test_the_mish_block_is_one_region_over_its_input():
    """log1p (softplus's tail) stopped the region: the planner's largest option read x, x * 1
    and log1p(exp(-|x|)), so fusing meant four steps (x * 1, exp(-|x|), log1p, the rest),
    each a pass through memory, and the plan kept torch's softplus and two more steps."""
    x = tg.input("x", (256, 4096))
    y = tg.mul(x, tg.tanh(tg.softplus(x)))
    found = _elementwise_candidates(y)
    assert found, "no generated option at the block's root"
    whole = max(found, key=lambda c: len(c.covers))
    assert whole.inputs == (x,), [i.op.name for i in whole.inputs]
    ops = {n.op.name for n in whole.covers}
    assert {"log1p", "exp", "where"} <= ops, ops
    assert "log1p" in whole.summary


def test_log1p_and_expm1_match_the_reference_with_special_values():
    """Every edge numpy (the reference) defines: log1p(-1) = -inf, log1p(x < -1) = nan,
    -0.0 kept, tiny arguments exact (1 + x would round them away), expm1 overflowing to inf
    and saturating at -1; in float32 and float64, on the vector and the scalar tail."""
    for dtype in ("float32", "float64"):
        edges = np.array([-1.0, -1.5, -0.0, 0.0, 1e-30, -1e-30, 1e-10, np.nan, np.inf, -np.inf,
                          100.0, -100.0, 88.8, 709.9, 0.5, -0.5], dtype)
        rng = np.random.default_rng(7)
        vals = np.concatenate([edges, (rng.standard_normal(4099) * 3).astype(dtype)])
        for fn, ref in ((tg.log1p, np.log1p), (tg.expm1, np.expm1)):
            a = tg.input(f"a_{fn.__name__}_{dtype}", (vals.size,), dtype)
            k = cg.fuse_elementwise(fn(a))  # check_kernel, then verify(strict=True)
            with np.errstate(all="ignore"):
                want = ref(vals.astype(np.float64)).astype(dtype)
            got = k(vals)
            assert got.dtype == np.dtype(dtype)
            special = ~np.isfinite(want) | (want == 0)
            assert np.array_equal(got[special], want[special], equal_nan=True), \
                (fn.__name__, dtype, vals[special], got[special], want[special])
            assert np.array_equal(np.signbit(got[special]), np.signbit(want[special]))
            finite = ~special
            assert relative_error(got[finite], want[finite]) < 1e-6, (fn.__name__, dtype)
            tiny = np.abs(vals) == 1e-30
            assert np.array_equal(got[tiny], vals[tiny])  # exact where 1 + x rounds to 1


def test_softplus_asinh_and_atanh_regions_verify():
    """The composites that decompose to log1p, fused whole and passed by verify."""
    x = tg.input("xs", (7, 33))
    for y in (tg.softplus(x), tg.mul(x, tg.tanh(tg.softplus(x))), tg.asinh(x),
              tg.atanh(tg.mul(x, 0.01))):
        region = cg.elementwise_region(tg.decompose(y))
        assert "log1p" in region.ops
        k = cg.fuse_elementwise(region)
        assert verify(k, seed=1).ok
        X = np.random.default_rng(2).standard_normal((7, 33)).astype(np.float32) * 10
        ref = tg.evaluate(y, {"xs": X}, dtype="float64")
        assert relative_error(k(X), ref) < 1e-6


def test_log1p_and_expm1_loops_call_the_vector_functions():
    """A loop that calls a function without a simd declaration is not vectorised at all:
    log1pf and expm1f are declared for libmvec's variants wherever the probe found them."""
    x = tg.input("xv", (33, 1025))
    y = tg.log1p(tg.exp(tg.neg(x))) + tg.expm1(x * 0.5)
    emitted = cg.emit_c(cg.elementwise_region(y))
    found = cg.vector_math_functions()
    for fn in ("log1pf", "expm1f"):
        declared = f"extern float {fn}(float);" in emitted.source
        assert declared == (fn in found), fn
    if {"log1pf", "expm1f"} <= found:
        assert "-lmvec" in emitted.flags


def test_vector_functions_are_probed_on_glibc_with_them():
    """glibc 2.35 added libmvec's log1p and expm1 (x86-64): where its expf is found, these are
    too on such a glibc."""
    import platform

    found = cg.vector_math_functions()
    libc = platform.libc_ver()
    if "expf" not in found or libc[0] != "glibc" or \
            tuple(int(p) for p in libc[1].split(".")[:2]) < (2, 35):
        pytest.skip("no libmvec with log1p/expm1 here")
    assert {"log1pf", "expm1f", "log1p", "expm1"} <= found


def _exact(region, arrays):
    leaves = [cg._leaf_for(k, n, a.shape) for k, (n, a) in enumerate(zip(region.inputs, arrays))]
    graph = cg._on_leaves(region, leaves)
    feeds = {leaf.name: a for leaf, a in zip(leaves, arrays)}
    return np.asarray(tg.evaluate(graph, feeds, dtype="float64"), np.float64)


BOUND_CASES = {  # graph of a -> inputs where it cancels
    "log1p(a) - 0.1": (lambda a: tg.log1p(a) - 0.1,
                       lambda r, n: math.expm1(0.1) + 1e-4 * r.standard_normal(n)),
    "expm1(a) * 3 - 0.5": (lambda a: tg.expm1(a) * 3.0 - 0.5,
                           lambda r, n: math.log1p(0.5 / 3) + 1e-4 * r.standard_normal(n)),
    "log1p(exp(a)) - 0.7": (lambda a: tg.log1p(tg.exp(a)) - 0.7,
                            lambda r, n: math.log(math.expm1(0.7)) + 1e-4 * r.standard_normal(n)),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(BOUND_CASES))
def test_rounding_bound_holds_for_log1p_and_expm1(name, dtype):
    """The bound verification allows on cancelling data is a true bound for the new ops (the
    rule of log at 1 + a, and of exp), on the vector and scalar paths (4099 elements); a
    kernel 1e-5 off is outside it."""
    make, crowd = BOUND_CASES[name]
    n = 4099
    a = tg.input("a", (n,), dtype)
    region = cg.elementwise_region(tg.decompose(make(a)))
    k = cg.fuse_elementwise(region, verify=False, register=False)
    rng = np.random.default_rng(5)
    plain = rng.uniform(-0.9, 3.0, n)  # log1p's domain; the region does not cancel here
    for x in (crowd(rng, n), plain):
        x = np.asarray(x).astype(dtype)
        got = k(x).astype(np.float64)
        ref = _exact(region, [x])
        bound = cg.rounding_bound(region, [x])
        assert np.isfinite(bound).all()
        assert (np.abs(got - ref) <= bound).all(), name
    off = k(x).astype(np.float64) * (1 + 1e-5)
    assert (np.abs(off - ref) > bound).mean() > 0.5


def _vector_calls(root, tmp_path, fn: str) -> int:
    """How many calls of libmvec's vector ``fn`` the region's library makes, in GCC's
    assembly of its C as built (every loop copy: serial, parallel, their narrower tails)."""
    import subprocess

    emitted = cg.emit_c(cg.elementwise_region(tg.decompose(root)))
    src = tmp_path / f"{emitted.symbol}.c"
    src.write_text(emitted.source)
    flags = [f for f in build.flags_for(emitted.flags) if not f.startswith("-l")]
    asm = subprocess.run([build.compiler(), *flags, "-S", "-o", "-", str(src)],
                         capture_output=True, text=True, check=True).stdout
    return sum(1 for line in asm.splitlines()
               if "call" in line and "_ZGV" in line and f"v_{fn}@" in line)


def test_a_select_on_one_condition_twice_does_not_double_the_transcendentals(tmp_path):
    """tanh tests x < 0 twice (|x| first, the sign of the result last). GCC's jump threading
    copied what lay between the two tests into both arms, and the vectoriser ran both copies:
    two vector expf calls (and divisions) per element where the region has one. The loop of
    tanh calls expf as often as a loop with one exp and no select."""
    if not cg._is_gcc() or "expf" not in cg.vector_math_functions():
        pytest.skip("GCC with libmvec only")
    x = tg.input("xj", (33, 1025))
    plain = _vector_calls(tg.exp(tg.mul(x, -2.0)), tmp_path, "expf")
    assert plain > 0
    assert _vector_calls(tg.tanh(x), tmp_path, "expf") == plain


ELEMENT_LOOP = "        for (int64_t j = 0; j < len; j++) {"


def test_a_chain_of_vector_calls_runs_as_one_loop_per_call(monkeypatch):
    """Mish's region is one dependent chain through exp, log1p and exp: in one loop every
    vector waits out each call in turn. The tile runs as a loop per call instead (values the
    later loops read kept in per-tile buffers): the same bits as the single loop on whole
    vectors; a tile's tail (under one vector) may take another libm variant in one stage."""
    vector = sorted(cg.vector_math_functions())
    if not {"expf", "log1pf"} <= set(vector):
        pytest.skip("no libmvec expf/log1pf here: the loop makes no vector calls")
    x = tg.input("xm", (3, 4096))
    region = cg.elementwise_region(tg.decompose(tg.mul(x, tg.tanh(tg.softplus(x)))))
    calls = cg.calls_at(region, vector)
    assert [region.nodes[i].op.name for i in calls] == ["exp", "log1p", "exp"]
    split = cg.stages(region, calls)
    assert len(split) == 4 and [r[-1] for r in split[:3]] == calls
    source = cg.emit_c(region).source
    assert source.count(ELEMENT_LOOP + "\n") == 2 * 4  # the serial and the parallel copy
    staged = cg.fuse_elementwise(region, register=False)
    cg.clear_cache()
    monkeypatch.setattr(cg, "stages", lambda region, calls: [range(len(region.nodes))])
    single = cg.fuse_elementwise(region, register=False)
    assert single.fn.source_text.count(ELEMENT_LOOP + "\n") == 2
    X = (np.random.default_rng(9).standard_normal((3, 4096)) * 8).astype(np.float32)
    X[0, :7] = [np.nan, np.inf, -np.inf, -0.0, 0.0, 25.0, -90.0]
    assert np.array_equal(staged(X), single(X), equal_nan=True)  # whole tiles
    tail = np.ascontiguousarray(X[:, :4093])  # 3 tiles of 1024 and one of 1021 a row
    got, want = staged(tail), single(tail)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    finite = np.isfinite(want)
    assert relative_error(got[finite], want[finite]) < 1e-6
    for gap in (1, 3, 8):  # as the single loop: the bits do not depend on where the output is
        block = np.empty(tail.size + 16, np.float32)
        near = staged(tail, out=block[gap:gap + tail.size].reshape(tail.shape))
        assert np.array_equal(near, got, equal_nan=True)


def test_one_call_or_too_many_buffers_keep_one_loop(monkeypatch):
    """A region with one vector call gains nothing from stages (its source stays as it was),
    and one whose stages would keep more than MAX_STAGE_BUFFERS values per tile is one loop."""
    vector = sorted(cg.vector_math_functions())
    if "expf" not in vector:
        pytest.skip("no libmvec expf here")
    x = tg.input("xo", (7, 33))
    one = cg.elementwise_region(tg.decompose(tg.tanh(x)))
    assert len(cg.stages(one, cg.calls_at(one, vector))) == 1
    wide = [tg.mul(x, float(k + 2)) for k in range(6)]
    y = tg.exp(wide[0])
    for w in wide[1:]:
        y = tg.add(y, w)
    y = tg.exp(y)
    for w in wide:
        y = tg.add(y, w)
    region = cg.elementwise_region(y)
    calls = cg.calls_at(region, vector)
    split = cg.stages(region, calls)
    assert len(split) == 3
    crossing = len(cg._crossing(region, split))
    assert crossing >= 6  # the six products the last stage adds
    monkeypatch.setattr(cg, "MAX_STAGE_BUFFERS", crossing - 1)
    assert len(cg.stages(region, calls)) == 1
