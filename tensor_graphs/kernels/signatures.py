"""Input signatures for verifying a kernel: shapes, dtypes, value ranges and attributes.

``cases(kernel)`` lists the ``Case``s that ``tg.kernels.verify`` tries, from the first source
that applies:

1. the kernel's own ``signatures=`` (for fused patterns: a list of dicts mapping each input name
   to a shape or a (shape, dtype) pair, with an optional ``"attrs"`` dict for the root node);
2. a per-op table of generators keyed by the pattern's root op, when the root's inputs are
   variables or scalars (every single-op kernel): sizes 1, 7, 33 and 1025 (1025 along one axis
   only for the heavy ops), broadcasting, every dtype the op accepts, attributes in their
   common forms (matmul with compatible shapes, layer_norm with a (D,) weight, attention with
   grouped-query heads and masks, gather with in-range indices, ...);
3. a search over shape templates (``(M, N)``, ``(N,)``, ``(M, K)``, ``(K, N)``, ...) for fused
   patterns: the first assignments under which the pattern builds and the kernel accepts it,
   then scaled to several sizes.

A variadic kernel (a ``pat.many`` input, see the registry) is tried at several arities
(``VARIADIC_ARITIES``: 1, 2, 5 and 9 inputs where its pattern allows that many): its cases key
the elements ``xs[0]``, ``xs[1]``, ... (``registry.element_name``), and a signature gives the
variadic input a list of shapes (``{"xs": [(2, 3), (4, 3)]}``).

The verifier builds each case's graph, skips the cases the kernel's constraints reject, and
fails a kernel that rejects them all.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.domains import DOMAINS
from tensor_graphs.ir.domains import POSITIVE as DOMAIN_POSITIVE
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.names import (
    EMBEDDING,
    EQUAL,
    GATHER,
    GREATER,
    GREATER_EQUAL,
    INPUT,
    LESS,
    LESS_EQUAL,
    MAXIMUM,
    MINIMUM,
    NLL_LOSS,
    NOT_EQUAL,
    STATE,
    WHERE,
)
from tensor_graphs.rewrite import pattern as pat

# The order verification takes dtypes in (see ``generator``): the first one a kernel accepts
# gets every case, so float32, what models run in, leads; all cases draw from one random stream,
# so the order also fixes each case's values. Which dtypes a group holds is ir/dtypes.py's.
VERIFY_ORDER = ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8",
                "bool")


def _in_verify_order(group: tuple[_dtypes.DType, ...]) -> tuple[str, ...]:
    return tuple(sorted((d.name for d in group), key=VERIFY_ORDER.index))


FLOATS = _in_verify_order(_dtypes.FLOATS)
INTS = _in_verify_order(_dtypes.INTS)
NUMBERS = _in_verify_order(_dtypes.NUMBERS)
ALL = _in_verify_order(_dtypes.ALL)
VARIADIC_ARITIES = (1, 2, 5, 9)  # the input counts a variadic kernel is verified on


@dataclass(frozen=True)
class Spec:
    """One input: shape, dtype, how its values are drawn, and the leaf kind.

    values: "normal" (standard normal, never zero), "positive", "biased" (normal / 2 + 1: sums
    that do not cancel, so the measured error is the kernel's, not the data's conditioning),
    "ties" (small integers, so comparisons see equal elements), "halves" (half of them
    multiples of 1/2 in [-4, 4], zero included: rounding's ties), "near_one" (magnitudes in
    [0.6, 1.4], for products), "index" (ints in [0, high)). Int dtypes draw small nonzero ints,
    bool dtypes random bools. The adversarial kinds "logits", "masked", "scaled", "offset",
    "tiny", "nonfinite", "cancel" and "tail" (``kernels.adversarial``: large and shifted
    logits, -inf masked positions, rows far from zero, rows far below eps, NaN/inf in reduced
    rows, cancelling float16 sums, values in the normal CDF's far left tail, about -9 (float16
    -4.5), where ``1 + erf(x / sqrt 2)`` cancels to 0 and an erfc-form gelu does not) draw rows
    along ``axes`` (None: the whole tensor is one row).
    """

    shape: tuple[int, ...]
    dtype: str = "float32"
    values: str = "normal"
    high: int = 0
    leaf: str = INPUT  # STATE: a tg.state leaf (state_update's first operand)
    axes: tuple[int, ...] | None = None  # the row of an adversarial kind (None: every axis)

    def describe(self) -> str:
        return f"{tuple(self.shape)} {self.dtype}"


@dataclass
class Case:
    """Specs keyed by the kernel's input names, the root node's attributes and a note."""

    specs: dict[str, Spec]
    attrs: dict = field(default_factory=dict)
    note: str = ""
    layout: str = "contiguous"  # or "strided", "broadcast" (a stride-0 input), "transposed"
    special: bool = False  # NaN, +-inf, -0.0 and large magnitudes mixed into float inputs
    adversarial: str = ""  # what the adversarial case tries ("offset x", "rows of 1", ...)
    floor: float = 0.0  # an error any correct kernel may show on its data (adversarial.floor)

    def describe(self) -> str:
        parts = [f"{k} {s.describe()}" for k, s in self.specs.items()]
        shown = {k: v for k, v in self.attrs.items() if k != "args"}
        if shown:
            parts.append(", ".join(f"{k}={v}" for k, v in shown.items()))
        tags = [t for t in (self.note, "" if self.layout == "contiguous" else self.layout,
                            "special values" if self.special else "", self.adversarial) if t]
        return "; ".join(parts) + (f" [{', '.join(tags)}]" if tags else "")


@dataclass(frozen=True)
class OpCase:
    """A generator's case: one Spec per tensor parameter of the op, in order."""

    inputs: tuple
    attrs: dict = field(default_factory=dict)
    note: str = ""


