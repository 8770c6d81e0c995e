"""Recomposition: find composites a model spells out by hand and fold them back into one node.

A model that writes RMSNorm as ``x * rsqrt(mean(x**2) + eps) * w`` or GPT-2's GELU as
``0.5*x*(1 + tanh(sqrt(2/pi)*(x + 0.044715*x**3)))`` computes exactly a composite we define,
but no fused kernel's pattern sees it. Recomposition finds such regions and replaces each by the
composite node (``rms_norm(x, w, eps=...)``), so kernel matching in the planner finds the fused
kernels; the planner can still decompose the node.

Both sides meet in a *normal view* (``NormalView``): every composite expanded into atomic ops,
``pow`` by 2 or 3 spelled as products, ``pm_simplify`` at every node, float constants rounded to
their dtype. The view only serves matching; the graph itself keeps its nodes. For each entry of
``RECOMPOSABLE`` (an op and a variant: which optional tensors, which fixed attributes) a
*skeleton* pattern is traced once from the op's own definition, in the view: its leaves are the
op's tensor parameters, its float attributes (eps) are found by tracing with a sentinel value,
other constants and every op attribute are left free. A skeleton match only proposes bindings;
the candidate ``op(bound inputs, eps=...)`` is accepted when its normal view and the matched
region have equal digests with the bound inputs as placeholders (chains compared as multisets).
So a recomposed node computes the matched function exactly as its definition does, and a
look-alike (another constant, another axis, a missing term) is never folded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.ir import builder as tg
from tensor_graphs.ir.algebra import ASSOCIATIVE_COMMUTATIVE, build_chain, chain_terms
from tensor_graphs.ir.graph import _as_list, nodes, use_counts
from tensor_graphs.ir.node import ConstValue, Node, expand_composite
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.names import CONSTANT, DIM, ERFC, MUL
from tensor_graphs.rewrite import pattern as pat
from tensor_graphs.rewrite.canonical import digests
from tensor_graphs.rewrite.simplify import pm_simplify

SENTINEL = 0.0123456789  # a float attribute's value while tracing a skeleton (found by value)


# ---------------------------------------------------------------------------- the normal view
def _small_power(e: Node, n: int) -> bool:
    return pat.constant_equals(e, n) and e.attrs["value"].array.size == 1


_x, _e = pat.var("x"), pat.var("e")
pm_powers = pat.RuleTable("powers", [
    # x**2 -> x*x, x**3 -> x*x*x: the spellings of a square the definitions use (tg.mul(h, h))
    pat.rule(pat.pow(_x, pat.var("e", where=lambda e: _small_power(e, 2))),
             lambda x, e: tg.mul(x, x), "pow2"),
    pat.rule(pat.pow(_x, pat.var("e", where=lambda e: _small_power(e, 3))),
             lambda x, e: tg.mul(tg.mul(x, x), x), "pow3"),
])


def _negated(u: Node) -> Node:
    """-u, a scaling constant's sign flipped when u = y * c: the spelling gelu's definition
    uses (erfc(x * -1/sqrt 2)), so a hand-written x / sqrt 2 meets it."""
    if u.op.name == MUL:
        for k in (0, 1):
            c = u.inputs[k]
            if c.op.name == CONSTANT and c.dtype.is_float:
                return tg.mul(u.inputs[1 - k], tg.constant(-c.attrs["value"].array, c.dtype))
    return tg.neg(u)


def _unit(e: Node) -> bool:
    return pat.constant_equals(e, 1.0) and e.attrs["value"].array.size == 1


_u = pat.var("u")
pm_complement = pat.RuleTable("complement", [
    # 1 + erf(u) -> erfc(-u): the same function; gelu is defined with the erfc, which keeps
    # the tail that 1 + erf cancels away, and a model's 0.5 x (1 + erf(x / sqrt 2)) is gelu
    pat.rule(pat.erf(_u) + pat.var("one", where=_unit),
             lambda u, one: tg._make(ERFC, (_negated(u),)), "erf_complement"),
])
NORMAL_RULES = pm_powers + pm_complement + pm_simplify


def _rounded(node: Node) -> Node:
    """A float constant stored wider than its dtype, stored in its dtype: constants that round
    to the same value where the graph computes compare equal (0.7978845608 vs sqrt(2/pi))."""
    if node.op.name != CONSTANT or not node.dtype.is_float:
        return node
    arr = node.attrs["value"].array
    want = np.dtype(node.dtype.np_dtype)
    if arr.dtype == want:
        return node
    return Node.make(node.op, (), {**node.attrs, "value": ConstValue(arr.astype(want))})


class NormalView:
    """Each node -> its normal form (see the module docstring), memoised; ``origin`` maps a
    normal node back to the first graph node that has it as its normal form."""

    def __init__(self, rules: pat.RuleTable = NORMAL_RULES, max_steps: int = 64):
        self.rules = rules
        self.max_steps = max_steps
        self.memo: dict[Node, Node] = {}
        self.origin: dict[Node, Node] = {}

    def __call__(self, root: Node) -> Node:
        memo = self.memo
        stack: list[tuple[Node, bool]] = [(root, False)]
        while stack:
            n, ready = stack.pop()
            if n in memo:
                continue
            if not ready:
                stack.append((n, True))
                stack.extend((i, False) for i in n.inputs if i not in memo)
                continue
            out = self._normal(n)
            memo[n] = out
            memo.setdefault(out, out)  # normal nodes are their own normal form
        return memo[root]

    def of_graph(self, outputs: Sequence[Node]) -> None:
        """Normalise every node of the graph and record where each normal node came from."""
        for n in nodes(list(outputs)):
            self.origin.setdefault(self(n), n)

    def _normal(self, n: Node) -> Node:
        if n.op.is_leaf:
            return _rounded(n)
        inputs = tuple(self.memo[i] for i in n.inputs)
        if not n.op.is_atomic:
            return self(expand_composite(n.op, inputs, n.attrs))
        cur = n if inputs == n.inputs else Node.make(n.op, inputs, n.attrs, n.name)
        for _ in range(self.max_steps):
            for r in self.rules.candidates(cur):
                out = r.rewrite(cur)
                if out is not None:
                    break
            else:
                return _rounded(cur)
            if any(i not in self.memo for i in out.inputs) or not out.op.is_atomic:
                return self(out)  # a rule built new nodes below: normalise them too
            cur = out
        return _rounded(cur)


# ---------------------------------------------------------------------------- what recomposes
@dataclass(frozen=True)
class Recomposable:
    """One composite op in one variant: ``example`` gives its tensor arguments (None for an
    absent optional one) in the op's parameter order; ``attrs`` fixes non-float attributes;
    ``bind`` names the float attributes read from the match (eps)."""

    op: str
    example: Callable[[], tuple]
    attrs: dict = field(default_factory=dict)
    bind: tuple[str, ...] = ()


def _x2():
    return (tg.input("%x", (2, 8)),)


def _norm(*present: bool):
    def make():
        x, w, b = tg.input("%x", (2, 8)), tg.input("%weight", (8,)), tg.input("%bias", (8,))
        return tuple(t if keep else None for t, keep in zip((x, w, b), present))
    return make


def _rope():
    return (tg.input("%x", (1, 2, 3, 8)), tg.input("%cos", (3, 8)), tg.input("%sin", (3, 8)))


# larger first: a region that holds a smaller one's (gelu holds tanh) is tried first
RECOMPOSABLE: tuple[Recomposable, ...] = (
    Recomposable("layer_norm", _norm(True, True, True), bind=("eps",)),
    Recomposable("layer_norm", _norm(True, True, False), bind=("eps",)),
    Recomposable("layer_norm", _norm(True, False, False), bind=("eps",)),
    Recomposable("rms_norm", _norm(True, True), bind=("eps",)),
    Recomposable("rms_norm", _norm(True, False), bind=("eps",)),
    Recomposable("gelu", _x2, {"approximate": "tanh"}),
    Recomposable("gelu", _x2, {"approximate": "none"}),
    Recomposable("rotary_embedding", _rope),
    Recomposable("silu", _x2),
)


@dataclass(frozen=True, eq=False)
class Skeleton:
    entry: Recomposable
    params: tuple[str, ...]  # the tensor parameters present, in the op's order
    pattern: pat.Pat
    root_op: str


def _call(entry: Recomposable, tensors: Sequence[Node | None], floats: dict) -> Node:
    """The composite node ``entry.op(tensors, attrs)`` (validates shapes as the builder does)."""
    op = OPS[entry.op]
    attrs = {**op.attr_defaults, **entry.attrs, **floats}
    given = tuple(p for p, t in zip(op.params, tensors) if t is not None)
    if op.optional and given != op.params:
        attrs["args"] = given
    made = Node.make(op, tuple(t for t in tensors if t is not None), attrs)
    expand_composite(op, made.inputs, made.attrs)  # raises on shapes the definition rejects
    return made


def _skeleton(entry: Recomposable) -> Skeleton:
    """The entry's definition in the normal view, as a pattern (see the module docstring)."""
    op = OPS[entry.op]
    tensors = entry.example()
    params = tuple(p for p, t in zip(op.params, tensors) if t is not None)
    view = NormalView()
    root = view(_call(entry, tensors, {k: SENTINEL for k in entry.bind}))
    leaves = {t: p for p, t in zip(op.params, tensors) if t is not None}
    sentinel = {_rounded(tg.constant(SENTINEL, t.dtype)) for t in tensors if t is not None}
    uses: dict[Node, int] = {}
    for n in nodes(root):
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
    built: dict[Node, pat.Pat] = {}
    for k, n in enumerate(nodes(root)):
        if n in leaves:
            built[n] = pat.var(leaves[n])
        elif n in sentinel:
            built[n] = pat.var(entry.bind[0], where=_is_scalar_constant)
        elif n.op.is_leaf:  # a constant or dim the definition made: checked by verification
            built[n] = pat.var(f"_c{k}", where=_is_fixed)
        else:
            shared = uses.get(n, 0) > 1 and n.op.name not in ASSOCIATIVE_COMMUTATIVE
            built[n] = pat.OpPat(n.op.name, tuple(built[i] for i in n.inputs), {},
                                 f"_n{k}" if shared else None)
    if len(entry.bind) > 1:
        raise TensorGraphsError("recompose: one float attribute per entry is supported")
    return Skeleton(entry, params, built[root], root.op.name)


