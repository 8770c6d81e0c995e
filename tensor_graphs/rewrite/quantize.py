"""``tg.quantize``: a graph's matmul/linear weights rewritten to a low-precision scheme.

Why a rewrite and not a kernel option: quantizing changes the numbers, so it is the user's
choice of model, not the planner's choice of how to compute one. The rewritten graph says
exactly what is computed (its float64 reference is the quantized model's), and the planner
then chooses kernels for it under the tolerance as for any graph: a quantized kernel's
measured error is against that reference.

A weight here is a float ``tg.weight`` leaf of rank 2 read by a product as its right operand:
``a @ w`` (w (K, N)) or ``linear(x, w, b)`` (w (N, K), torch's layout). Each becomes
``a @ dequantize(quantize(w', s), s)`` with ``w'`` the (K, N) view (``permute(w)`` for a
linear) and ``s = quant_scale(w', axis=0)``, one scale per output channel. int8-dynamic:
``dynamic_quant(a, group=G) @ dequantize(q, s)``, the rows of ``a`` quantized at run time
with a scale per G values of a row, and the weight with a scale per (G rows of K, output
channel): ``s`` (K / G, N), the max over each group of the (K / G, G, N) view / 127 (G =
``group_size``, 32; a K that G does not divide: a scale per row and per channel). Why groups
on both sides: on MiniLM's real weights and 16 real sentences (benchmarks/quant_accuracy.py)
per-channel int8 weights alone move a pair's cosine similarity by 0.010 and one scale a row
by 0.029; groups of 32 on both by 0.007 (docs/benchmarks.md, issue 23). ``quantize`` and
``quant_scale`` read weights only, so the runtime computes them once per binding (the
prelude, ``ir.graph.is_static``) from the float weights the user binds; a kernel matching
``a @ dequantize(q, s)`` then packs ``q`` once more at bind time. Other readers of the same
weight keep the float tensor: GPT-2's tied embedding still gathers float rows while its LM
head reads int8.

fp16-weight writes ``a @ fp16_round(w')``; int4-weight ``a @ dequantize_int4(q, s)`` with
``q = quantize_int4(w', s)``, ``s = int4_scale(w', group_size=G)``: a scale per group of G
rows along K and output channel (``GROUP_SIZE``), also prepared once per binding.

``a @ w.T`` (``permute(w, (1, 0))`` of a weight: a tied LM head written by hand) is read as
``linear(a, w)``. ``skip``: weight names (``fnmatch`` patterns) left in float, e.g.
``["lm_head.weight"]``; a pattern naming none of the weights quantized is refused, and so is
a graph with nothing to quantize (one quantized already: a second scheme was ignored).
"""

from __future__ import annotations

import re
from fnmatch import fnmatchcase

import numpy as np

from tensor_graphs.errors import ArgumentError
from tensor_graphs.ir import api as tg
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import (
    BF16_ROUND,
    DEQUANTIZE,
    DEQUANTIZE_INT4,
    DYNAMIC_QUANT,
    FP16_ROUND,
    LINEAR,
    MATMUL,
    PERMUTE,
    QUANTIZE,
    QUANTIZE_INT4,
    WEIGHT,
)
from tensor_graphs.ir.shapes import format_shape

# scheme -> (what it does to one (K, N) weight view (the product's right operand) given the
# group size, what it does to the activation (the left operand))
SCHEMES = {
    # symmetric int8, one scale per output channel (column of the (K, N) view)
    "int8-weight": (lambda w, g: tg.dequantize(*_int8(w)), lambda a, g: a),
    # int8 weights with a scale per (g rows of K, column), and each activation row quantized
    # at run time with a scale per g values: int8 x int8 summed in int32 per group, times
    # both groups' scales (a K that g does not divide: per channel and per row)
    "int8-dynamic": (lambda w, g: tg.dequantize(*_int8_groups(w, g)),
                     lambda a, g: tg.dynamic_quant(a, group=_group(a.shape[-1], g))),
    # bfloat16 storage: w rounded to bfloat16 (to nearest even), a float result
    "bf16-weight": (lambda w, g: tg.bf16_round(w), lambda a, g: a),
    # IEEE float16 storage: w rounded to float16 (to nearest even; subnormals, inf past range)
    "fp16-weight": (lambda w, g: tg.fp16_round(w), lambda a, g: a),
    # symmetric int4, a scale per (group of g rows along K, output channel)
    "int4-weight": (lambda w, g: tg.dequantize_int4(*_int4(w, g)), lambda a, g: a),
}
# int4-weight's rows per scale along K. Why 32: a group's step is its largest |w| / 7, so a
# smaller group keeps outlier weights from coarsening their neighbours' steps. Measured
# (docs/benchmarks.md): MiniLM's real weights, sentence similarities' largest change from
# float32 0.099 at 32 against 0.144 at 128 (embeddings' error 0.28 against 0.35); GPT-2 124M
# decode (random weights, load ~9) 28 against 22 ms/token, 4 bytes of scale a group.
GROUP_SIZE = 32
# the schemes whose scales cover groups of ``group_size`` rows along K, so a file saved with
# another group size holds other numbers (int8-weight has a scale per output channel;
# bf16/fp16 none)
GROUPED = frozenset({"int4-weight", "int8-dynamic"})