GENERATORS: dict[str, tuple[Callable, tuple[str, ...]]] = {}


def generator(*ops: str, dtypes=FLOATS):
    """Register ``fn(dt, arity) -> list[OpCase]`` for ops; ``dtypes`` it may be asked for (the
    first one the kernel accepts gets every case, the others a few small ones)."""

    def decorate(fn):
        for op in ops:
            GENERATORS[op] = (fn, dtypes)
        return fn

    return decorate


def S(shape, dtype="float32", values="normal", high=0, leaf=INPUT) -> Spec:  # noqa: N802
    return Spec(tuple(shape), dtype, values, high, leaf)


# ---------------------------------------------------------------------------- elementwise
UNARY_SHAPES = [(1,), (7,), (7, 33), (1025,), (), (2, 3, 4)]
BINARY_SHAPES = [((1,), (1,)), ((7,), (7,)), ((7, 33), (7, 33)), ((7, 33), (33,)),
                 ((7, 1), (1, 33)), ((1025,), (1025,)), ((), (7,)), ((2, 1, 4), (3, 1))]
# unary ops whose operand is drawn positive (``ir.domains``, which the profiler's inputs follow)
POSITIVE = frozenset(op for op, d in DOMAINS.items() if d.values == DOMAIN_POSITIVE)
TIES = {EQUAL, LESS, GREATER, LESS_EQUAL, GREATER_EQUAL, NOT_EQUAL, MAXIMUM, MINIMUM}


def _unary(values="normal", attrs=({},)):
    def gen(dt, arity):
        return [OpCase((S(s, dt, values),), dict(attrs[i % len(attrs)]))
                for i, s in enumerate(UNARY_SHAPES)]
    return gen


for _op in ("exp", "log", "sqrt", "reciprocal", "sin", "erf", "rsqrt", "cos", "sigmoid",
            "tanh", "silu", "selu"):
    generator(_op)(_unary("positive" if _op in POSITIVE else "normal"))
for _op in ("neg", "abs", "sign", "square", "relu", "isnan"):
    generator(_op, dtypes=NUMBERS)(_unary())
generator("logical_not", dtypes=("bool",) + NUMBERS)(_unary())
generator("copy_to", dtypes=ALL)(_unary(attrs=({"device": "cpu"},)))
generator("gelu")(_unary(attrs=({"approximate": "none"}, {"approximate": "tanh"})))
generator("elu")(_unary(attrs=({"alpha": 1.0}, {"alpha": 0.5})))
generator("softplus")(_unary(attrs=({"beta": 1.0, "threshold": 20.0},
                                    {"beta": 2.0, "threshold": 1.0})))


@generator("clamp", dtypes=NUMBERS)
def _clamp(dt, arity):
    bounds = ([(-0.5, 0.5), (0.0, None), (None, 1.0)] if dt in FLOATS
              else [(2, 6), (3, None), (None, 5)])
    return [OpCase((S(s, dt),), {"min": bounds[i % 3][0], "max": bounds[i % 3][1]})
            for i, s in enumerate(UNARY_SHAPES)]


def _binary(values_a="normal", values_b="normal"):
    def gen(dt, arity):
        return [OpCase((S(a, dt, values_a), S(b, dt, values_b))) for a, b in BINARY_SHAPES]
    return gen


for _op in ("add", "mul", "maximum", "equal", "less", "minimum", "greater", "less_equal",
            "greater_equal", "not_equal", "logical_and", "logical_or"):
    generator(_op, dtypes=ALL)(_binary("ties" if _op in TIES else "normal",
                                       "ties" if _op in TIES else "normal"))
generator("sub", dtypes=NUMBERS)(_binary())
generator("div")(_binary())