def _is_scalar_constant(n: Node) -> bool:
    return n.op.name == CONSTANT and n.attrs["value"].array.size == 1


def _is_fixed(n: Node) -> bool:
    return n.op.name in (CONSTANT, DIM)


_SKELETONS: list[Skeleton] | None = None


def skeletons() -> list[Skeleton]:
    """Every entry's skeleton, traced once."""
    global _SKELETONS
    if _SKELETONS is None:
        _SKELETONS = [_skeleton(e) for e in RECOMPOSABLE]
    return _SKELETONS


# ---------------------------------------------------------------------------- recompose
@dataclass(frozen=True)
class Found:
    """A verified region: ``root`` (a graph node) equals ``node`` times the chain's ``rest``."""

    root: Node
    node: Node
    rest: tuple[Node, ...] = ()
    chain: str = ""  # the op of the chain ``rest`` multiplies or adds into


def find(outputs, view: NormalView | None = None) -> list[Found]:
    """Every node of the graph that equals a recomposable composite of other graph nodes."""
    outs = _as_list(outputs)
    view = view or NormalView()
    view.of_graph(outs)
    by_root: dict[str, list[Skeleton]] = {}
    for s in skeletons():
        by_root.setdefault(s.root_op, []).append(s)
    found: list[Found] = []
    order = {n: k for k, n in enumerate(nodes(outs))}
    shared = frozenset(view.memo[n] for n, c in use_counts(outs).items() if c > 1)
    for n in order:
        if n.op.is_leaf:
            continue
        normal = view.memo[n]
        for s in by_root.get(normal.op.name, ()):
            hit = _verified(s, n, normal, view, order, shared)
            if hit is not None:
                found.append(hit)
                break
    return found


