"""int8-dynamic: ``dynamic_quant`` (the activation's rows quantized at run time) and the C int8 x
int8 GEMM (kernels/c/quant_dyn.c) against the float64 reference of the quantized graph, on
every instruction path (AVX-512 VNNI, AVX-VNNI, AVX2, portable: ``TG_INT8_ISA`` forces one),
with adversarial rows: large offsets, zero rows, NaN and inf, exact ties, saturation at
+-127 and weights of -128."""

import os
import subprocess
import sys

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir.dtypes import as_dtype
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.kernels.c import quant_dyn as qd
from tensor_graphs.kernels.verify import verify
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

ACTS = {None: lambda y: y, "relu": tg.relu, "gelu": lambda y: tg.gelu(y),
        "gelu_tanh": lambda y: tg.gelu(y, approximate="tanh")}
PATHS = [name for name in qd.ISAS if build.available() and qd.supported(name)]


def _reference(a, q, s, bias=None, res=None, act=None):
    """The quantized graph in float64: dynamic_quant's and dequantize's decompositions."""
    A, Q, S = tg.input("a", a.shape), tg.input("q", q.shape, "int8"), tg.input("s", s.shape)
    y = tg.dynamic_quant(A) @ tg.dequantize(Q, S)
    feeds = {"a": a, "q": q, "s": s}
    if bias is not None:
        y = y + tg.input("bias", bias.shape)
        feeds["bias"] = bias
    y = ACTS[act](y)
    if res is not None:
        y = y + tg.input("res", res.shape)
        feeds["res"] = res
    with np.errstate(invalid="ignore"):
        return evaluate(y, feeds, dtype="float64")


def _adversarial(rng, m, k):
    """Rows a quantizer gets wrong: a zero row, a row at +1e4 with a spread of 1 (all but the
    spread rounds to one value), a row of exact ties (x / s = n + 1/2), a row whose max is
    far above the rest (everything else 0 or +-1), a constant row (every q = +-127)."""
    a = rng.standard_normal((m, k)).astype(np.float32)
    kinds = [np.zeros(k), 1e4 + rng.standard_normal(k), None, None, np.full(k, -3.5)]
    for i, row in enumerate(kinds[:m]):
        if row is not None:
            a[i] = row
    if m > 2:  # ties: max 254 -> s = 2, so odd integers divide to n + 0.5
        a[2] = rng.integers(-127, 128, k) * 2 + rng.choice([-1.0, 1.0], k)
        a[2, 0] = 254.0
    if m > 3:
        a[3] = rng.choice([0.0, 1.0, -1.0], k) * 0.3
        a[3, -1] = 1e6
    return a


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (1, 33, 17), (5, 67, 31), (13, 130, 80),
                                   (7, 384, 70), (100, 96, 129)])
def test_q8d_gemm_matches_the_quantized_reference(path, m, k, n):
    rng = np.random.default_rng(100 * m + k + n)
    a = _adversarial(rng, m, k)
    q = rng.integers(-128, 128, (k, n)).astype(np.int8)  # -128 too (AVX2's sign trick)
    s = (rng.random((1, n)) * 0.02 + 1e-3).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    res = rng.standard_normal((m, n)).astype(np.float32)
    packed = qd.pack(q)
    code = qd.ISAS[path]
    ref = _reference(a, q, s)
    assert relative_error(qd.gemm(a, packed, s, path=code), ref) <= 1e-6
    for act in ACTS:
        ref = _reference(a, q, s, bias, res, act)
        got = qd.gemm(a, packed, s, bias, act, res=res, path=code)
        assert relative_error(got, ref) <= 1e-6, act


@pytest.mark.parametrize("path", PATHS)
def test_q8d_nonfinite_rows_follow_the_reference(path):
    """A row with NaN: its scale is NaN (1 only for a zero row), so every output of the row
    is NaN, as the float product's (the quantization does not hide it); a row with inf:
    scale inf, every output NaN."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 40)).astype(np.float32) * 3
    a[1, 5] = np.nan
    a[2, 7] = -np.inf
    q = rng.integers(-127, 128, (40, 20)).astype(np.int8)
    s = np.full((1, 20), 0.01, np.float32)
    ref = _reference(a, q, s)
    got = qd.gemm(a, q, s, path=qd.ISAS[path])
    assert np.array_equal(np.isnan(got), np.isnan(ref))
    assert np.isnan(got[1]).all() and np.isnan(got[2]).all()
    rows = [0, 3]
    assert relative_error(got[rows], ref[rows]) <= 1e-6


def test_dynamic_quant_is_what_the_kernel_uses():
    """The op's own values: zero rows stay zero, the max of a row maps to +-127, ties round
    to even; the kernel's product equals the float64 product of those values."""
    x = np.array([[0, 0, 0, 0], [254, 1, 3, -5], [-2, 1, 0.5, 0]], np.float32)
    got = evaluate(tg.dynamic_quant(tg.input("x", x.shape)), {"x": x}, dtype="float64")
    # row 1: s = 2, so 1/2 -> 0, 3/2 -> 2, -5/2 -> -2 (half to even); row 2: s = 2/127
    assert np.allclose(got[0], 0) and np.allclose(got[1], [254, 0, 4, -4])
    assert np.allclose(got[2] / (2 / 127), [-127, 64, 32, 0])  # 63.5 -> 64, 31.75 -> 32
    q = np.eye(4, dtype=np.int8)
    for path in PATHS:
        out = qd.gemm(x, q, np.ones((1, 4), np.float32), path=qd.ISAS[path])
        assert relative_error(out, got) <= 1e-7, path