@generator("pow", dtypes=NUMBERS)
def _pow(dt, arity):  # int exponents must be >= 0 (negative ones are undefined for ints)
    return _binary("positive", "normal" if dt in FLOATS else "positive")(dt, arity)


@generator("where", dtypes=ALL)
def _where(dt, arity):
    shapes = [((7, 33), (7, 33), (7, 33)), ((7, 33), (33,), (7, 1)), ((1,), (1,), (1,)),
              ((1025,), (1025,), ()), ((7, 1), (1, 33), (33,))]
    return [OpCase((S(c, "bool"), S(a, dt), S(b, dt))) for c, a, b in shapes]


@generator("cast", dtypes=ALL)
def _cast(dt, arity):
    cases = [OpCase((S((7, 33), dt),), {"dtype": _dtypes.as_dtype(t)}) for t in ALL if t != dt]
    cases += [OpCase((S((1025,), dt),), {"dtype": _dtypes.float16 if dt != "float16"
                                         else _dtypes.float32}),
              OpCase((S((1,), dt),), {"dtype": _dtypes.int32 if dt != "int32"
                                      else _dtypes.int64})]
    return cases


# ---------------------------------------------------------------------------- reductions
@generator("sum", dtypes=NUMBERS)
def _sum(dt, arity):
    return _reduce_atomic(dt, "biased")


@generator("max", dtypes=ALL)
def _max(dt, arity):
    return _reduce_atomic(dt, "ties")


def _reduce_atomic(dt, values="normal"):
    table = [((1,), (0,), False), ((7, 33), (1,), False), ((7, 33), (0,), True),
             ((7, 33), (0, 1), False), ((1025,), (0,), False), ((3, 1025), (1,), True),
             ((33, 7, 5), (0, 2), False)]
    return [OpCase((S(s, dt, values),), {"axes": a, "keepdims": k}) for s, a, k in table]


REDUCE = [((1,), None, False), ((7, 33), 1, False), ((7, 33), 0, True), ((7, 33), (0, 1), False),
          ((7, 33), None, True), ((1025,), 0, False), ((3, 1025), 1, True),
          ((33, 7, 5), (0, 2), False)]


def _reduce(values="normal", extra=None):
    def gen(dt, arity):
        out = []
        for i, (s, a, k) in enumerate(REDUCE):
            attrs = {"axis": a, "keepdims": k}
            if extra:
                attrs.update(extra[i % len(extra)])
            out.append(OpCase((S(s, dt, values),), attrs))
        return out
    return gen


generator("mean")(_reduce("biased"))
generator("var")(_reduce(extra=[{"correction": 0}, {"correction": 1}]))
generator("min", dtypes=ALL)(_reduce("ties"))
generator("argmax", "argmin", dtypes=ALL)(_reduce("ties"))
generator("prod", dtypes=NUMBERS)(_reduce("near_one"))
generator("logsumexp")(_reduce())

AXIS = [((1,), 0), ((7, 33), 1), ((7, 33), 0), ((1025,), 0), ((3, 1025), 1), ((2, 3, 4), 1)]


@generator("softmax", "log_softmax")
def _softmax(dt, arity):
    return [OpCase((S(s, dt),), {"axis": a}) for s, a in AXIS]


@generator("cumsum", dtypes=NUMBERS)
def _cumsum(dt, arity):
    return [OpCase((S(s, dt, "biased"),), {"axis": a}) for s, a in AXIS[:5] + [((2, 3, 4), 2)]]


# ---------------------------------------------------------------------------- movement
@generator("reshape", dtypes=ALL)
def _reshape(dt, arity):
    table = [((7, 33), (33, 7)), ((7, 33), (231,)), ((1025,), (5, 205)), ((1,), ()),
             ((2, 3, 4), (4, 6)), ((1, 7), (7, 1))]
    return [OpCase((S(s, dt),), {"shape": t}) for s, t in table]


@generator("permute", dtypes=ALL)
def _permute(dt, arity):
    table = [((7, 33), (1, 0)), ((2, 3, 4), (2, 0, 1)), ((1,), (0,)), ((1025, 3), (1, 0)),
             ((1, 7, 33), (0, 2, 1))]
    return [OpCase((S(s, dt),), {"perm": p}) for s, p in table]


@generator("expand", dtypes=ALL)
def _expand(dt, arity):
    table = [((1, 33), (7, 33)), ((7, 1), (7, 1025)), ((1,), (1,)), ((1, 1), (33, 7)),
             ((2, 1, 4), (2, 3, 4))]
    return [OpCase((S(s, dt),), {"shape": t}) for s, t in table]