def group_size_for(scheme: str, group_size, where: str) -> int | None:
    """The rows per scale ``scheme`` quantizes with: ``group_size``, or ``GROUP_SIZE`` when
    None; None for a scheme without groups. Refused: a group size that is not a positive int,
    and one given for a scheme without groups, which would be ignored (a user asking for
    int8-weight at 64 rows would believe the scales covered 64 rows)."""
    if group_size is not None and (isinstance(group_size, bool)
                                   or not isinstance(group_size, int) or group_size < 1):
        raise ArgumentError(f"{where}: group_size must be a positive int (rows of K per scale "
                            f"of {' and '.join(sorted(GROUPED))}), got {group_size!r}")
    if scheme not in GROUPED:
        if group_size is not None:
            raise ArgumentError(f"{where}: group_size is for {' and '.join(sorted(GROUPED))}, "
                                f"whose scales cover groups of rows; {scheme} has none: "
                                "leave group_size out")
        return None
    return GROUP_SIZE if group_size is None else group_size


def _int8(w: Node) -> tuple[Node, Node]:
    s = tg.quant_scale(w, axis=0)
    return tg.quantize(w, s), s


def _group(k, group_size: int) -> int:
    """int8-dynamic's group along K: ``group_size`` where it divides K and is smaller, else 0
    (one scale a row / a channel)."""
    return group_size if isinstance(k, int) and group_size < k and k % group_size == 0 else 0


