"""C kernels against numpy and torch eager on GPT-2-sized shapes (seq 128, d 768, 12 heads).

    python benchmarks/kernels.py [--repeats 15] [--threads N] [--quick] [--only TEXT]

C times are of the kernel function itself (its constraints are checked once beforehand, as a
compiled plan does). Everything runs in one process with one thread setting
(tensor_graphs.threads: OpenBLAS, OpenMP and torch together). Repeats are interleaved (C,
numpy, torch, next case, ... then the next repeat), each sample times enough calls to last
>= 2 ms; the table shows medians with the 10th-90th percentile spread, and the ratios numpy/C
and torch/C (> 1: C is faster). Each C result is checked against numpy first, so a row never
compares different computations. The matmul section compares the C matmul's throughput with
OpenBLAS's own sgemm (the same library, called directly) and with numpy's and torch's matmul;
the packed-GEMM section compares c_packed_matmul (weight packed once, outside the timing, as a
compiled program does per binding) with c_matmul, numpy, torch and ONNX Runtime's MatMul (MLAS,
where onnxruntime is installed; ORT/pk > 1: ours is faster) on GPT-2's layer shapes, the LM
head and one-row decode.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import numpy as np


from tensor_graphs import threads  # noqa: E402
from tensor_graphs.kernels import registry  # noqa: E402
from tensor_graphs.kernels.c import matmul as c_matmul  # noqa: E402

try:
    import torch
    import torch.nn.functional as F  # noqa: N812
except ImportError:  # the table then has no torch column
    torch = None
    F = None

SEQ, D, HEADS, HD, FF = 128, 768, 12, 64, 3072


def k(name):
    return registry.get(name)


# ------------------------------------------------------------------------------ numpy refs
def np_sigmoid(x):
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def np_erf(x):
    # numpy has no erf ufunc: math.erf per element, a slow but exact baseline
    return np.vectorize(math.erf, otypes=[x.dtype])(x)


def np_gelu(x):
    return (0.5 * x * (1.0 + np_erf(x * np.float32(1 / math.sqrt(2))))).astype(x.dtype)


def np_gelu_tanh(x):
    c = np.float32(math.sqrt(2 / math.pi))
    return 0.5 * x * (1.0 + np.tanh(c * (x + np.float32(0.044715) * x * x * x)))


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_layer_norm(x, w, b, eps=1e-5):
    m = x.mean(-1, keepdims=True)
    c = x - m
    return c / np.sqrt((c * c).mean(-1, keepdims=True) + eps) * w + b


def np_rms_norm(x, w, eps=1e-6):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def np_rotary(x, cos, sin):
    h = x.shape[-1] // 2
    rot = np.concatenate([-x[..., h:], x[..., :h]], axis=-1)
    return x * cos + rot * sin


def np_attention(q, k_, v, mask=None, causal=False):
    group = q.shape[-3] // k_.shape[-3]
    if group > 1:  # grouped-query attention: each kv head serves `group` q heads
        k_, v = np.repeat(k_, group, axis=-3), np.repeat(v, group, axis=-3)
    s = q @ np.swapaxes(k_, -1, -2) / np.float32(math.sqrt(q.shape[-1]))
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    return np_softmax(s) @ v


# ------------------------------------------------------------------------------ torch refs
def t_rotary(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., h:], x[..., :h]], dim=-1) * sin


def cases(rng, quick: bool):
    f = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    hid = f(SEQ, FF)
    pos = np.abs(hid) + np.float32(0.1)
    x = f(SEQ, D)
    w, b = f(D), f(D)
    w1, b1 = f(D, FF) * np.float32(0.03), f(FF)
    wl, bl = f(D, D) * np.float32(0.03), f(D)
    scores = f(1, HEADS, SEQ, SEQ)
    q, kk, v = f(1, HEADS, SEQ, HD), f(1, HEADS, SEQ, HD), f(1, HEADS, SEQ, HD)
    kg, vg = f(1, HEADS // 3, SEQ, HD), f(1, HEADS // 3, SEQ, HD)  # GQA: 4 kv heads
    mask = f(1, 1, SEQ, SEQ)
    xr, cos, sin = f(1, HEADS, SEQ, HD), f(SEQ, HD), f(SEQ, HD)
    g = f(SEQ, FF)
    to_t = (lambda *a: tuple(torch.from_numpy(t) for t in a)) if torch else None  # noqa: E731

    out = []

    def add(name, kernel, args, np_fn, t_fn=None, flops=None):
        targs = to_t(*args) if torch else None
        kern = k(kernel)
        kern.check(args)  # constraints once, as a compiled plan does; then the function alone
        out.append((name, lambda: kern.fn(*args), lambda: np_fn(*args),
                    (lambda: t_fn(*targs)) if (torch and t_fn) else None, flops))

    unary = [("tanh", "c_tanh", np.tanh, "tanh"), ("tanh_fast", "c_tanh_fast", np.tanh, "tanh"),
             ("exp", "c_exp", np.exp, "exp"), ("log", "c_log", np.log, "log"),
             ("sqrt", "c_sqrt", np.sqrt, "sqrt"), ("neg", "c_neg", np.negative, "neg"),
             ("reciprocal", "c_reciprocal", np.reciprocal, "reciprocal"),
             ("sigmoid", "c_sigmoid", np_sigmoid, "sigmoid"),
             ("erf", "c_erf", np_erf, "erf"),
             ("relu", "c_relu", lambda a: np.maximum(a, 0), "relu"),
             ("silu", "c_silu", lambda a: a * np_sigmoid(a), "silu"),
             ("gelu", "c_gelu", np_gelu, "gelu"),
             ("gelu_tanh", "c_gelu_tanh", np_gelu_tanh, "gelu_tanh")]
    tmap = {} if not torch else {
        "tanh": torch.tanh, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
        "neg": torch.neg, "reciprocal": torch.reciprocal, "sigmoid": torch.sigmoid,
        "erf": torch.erf, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu,
        "gelu_tanh": lambda a: F.gelu(a, approximate="tanh")}
    for name, kern, np_fn, tn in unary:
        arg = pos if name in ("log", "sqrt") else hid
        add(f"{name} {arg.shape}", kern, (arg,), np_fn, tmap.get(tn))
    add(f"swiglu {hid.shape}", "c_swiglu", (hid, g), lambda a, b_: a * np_sigmoid(a) * b_,
        (lambda a, b_: F.silu(a) * b_) if torch else None)
    add(f"softmax {scores.shape}", "c_softmax", (scores,), np_softmax,
        (lambda a: torch.softmax(a, -1)) if torch else None)
    add(f"layer_norm {x.shape}", "c_layer_norm", (x, w, b), np_layer_norm,
        (lambda a, w_, b_: F.layer_norm(a, (D,), w_, b_)) if torch else None)
    add(f"rms_norm {x.shape}", "c_rms_norm", (x, w), np_rms_norm,
        (lambda a, w_: F.rms_norm(a, (D,), w_, eps=1e-6)) if torch else None)
    add(f"rotary {xr.shape}", "c_rotary", (xr, cos, sin), np_rotary, t_rotary)
    mm_flops = 2 * SEQ * D * FF
    add(f"matmul {x.shape}@{w1.shape}", "c_matmul", (x, w1), np.matmul,
        torch.matmul if torch else None, mm_flops)
    add("matmul+bias+gelu_tanh (MLP up)", "c_matmul_bias_gelu_tanh", (x, w1, b1),
        lambda a, w_, b_: np_gelu_tanh(a @ w_ + b_),
        (lambda a, w_, b_: F.gelu(torch.addmm(b_, a, w_), approximate="tanh"))
        if torch else None, mm_flops)
    add(f"linear {x.shape}x{wl.shape}^T+b", "c_linear", (x, wl, bl),
        lambda a, w_, b_: a @ w_.T + b_, F.linear if torch else None, 2 * SEQ * D * D)
    att_flops = 4 * HEADS * SEQ * SEQ * HD
    sdpa = (lambda **kw: (lambda *a: F.scaled_dot_product_attention(*a, **kw))) if torch \
        else (lambda **kw: None)
    add("attention (1,12,128,64)", "c_attention", (q, kk, v), np_attention, sdpa(),
        att_flops)
    add("attention causal", "c_attention_causal", (q, kk, v),
        lambda *a: np_attention(*a, causal=True), sdpa(is_causal=True), att_flops // 2)
    add("attention + mask", "c_attention_mask", (q, kk, v, mask), np_attention, sdpa(),
        att_flops)
    add("attention GQA (12 q, 4 kv heads)", "c_attention", (q, kg, vg), np_attention,
        sdpa(enable_gqa=True), att_flops)
    add("attention GQA causal", "c_attention_causal", (q, kg, vg),
        lambda *a: np_attention(*a, causal=True), sdpa(enable_gqa=True, is_causal=True),
        att_flops // 2)
    add("flash attention", "c_flash_attention", (q, kk, v), np_attention, sdpa(), att_flops)
    add("flash attention causal", "c_flash_attention_causal", (q, kk, v),
        lambda *a: np_attention(*a, causal=True), sdpa(is_causal=True), att_flops // 2)
    if not quick:
        n = 1024
        ql, kl, vl = f(1, HEADS, n, HD), f(1, HEADS, n, HD), f(1, HEADS, n, HD)
        lf = 4 * HEADS * n * n * HD // 2
        add(f"attention causal, seq {n}", "c_attention_causal", (ql, kl, vl),
            lambda *a: np_attention(*a, causal=True), sdpa(is_causal=True), lf)
        add(f"flash attention causal, seq {n}", "c_flash_attention_causal", (ql, kl, vl),
            lambda *a: np_attention(*a, causal=True), sdpa(is_causal=True), lf)
        add(f"flash attention, seq {n}", "c_flash_attention", (ql, kl, vl), np_attention,
            sdpa(), 2 * lf)
    return out


def timer(fn, inner):
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - t0) / inner


def calibrate(fn, target=2e-3):
    fn()
    one = timer(fn, 1)
    return max(1, min(1000, int(target / max(one, 1e-7))))


def check(name, c_fn, np_fn):
    got = np.asarray(c_fn(), dtype=np.float64)
    ref = np.asarray(np_fn(), dtype=np.float64)
    err = np.linalg.norm(got - ref) / max(np.linalg.norm(ref), 1e-30)
    if not err < 1e-3:
        raise SystemExit(f"{name}: C and numpy disagree (relative error {err:.2e})")


def fmt(t):
    return f"{t * 1e6:9.1f}" if t is not None else "        -"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="skip the long-sequence rows")
    ap.add_argument("--only", metavar="TEXT", default=None,
                    help="only the kernel rows whose name contains TEXT (and no matmul, "
                         "packed or generated-C sections unless TEXT is in 'matmul', "
                         "'packed gemm' or 'generated')")
    args = ap.parse_args(argv)
    if args.threads:
        threads.set_num_threads(args.threads)
    else:
        threads.set_num_threads(threads.get_num_threads())  # torch is imported: it follows
    n = threads.get_num_threads()
    rng = np.random.default_rng(0)
    rows = cases(rng, args.quick)
    if args.only:
        rows = [r for r in rows if args.only in r[0]]
    print(f"# C kernels vs numpy {np.__version__} and torch "
          f"{torch.__version__ if torch else '(absent)'}; {n} thread(s) "
          f"(OpenBLAS, OpenMP, torch); {args.repeats} interleaved repeats; times in us")
    plans = []
    for name, c_fn, np_fn, t_fn, _ in rows:
        check(name, c_fn, np_fn)
        plans.append([calibrate(fn) if fn else 0 for fn in (c_fn, np_fn, t_fn)])
    samples = [[[], [], []] for _ in rows]
    for _ in range(args.repeats):
        for i, (_name, c_fn, np_fn, t_fn, _) in enumerate(rows):
            for j, fn in enumerate((c_fn, np_fn, t_fn)):
                if fn is not None:
                    samples[i][j].append(timer(fn, plans[i][j]))
    hdr = (f"{'kernel':38s} {'C med':>9s} {'C p10-p90':>17s} {'numpy':>9s} {'torch':>9s} "
           f"{'np/C':>6s} {'torch/C':>7s} {'C GF/s':>7s}")
    print(hdr)
    print("-" * len(hdr))
    for (name, _, _, _, flops), s in zip(rows, samples):
        med = [float(np.median(x)) if x else None for x in s]
        lo, hi = np.percentile(s[0], [10, 90])
        r_np = f"{med[1] / med[0]:6.2f}" if med[1] else "     -"
        r_t = f"{med[2] / med[0]:7.2f}" if med[2] else "      -"
        gf = f"{flops / med[0] / 1e9:7.1f}" if flops else "      -"
        print(f"{name:38s} {fmt(med[0])} {lo * 1e6:8.1f}-{hi * 1e6:<8.1f} {fmt(med[1])} "
              f"{fmt(med[2])} {r_np} {r_t} {gf}")
    if not args.only or args.only in "matmul":
        blas_vs_raw(args.repeats)
    if not args.only or args.only in "packed gemm":
        packed_gemm(args.repeats, args.quick)
    if not args.only or args.only in "generated":
        fused_codegen(args.repeats)


def blas_vs_raw(repeats):
    """The C matmul's throughput against OpenBLAS's sgemm called directly."""
    rng = np.random.default_rng(1)
    print("\n# matmul throughput (GFLOP/s, median of interleaved samples)")
    print(f"{'shape (m, k, n)':24s} {'c_matmul':>9s} {'raw sgemm':>9s} {'C/raw':>6s} "
          f"{'numpy':>7s} {'torch':>7s}")
    for m, kk, nn in ((SEQ, D, FF), (SEQ, FF, D), (SEQ, D, D), (512, 768, 3072)):
        a = rng.standard_normal((m, kk)).astype(np.float32)
        b = rng.standard_normal((kk, nn)).astype(np.float32)
        fns = [lambda a=a, b=b: k("c_matmul")(a, b),
               lambda a=a, b=b: c_matmul.raw_sgemm(a, b), lambda a=a, b=b: a @ b]
        if torch:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            fns.append(lambda ta=ta, tb=tb: ta @ tb)
        inner = [calibrate(fn) for fn in fns]
        s = [[] for _ in fns]
        for _ in range(repeats):
            for j, fn in enumerate(fns):
                s[j].append(timer(fn, inner[j]))
        gf = [2 * m * kk * nn / float(np.median(x)) / 1e9 for x in s]
        tcol = f"{gf[3]:7.1f}" if torch else "      -"
        print(f"{str((m, kk, nn)):24s} {gf[0]:9.1f} {gf[1]:9.1f} {gf[0] / gf[1]:6.2f} "
              f"{gf[2]:7.1f} {tcol}")


def packed_gemm(repeats, quick: bool):
    """The packed GEMM (weight packed once, as the runtime does per binding) against
    c_matmul (OpenBLAS sgemm, which packs the weight on every call), numpy and torch, on
    GPT-2's layer shapes, the LM head (50257 wide), one-row decode and all-MiniLM-L6-v2's
    layers on a batch of 8 x 128 tokens. A 1 ms pause and an
    untimed call before each sample, so no library pays for the previous one's spinning thread
    pool (the spin settings of tensor_graphs.threads end spinning within microseconds).
    Longer pauses distort: on the 2-vCPU VM measured, after 10+ ms idle the OpenMP pool ran
    at about one core's speed for several ms (0.1 s idle: 5.2 ms instead of 2.4 ms for
    (128, 768, 2304)), while OpenBLAS's pool recovered at once."""
    rng = np.random.default_rng(3)
    print("\n# packed GEMM: weight packed once (GFLOP/s, median of interleaved samples; "
          "time of the packed kernel in ms)")
    peak = fma_peak_gflops()
    print(f"# the cores' float32 FMA peak, measured: {peak:.1f} GFLOP/s "
          f"({threads.get_num_threads()} threads); 'pk %' is the packed GEMM's share of it")
    print(f"{'shape (m, k, n)':24s} {'packed':>7s} {'pk %':>5s} {'c_matmul':>9s} {'numpy':>7s} "
          f"{'torch':>7s} {'ORT':>7s} {'ORT/pk':>6s} {'pk/c_mm':>7s} {'packed ms':>9s}")
    shapes = [(SEQ, D, 3 * D), (SEQ, D, D), (SEQ, D, FF), (SEQ, FF, D), (SEQ, D, 50257),
              (1, D, 3 * D), (1, FF, D), (1, D, 50257),
              # all-MiniLM-L6-v2 on 8 x 128 tokens: Q/K/V/output projections, MLP up, down
              (1024, 384, 384), (1024, 384, 1536), (1024, 1536, 384)]
    if quick:
        shapes = [s for s in shapes if s[2] != 50257]
    packed = k("c_packed_matmul")
    for m, kk, nn in shapes:
        a = rng.standard_normal((m, kk)).astype(np.float32)
        b = (rng.standard_normal((kk, nn)) * 0.03).astype(np.float32)
        out = np.empty((m, nn), np.float32)
        pb = packed.prepare_arguments([a, b])[1]  # once, as at bind time
        fns = [lambda a=a, pb=pb, out=out: packed.fn(a, pb, out=out),
               lambda a=a, b=b, out=out: k("c_matmul").fn(a, b, out=out),
               lambda a=a, b=b, out=out: np.matmul(a, b, out=out)]
        if torch:
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            tout = torch.from_numpy(out)
            fns.append(lambda ta=ta, tb=tb, tout=tout: torch.matmul(ta, tb, out=tout))
        ort_mm = ort_matmul(b)
        if ort_mm:
            check(f"onnxruntime {(m, kk, nn)}", lambda a=a, f=ort_mm: f(a), lambda a=a, b=b: a @ b)
            fns.append(lambda a=a, f=ort_mm: f(a))
        check(f"packed {(m, kk, nn)}", fns[0], lambda a=a, b=b: a @ b)
        inner = [calibrate(fn) for fn in fns]
        s = [[] for _ in fns]
        for rep in range(repeats):
            for j in np.roll(np.arange(len(fns)), rep):  # an order that rotates per repeat
                fn = fns[j]
                time.sleep(0.001)
                fn()  # untimed: the first call after a pause wakes the pools
                s[j].append(timer(fn, inner[j]))
        med = [float(np.median(x)) for x in s]
        gf = [2 * m * kk * nn / t / 1e9 for t in med]
        tcol = f"{gf[3]:7.1f}" if torch else "      -"
        ocol = f"{gf[-1]:7.1f} {med[-1] / med[0]:6.2f}" if ort_mm else "      -      -"
        print(f"{str((m, kk, nn)):24s} {gf[0]:7.1f} {100 * gf[0] / peak:5.0f} {gf[1]:9.1f} "
              f"{gf[2]:7.1f} {tcol} {ocol} {med[1] / med[0]:7.2f} {med[0] * 1e3:9.3f}",
              flush=True)