def test_q8d_kernels_verify():
    for name in ("c_q8d_matmul", "c_q8d_matmul_bias", "c_q8d_matmul_bias_gelu",
                 "c_q8d_matmul_bias_relu", "c_q8d_matmul_bias_gelu_tanh", "c_q8d_matmul_add",
                 "c_q8d_matmul_bias_add"):
        report = verify(name)
        assert report.ok, report


def test_q8d_constraints_and_packing_errors():
    where = registry.get("c_q8d_matmul").where
    f, i = as_dtype("float32"), as_dtype("int8")
    assert where([(3, 8), (8, 4), (1, 4)], [f, i, f], {}) is True
    assert "scale" in where([(1, 8), (8, 4), (4,)], [f, i, f], {})
    assert "inner dims" in where([(1, 7), (8, 4), (1, 4)], [f, i, f], {})
    a = np.ones((2, 8), np.float32)
    with pytest.raises(ValueError, match="packed as"):
        qd.gemm(a, qd.pack(np.ones((9, 4), np.int8)), np.ones((1, 4), np.float32))


def test_the_isa_switch(monkeypatch):
    """TG_INT8_ISA picks the path (each checked above against the reference); a name that is
    not one, or a path this CPU lacks, is refused naming the choices."""
    monkeypatch.setenv(qd.ENV, "portable")
    assert qd.isa_name() == "portable"
    monkeypatch.setenv(qd.ENV, "avx-512")
    with pytest.raises(ArgumentError, match="portable"):
        qd.isa()
    monkeypatch.delenv(qd.ENV)
    assert qd.isa_name() == PATHS[0]  # the widest this CPU runs


def test_the_isa_switch_reaches_a_compiled_program():
    """A whole int8-dynamic program under TG_INT8_ISA=avx2 in a fresh process gives the same
    result as the widest path (the int32 sums are exact on each)."""
    code = (
        "import numpy as np, tensor_graphs as tg\n"
        "x = tg.input('x', (5, 48)); w = tg.weight('w', (48, 24))\n"
        "p = tg.compile(tg.quantize(x @ w, 'int8-dynamic'), db=':memory:')\n"
        "rng = np.random.default_rng(0)\n"
        "p.bind(w=rng.standard_normal((48, 24)).astype(np.float32))\n"
        "y = p(x=rng.standard_normal((5, 48)).astype(np.float32))\n"
        "print(repr(y.tobytes().hex()), [s.kernel.name for s in p.plan.steps if 'q8d' in "
        "s.kernel.name])\n")
    outs = []
    for isa in ("avx2", ""):
        env = {**os.environ, "TG_INT8_ISA": isa}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, check=True)
        outs.append(done.stdout)
    assert "c_q8d_matmul" in outs[0] and outs[0] == outs[1]


def test_a_quantized_model_plans_few_more_slots_than_its_float_form():
    """Every quantize rounds half to even. Built from int64 casts, the rounding was ~40
    atomic ops, each a slot the planner costs: a small GPT-2's int8-dynamic form had 5.3x
    its float form's slots (3168 against 602) and compiled 5.5x slower. An atomic
    ``round_half_even`` leaves 2.6x."""
    from tensor_graphs.demo import gpt2_style

    model = gpt2_style(4, d_model=384, heads=6, vocab=1000, n_ctx=128)
    bounds = {"batch": 2, "seq": 64}
    slots = {}
    for label, graph in (("float", model), ("int8-dynamic", tg.quantize(model, "int8-dynamic"))):
        prog = tg.compile(graph, bounds=bounds, profile="never")
        slots[label] = prog.stats["slots"]
    assert slots["int8-dynamic"] < 3 * slots["float"], slots