@generator("slice", dtypes=ALL)
def _slice(dt, arity):
    table = [((7, 33), (1, 0), (5, 33), (1, 2)), ((1025,), (3,), (1000,), (7,)),
             ((7,), (6,), (-1,), (-1,)), ((1,), (0,), (1,), (1,)),
             ((2, 3, 4), (0, 1, 0), (2, 3, 4), (1, 1, 3)), ((33, 7), (30, 0), (2, 7), (-3, 1))]
    return [OpCase((S(s, dt),), {"starts": a, "stops": b, "steps": c}) for s, a, b, c in table]


@generator("pad", dtypes=ALL)
def _pad(dt, arity):
    table = [((7, 33), ((1, 2), (0, 3)), 0.0), ((1,), ((0, 1),), 1.5),
             ((1025,), ((2, 0),), -1.0), ((2, 3, 4), ((0, 0), (1, 1), (2, 0)), 0.0)]
    return [OpCase((S(s, dt),), {"pads": p, "value": v if dt in FLOATS else float(int(v))})
            for s, p, v in table]


@generator("concat", dtypes=ALL)
def _concat(dt, arity):
    n = max(arity, 1)
    rows = [7, 5, 1, 2, 3, 4, 6, 8][:n]
    return [
        OpCase(tuple(S((1,), dt) for _ in range(n)), {"axis": 0}),
        OpCase(tuple(S((r, 33), dt) for r in rows), {"axis": 0}),
        OpCase(tuple(S((7, r), dt) for r in rows), {"axis": 1}),
        OpCase(tuple(S(((1025, 7, 1) * n)[i:i + 1], dt) for i in range(n)), {"axis": 0}),
        OpCase(tuple(S((2, 3, 4), dt) for _ in range(n)), {"axis": 2}),
    ]


@generator("gather", dtypes=ALL)
def _gather(dt, arity):
    table = [((33, 7), (5,), 0, "int64"), ((7, 33), (2, 3), 1, "int64"),
             ((1025,), (7,), 0, "int32"), ((1,), (1,), 0, "int64"),
             ((2, 3, 4), (1025,), 2, "int32")]
    return [OpCase((S(s, dt), S(i, it, "index", s[a])), {"axis": a}) for s, i, a, it in table]


@generator("matmul", dtypes=NUMBERS)
def _matmul(dt, arity):
    table = [((1, 1), (1, 1)), ((7, 33), (33, 5)), ((33,), (33, 7)), ((7, 33), (33,)),
             ((2, 7, 33), (33, 5)), ((3, 1, 7, 5), (2, 5, 4)), ((7, 1025), (1025, 3)),
             ((1, 1025), (1025, 1)), ((1025,), (1025,))]
    return [OpCase((S(a, dt, "biased"), S(b, dt, "biased"))) for a, b in table]


@generator("iota", dtypes=("int64",))
def _iota(dt, arity):
    return [OpCase((), {"length": n, "dtype": _dtypes.as_dtype(t)})
            for n, t in ((1, "int64"), (7, "int32"), (33, "float32"), (1025, "int64"))]


@generator("state_update", dtypes=ALL)
def _state_update(dt, arity):
    table = [((4, 8), (2, 8), 0, 0), ((4, 8), (2, 8), 0, 2), ((4, 8), (3, 8), 0, 4),
             ((3, 5), (3, 2), 1, 5), ((1,), (1,), 0, 1), ((1025,), (7,), 0, 1000),
             ((33, 4), (7, 4), 0, 33)]
    return [OpCase((S(s, dt, leaf=STATE), S(v, dt)), {"axis": a, "offset": o})
            for s, v, a, o in table]


# ---------------------------------------------------------------------------- nn
NORM = [(1, 1), (7, 33), (3, 1025), (2, 3, 7), (1,)]


@generator("layer_norm")
def _layer_norm(dt, arity):
    return [OpCase((S(s, dt), S(s[-1:], dt), S(s[-1:], dt)), {"eps": 1e-5 if i % 2 else 1e-3})
            for i, s in enumerate(NORM)]


@generator("rms_norm")
def _rms_norm(dt, arity):
    return [OpCase((S(s, dt), S(s[-1:], dt)), {"eps": 1e-6 if i % 2 else 1e-3})
            for i, s in enumerate(NORM)]


@generator("linear", dtypes=FLOATS)
def _linear(dt, arity):
    table = [((7, 33), (5, 33), (5,)), ((1, 1), (1, 1), (1,)), ((2, 3, 33), (7, 33), (7,)),
             ((1025,), (3, 1025), (3,)), ((7, 1025), (1, 1025), (1,)), ((7, 33), (33,), (1,))]
    return [OpCase((S(x, dt, "biased"), S(w, dt, "biased"), S(b, dt))) for x, w, b in table]


@generator("embedding", dtypes=FLOATS)
def _embedding(dt, arity):
    table = [((7,), "int64", (33, 5)), ((2, 3), "int32", (7, 4)), ((1,), "int64", (1, 1)),
             ((33,), "int64", (1025, 3))]
    return [OpCase((S(i, it, "index", t[0]), S(t, dt))) for i, it, t in table]