def _verified(s: Skeleton, root: Node, normal: Node, view: NormalView,
              order: dict[Node, int], shared: frozenset) -> Found | None:
    """The first match of ``s`` at ``root`` whose candidate is verified. Chains end at values
    the graph shares: an input that is itself a product (``x = e * c``) stays one term, and a
    region never reaches into a shared value (``r**3`` of a norm ``r`` is not a norm times
    eight more factors)."""
    stop = shared
    here = order[root]
    for m in pat.iter_matches(s.pattern, normal, partial=True, stop=stop):
        tensors = [view.origin.get(m.bindings.get(p)) for p in s.params]
        rest = tuple(view.origin.get(t) for t in m.rest)
        if any(t is None or order[t] >= here for t in (*tensors, *rest)):
            continue  # no graph node computed before the root has this value
        floats = {}
        for name in s.entry.bind:
            const = m.bindings[name]
            source = view.origin.get(const, const)
            floats[name] = float(np.asarray(source.attrs["value"].array).reshape(-1)[0])
        op = OPS[s.entry.op]
        it = iter(tensors)
        args = [next(it) if p in s.params else None for p in op.params]
        try:
            candidate = _call(s.entry, args, floats)
        except TensorGraphsError:
            continue
        if candidate.shape != root.shape and not m.rest or candidate.dtype != root.dtype:
            continue
        region = normal
        if m.rest:
            kept = list(chain_terms(normal, stop))
            for t in m.rest:
                kept.remove(t)
            region = build_chain(normal.op.name, kept)
        if _same(view(candidate), region, [m.bindings[p] for p in s.params]):
            return Found(root, candidate, rest, normal.op.name)
    return None


def _same(a: Node, b: Node, inputs: Sequence[Node]) -> bool:
    """Equal digests with ``inputs`` as placeholders: the same function of the same inputs."""
    holders = {}
    for i in inputs:
        holders.setdefault(i, len(holders))
    table = digests([a, b], placeholders=holders)
    return table[a] == table[b]


def recompose(outputs):
    """The graph with every verified hand-spelled composite replaced by its composite node
    (see the module docstring). Returns the structure it was given."""
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    hits = {f.root: f for f in find(outs)}
    if not hits:
        return outputs
    mapped: dict[Node, Node] = {}
    for n in nodes(outs):
        f = hits.get(n)
        if f is not None:
            node = f.node
            inputs = tuple(mapped[i] for i in node.inputs)
            new = node if inputs == node.inputs else Node.make(node.op, inputs, node.attrs)
            if f.rest:
                new = build_chain(f.chain, [new, *(mapped[r] for r in f.rest)])
            mapped[n] = new
            continue
        inputs = tuple(mapped[i] for i in n.inputs)
        mapped[n] = n if inputs == n.inputs else Node.make(n.op, inputs, n.attrs, n.name)
    result = [mapped[o] for o in outs]
    return result[0] if single else result