PEAK_C = r"""
#include <stdint.h>
#ifdef __AVX512F__
typedef float vec __attribute__((vector_size(64)));
#else
typedef float vec __attribute__((vector_size(32)));
#endif
/* 12 independent FMA chains per thread, all in registers: the cores' float32 FMA peak */
double tg_fma_peak(int64_t iters, int threads) {
    double total = 0.0;
    #pragma omp parallel num_threads(threads) reduction(+:total)
    {
        vec b = (vec){0} + 1.0000001f, c = (vec){0} + 1e-9f, a[12];
        for (int i = 0; i < 12; i++) a[i] = (vec){0} + (float)i;
        for (int64_t it = 0; it < iters; it++) {
            #pragma GCC unroll 12
            for (int i = 0; i < 12; i++) a[i] = a[i] * b + c;
        }
        vec s = (vec){0};
        for (int i = 0; i < 12; i++) s += a[i];
        total += s[0];
    }
    return total;
}
/* float lanes a vec holds in this build (-march=native decides) */
int tg_fma_lanes(void) { return (int)(sizeof(vec) / sizeof(float)); }
"""


def fma_peak_gflops() -> float:
    """The cores' float32 FMA peak, measured: twelve register-resident FMA chains per
    thread (enough to cover the latency of two FMA pipes) on this process's thread count,
    best of five runs. A GEMM's GFLOP/s over this is the share of the peak it reaches."""
    import ctypes

    from tensor_graphs.kernels.c import build

    lib = build.load_library("tg_fma_peak", PEAK_C)
    fn = lib.tg_fma_peak
    fn.argtypes, fn.restype = [ctypes.c_int64, ctypes.c_int], ctypes.c_double
    n, lanes = threads.get_num_threads(), lib.tg_fma_lanes()
    iters, best = 20_000_000, math.inf
    for _ in range(5):
        t = time.perf_counter()
        fn(iters, n)
        best = min(best, time.perf_counter() - t)
    return 2 * 12 * lanes * iters * n / best / 1e9