@generator("dequantize")
def _dequantize(dt, arity):  # int8 values (small nonzero ints) and a positive float scale
    table = [((7, 33), (1, 33)), ((33, 5), (33, 1)), ((1025,), ())]
    return [OpCase((S(q, "int8"), S(sc, dt, "positive"))) for q, sc in table]


@generator("dequantize_int4")
def _dequantize_int4(dt, arity):  # int4 values offset by 8 (0..15) and positive group scales
    table = [((64, 5), (2, 5)), ((33, 3), (2, 3)), ((7, 1), (1, 1))]  # 33 rows: 17 + 16
    return [OpCase((S(q, "uint8", "index", 16), S(sc, dt, "positive"))) for q, sc in table]


def _recurrent(kind: str, gates: int, layer: bool, proj: bool = False):
    """Cases of a recurrent cell or layer (all of its inputs; a variant without a bias or
    the projection drops it): batch of 1 and 3, odd sizes, a layer over 1 and 7 steps."""
    def gen(dt, arity):
        out = []
        for steps, batch, feat, hidden, attrs in ((1, 1, 1, 1, {}), (7, 3, 5, 4, {}),
                                                  (4, 2, 33, 7, {"reverse": True})):
            if not layer and attrs:
                continue
            size = hidden  # h's size: the projection keeps it (a variant may drop w_hr)
            x = S((steps, batch, feat) if layer else (batch, feat), dt)
            state = [S((batch, size), dt)] + ([S((batch, hidden), dt)] if kind == "lstm"
                                              else [])
            params = [S((gates * hidden, feat), dt), S((gates * hidden, size), dt),
                      S((gates * hidden,), dt), S((gates * hidden,), dt)]
            if proj:
                params.append(S((size, hidden), dt))
            for extra in ({}, {"nonlinearity": "relu"}) if kind == "rnn" else ({},):
                out.append(OpCase((x, *state, *params), {**attrs, **extra}))
        return out
    return gen


for _kind, _gates in (("rnn", 1), ("gru", 3), ("lstm", 4)):
    generator(f"{_kind}_cell")(_recurrent(_kind, _gates, False))
    generator(f"{_kind}_layer")(_recurrent(_kind, _gates, True, _kind == "lstm"))


@generator("scaled_dot_product_attention")
def _attention(dt, arity):
    table = [  # q, k/v, mask (shape, dtype), is_causal, scale
        ((1, 4, 7, 8), (1, 2, 33, 8), ((7, 33), "bool"), False, None),
        ((1, 4, 7, 8), (1, 2, 33, 8), ((1, 1, 7, 33), dt), True, None),
        ((2, 2, 1, 4), (2, 2, 1, 4), ((2, 1, 1, 1), dt), False, 0.3),
        ((1, 1, 7, 16), (1, 1, 1025, 16), ((7, 1025), "bool"), True, None),
        ((2, 7, 8), (2, 33, 8), ((7, 33), dt), False, None),
        ((1, 2, 33, 8), (1, 2, 33, 8), ((33, 33), "bool"), True, 0.125),
    ]
    return [OpCase((S(q, dt), S(kv, dt), S(kv, dt), S(m, mdt)),
                   {"is_causal": causal, "scale": scale})
            for q, kv, (m, mdt), causal, scale in table]


@generator("rotary_embedding")
def _rotary(dt, arity):
    table = [((1, 2, 7, 8), (7, 8)), ((2, 33, 4), (33, 4)), ((1, 1, 1, 2), (1, 2)),
             ((1, 1025, 2), (1025, 2)),
             ((3, 2, 5, 8), (3, 1, 5, 8))]  # a table per batch row (a padded batch's)
    return [OpCase((S(x, dt), S(c, dt), S(c, dt))) for x, c in table]


@generator("triu", "tril", dtypes=ALL)
def _band(dt, arity):
    table = [((7, 33), 0), ((7, 33), 2), ((33, 7), -1), ((2, 3, 4), 0), ((1, 1), 0),
             ((1025, 2), -3)]
    return [OpCase((S(s, dt),), {"diagonal": d}) for s, d in table]


@generator("tile", dtypes=ALL)
def _tile(dt, arity):
    table = [((7, 3), (2, 1)), ((1,), (7,)), ((2, 3), (1, 1, 2)), ((1025,), (2,)),
             ((33, 1), (1, 3))]
    return [OpCase((S(s, dt),), {"reps": r}) for s, r in table]


