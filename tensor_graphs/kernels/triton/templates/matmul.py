"""GEMM kernels from the template in ``matmul_jit.py``: linear and matmul with a fused epilogue.

One kernel per (pattern, config), named ``triton_<pattern>_<config>``, so the profiler times
every config on every shape and the database keeps what it measured. The patterns are those
the torch CUDA kernels and the C GEMMs cover: ``linear`` (torch's (out, in) weight: b is the
weight with swapped strides, no transposed copy) and ``a @ b`` with a 2-D ``b``, each plain,
with a bias, a bias and an activation (relu, gelu in its erf and tanh forms), or plus an
operand of the result's shape (a transformer block's residual). The epilogue runs on the fp32
accumulator; the result is rounded once.

fp32 operands: the "ieee" configs multiply in full fp32 (FMA on the GPU, tolerance 1e-5, what
cuBLAS gives by default); the "tf32" configs use the tensor cores (10-bit mantissas, declared
2e-3), so the planner takes them only where the tolerance asked for allows that.

A few rows (a decode step's GEMV, up to ``GEMV_ROWS``) also have ``gemv`` configs,
``triton_<pattern>_gemv_<config>``: ``tl.dot``'s smallest tile has 16 rows, so on one row the
GEMM configs do 16 rows' arithmetic in as few programs as the columns give (GPT-2's
3072 -> 768 projection: 12 of an H100's 132 SMs). A GEMV program sums one row's products with
plain FMAs over a split of K; the splits aim at two waves of the SMs, and the last split of a
column block to finish adds them and applies the epilogue (counted in ``arrival_counters``;
a second kernel does it where no counters can be made, inside a CUDA graph's capture).
Three GEMV-only patterns (``ln_*``) take LayerNorm's input instead of its output, and two
(``rms5_*``, ``rms6_*``: one per eps in use) RMSNorm's: each program computes its row's
statistics and normalizes its split of the row as it loads it, so a pre-norm block's norm is
no launch of its own in a decode step, and a Llama block's q/k/v and gate/up projections can
join a persistent chain (``chain.py``) as GPT-2's do.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

from tensor_graphs.ir import api as tg
from tensor_graphs.kernels.registry import Occupancy, kernel
from tensor_graphs.kernels.signatures import Spec
from tensor_graphs.kernels.torch import bound
from tensor_graphs.kernels.triton.templates.chain import Prepared, chained
from tensor_graphs.kernels.triton.templates.runtime import (
    PROGRAMS,
    REDUCTION,
    TF32,
    arrival_counters,
    deliver,
    float_dtypes,
    interpreted,
    ints,
    jit,
    next_power_of_2,
    pdl,
    source_text,
    target,
    torch,
)

JIT = "matmul_jit"
ACTS = {None: 0, "relu": 1, "gelu": 2, "gelu_tanh": 3}  # matmul_jit's ACT codes
GROUP_M = 8  # rows of tiles that share b's columns (L2 reuse)
BIASED = "biased"  # verification values: normal / 2 + 1 (sums that do not cancel)


@dataclass(frozen=True)
class Config:
    """One tile shape and launch setting; ``precision`` is tl.dot's for fp32 operands."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    precision: str = "ieee"
    fp32_share: float = 1.0  # of the GPU's fp32 peak, for estimates (``CONFIGS`` says whence)

    @property
    def label(self) -> str:
        tiles = f"m{self.block_m}n{self.block_n}k{self.block_k}"
        return tiles if self.precision == "ieee" else f"{self.precision}_{tiles}"

    @property
    def dtypes(self) -> tuple[str, ...]:
        return ("float32",) if self.precision == "tf32" else float_dtypes()

    @property
    def tolerance(self) -> float:
        return TF32 if self.precision == "tf32" else REDUCTION


