"""The C backend: each kernel against the float64 reference, NaN/inf, attention variants, the
build cache (hits, concurrent compiles, failures), constraint errors, threads.

Runs under AddressSanitizer too (docs/ARCHITECTURE.md, "C backend"):
    TG_C_SANITIZE=address LD_PRELOAD=$(gcc -print-file-name=libasan.so) \\
        ASAN_OPTIONS=detect_leaks=0 python -m pytest tests/kernels/test_c.py
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs import threads
from tensor_graphs.errors import ArgumentError, CCompileError, KernelConstraintError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build

pytestmark = pytest.mark.skipif(not build.available(),
                                reason=f"C backend unavailable: {build.unavailable_reason()}")

SIZES = (1, 7, 33, 1025)


def rel(got, ref) -> float:
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(got - ref) / den) if den else float(np.linalg.norm(got))


def reference(build_fn, names, arrays, **attrs):
    leaves = [tg.input(n, a.shape, str(a.dtype)) for n, a in zip(names, arrays)]
    return tg.evaluate(build_fn(*leaves, **attrs), dict(zip(names, arrays)), dtype="float64")


def check(kname, build_fn, arrays, **attrs):
    k = registry.get(kname)
    got = k(*arrays)
    ref = reference(build_fn, k.inputs, arrays, **attrs)
    assert got.shape == ref.shape
    assert got.dtype == arrays[0].dtype
    err = rel(got, ref)
    assert err <= k.tolerance, f"{kname}: relative error {err:.2e} > {k.tolerance}"
    return got, ref


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


# ----------------------------------------------------------------------------- elementwise
UNARY = {
    "c_neg": tg.neg, "c_reciprocal": tg.reciprocal, "c_sqrt": tg.sqrt, "c_exp": tg.exp,
    "c_log": tg.log, "c_tanh": tg.tanh, "c_sigmoid": tg.sigmoid, "c_erf": tg.erf,
    "c_relu": tg.relu, "c_silu": tg.silu, "c_gelu": tg.gelu,
    "c_gelu_tanh": lambda x: tg.gelu(x, approximate="tanh"), "c_tanh_fast": tg.tanh,
}


def _unary_input(name, rng, n, dtype):
    x = rng.standard_normal(n) * 3
    if name in ("c_log", "c_sqrt"):
        x = np.abs(x) + 0.05
    if name == "c_reciprocal":
        x = np.where(np.abs(x) < 0.1, 0.5, x)
    return x.astype(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_reference(name, dtype, n, rng):
    k = registry.get(name)
    if tg.ir.dtypes.as_dtype(dtype) not in k.dtypes:
        pytest.skip(f"{name} is float32 only")
    check(name, UNARY[name], [_unary_input(name, rng, n, dtype)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_nan_inf_propagate(name, dtype):
    k = registry.get(name)
    if tg.ir.dtypes.as_dtype(dtype) not in k.dtypes:
        pytest.skip(f"{name} is float32 only")
    x = np.array([np.nan, np.inf, -np.inf, -0.0, 0.5, -2.0, 60.0, -60.0, 100.0, -100.0],
                 dtype=dtype)
    with np.errstate(all="ignore"):
        got = k(x)
        ref = reference(UNARY[name], k.inputs, [x]).astype(dtype)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(got), np.isinf(ref))
    fin = np.isfinite(ref)
    np.testing.assert_allclose(got[fin], ref[fin], rtol=max(k.tolerance, 1e-6) * 10, atol=1e-30)


def test_fast_tanh_is_faster_class_and_within_its_tolerance(rng):
    exact, fast = registry.get("c_tanh"), registry.get("c_tanh_fast")
    assert fast.tolerance == 1e-3 and exact.tolerance < fast.tolerance
    x = (rng.standard_normal(100_000) * 3).astype(np.float32)
    ref = np.tanh(x.astype(np.float64))
    assert rel(fast(x), ref) < 1e-4
    assert np.max(np.abs(fast(x) - ref)) < 2e-4
    assert rel(exact(x), ref) < 1e-6


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_swiglu(n, dtype, rng):
    a, b = (rng.standard_normal((2, n)) * 3).astype(dtype)
    check("c_swiglu", lambda a, b: tg.silu(a) * b, [a, b])


# ----------------------------------------------------------------------------- rows
@pytest.mark.parametrize("n", SIZES)
def test_softmax_layer_norm_rms_norm(n, rng):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    check("c_softmax", tg.softmax, [f(3, n) * 4])
    check("c_layer_norm", tg.layer_norm, [f(5, n) + 3, f(n), f(n)])
    check("c_add_layer_norm", lambda a, b, w, c: tg.layer_norm(a + b, w, c),
          [f(2, 5, n) + 3, f(2, 5, n), f(n), f(n)])
    check("c_rms_norm", tg.rms_norm, [f(5, n), f(n)])
    check("c_rms_norm_plain", tg.rms_norm, [f(2, 3, n)])
    if n > 1:  # one element normalises to exactly 0: nothing to compare relatively
        check("c_layer_norm_plain", tg.layer_norm, [f(2, 3, n)])


def test_softmax_nan_row_and_inf():
    x = np.array([[1.0, np.nan, 2.0], [1.0, 2.0, 3.0], [-np.inf, 0.0, 1.0]], np.float32)
    got = registry.get("c_softmax")(x)
    ref = reference(tg.softmax, ["x"], [x])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    np.testing.assert_allclose(got[1:], ref[1:], rtol=1e-6)


@pytest.mark.parametrize("cshape", [(7, 64), (1, 1, 7, 64), (64,), (2, 1, 7, 64), (2, 1, 1, 64)])
def test_rotary(cshape, rng):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    check("c_rotary", tg.rotary_embedding, [f(2, 3, 7, 64), f(*cshape), f(*cshape)])
    check("c_rotary", tg.rotary_embedding, [f(1, 1, 1, 8), f(1, 8), f(1, 8)])


# ----------------------------------------------------------------------------- matmul
@pytest.mark.parametrize("n", SIZES)
def test_matmul_variants(n, rng):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    check("c_matmul", lambda a, b: a @ b, [f(3, n), f(n, 5)])
    check("c_matmul", lambda a, b: a @ b, [f(2, 3, 4, n), f(2, 3, n, 6)])
    check("c_matmul", lambda a, b: a @ b, [f(2, 3, n), f(n, 6)])
    check("c_matmul_bias", lambda a, b, c: a @ b + c, [f(4, n), f(n, 9), f(9)])
    for act, fn in (("relu", tg.relu), ("gelu", tg.gelu),
                    ("gelu_tanh", lambda y: tg.gelu(y, approximate="tanh"))):
        check(f"c_matmul_bias_{act}", lambda a, b, c, fn=fn: fn(a @ b + c),
              [f(4, n), f(n, 9), f(9)])
        check(f"c_linear_{act}", lambda x, w, b, fn=fn: fn(tg.linear(x, w, b)),
              [f(2, 4, n), f(9, n), f(9)])
    check("c_linear", tg.linear, [f(4, n), f(9, n), f(9)])
    check("c_linear_nobias", tg.linear, [f(n), f(9, n)])
    d = lambda *s: rng.standard_normal(s)  # noqa: E731  float64 through dgemm
    check("c_matmul_bias", lambda a, b, c: a @ b + c, [d(4, n), d(n, 9), d(9)])
    # one row (a decode step): gemv, for both weight layouts, batched, shared or not
    check("c_matmul", lambda a, b: a @ b, [f(2, 3, 1, n), f(2, 3, n, 6)])
    check("c_matmul_bias_gelu_tanh", lambda a, b, c: tg.gelu(a @ b + c, approximate="tanh"),
          [f(3, 1, n), f(n, 33), f(33)])
    check("c_linear_nobias", tg.linear, [f(2, 1, n), f(33, n)])
    check("c_linear", tg.linear, [d(1, n), d(7, n), d(7)])


def test_matmul_nan_propagates():
    a = np.ones((2, 3), np.float32)
    a[0, 1] = np.nan
    out = registry.get("c_matmul")(a, np.ones((3, 4), np.float32))
    assert np.isnan(out[0]).all() and np.isfinite(out[1]).all()


# ----------------------------------------------------------------------------- attention
def _attn(rng, b, hq, hkv, sq, sk, d, dv=None, mask=None):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    arrays = [f(b, hq, sq, d), f(b, hkv, sk, d), f(b, hkv, sk, dv or d)]
    if mask is not None:
        arrays.append(f(*mask))
    return arrays


ATTN_SHAPES = [(1, 1, 1, 1, 1, 1), (2, 4, 2, 7, 7, 8), (1, 6, 2, 33, 33, 64),
               (1, 2, 1, 5, 70, 16), (1, 4, 4, 130, 129, 64),
               # head dim 20: 8 x 8 transposes plus a scalar rest when packing K; 45 keys: a
               # partly padded panel; 17 and 140 rows: partial row groups, several row blocks
               (1, 2, 2, 17, 45, 20), (2, 3, 1, 140, 37, 12)]


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", ATTN_SHAPES)
def test_attention_gqa_causal(shape, causal, flash, rng):
    name = "c_" + ("flash_" if flash else "") + "attention" + ("_causal" if causal else "")
    check(name, lambda q, k, v: tg.scaled_dot_product_attention(q, k, v, is_causal=causal),
          _attn(rng, *shape))


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_mask_and_fully_masked_rows(causal, flash, rng):
    name = "c_" + ("flash_" if flash else "") + "attention_mask" + ("_causal" if causal else "")
    sdpa = lambda q, k, v, m: tg.scaled_dot_product_attention(  # noqa: E731
        q, k, v, m, is_causal=causal)
    for b, hq, hkv, sq, sk, d, mshape in [(1, 4, 2, 33, 40, 16, (1, 4, 33, 40)),
                                         (2, 2, 2, 9, 9, 8, (9, 9)),
                                         (1, 3, 1, 70, 70, 32, (1, 1, 70, 70))]:
        arrays = _attn(rng, b, hq, hkv, sq, sk, d, mask=mshape)
        arrays[3][..., :2, :] = -np.inf  # rows with nothing to attend to give 0
        got, ref = check(name, sdpa, arrays)
        assert not np.isnan(got).any()
        np.testing.assert_array_equal(got[..., :2, :], 0.0)


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_bool_mask_read_as_bytes(causal, flash, rng):
    """A bool mask (True = attend) is read by the kernel as bytes, dense along the keys (a
    padding mask) or broadcast along them (stride 0); rows with nothing to attend to give 0."""
    name = "c_" + ("flash_" if flash else "") + "attention_mask" + ("_causal" if causal else "")
    sdpa = lambda q, k, v, m: tg.scaled_dot_product_attention(  # noqa: E731
        q, k, v, m, is_causal=causal)
    q, k, v = _attn(rng, 2, 4, 2, 37, 37, 32)
    padding = np.ones((2, 1, 37, 37), bool)
    padding[0, :, :, 30:] = False  # padded keys of the first sequence
    padding[1, :, :3, :] = False  # rows that see nothing
    rows = rng.random((37, 1)) < 0.7  # broadcast along the keys
    for mask in (padding, rows):
        got, ref = check(name, sdpa, [q, k, v, mask])
        assert not np.isnan(got).any()
    np.testing.assert_array_equal(registry.get(name)(q, k, v, padding)[1, :, :3], 0.0)


def test_attention_rank3_and_value_dim(rng):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    for name in ("c_attention", "c_flash_attention"):
        check(name, tg.scaled_dot_product_attention, [f(4, 9, 8), f(2, 9, 8), f(2, 9, 24)])


@pytest.mark.parametrize("causal", [False, True])
def test_flash_equals_plain_on_long_sequences(causal, rng):
    suffix = "_causal" if causal else ""
    q, k, v = _attn(rng, 1, 4, 2, 300, 300, 64)
    plain = registry.get("c_attention" + suffix)(q, k, v)
    flash = registry.get("c_flash_attention" + suffix)(q, k, v)
    assert rel(flash, plain) < 2e-6
    ref = reference(lambda q, k, v: tg.scaled_dot_product_attention(q, k, v, is_causal=causal),
                    ["q", "k", "v"], [q, k, v])
    assert rel(flash, ref) < 1e-5


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [16, 48])
def test_flash_key_blocks_with_mask_gqa(block, causal, rng):
    """Several key blocks (small `block`): the online softmax's rescaling, causal groups that
    skip blocks, masked rows that see nothing in the first blocks, fully masked rows."""
    from tensor_graphs.kernels.c.attention import attention
    q, k, v, m = _attn(rng, 2, 4, 2, 75, 90, 24, dv=40, mask=(1, 4, 75, 90))
    m[..., :3, :] = -np.inf  # rows that see nothing
    m[..., 5:9, :50] = -np.inf  # rows that see nothing in the first blocks
    got = attention(q, k, v, m, causal, flash=True, block=block)
    ref = reference(lambda q, k, v, m: tg.scaled_dot_product_attention(q, k, v, m,
                                                                       is_causal=causal),
                    ["q", "k", "v", "m"], [q, k, v, m])
    assert rel(got, ref) < 1e-5
    np.testing.assert_array_equal(got[..., :3, :], 0.0)
    plain = attention(q, k, v, m, causal, flash=False)
    assert rel(got, plain) < 2e-6


@pytest.mark.parametrize("flash", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_nan_propagates(masked, flash, rng):
    from tensor_graphs.kernels.c.attention import attention
    q, k, v, m = _attn(rng, 1, 2, 2, 20, 300, 16, mask=(20, 300))
    q[0, 0, 3, 5] = np.nan  # a NaN query: its row's output is NaN
    k[0, 1, 290, 0] = np.nan  # a NaN key in the last key block: every row of head 1
    got = attention(q, k, v, m if masked else None, False, flash=flash, block=64)
    assert np.isnan(got[0, 0, 3]).all()
    assert np.isnan(got[0, 1]).all()
    others = np.delete(got[0, 0], 3, axis=0)
    assert np.isfinite(others).all()


def test_attention_concurrent_calls(rng):
    """Python threads calling at once (ctypes releases the GIL): the packed-K/V buffer kept
    between calls is taken by one call at a time, the others allocate their own."""
    from concurrent.futures import ThreadPoolExecutor
    shapes = [(1, 4, 2, 70, 70, 32), (1, 2, 2, 130, 129, 64), (2, 3, 3, 9, 40, 8)]
    cases = [(name, _attn(rng, *s)) for s in shapes
             for name in ("c_attention", "c_flash_attention_causal")]
    want = [registry.get(name)(*arrays) for name, arrays in cases]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(3):
            got = list(pool.map(lambda c: registry.get(c[0])(*c[1]), cases * 4))
            for i, g in enumerate(got):
                np.testing.assert_array_equal(g, want[i % len(cases)])


# ----------------------------------------------------------------------------- constraints
def test_constraint_errors_name_the_kernel(rng):
    x = rng.standard_normal((3, 8)).astype(np.float32)
    with pytest.raises(KernelConstraintError, match="c_layer_norm"):
        registry.get("c_layer_norm")(x, np.ones(7, np.float32), np.ones(8, np.float32))
    with pytest.raises(KernelConstraintError, match="c_tanh.*int32"):
        registry.get("c_tanh")(np.ones(3, np.int32))
    with pytest.raises(KernelConstraintError, match="c_softmax.*float64"):
        registry.get("c_softmax")(x.astype(np.float64))
    with pytest.raises(KernelConstraintError, match="c_exp.*contiguous"):
        registry.get("c_exp")(x.T)
    with pytest.raises(KernelConstraintError, match="c_matmul.*batch dims"):
        registry.get("c_matmul")(np.ones((2, 3, 4), np.float32), np.ones((3, 4, 5), np.float32))
    q = np.ones((1, 3, 4, 8), np.float32)
    with pytest.raises(KernelConstraintError, match="c_attention.*multiple"):
        registry.get("c_attention")(q, np.ones((1, 2, 4, 8), np.float32),
                                    np.ones((1, 2, 4, 8), np.float32))
    with pytest.raises(KernelConstraintError, match="c_swiglu.*one dtype"):
        registry.get("c_swiglu")(np.ones(3, np.float32), np.ones(3, np.float64))


def test_kernels_are_registered_as_c(rng):
    names = {k.name for k in tg.kernels.all() if k.backend == "c"}
    for want in ("c_tanh", "c_matmul", "c_linear_gelu_tanh", "c_swiglu", "c_softmax",
                 "c_layer_norm", "c_rms_norm", "c_rotary", "c_attention",
                 "c_flash_attention_causal", "c_tanh_fast"):
        assert want in names
    assert all(registry.get(n).source_hash for n in names)


# ----------------------------------------------------------------------------- build cache
def test_second_load_is_a_cache_hit(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    src = f"int tg_answer(void) {{ return 42; }} /* {uuid.uuid4()} */\n"
    before = dict(build.stats)
    lib = build.load_library("answer", src)
    assert lib.tg_answer() == 42
    assert build.stats["compiled"] == before["compiled"] + 1
    path = build.library_path("answer", src)
    assert path.exists() and path.parent == tmp_path / "c"
    build._loaded.clear()  # as a fresh process would: found on disk, not compiled
    build.load_library("answer", src)
    assert build.stats["compiled"] == before["compiled"] + 1
    assert build.stats["disk_hits"] == before["disk_hits"] + 1
    build.load_library("answer", src)
    assert build.stats["memory_hits"] == before["memory_hits"] + 1
    assert build.library_path("answer", src, ["-DX=1"]) != path  # flags are in the key
    assert not [p for p in tmp_path.joinpath("c").iterdir() if p.name.startswith(".")]


def test_concurrent_processes_compile_the_same_source(tmp_path, child_env):
    token = uuid.uuid4().hex
    script = textwrap.dedent(f"""
        from tensor_graphs.kernels.c import build
        src = "int tg_twice(int x) {{ return 2 * x; }} /* {token} */\\n" + "\\n" * 20000
        lib = build.load_library("twice", src)
        assert lib.tg_twice(21) == 42
        print(build.stats["compiled"], build.library_path("twice", src))
    """)
    env = dict(child_env, TG_CACHE_DIR=str(tmp_path))
    procs = [subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    paths = {out.split()[1] for out, _ in outs}
    assert len(paths) == 1 and Path(paths.pop()).exists()
    leftovers = [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")]
    assert not leftovers


def test_compile_failure_reports_compiler_output(tmp_path, monkeypatch):
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    with pytest.raises(CCompileError) as info:
        build.load_library("broken", "int broken( { return; }\n")
    assert "error" in info.value.output
    assert "error" in str(info.value)
    assert build.available()  # one bad source does not take the backend down
    assert not [p for p in (tmp_path / "c").iterdir() if p.name.startswith(".")]


def test_missing_compiler_makes_the_backend_unavailable(tmp_path, child_env):
    script = textwrap.dedent("""
        import numpy as np
        import tensor_graphs as tg
        from tensor_graphs.kernels.c import build
        assert not build.available()
        print("REASON", build.unavailable_reason().splitlines()[0])
        k = tg.kernels.get("c_tanh")
        x = tg.input("x", (3,))
        assert k.match(tg.tanh(x)) is None  # the planner never picks it
        try:
            k(np.ones(3, np.float32))
        except tg.TensorGraphsError as e:
            print("ERR", type(e).__name__)
    """)
    env = dict(child_env, TG_CACHE_DIR=str(tmp_path), CC="/bin/false")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert "REASON" in res.stdout and "ERR KernelConstraintError" in res.stdout


# ----------------------------------------------------------------------------- threads
def test_threads_setting():
    old = threads.get_num_threads()
    try:
        threads.set_num_threads(1)
        assert threads.get_num_threads() == 1
        registry.get("c_exp")(np.ones(100_000, np.float32))  # a library is loaded and follows
        if threads.openblas_num_threads() is not None:
            assert threads.openblas_num_threads() == 1
        with pytest.raises(ArgumentError):
            threads.set_num_threads(0)
    finally:
        threads.set_num_threads(old)


def test_threads_env_default(child_env):
    script = ("from tensor_graphs import threads; import numpy as np, tensor_graphs as tg;"
              "tg.kernels.get('c_matmul')(np.ones((4, 4), np.float32), np.ones((4, 4), "
              "np.float32)); print(threads.get_num_threads(), threads.openblas_num_threads())")
    env = dict(child_env, TG_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["1", "1"]


@pytest.mark.parametrize("first, warned", [("tensor_graphs, numpy, torch", False),
                                           ("numpy, tensor_graphs", True),
                                           ("torch, tensor_graphs", True)])
def test_pools_loaded_before_the_spin_settings_are_named(first, warned, child_env):
    """The spin settings reach numpy's and torch's pools only when tensor_graphs comes first;
    otherwise the import says which pools keep spinning and how to fix it."""
    script = (f"import warnings; warnings.simplefilter('always'); import {first}; import os; "
              "from tensor_graphs import threads; "
              "print(os.environ['OPENBLAS_THREAD_TIMEOUT'], threads.late_pools)")
    env = {k: v for k, v in child_env.items()
           if k not in ("OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    res = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("4 ")
    assert ("keep spinning" in res.stderr) == warned, res.stderr
    if warned:
        assert first.split(",")[0] in res.stderr and "OPENBLAS_THREAD_TIMEOUT=4" in res.stderr