@generator("conv2d")
def _conv2d(dt, arity):
    table = [  # x, weight, attrs
        ((1, 2, 7, 7), (4, 2, 3, 3), {"stride": 1, "padding": 1}),
        ((2, 4, 9, 9), (6, 2, 3, 3), {"stride": 2, "groups": 2}),
        ((3, 5, 5), (2, 3, 1, 1), {}),
        ((1, 1, 1, 33), (1, 1, 1, 3), {"padding": "same"}),
        ((1, 1, 1, 1025), (2, 1, 1, 3), {"dilation": 2, "padding": "valid"}),
    ]
    base = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    return [OpCase((S(x, dt), S(w, dt), S(w[:1], dt)), {**base, **a}) for x, w, a in table]


@generator("conv3d")
def _conv3d(dt, arity):
    table = [  # x, weight, attrs
        ((1, 2, 4, 5, 5), (3, 2, 2, 3, 3), {"padding": 1}),
        ((2, 4, 6, 5, 4), (4, 2, 3, 1, 1), {"stride": (2, 1, 1), "groups": 2}),
        ((3, 5, 4, 4), (2, 3, 1, 1, 1), {}),
        ((1, 1, 9, 1, 33), (1, 1, 3, 1, 3), {"padding": "same", "dilation": (2, 1, 1)}),
    ]
    base = {"stride": 1, "padding": 0, "dilation": 1, "groups": 1}
    return [OpCase((S(x, dt), S(w, dt), S(w[:1], dt)), {**base, **a}) for x, w, a in table]


@generator("max_pool2d", "avg_pool2d", "max_pool2d_indices")
def _pool(dt, arity):
    return [OpCase((S((1, 2, 7, 7), dt),), {"kernel_size": 3, "stride": 2, "padding": 1}),
            OpCase((S((2, 1, 33, 8), dt),), {"kernel_size": 2}),
            OpCase((S((1, 1, 1, 1025), dt),), {"kernel_size": (1, 3)})]


@generator("batch_norm")
def _batch_norm(dt, arity):
    return [OpCase((S(x, dt), S(x[1:2], dt), S(x[1:2], dt, "positive"), S(x[1:2], dt),
                    S(x[1:2], dt))) for x in ((2, 3, 7, 5), (1, 1, 1, 1), (1, 7, 33), (1, 3, 1025))]


@generator("group_norm")
def _group_norm(dt, arity):
    return [OpCase((S(x, dt), S(x[1:2], dt), S(x[1:2], dt)), {"num_groups": g})
            # (1, 2, 1): a single element per group has variance 0, and rsqrt(eps) magnifies
            # any rounding 316 times: a statement about the data, not about the kernel
            for x, g in (((2, 4, 7), 2), ((1, 6, 33), 3), ((1, 2, 1), 1), ((1, 4, 1025), 2))]


@generator("mse_loss", "l1_loss")
def _pointwise_loss(dt, arity):
    return [OpCase((S(s, dt), S(s, dt), S(s, dt, "positive")), {"reduction": r})
            for s, r in (((7, 33), "mean"), ((1,), "sum"), ((1025,), "none"))]


@generator("nll_loss", "cross_entropy")
def _class_loss(dt, arity):
    return [OpCase((S(x, dt), S(t, "int64", "index", x[1] if len(x) > 1 else x[0]),
                    S(x[1:2] if len(x) > 1 else x, dt, "positive")), {"reduction": r})
            for x, t, r in (((7, 5), (7,), "mean"), ((2, 5, 3), (2, 3), "sum"),
                            ((1, 33), (1,), "none"), ((3, 1025), (3,), "mean"))]


@generator("kl_div")
def _kl_div(dt, arity):
    return [OpCase((S(s, dt), S(s, dt, "positive")), {"reduction": r})
            for s, r in (((7, 33), "batchmean"), ((1,), "sum"), ((1025,), "mean"))]


@generator("adaptive_avg_pool2d", "adaptive_max_pool2d", "adaptive_max_pool2d_indices")
def _adaptive_pool(dt, arity):
    return [OpCase((S(x, dt),), {"output_size": o})
            for x, o in (((1, 2, 5, 7), (2, 3)), ((2, 1, 33, 7), (7, 1)), ((1, 1, 1, 1), (1, 1)),
                         ((1, 1, 2, 1025), (1, 5)))]


@generator("unfold")
def _unfold(dt, arity):
    return [OpCase((S(x, dt),), a) for x, a in (
        ((1, 2, 5, 5), {"kernel_size": 2}),
        ((2, 3, 7, 6), {"kernel_size": 3, "padding": 1, "stride": 2}),
        ((1, 1, 3, 33), {"kernel_size": (1, 3), "dilation": (1, 2)}))]