# fp32 operands in "ieee" precision run tl.dot on the FMA units: on an H100, GPT-2's LM head
# ((128, 768) x (768, 50257), 9.9 GFLOP) took 1579, 673 and 449 us in the three configs below
# (6.3, 14.7 and 22.0 TFLOP/s) where cuBLAS took 235 (42): a share of the 50 TFLOP/s the cost
# model assumes for a GPU's fp32 (``fp32_share``), so that an unmeasured plan does not take
# them over cuBLAS for a fused bias (measured rows replace it)
CONFIGS = (
    Config(16, 64, 128, 4, 4, fp32_share=0.125),  # a few rows (decode): long K steps
    Config(64, 128, 64, 4, 4, fp32_share=0.3),  # mid-sized M
    Config(128, 128, 64, 8, 3, fp32_share=0.45),  # prefill: large tiles, 8 warps
    Config(64, 128, 32, 4, 4, "tf32"),  # fp32 on the tensor cores, mid-sized M
    Config(128, 128, 32, 8, 3, "tf32"),  # fp32 on the tensor cores, prefill
)


@dataclass(frozen=True)
class Gemv:
    """A GEMV config: columns and K steps per program, at most ``max_splits`` splits of K."""

    block_n: int
    block_k: int
    max_splits: int
    warps: int
    stages: int

    @property
    def label(self) -> str:
        return f"gemv_n{self.block_n}k{self.block_k}"

    @property
    def dtypes(self) -> tuple[str, ...]:
        return float_dtypes()

    @property
    def tolerance(self) -> float:
        return REDUCTION


GEMV_ROWS = 8  # a decode step's rows (batch x new tokens): more take the GEMM configs
NORM_TILE = 4096  # a norm prologue loads a row up to this long at once (32 fp32 a thread)
COMBINE_BLOCK = 256  # the combine kernel's columns per program
GEMV_CONFIGS = (
    Gemv(32, 256, 32, 4, 3),  # a @ b's (K, N) weight: 128-byte row segments, 256 K a step
    Gemv(16, 256, 32, 4, 3),  # linear's (N, K) weight: 1 KiB runs along each column's K
)


NORMS = {"layer": 1, "rms": 2}  # matmul_jit's NORM codes (0: no norm)
# a norm's operands after a, named in the pattern (LayerNorm's weight and bias, RMSNorm's weight)
NORM_PARAMS = {"layer": ("ln_weight", "ln_bias"), "rms": ("ln_weight",)}
LN_EPS = 1e-5  # LayerNorm's eps in a norm epilogue (torch's default, GPT-2's)
RMS_EPS = (1e-5, 1e-6)  # RMSNorm's: Llama's and Mistral's; Qwen2's, Qwen3's and HF's default


@dataclass(frozen=True)
class Epilogue:
    """What a pattern computes around its product."""

    label: str
    linear: bool  # x @ weight.T (torch's linear), else a @ b
    bias: bool
    act: str | None
    residual: bool  # + an operand of the result's shape, after the activation
    norm: str | None = None  # a is this norm's input (NORMS): a GEMV normalizes it as it loads
    eps: float = LN_EPS  # the norm's: a kernel takes only its pattern's root's attributes, so
    #                      the norm's is fixed in the pattern, a pattern for each eps in use


EPILOGUES = (
    Epilogue("linear", True, True, None, False),  # x @ w.T + b
    Epilogue("linear_nobias", True, False, None, False),  # x @ w.T
    Epilogue("linear_relu", True, True, "relu", False),  # relu(x @ w.T + b)
    Epilogue("linear_gelu", True, True, "gelu", False),  # BERT's MLP
    Epilogue("linear_gelu_tanh", True, True, "gelu_tanh", False),  # GPT-2's MLP
    Epilogue("linear_add", True, True, None, True),  # a projection + the residual
    Epilogue("linear_nobias_add", True, False, None, True),  # Llama's o_proj/down + residual
    Epilogue("matmul", False, False, None, False),  # a @ b
    Epilogue("matmul_bias", False, True, None, False),  # GPT-2's Conv1D (addmm)
    Epilogue("matmul_bias_relu", False, True, "relu", False),
    Epilogue("matmul_bias_gelu", False, True, "gelu", False),
    Epilogue("matmul_bias_gelu_tanh", False, True, "gelu_tanh", False),
    Epilogue("matmul_add", False, False, None, True),
    Epilogue("matmul_bias_add", False, True, None, True),
    # a pre-norm block's projections of LayerNorm's output (GEMV configs only: a decode step)
    Epilogue("ln_linear", True, True, None, False, norm="layer"),  # q/k/v or an MLP's up
    Epilogue("ln_matmul_bias", False, True, None, False, norm="layer"),  # GPT-2's c_attn
    Epilogue("ln_matmul_bias_gelu_tanh", False, True, "gelu_tanh", False, norm="layer"),  # c_fc
    # a Llama block's q/k/v (packed or not) and gate/up projections of RMSNorm's output
    *(Epilogue(f"rms{round(-math.log10(eps))}_linear_nobias", True, False, None, False,
               norm="rms", eps=eps) for eps in RMS_EPS),
)