def ort_matmul(b):
    """ONNX Runtime's MatMul on the constant weight b (MLAS, which packs it once at session
    start, as we do at bind time), on this process's thread count; None without onnxruntime."""
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    kk, nn = b.shape
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["a", "w"], ["c"])], "mm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", kk])],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, ["m", nn])],
        [numpy_helper.from_array(b, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads.get_num_threads()
    # no spinning after a call: its workers would otherwise hold a core through the next
    # runner's sample (this table's 1 ms pauses are shorter than ORT's spin; every OpenMP
    # column halved); a wake costs it microseconds against these calls' 0.04-30 ms
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return lambda a: session.run(None, {"a": a})[0]


def fused_codegen(repeats):
    """Generated C (kernels/c/codegen.py): a whole elementwise decomposition as one loop,
    against numpy evaluating the same decomposition op by op (tg.evaluate) and torch eager."""
    import tensor_graphs as tg
    from tensor_graphs.kernels.c import codegen
    from tensor_graphs.numerics import relative_error

    rng = np.random.default_rng(2)
    x, b, g = tg.input("x", (SEQ, FF)), tg.input("b", (FF,)), tg.input("g", (SEQ, FF))
    a = rng.standard_normal((SEQ, FF)).astype(np.float32)
    bias = rng.standard_normal(FF).astype(np.float32)
    gate = rng.standard_normal((SEQ, FF)).astype(np.float32)
    rows = [("gelu_tanh (128, 3072)", tg.gelu(x, approximate="tanh"), {"x": a},
             (lambda t: F.gelu(t["x"], approximate="tanh")) if torch else None),
            ("silu(x + b) * g, b (3072,)", tg.silu(x + b) * g, {"x": a, "b": bias, "g": gate},
             (lambda t: F.silu(t["x"] + t["b"]) * t["g"]) if torch else None)]
    print("\n# generated C: one fused loop vs numpy evaluating the decomposition op by op "
          "(tg.evaluate) vs torch eager (times in us)")
    print(f"{'graph':30s} {'ops':>4s} {'fused C':>9s} {'numpy':>9s} {'torch':>9s} "
          f"{'np/C':>6s} {'torch/C':>7s} {'C rel.err':>9s} {'np rel.err':>10s}")
    for name, y, feeds, t_fn in rows:
        y = tg.decompose(y)
        kern = codegen.fuse_elementwise(y)  # compiled (cached on disk) and verified here
        region = codegen.elementwise_region(y)
        args = [feeds[n.name] for n in region.inputs]
        tfeeds = {n: torch.from_numpy(v) for n, v in feeds.items()} if torch else None
        fns = [lambda kern=kern, args=args: kern.fn(*args),
               lambda y=y, feeds=feeds: tg.evaluate(y, feeds),
               (lambda t_fn=t_fn, tfeeds=tfeeds: t_fn(tfeeds)) if t_fn else None]
        ref = tg.evaluate(y, feeds, dtype="float64")
        errs = [relative_error(kern.fn(*args), ref), relative_error(tg.evaluate(y, feeds), ref)]
        inner = [calibrate(fn) if fn else 0 for fn in fns]
        s = [[] for _ in fns]
        for _ in range(repeats):
            for j, fn in enumerate(fns):
                if fn is not None:
                    s[j].append(timer(fn, inner[j]))
        med = [float(np.median(v)) if v else None for v in s]
        r_t = f"{med[2] / med[0]:7.2f}" if med[2] else "      -"
        print(f"{name:30s} {len(region.nodes):4d} {fmt(med[0])} {fmt(med[1])} {fmt(med[2])} "
              f"{med[1] / med[0]:6.2f} {r_t} {errs[0]:9.1e} {errs[1]:10.1e}")


if __name__ == "__main__":
    main()