@generator("interpolate")
def _interpolate(dt, arity):
    base = {"size": None, "scale_factor": None, "mode": "nearest", "align_corners": None,
            "recompute_scale_factor": None}
    table = [((1, 2, 3, 4), {"scale_factor": 2}), ((1, 1, 7, 5), {"size": (9, 11)}),
             ((2, 1, 1, 33), {"scale_factor": 3, "mode": "nearest-exact"}),
             ((1, 2, 7, 5), {"scale_factor": 1.7, "mode": "bilinear", "align_corners": False}),
             ((1, 1, 5, 33), {"size": (7, 9), "mode": "bilinear", "align_corners": True}),
             ((2, 3, 33), {"scale_factor": 2, "mode": "linear", "align_corners": False}),
             ((1, 2, 7, 9), {"size": (3, 4), "mode": "area"}),
             ((1, 1, 1, 1025), {"scale_factor": 2})]
    return [OpCase((S(x, dt),), {**base, **a}) for x, a in table]


# ---------------------------------------------------------------------------- drivers
def op_cases(kernel, limit_other: int = 2) -> list[Case]:
    """Cases for a single-op pattern from the op's generator ([] when it has none)."""
    root = kernel.pattern
    op = OPS[root.op]
    given = root.attrs.get("args", op.params) if op.optional else op.params
    found = GENERATORS.get(op.name)
    if found is None:
        return []
    gen, dts = found
    allowed = [d for d in dts if kernel.dtypes is None or _dtypes.as_dtype(d) in kernel.dtypes]
    if not allowed:  # the generator's dtypes miss the kernel's: try the kernel's own
        allowed = [d.name for d in kernel.dtypes or ()]
    out: list[Case] = []
    star = _star(root)
    if star is None:
        arities = [len(root.inputs)]
    else:
        least = len(root.inputs) - 1 + root.inputs[star].min
        arities = [n for n in VARIADIC_ARITIES if n >= least] or [least]
    for rank, dt in enumerate(allowed):
        for arity in arities:
            made = gen(dt, arity)
            if rank:
                made = sorted(made, key=lambda c: _elements(c.inputs))[:limit_other]
            for c in made:
                specs = _positional(root, op, given, c.inputs)
                if specs is not None:
                    out.append(Case(specs, dict(c.attrs), c.note))
    return out


def _star(root: pat.OpPat) -> int | None:
    """The position of the root's ``pat.many`` operand, or None."""
    return next((i for i, q in enumerate(root.inputs) if isinstance(q, pat.Many)), None)


def _elements(specs) -> int:
    total = 0
    for s in specs:
        if s is not None:
            n = 1
            for d in s.shape:
                n *= d
            total += n
    return total


def _positional(root: pat.OpPat, op, given, inputs) -> dict[str, Spec] | None:
    """Specs keyed by the pattern's variable names (pattern inputs are the given params)."""
    if op.variadic:
        chosen = list(inputs)
    else:
        by_param = dict(zip(op.params, inputs))
        chosen = [by_param.get(p) for p in given]
    if any(c is None for c in chosen):
        return None
    star = _star(root)
    if star is None:
        if len(chosen) != len(root.inputs):
            return None
        slots = list(root.inputs)
    else:
        from tensor_graphs.kernels.registry import element_name

        many = root.inputs[star]
        count = len(chosen) - (len(root.inputs) - 1)
        if count < many.min:
            return None
        slots = list(root.inputs[:star]) + [pat.Var(element_name(many.name, i))
                                            for i in range(count)] + list(root.inputs[star + 1:])
    specs = {}
    for p, spec in zip(slots, chosen):
        if isinstance(p, pat.Var):
            if p.name in specs and specs[p.name] != spec:
                return None
            specs[p.name] = spec
    return specs


def from_signatures(kernel) -> list[Case]:
    """Cases from the kernel's ``signatures=``: dicts of input name -> shape, (shape, dtype)
    or Spec (a variadic input: a list of those), with an optional "attrs" dict for the root
    node."""
    from tensor_graphs.kernels.registry import element_name

    sigs = kernel.signatures() if callable(kernel.signatures) else kernel.signatures
    out = []
    for sig in sigs:
        if not isinstance(sig, dict):
            raise ArgumentError(f"kernel {kernel.name}: each signature is a dict of input name "
                                f"-> shape or (shape, dtype), got {sig!r}")
        attrs = dict(sig.get("attrs", {}))
        specs = {}
        for name in kernel.inputs:
            if name not in sig:
                raise ArgumentError(f"kernel {kernel.name}: signature {sig!r} has no entry for "
                                    f"input '{name}'")
            if name == kernel.variadic:
                entries = sig[name]
                if not isinstance(entries, list):
                    raise ArgumentError(f"kernel {kernel.name}: the variadic input '{name}' "
                                        f"takes a list of shapes, got {entries!r}")
                for i, entry in enumerate(entries):
                    specs[element_name(name, i)] = as_spec(entry)
            else:
                specs[name] = as_spec(sig[name])
        out.append(Case(specs, attrs, "signatures="))
    return out