def _int8_groups(w: Node, group_size: int) -> tuple[Node, Node]:
    """(q (K, N), s (K / G, N)): a symmetric scale per (G rows of K, column) of the (K, N)
    weight ``w``, by ``quant_scale``/``quantize`` over its (K / G, G, N) view; per column
    where ``_group`` gives 0."""
    k, n = w.shape
    g = _group(k, group_size)
    if not g:
        return _int8(w)
    v = tg.reshape(w, k // g, g, n)
    s = tg.quant_scale(v, axis=1)
    return tg.reshape(tg.quantize(v, s), k, n), tg.reshape(s, k // g, n)


def _int4(w: Node, group_size: int) -> tuple[Node, Node]:
    s = tg.int4_scale(w, group_size=group_size)
    return tg.quantize_int4(w, s), s


# prequantized weights: scheme -> what the file holds for a float weight ``<name>``, in the
# weight's own layout ((N, K) for a linear, torch's; (K, N) for a matmul's right operand). A
# weight read both ways (F.linear(h, w) and h @ w: its output channels are its rows for one,
# its columns for the other) holds the matmul's values under ``<name>.matmul`` (``TWIN``):
# the two quantize along different axes, so they are different numbers of the same shape
LOADED = {
    # <name>.q int8 [-127, 127] the weight's shape; <name>.scale size 1 along K: (N, 1) / (1, N)
    "int8-weight": "int8",
    # the same, the scale a row per group of K (``_group``): (N, K / G) / (K / G, N)
    "int8-dynamic": "int8",
    # <name>.q int8 [-8, 7] the weight's shape (one a byte); <name>.scale a row per group of
    # K: (N, ng) / (ng, N), ng = ceil(K / group_size)
    "int4-weight": "int4",
}
TWIN = ".matmul"  # what a weight read both ways adds to its matmul reading's leaves' names


def _layouts(outputs, skip) -> dict[str, set[bool]]:
    """Weight name -> the layouts the products ``quantize`` rewrites read it in (True: a
    linear's (N, K), False: a matmul's (K, N)): the same test as ``quantize``'s."""
    found: dict[str, set[bool]] = {}
    for n in nodes(outputs):
        read = _reading(n, skip)
        if read is not None:
            found.setdefault(read[0].name, set()).add(read[1])
    return found


def _stored(name: str, linear: bool, layouts: dict[str, set[bool]]) -> str:
    """The name of a weight's prequantized leaves without ``.q``/``.scale``: its own, or,
    for a matmul's reading of a weight a linear reads too, ``<name>.matmul`` (``TWIN``). Why
    apart: under one name the two readings' scales ((N, 1) and (1, N)) were two leaves of one
    name, which no file can bind (the FeedError named them, not the model)."""
    return name + TWIN if not linear and True in layouts.get(name, ()) else name


def _loaded(scheme: str, w: Node, linear: bool, group_size: int | None, base: str
            ) -> Node:
    """The (K, N) weight a product reads from prequantized leaves ``<base>.q``,
    ``<base>.scale`` (``LOADED``; ``base``: ``_stored``'s name of ``w``), in place of ``w``'s
    float values."""
    n, k = (int(d) for d in w.shape) if linear else reversed([int(d) for d in w.shape])
    ng = -(-k // group_size) if LOADED[scheme] == "int4" else _groups_of(scheme, k, group_size)
    q = tg.weight(f"{base}.q", tuple(w.shape), "int8")
    s = tg.weight(f"{base}.scale", (n, ng) if linear else (ng, n), w.dtype)
    if linear:
        q, s = tg.transpose(q, 0, 1), tg.transpose(s, 0, 1)
    if LOADED[scheme] == "int8":
        return tg.dequantize(q, s)
    # int4 as the graph holds it: v + 8 in uint8 (a value past [-8, 7] fails the packing)
    return tg.dequantize_int4(tg.cast(tg.add(tg.cast(q, "int32"), 8), "uint8"), s)


def prequantized_weights(outputs, weights, scheme: str, *, skip=(),
                         group_size: int | None = None) -> dict:
    """The ``<name>.q``/``<name>.scale`` arrays (``LOADED``'s convention) of the float
    ``weights`` ``tg.quantize(outputs, scheme, prequantized=True)`` reads: what a file for it
    holds (``tg.write_safetensors``), computed by the scheme's own composites in float32."""
    from tensor_graphs.ir.evaluate import evaluate

    if scheme not in LOADED:
        raise ArgumentError(f"prequantized_weights: {scheme!r} has no prequantized form; "
                            f"known: {sorted(LOADED)}")
    group_size = group_size_for(scheme, group_size, "prequantized_weights")
    if isinstance(skip, str):
        skip = (skip,)
    layouts = _layouts(outputs if isinstance(outputs, (list, tuple)) else
                       list(outputs.values()) if isinstance(outputs, dict) else [outputs], skip)
    out = {}
    for name, linear in ((n, lin) for n, found in layouts.items() for lin in sorted(found)):
        if name not in weights:
            raise ArgumentError(f"prequantized_weights: no value for weight {name!r}")
        w = tg.weight(name, np.shape(weights[name]))
        view = tg.transpose(w, 0, 1) if linear else w
        if LOADED[scheme] == "int8":
            q, s = (_int8_groups(view, group_size) if scheme == "int8-dynamic" else
                    _int8(view))
        else:
            s = tg.int4_scale(view, group_size=group_size)
            q = tg.cast(tg.add(tg.cast(tg.quantize_int4(view, s), "int32"), -8), "int8")
        if linear:
            q, s = tg.transpose(q, 0, 1), tg.transpose(s, 0, 1)
        qv, sv = evaluate([q, s], {name: np.asarray(weights[name], np.float32)})
        base = _stored(name, linear, layouts)
        out[f"{base}.q"], out[f"{base}.scale"] = (np.ascontiguousarray(qv),
                                                  np.ascontiguousarray(sv, np.float32))
    return out


def _groups_of(scheme: str, k: int, group_size: int | None) -> int:
    """Rows of an int8 prequantized scale along K: int8-dynamic's groups, else 1."""
    g = _group(k, group_size) if scheme == "int8-dynamic" else 0
    return k // g if g else 1


def _weight(node: Node) -> bool:
    """A float weight leaf of rank 2: what the schemes quantize (per output channel or per
    group of rows along K of a (K, N) view)."""
    return node.op.name == WEIGHT and node.ndim == 2 and node.dtype.is_float


def _skipped(name: str, skip) -> bool:
    return any(fnmatchcase(name, p) for p in skip)


def _reading(n: Node, skip=()) -> tuple[Node, bool] | None:
    """(the weight leaf, read as (N, K)?) of a product ``quantize`` rewrites, else None:
    ``a @ w`` (False), ``linear(a, w, b)`` and ``a @ w.T`` (True: torch's ``h @ w.T``, a
    tied LM head written by hand, is a linear's reading of w; left float it was silently
    not quantized), ``a`` float, ``w`` a float rank-2 weight no ``skip`` pattern names."""
    if n.op.name not in (MATMUL, LINEAR) or len(n.inputs) < 2 or not _float(n.inputs[0]):
        return None
    b, linear = n.inputs[1], n.op.name == LINEAR
    if not linear and b.op.name == PERMUTE and tuple(b.attrs.get("perm", ())) == (1, 0):
        b, linear = b.inputs[0], True
    if not _weight(b) or _skipped(b.name, skip):
        return None
    return b, linear


def _float(a: Node) -> bool:
    """An activation a scheme may quantize: float, with a row (rank >= 1)."""
    return a.dtype.is_float and a.ndim >= 1


# a weight name's layer index: a path component of digits ("h.3.attn" -> "h.#.attn")
_LAYER_INDEX = re.compile(r"(?<=\.)\d+(?=\.)")


def _own(a: Node, w: Node) -> Node:
    """The activation as this product reads it; a run-time quantization gets a node of its
    own, named after the weight with its layer index dropped (``h.#.attn.c_attn.weight:rows``).
    Why its own: products of one input (attention's q, k and v) would otherwise share one
    ``dynamic_quant`` node, and a kernel may fuse a node only when nothing else reads it, so
    each would run as a float GEMM on the shared quantize-dequantize's float result;
    quantizing the rows once per product costs O(rows x K) against the product's O(rows x K
    x N). Why without the index: the name is part of the node, so with it every layer's
    block differed from the others and the planner searched all of them (MiniLM int8-dynamic:
    39 s, where the float model reuses one block's plan for 10 of its 12 layers). Two
    products of one input whose weights differ only by such an index (a mixture's experts)
    share the node again: the same values, fused less."""
    if a.op.name != DYNAMIC_QUANT:
        return a
    return Node.make(a.op, a.inputs, a.attrs, _LAYER_INDEX.sub("#", str(w.name)) + ":rows")


def quantize(outputs, scheme="int8-weight", *, skip=(), group_size: int | None = None,
             prequantized: bool = False):
    """``outputs`` (a node, or a list/tuple/dict of nodes) with the weights of their matmuls
    and linears in ``scheme`` (``SCHEMES``); returns the same structure. Weights named by a
    ``skip`` pattern stay float. ``group_size``: int4-weight's and int8-dynamic's rows per
    scale along K (None: ``GROUP_SIZE``; int4, a K not a multiple of it: ceil(K /
    group_size) groups, equal but the last; int8-dynamic, a K it does not divide or does not
    exceed: a scale per output channel and per activation row). ``prequantized``: the
    int8/int4 values and scales are bound as weights of their own (``<name>.q``,
    ``<name>.scale``: ``LOADED``), e.g. from a safetensors file, instead of computed from
    the float weight, which the quantized products then no longer read.

    ``tg.quantize(x, scale)`` with a node as the second argument is the ``quantize`` op
    (``ir/ops/quant.py``): one public name for the op and for the rewrite that writes it."""
    if isinstance(scheme, Node):
        return tg.quantize(outputs, scheme)
    if scheme not in SCHEMES:
        raise ArgumentError(f"quantize: unknown scheme {scheme!r}; known: {sorted(SCHEMES)}")
    if isinstance(skip, str):
        skip = (skip,)
    group_size = group_size_for(scheme, group_size, "quantize")
    scheme_make, act = SCHEMES[scheme]
    if prequantized and scheme not in LOADED:
        raise ArgumentError(f"quantize: prequantized weights exist for {sorted(LOADED)}, not "
                            f"{scheme!r} (a float16/bfloat16 checkpoint binds to the float "
                            f"weights as it is: the file's dtype is converted on load)")

    def make(w: Node, leaf: Node, linear: bool) -> Node:
        if prequantized:
            return _loaded(scheme, leaf, linear, group_size,
                           _stored(leaf.name, linear, layouts))
        return scheme_make(w, group_size)

    if isinstance(outputs, dict):
        keys, outs = list(outputs), list(outputs.values())
    elif isinstance(outputs, Node):
        keys, outs = None, [outputs]
    elif isinstance(outputs, (list, tuple)):
        keys, outs = None, list(outputs)
    else:  # a compiled program, None...: not iterated, which raised a bare TypeError
        keys, outs = None, [outputs]
    for o in outs:
        if not isinstance(o, Node):
            raise ArgumentError(f"quantize: needs graph nodes (a node, or a list/tuple/dict of "
                                f"them), got {type(o).__name__}; a tg.compile'd program is "
                                f"quantized by quantizing its graph and compiling that: "
                                f"tg.compile(tg.quantize(y, {scheme!r}), ...)")
    _check_skip(outs, scheme, skip)
    layouts = _layouts(outs, skip) if prequantized else {}
    mapped: dict[Node, Node] = {}  # old node -> its rewritten graph, inputs first
    for n in nodes(outs):
        ins = tuple(mapped[i] for i in n.inputs)
        read = _reading(n, skip)
        if read is None:
            mapped[n] = n if ins == n.inputs else Node.make(n.op, ins, n.attrs, n.name)
            continue
        leaf, linear = read
        _check_fixed(leaf, scheme, prequantized)
        y = tg.matmul(_own(act(ins[0], group_size), leaf),
                      make(tg.transpose(leaf, 0, 1) if linear else leaf, leaf, linear))
        mapped[n] = y + ins[2] if n.op.name == LINEAR and len(ins) >= 3 else y
    new = [mapped[o] for o in outs]
    if keys is not None:
        return dict(zip(keys, new))
    if isinstance(outputs, Node):
        return new[0]
    return type(outputs)(new) if isinstance(outputs, tuple) else list(new)


def quantized_weights(outputs) -> list[str]:
    """Names of the weights ``outputs`` read through a scheme (for reports)."""
    found = []
    for n in nodes(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        if n.op.name in _SCHEME_OPS:
            found += [leaf.name for leaf in nodes([n.inputs[0]]) if leaf.op.name == WEIGHT]
    return sorted(set(found))


# the ops the schemes write on a weight: a graph holding them is quantized already
_SCHEME_OPS = frozenset({QUANTIZE, QUANTIZE_INT4, BF16_ROUND, FP16_ROUND, DEQUANTIZE,
                         DEQUANTIZE_INT4})


def _candidates(outs) -> list[str]:
    """The weights a scheme would quantize, skip aside: what a skip pattern must name."""
    return sorted({read[0].name for n in nodes(outs) if (read := _reading(n)) is not None})


def _listed(names: list[str], most: int = 8) -> str:
    shown = ", ".join(repr(n) for n in names[:most])
    return shown + (f" and {len(names) - most} more" if len(names) > most else "")


def _check_skip(outs, scheme: str, skip) -> None:
    """Refuse a graph with no product to quantize and a ``skip`` pattern that names none of
    its quantizable weights. Why: both returned the graph as if quantized: a mistyped
    pattern (``"lm_head"`` for ``"lm_head.weight"``) quantized the weight it was meant to
    keep float, and a graph quantized twice kept the first scheme under the second's name."""
    names = _candidates(outs)
    if not names:
        done = quantized_weights(outs)
        why = (f"it is quantized already (weights {_listed(done)}): quantize the float graph "
               "once, with the scheme you want" if done else
               "no matmul or linear reads a float weight of rank 2 as its right operand "
               "(a 3-D batched weight, or one reached through ops other than a transpose, "
               "stays float)")
        raise ArgumentError(f"quantize: nothing to quantize with {scheme}: {why}")
    for p in skip:
        if not isinstance(p, str):
            raise ArgumentError(f"quantize: skip patterns are weight names (fnmatch), got "
                                f"{p!r}")
        if not any(fnmatchcase(name, p) for name in names):
            raise ArgumentError(f"quantize: skip pattern {p!r} matches none of the weights "
                                f"{scheme} quantizes ({_listed(names)}), so it keeps nothing "
                                "float: give the weight's full name (a fnmatch pattern) or "
                                "leave the pattern out")


def _check_fixed(leaf: Node, scheme: str, prequantized: bool) -> None:
    """Refuse a weight of symbolic shape where the scheme needs its sizes: int4's groups
    along K, and a prequantized weight's ``.q``/``.scale`` leaves (an unclear TypeError
    from inside int4_scale's decomposition before)."""
    if (scheme == "int4-weight" or prequantized) and not all(
            isinstance(d, int) for d in leaf.shape):
        raise ArgumentError(f"quantize: weight {leaf.name!r} {format_shape(leaf.shape)} has a "
                            f"symbolic size; {scheme}{' prequantized' if prequantized else ''} "
                            "needs fixed sizes (its scales' groups along K): declare the "
                            "weight's shape, or use int8-weight")