def _eps_is(want: float):
    """A pattern's eps: ``want``, also as float32 rounds it (a float32 graph's attribute);
    its ``example`` is what verification builds the norm with (``verify.instantiate``)."""
    def matches(eps) -> bool:
        return abs(float(eps) - want) <= 1e-6 * want
    matches.example = want
    return matches


class Operands:
    """A product's 2-D views: a (m, k), b's strides along K and N (``linear`` reads torch's
    (out, in) weight transposed by its strides), c and res (m, n), and c itself to return."""

    def __init__(self, e: Epilogue, a, b, res, out):
        self.k = a.shape[-1]
        self.n = b.shape[0] if e.linear else b.shape[1]
        self.m = math.prod(a.shape[:-1])
        self.c = target(tuple(a.shape[:-1]) + (self.n,), a, out)
        if self.m and self.n:
            self.a = a.reshape(self.m, self.k)
            self.c2 = self.c.view(self.m, self.n)
            self.res = self.c2 if res is None else res.reshape(self.m, self.n)
            self.b_k, self.b_n = ((b.stride(1), b.stride(0)) if e.linear
                                  else (b.stride(0), b.stride(1)))


def gemm(cfg: Config, e: Epilogue, a, b, bias=None, res=None, out=None):
    """act(a @ op(b) + bias) + res through the template (op: transpose for ``linear``)."""
    o = Operands(e, a, b, res, out)
    if o.m and o.n:
        a2, c2, r2 = o.a, o.c2, o.res
        grid = (-(-o.m // cfg.block_m) * -(-o.n // cfg.block_n),)
        jit(JIT).gemm[grid](
            a2, b, c2 if bias is None else bias, r2, c2, o.m, o.n, o.k,
            a2.stride(0), a2.stride(1), o.b_k, o.b_n, 0 if bias is None else bias.stride(0),
            r2.stride(0), r2.stride(1), c2.stride(0), c2.stride(1),
            HAS_BIAS=bias is not None, HAS_RES=res is not None, ACT=ACTS[e.act],
            PRECISION=cfg.precision, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
            BLOCK_K=cfg.block_k, GROUP_M=GROUP_M, num_warps=cfg.warps,
            num_stages=cfg.stages)
    return deliver(o.c, out)


def gemv_splits(cfg: Gemv, rows: int, n: int, k: int) -> tuple[int, int]:
    """(splits, K per split): enough splits of K for ``PROGRAMS`` programs in all, at most
    the config's, each a whole number of K blocks and none empty."""
    blocks = max(1, -(-k // cfg.block_k))
    columns = rows * -(-n // cfg.block_n)
    want = max(1, min(cfg.max_splits, blocks, -(-PROGRAMS // max(1, columns))))
    chunk = -(-blocks // want) * cfg.block_k
    return max(1, -(-k // chunk)), chunk


class _GemvCall:
    """What a GEMV's launch passes its kernel, for ``gemv_split`` alone or as a stage of a
    persistent chain (``chain.py``): the runtime arguments in ``gemv_split``'s order (the
    chain's stage tuple adds the count of splits after K's chunk) and the constexprs."""

    def __init__(self, cfg: Gemv, e: Epilogue, o: Operands, b, bias, res, norm, counters):
        a = o.a  # (a product with rows and columns: Operands made its views)
        self.operands = o
        m, n, c2, r2 = o.m, o.n, o.c2, o.res
        bias_t = c2 if bias is None else bias
        self.splits, self.chunk = gemv_splits(cfg, m, n, o.k)
        self.part = c2 if self.splits == 1 else torch.empty(
            self.splits * m * n, dtype=torch.float32, device=a.device)
        self.blocks = m * -(-n // cfg.block_n)
        self.counters = None if self.splits == 1 else counters(self.blocks)
        ln_w, ln_b = (*norm, c2, c2)[:2]  # (RMSNorm has no bias: c2 stands in, unread)
        self.tail = (0 if bias is None else bias.stride(0), r2.stride(0), r2.stride(1),
                     c2.stride(0), c2.stride(1))
        self.pointers = (o.a, b, bias_t, r2, c2, self.part,
                         self.part if self.counters is None else self.counters, ln_w, ln_b)
        self.strides = (o.a.stride(0), o.a.stride(1), o.b_k, o.b_n, *self.tail,
                        ln_w.stride(0), ln_b.stride(0))
        self.epilogue = dict(HAS_BIAS=bias is not None, HAS_RES=res is not None,
                             ACT=ACTS[e.act])
        norm_block = min(next_power_of_2(o.k), NORM_TILE) if e.norm else 16
        self.constexprs = dict(
            **self.epilogue, NORM=NORMS.get(e.norm, 0), NORM_BLOCK=norm_block,
            ONE_TILE=o.k <= norm_block,
            FINISH=self.splits == 1, LAST_ADDS=self.counters is not None,
            BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
            MAX_SPLITS=next_power_of_2(cfg.max_splits))

    def stage(self) -> tuple:
        """The stage tuple of a chain (``chain_jit._gemv_stage``)."""
        o = self.operands
        return (*self.pointers, o.n, o.k, self.chunk, self.splits, *self.strides)

    def stage_constexprs(self, prefetch: bool) -> tuple:
        """The stage's constexprs, in ``chain_jit``'s order (a GEMV is kind 0)."""
        c = self.constexprs
        return (0, prefetch, c["BLOCK_N"], c["BLOCK_K"], c["HAS_BIAS"], c["HAS_RES"],
                c["ACT"], c["NORM"], c["FINISH"], c["LAST_ADDS"], c["MAX_SPLITS"],
                c["NORM_BLOCK"], c["ONE_TILE"])


def gemv(cfg: Gemv, e: Epilogue, a, b, bias=None, res=None, out=None, norm=()):
    """act(a @ op(b) + bias) + res for a few rows of a: split-K FMAs, then the epilogue.
    ``norm``: the operands of the norm a is normalized by first (``e.norm``: NORM_PARAMS)."""
    o = Operands(e, a, b, res, out)
    if o.m and o.n:
        call = _GemvCall(cfg, e, o, b, bias, res, norm,
                         lambda blocks: arrival_counters(a.device, blocks))
        mod = jit(JIT)
        mod.gemv_split[(call.blocks, call.splits)](
            *call.pointers, o.m, o.n, o.k, call.chunk, e.eps, *call.strides,
            **call.constexprs, num_warps=cfg.warps, num_stages=cfg.stages, **_dependent(b))
        if call.splits > 1 and call.counters is None:
            mod.gemv_combine[(o.m * -(-o.n // COMBINE_BLOCK),)](
                *call.pointers[2:6], o.m, o.n, call.splits, *call.tail, **call.epilogue,
                BLOCK_N=COMBINE_BLOCK, num_warps=4)
    return deliver(o.c, out)


@dataclass(frozen=True)
class Link:
    """A GEMV as a stage of a persistent chain (``chain.py``): ``gemv``'s arguments."""

    cfg: Gemv
    e: Epilogue
    a: object
    b: object
    bias: object = None
    res: object = None
    out: object = None
    norm: tuple = ()

    @property
    def rows(self) -> int:
        return math.prod(self.a.shape[:-1])

    def target(self):
        """The tensor the result is written to (``out`` itself where the kernel can)."""
        return Operands(self.e, self.a, self.b, self.res, self.out).c

    def copies(self) -> bool:
        """Whether the kernel's 2-D views of a or res are copies (a view reshape cannot make,
        such as a permuted batch): a copy reads them when it is made, so a chain must have
        written them by then."""
        n = self.b.shape[0] if self.e.linear else self.b.shape[1]
        m = self.rows
        for t, shape in ((self.a, (m, self.a.shape[-1])), (self.res, (m, n))):
            if t is not None and t.numel():
                try:
                    t.view(shape)
                except RuntimeError:
                    return True
        return False

    def prepare(self, early: bool) -> Prepared:
        """The stage's arguments for the chain; ``early``: its first weights may be loaded
        before the stage's barrier (or wait), where b is a bound weight."""
        o = Operands(self.e, self.a, self.b, self.res, self.out)
        if not (o.m and o.n):
            raise ValueError(f"an empty product ({o.m} x {o.n}) in {self.e.label}")
        call = _GemvCall(self.cfg, self.e, o, self.b, self.bias, self.res, self.norm,
                         lambda blocks: arrival_counters(o.a.device, blocks))
        if call.splits > 1 and call.counters is None:
            raise RuntimeError("no arrival counters for a chain's split GEMV inside a "
                               "capture; call it once before capturing")
        return Prepared(call.stage(), call.stage_constexprs(early and bound.is_weight(self.b)),
                        o.c, o.m, self.e.eps if self.e.norm else None, self.cfg.warps,
                        self.cfg.stages)

    def alone(self):
        """The GEMV as a launch of its own (``gemv``)."""
        return gemv(self.cfg, self.e, self.a, self.b, self.bias, self.res, self.out, self.norm)


def _dependent(b) -> dict:
    """The GEMV's launch options: PDL where the GPU has it (``runtime.pdl``), and PREFETCH
    (its first weights loaded before it waits for the kernel before) only where ``b`` is a
    bound weight, which no kernel still running can be writing."""
    options = pdl(b.device)
    return {**options, "PREFETCH": options["PDL"] and bound.is_weight(b)}


def _product(e: Epilogue, shapes) -> list:
    """The shapes of a call's product operands (a, b[, bias][, res]): a norm's operands,
    after a, left out."""
    shapes = list(shapes)
    return shapes[:1] + shapes[1 + len(NORM_PARAMS[e.norm]):] if e.norm else shapes


def _dims(e: Epilogue, shapes) -> tuple[int, int, int]:
    """(rows, columns, K) of a call at ``shapes`` (the pattern's inputs, a first)."""
    shapes = _product(e, shapes)
    a, b = tuple(shapes[0]), tuple(shapes[1])
    n, k = b if e.linear else b[::-1]
    return math.prod(a[:-1]), n, k


def occupancy(cfg: Config | Gemv, e: Epilogue):
    """The ``Occupancy`` of a config's call: its programs, and for a GEMM tile the rows and
    columns it computes beyond the result's (``tl.dot`` pads a 1-row product to 16 rows)."""
    def of(shapes) -> Occupancy:
        m, n, k = _dims(e, shapes)
        if isinstance(cfg, Gemv):
            splits, _ = gemv_splits(cfg, m, n, k)
            return Occupancy(max(1, m * -(-n // cfg.block_n) * splits))
        tiles_m, tiles_n = -(-m // cfg.block_m), -(-n // cfg.block_n)
        padded = tiles_m * cfg.block_m * tiles_n * cfg.block_n
        return Occupancy(max(1, tiles_m * tiles_n), m * n / padded if padded else 1.0)

    return of


def pattern(e: Epilogue):
    """The pattern of an epilogue: variables (x, weight[, bias][, res]) or (a, b[, ...])."""
    def act(y):
        if e.act is None:
            return y
        if e.act == "relu":
            return tg.relu(y)
        return tg.gelu(y, approximate="tanh" if e.act == "gelu_tanh" else "none")

    if e.linear:
        core = ((lambda x, weight, bias: act(tg.linear(x, weight, bias))) if e.bias
                else (lambda x, weight: act(tg.linear(x, weight))))
    else:
        core = ((lambda a, b, bias: act(a @ b + bias)) if e.bias else (lambda a, b: act(a @ b)))
    eps = _eps_is(e.eps)
    if e.norm == "rms":  # (EPILOGUES: a linear without a bias)
        return lambda x, ln_weight, weight: core(tg.rms_norm(x, ln_weight, eps=eps), weight)
    if e.norm:
        if e.linear:
            return lambda x, ln_weight, ln_bias, weight, bias: core(
                tg.layer_norm(x, ln_weight, ln_bias, eps=eps), weight, bias)
        return lambda a, ln_weight, ln_bias, b, bias: core(
            tg.layer_norm(a, ln_weight, ln_bias, eps=eps), b, bias)
    if not e.residual:
        return core
    if e.linear:
        return ((lambda x, weight, bias, res: core(x, weight, bias) + res) if e.bias
                else (lambda x, weight, res: core(x, weight) + res))
    return ((lambda a, b, bias, res: core(a, b, bias) + res) if e.bias
            else (lambda a, b, res: core(a, b) + res))


def function(cfg: Config | Gemv, e: Epilogue):
    """The kernel function, its parameters named as the pattern's variables."""
    body = gemv if isinstance(cfg, Gemv) else gemm
    if e.norm == "rms":  # (no bias, no residual: EPILOGUES)
        def run(x, ln_weight, weight, *, out=None):
            return gemv(cfg, e, x, weight, None, None, out, (ln_weight,))
    elif e.norm and e.linear:  # (a LayerNorm epilogue has a bias and no residual)
        def run(x, ln_weight, ln_bias, weight, bias, *, out=None):
            return gemv(cfg, e, x, weight, bias, None, out, (ln_weight, ln_bias))
    elif e.norm:
        def run(a, ln_weight, ln_bias, b, bias, *, out=None):
            return gemv(cfg, e, a, b, bias, None, out, (ln_weight, ln_bias))
    elif e.linear and e.bias and e.residual:
        def run(x, weight, bias, res, *, out=None):
            return body(cfg, e, x, weight, bias, res, out)
    elif e.linear and e.bias:
        def run(x, weight, bias, *, out=None):
            return body(cfg, e, x, weight, bias, None, out)
    elif e.linear and e.residual:
        def run(x, weight, res, *, out=None):
            return body(cfg, e, x, weight, None, res, out)
    elif e.linear:
        def run(x, weight, *, out=None):
            return body(cfg, e, x, weight, None, None, out)
    elif e.bias and e.residual:
        def run(a, b, bias, res, *, out=None):
            return body(cfg, e, a, b, bias, res, out)
    elif e.bias:
        def run(a, b, bias, *, out=None):
            return body(cfg, e, a, b, bias, None, out)
    elif e.residual:
        def run(a, b, res, *, out=None):
            return body(cfg, e, a, b, None, res, out)
    else:
        def run(a, b, *, out=None):
            return body(cfg, e, a, b, None, None, out)
    if body is gemv:  # a chain's stage (runtime/chains.py)
        run.link, run.chained = _linking(cfg, e, run), chained
    what = "x @ weight.T" if e.linear else "a @ b"
    what = f"{e.norm}_norm({what[0]}) {what[2:]}" if e.norm else what
    how = ("split-K Triton GEMV (a few rows)" if body is gemv else "one Triton GEMM")
    run.__doc__ = (f"{e.act + '(' if e.act else ''}{what}{' + bias' if e.bias else ''}"
                   f"{')' if e.act else ''}{' + res' if e.residual else ''} in {how} "
                   f"({cfg.label}, {cfg.warps} warps, {cfg.stages} stages).")
    return run


def _linking(cfg: Gemv, e: Epilogue, run):
    """``link(*args, out=None)``: a GEMV kernel's call, by its parameters' names, as a ``Link``
    of a persistent chain (``chain.py``), so the runtime can run consecutive GEMV steps as
    one launch (``runtime/chains.py``)."""
    names = [n for n in inspect.signature(run).parameters if n != "out"]

    def link(*args, out=None) -> Link:
        got = dict(zip(names, args))
        norm = tuple(got[p] for p in NORM_PARAMS[e.norm]) if e.norm else ()
        return Link(cfg, e, got.get("x", got.get("a")), got.get("weight", got.get("b")),
                    got.get("bias"), got.get("res"), out, norm)
    return link


def constraint(e: Epilogue, few_rows: bool = False):
    """The ``where`` of an epilogue's kernels: one dtype, a 2-D weight, the bias and the added
    operand of the shapes the epilogue reads (no broadcasting); a GEMV's (``few_rows``) also
    at most ``GEMV_ROWS`` rows, known."""
    def fits(shapes, dtypes, attrs):
        if e.norm:
            k = tuple(shapes[0])[-1:]
            for what, shape in zip(("weight", "bias"), shapes[1:1 + len(NORM_PARAMS[e.norm])]):
                if tuple(shape) != k:
                    return f"the norm's {what} must have shape {k}, got {tuple(shape)}"
        found = _fits(_product(e, shapes), dtypes, attrs)
        if found is not True or not few_rows:
            return found
        rows = tuple(shapes[0])[:-1]
        if not ints(rows) or math.prod(rows) > GEMV_ROWS:
            return (f"a GEMV takes at most {GEMV_ROWS} rows, known, got {rows} (the GEMM "
                    "configs take the rest)")
        return True

    def _fits(shapes, dtypes, attrs):
        if len(set(dtypes)) > 1:
            return "every operand must have one dtype (cast first)"
        a, b = tuple(shapes[0]), tuple(shapes[1])
        if len(b) != 2:
            return f"the {'weight' if e.linear else 'right operand'} must be 2-D, got {b}"
        if len(a) < (1 if e.linear else 2):
            return f"the left operand needs rank >= {1 if e.linear else 2}, got {a}"
        n, k = b if e.linear else b[::-1]
        if ints(a, b) and a[-1] != k:
            return f"inner dims differ: {a} and {b}"
        if e.bias and tuple(shapes[2]) != (n,):
            return f"bias must have shape ({n},), got {tuple(shapes[2])}"
        if e.residual and tuple(shapes[-1]) != a[:-1] + (n,):
            return (f"the added operand must have the product's shape {a[:-1] + (n,)}, got "
                    f"{tuple(shapes[-1])}")
        return True

    return fits


def signatures(e: Epilogue, dtypes: tuple[str, ...], few_rows: bool = False):
    """Verification cases: tiny in the interpreter (it runs each program in Python), sizes
    up to 1025 and a transformer's on a GPU. Values are "biased" (normal / 2 + 1), as the
    linear generator draws them: TF32's error is relative to |x| |w|, so where x @ w + bias
    cancels (one product, K = 1, against a bias of the opposite sign: 2.5% seen on an H200)
    the error would measure the data's conditioning, not the kernel."""
    def cases():
        table = [(1, 1, 1, ()), (7, 33, 9, ()), (5, 40, 17, (2,))]  # (m, k, n, leading)
        if few_rows:  # one row, split K (a remainder block), several splits and columns
            table = [(1, 1, 1, ()), (1, 300, 70, ()), (3, 33, 9, (2,)), (1, 520, 17, (1,))]
        if not interpreted():
            table += ([(1, 3072, 768, ()), (1, 768, 2304, ()), (2, 1025, 33, (4,)),
                       (1, 7, 1025, ())] if few_rows else
                      [(5, 1025, 33, ()), (33, 7, 1025, (2,)), (1, 1025, 7, ()),
                       (128, 768, 768, ())])
        out = []
        for dt in dtypes:
            for m, k, n, lead in (table if dt == dtypes[0] else table[1:3]):
                a = Spec(lead + (m, k), dt, BIASED)
                b = Spec((n, k) if e.linear else (k, n), dt, BIASED)
                sig = {"x": a, "weight": b} if e.linear else {"a": a, "b": b}
                if e.norm:
                    sig.update({p: Spec((k,), dt, BIASED) for p in NORM_PARAMS[e.norm]})
                if e.bias:
                    sig["bias"] = Spec((n,), dt, BIASED)
                if e.residual:
                    sig["res"] = Spec(lead + (m, n), dt, BIASED)
                out.append(sig)
        return out

    return cases


def configs(e: Epilogue) -> tuple:
    """The configs an epilogue's kernels are registered in: a norm epilogue's are GEMVs'."""
    return GEMV_CONFIGS if e.norm else CONFIGS + GEMV_CONFIGS


def register() -> None:
    text = source_text(JIT)
    for e in EPILOGUES:
        for cfg in configs(e):
            name = f"triton_{e.label}_{cfg.label}"
            few = isinstance(cfg, Gemv)
            fn = function(cfg, e)
            fn.source_text = f"{text}\n# {name}: {cfg}"
            kernel(pattern(e), backend="triton", name=name, device="cuda", dtypes=cfg.dtypes,
                   where=constraint(e, few), tolerance=cfg.tolerance,
                   signatures=signatures(e, cfg.dtypes, few), writes_out=True,
                   efficiency=None if few else {"float32": cfg.fp32_share},
                   occupancy=occupancy(cfg, e))(fn)