def as_spec(value) -> Spec:
    if isinstance(value, Spec):
        return value
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], (tuple, list)) \
            and not isinstance(value[1], int):
        return Spec(tuple(value[0]), _dtypes.as_dtype(value[1]).name)
    if isinstance(value, (tuple, list)) and all(isinstance(d, int) for d in value):
        return Spec(tuple(value))
    raise ArgumentError(f"a signature entry is a shape or a (shape, dtype) pair, got {value!r}")


# Shape templates of the fused-pattern search; letters are sizes filled in per case.
TEMPLATES = [("M", "N"), ("N",), ("M", "K"), ("K", "N"), ("M", 1), (1, "N"), ("B", "M", "N"),
             ()]
SEARCH_SIZES = {"M": 3, "N": 4, "K": 5, "B": 2}
CASE_SIZES = [{"M": 1, "N": 1, "K": 1, "B": 1}, {"M": 7, "N": 33, "K": 5, "B": 2},
              {"M": 3, "N": 1025, "K": 2, "B": 1}, {"M": 2, "N": 3, "K": 1025, "B": 1},
              {"M": 33, "N": 7, "K": 33, "B": 3}]


def template_cases(kernel, build: Callable, max_assignments: int = 2) -> list[Case]:
    """Search shape templates for the pattern's variables (see the module docstring). Among
    the assignments that build and match, the most natural come first: matrices (rank 2), no
    outer broadcast (a result with a size twice), the most distinct sizes, the fewest size-1
    axes (so x @ w + b gives x (M, K), w (K, N), b (N,))."""
    names = list(kernel.inputs)
    if kernel.variadic is not None:  # its elements are searched as variables of their own
        from tensor_graphs.kernels.registry import _many

        names = kernel.argument_names(len(names) - 1 + max(2, _many(kernel.pattern).min))
    roles = variable_roles(kernel.pattern)
    dtype = "float32"
    if kernel.dtypes is not None and _dtypes.float32 not in kernel.dtypes:
        floats = [d for d in kernel.dtypes if d.is_float]
        dtype = (floats or list(kernel.dtypes))[0].name

    def spec(name, template, sizes):
        shape = tuple(sizes[d] if isinstance(d, str) else d for d in template)
        role = roles.get(name)
        if role == "bool":
            return Spec(shape, "bool")
        if role == "index":
            return Spec(shape, "int64", "index", min(sizes.values()))
        return Spec(shape, dtype)

    if len(names) <= 4:
        candidates = itertools.product(TEMPLATES, repeat=len(names))
    else:
        candidates = (tuple([t] * len(names)) for t in TEMPLATES)
    scored = []
    for assignment in candidates:
        specs = {n: spec(n, t, SEARCH_SIZES) for n, t in zip(names, assignment)}
        built = build(Case(specs))
        if built is None:
            continue
        shape = [d for d in built.root.shape if d > 1]
        ones = sum(1 for t in assignment for d in t if d == 1)
        letters = {d for t in assignment for d in t if isinstance(d, str)}
        rank = max(len(t) for t in assignment)
        order = sum(TEMPLATES.index(t) for t in assignment)
        ranks = sum(len(t) for t in assignment)
        scored.append(((abs(rank - 2), len(shape) != len(set(shape)), -len(letters), ones,
                        -ranks, order), assignment))
    scored.sort(key=lambda item: item[0])
    chosen, ranks_seen = [], set()
    for _, assignment in scored:  # the best, then the best of another rank structure
        ranks = tuple(len(t) for t in assignment)
        if ranks not in ranks_seen:
            ranks_seen.add(ranks)
            chosen.append(assignment)
        if len(chosen) >= max_assignments:
            break
    out = []
    for assignment in chosen:
        for sizes in CASE_SIZES:
            specs = {n: spec(n, t, sizes) for n, t in zip(names, assignment)}
            out.append(Case(specs, {}, "template " + " ".join(
                f"{n}{tuple(t)}" for n, t in zip(names, assignment))))
    return out


def variable_roles(p: pat.Pat) -> dict[str, str]:
    """Variables whose position fixes their kind: where's condition (bool), gather's and
    embedding's indices (int)."""
    roles: dict[str, str] = {}
    stack = [p]
    while stack:
        q = stack.pop()
        if not isinstance(q, pat.OpPat):
            continue
        slots = {WHERE: {0: "bool"}, GATHER: {1: "index"}, EMBEDDING: {0: "index"},
                 NLL_LOSS: {1: "index"}}.get(q.op, {})
        for i, child in enumerate(q.inputs):
            if isinstance(child, pat.Var) and i in slots:
                roles[child.name] = slots[i]
            stack.append(child)
    return roles
