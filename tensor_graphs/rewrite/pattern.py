"""The pattern language: graphs with variables, matched against IR graphs; rules and tables.

    from tensor_graphs import pat
    x = pat.var("x", dtype="float")
    pm_example = pat.RuleTable("example", [
        pat.rule(x * 1, lambda x: x),              # x * 1 -> x
        pat.rule(pat.neg(pat.neg(x)), lambda x: x),  # --x -> x
    ])
    tg.rewrite.apply(graph, pm_example)

A pattern is a ``Var`` (binds any node that passes its guards; a name used twice must bind the
same node), a ``Const`` (a constant node whose every element equals a value; Python scalars in
patterns become these) or an ``OpPat`` (an op applied to sub-patterns, with optional attribute
constraints, optionally bound to a name itself). ``pat.<op>(...)`` builds an ``OpPat`` for any
registered op; ``+ - * / @ ** -x`` build add/sub/mul/div/matmul/pow/neg.

A ``Many`` (``pat.many("xs", min=1, **guards)``) is a variadic operand: as an input of an
``OpPat`` it binds the whole tuple of the node's inputs it covers, ``bindings["xs"] = (n0, n1,
...)``, every one passing the guards. ``pat.concat(pat.many("xs"))`` matches a concat of any
number of inputs; ``pat.concat(x, pat.many("rest"))`` one whose first input binds ``x`` and
whose other inputs (at least one) bind ``rest``. An ``OpPat`` has at most one ``Many`` among its
inputs, and associative-commutative ops take none (their chains are matched as multisets).

Matching is commutative-aware: operands of commutative ops are tried in both orders, and an
associative-commutative op (add, mul, maximum) matches the multiset of terms of a chain, so one
pattern covers every operand order and grouping. At the root of a match, a pattern with k terms
may match any k of a chain's n terms; the other n - k terms are returned as ``rest`` and the
rewrite keeps them (``x*y + z`` matches ``a + p*q + b`` as x=p, y=q, z=a or z=b).

The pattern objects and their builders are data of the IR (``ir/pattern.py``), so that the
builders can trace a pattern without the rewriter; this module re-exports them.
"""

from __future__ import annotations

import builtins
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from tensor_graphs.errors import ArgumentError, TensorGraphsError
from tensor_graphs.ir import dtypes
from tensor_graphs.ir.algebra import (
    ASSOCIATIVE_COMMUTATIVE,
    COMMUTATIVE,
    build_chain,
    chain_terms,
)
from tensor_graphs.ir.graph import _as_list, nodes, use_counts
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.pattern import (  # noqa: F401  (tg.pat: patterns are IR data)
    Const,
    Many,
    OpPat,
    Pat,
    Var,
    as_pat,
    check_many,
    constant_equals,
    dtype_accepts,
    many,
    op,
    var,
)
from tensor_graphs.ir.shapes import dims_equal


class RewriteError(TensorGraphsError):
    """A rule table that does not reach a fixed point within its step limit."""


def __getattr__(name: str):
    """``pat.exp(x)``, ``pat.reshape(x, shape=...)``: any registered op by name."""
    if name in OPS:
        return lambda *inputs, **attrs: op(name, *inputs, **attrs)
    raise AttributeError(name)


# ---------------------------------------------------------------------------- matching
@dataclass(frozen=True)
class Match:
    """``bindings`` maps each variable (and bound OpPat) to its node, each ``Many`` to a tuple
    of nodes."""

    bindings: dict[str, Node | tuple[Node, ...]]
    rest: tuple[Node, ...] = ()  # unmatched terms of an associative-commutative root


def match(pattern: Pat, node: Node, uses: Mapping[Node, int] | None = None,
          partial: bool = True) -> Match | None:
    """The first match of ``pattern`` rooted at ``node``, or None."""
    return next(iter_matches(pattern, node, uses, partial), None)


def iter_matches(pattern: Pat, node: Node, uses: Mapping[Node, int] | None = None,
                 partial: bool = True, flat: bool = True,
                 stop: frozenset | set = frozenset()) -> Iterator[Match]:
    """Every match rooted at ``node`` (commutative alternatives included).

    ``flat``: associative-commutative chains (add, mul, maximum) are matched as flat term
    lists, so ``x + y`` matches any two terms of ``a + b + c`` (rewrite rules want that). With
    ``flat=False`` every node is matched as built, as a commutative binary op: what kernels
    need, since a kernel computes exactly the nodes it covers. Nodes in ``stop`` never join
    a chain below the root (a flat chain ends at them, as at a region boundary)."""
    if (flat and isinstance(pattern, OpPat) and pattern.op in ASSOCIATIVE_COMMUTATIVE
            and node.op.name == pattern.op):
        if not _attrs_ok(pattern, node):
            return
        pterms = _pattern_terms(pattern)
        terms = _root_chain_terms(node) if not stop else tuple(chain_terms(node, stop))
        exact = len(pterms) == len(terms)
        if exact or partial:
            b = {} if pattern.name is None else {pattern.name: node}
            for bound, used in _match_terms(pterms, terms, b, uses, exact=exact, flat=flat,
                                            stop=stop):
                yield Match(bound, tuple(t for k, t in enumerate(terms) if k not in used))
        return
    if isinstance(pattern, Many):
        raise ArgumentError(f"pat.many('{pattern.name}') matches only as an operand of an op "
                            "pattern (pat.concat(pat.many('xs')))")
    for b in _match(pattern, node, {}, uses, flat, stop):
        yield Match(b)


_last_chain: tuple | None = None


def _root_chain_terms(node: Node) -> tuple[Node, ...]:
    """chain_terms(node), remembered for the last node asked: a table tries several rules on
    one node in a row, and a long chain (a residual stream) costs O(length) to flatten."""
    global _last_chain
    last = _last_chain
    if last is not None and last[0] is node:
        return last[1]
    terms = tuple(chain_terms(node))
    _last_chain = (node, terms)
    return terms


def _attrs_ok(p: OpPat, node: Node) -> bool:
    for key, want in p.attrs.items():
        if key not in node.attrs:
            return False
        got = node.attrs[key]
        if key == "axis" and isinstance(want, int) and not isinstance(want, bool) and want < 0 \
                and node.inputs:
            want = want % builtins.max(node.inputs[0].ndim, 1)  # stored non-negative on nodes
        if callable(want) and not isinstance(want, dtypes.DType):
            if not want(got):
                return False
        elif got != want:
            return False
    return True


def _pattern_terms(p: OpPat) -> list[Pat]:
    """The terms of an associative-commutative pattern, most specific first (constants and
    ops, then guarded variables, then bare variables): matching tries a chain's terms for each
    pattern term in turn, so putting the selective ones first keeps a miss at O(terms)."""
    found = _terms_cache.get(p)
    if found is not None:
        return found
    terms, stack = [], [p]
    while stack:
        q = stack.pop()
        if isinstance(q, OpPat) and q.op == p.op and q.name is None and not q.attrs \
                or q is p:
            stack.extend(reversed(q.inputs))
        else:
            terms.append(q)
    terms.sort(key=_specificity)
    _terms_cache[p] = terms
    return terms


def _specificity(p: Pat) -> int:
    if not isinstance(p, Var):
        return 0
    guarded = (p.dtype, p.rank, p.shape, p.const, p.where) != (None,) * 5 or p.single_use
    return 1 if guarded else 2


_terms_cache: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _match(p: Pat, n: Node, b: dict, uses, flat: bool = True, stop=frozenset()
           ) -> Iterator[dict]:
    if isinstance(p, Var):
        if p.name in b:
            if b[p.name] is n and p.accepts(n, uses):  # each occurrence's guards hold
                yield b
        elif p.accepts(n, uses):
            yield {**b, p.name: n}
        return
    if isinstance(p, Const):
        if constant_equals(n, p.value):
            yield b
        return
    if isinstance(p, Many):
        raise ArgumentError(f"pat.many('{p.name}') matches only as an operand of a "
                            "non-associative op pattern")
    if n.op.name != p.op or not _attrs_ok(p, n):
        return
    if p.name is not None:
        if p.name in b:  # a shared sub-pattern, matched in full where it was bound
            if b[p.name] is n:
                yield b
            return
        b = {**b, p.name: n}
    if flat and p.op in ASSOCIATIVE_COMMUTATIVE:
        for bound, _ in _match_terms(_pattern_terms(p), chain_terms(n, stop), b, uses,
                                     exact=True, flat=flat, stop=stop):
            yield bound
        return
    star = next((i for i, q in enumerate(p.inputs) if isinstance(q, Many)), None)
    if star is None and len(p.inputs) != len(n.inputs) \
            or star is not None and len(p.inputs) - 1 > len(n.inputs):
        return
    orders = [n.inputs]
    if p.op in COMMUTATIVE and len(n.inputs) == 2 and n.inputs[0] is not n.inputs[1]:
        orders.append(n.inputs[::-1])
    for inputs in orders:
        if star is None:
            yield from _match_seq(p.inputs, inputs, b, uses, flat, stop)
            continue
        tail = len(p.inputs) - star - 1  # fixed operands after the Many
        covered = tuple(inputs[star:len(inputs) - tail])
        for b1 in _match_many(p.inputs[star], covered, b, uses):
            yield from _match_seq(p.inputs[:star] + p.inputs[star + 1:],
                                  inputs[:star] + inputs[len(inputs) - tail:], b1, uses, flat,
                                  stop)


def _match_many(p: Many, covered: tuple[Node, ...], b: dict, uses) -> Iterator[dict]:
    if not p.accepts(covered, uses):
        return
    if p.name in b:  # a repeated Many: the same nodes in the same order
        bound = b[p.name]
        if isinstance(bound, tuple) and len(bound) == len(covered) and builtins.all(
                x is y for x, y in zip(bound, covered)):
            yield b
        return
    yield {**b, p.name: covered}


def _match_seq(pats: Sequence[Pat], nodes_: Sequence[Node], b: dict, uses,
               flat: bool = True, stop=frozenset()) -> Iterator[dict]:
    if not pats:
        yield b
        return
    for b1 in _match(pats[0], nodes_[0], b, uses, flat, stop):
        yield from _match_seq(pats[1:], nodes_[1:], b1, uses, flat, stop)


def _match_terms(pterms: list[Pat], terms: list[Node], b: dict, uses, exact: bool,
                 flat: bool = True, stop=frozenset()) -> Iterator[tuple[dict, frozenset[int]]]:
    """Injective assignments of pattern terms to chain terms (bijective when ``exact``)."""
    if exact and len(pterms) != len(terms) or len(pterms) > len(terms):
        return
    dtype = terms[0].dtype  # a chain's terms share its dtype: a dtype guard decides for all
    if any(isinstance(p, Var) and p.dtype is not None and not dtype_accepts(p.dtype, dtype)
           for p in pterms):
        return
    seen_results: set = set()

    def go(k: int, b: dict, used: frozenset[int]):
        if k == len(pterms):
            yield b, used
            return
        tried: set[int] = set()
        for j, t in enumerate(terms):
            if j in used or id(t) in tried:  # equal terms are interchangeable
                continue
            tried.add(id(t))
            for b1 in _match(pterms[k], t, b, uses, flat, stop):
                yield from go(k + 1, b1, used | {j})

    for bound, used in go(0, b, frozenset()):
        key = (tuple(sorted((k, id(v)) for k, v in bound.items())), used)
        if key not in seen_results:
            seen_results.add(key)
            yield bound, used


# ---------------------------------------------------------------------------- rules and tables
@dataclass(frozen=True, eq=False)
class Rule:
    """A pattern and a builder of its replacement (given the bindings; None declines)."""

    pattern: Pat
    build: Callable[..., Node | None]
    name: str = ""

    def rewrite(self, node: Node, uses: Mapping[Node, int] | None = None) -> Node | None:
        """The replacement for ``node`` if the rule applies there and keeps shape and dtype."""
        for m in iter_matches(self.pattern, node, uses):
            out = self.build(**m.bindings)
            if out is None:
                continue
            if m.rest:
                out = build_chain(node.op.name, [out, *m.rest])
            if out is not node and same_type(out, node):
                return out
        return None


def rule(pattern: Pat, build: Callable[..., Node | None], name: str = "") -> Rule:
    return Rule(pattern, build, name)


def same_type(a: Node, b: Node) -> bool:
    """Same dtype and shape: a replacement must be a drop-in for the node it replaces."""
    return a.dtype == b.dtype and len(a.shape) == len(b.shape) and all(
        x == y if isinstance(x, int) and isinstance(y, int) else dims_equal(x, y)
        for x, y in zip(a.shape, b.shape))


class RuleTable:
    """A named, ordered list of rules, indexed by the op at each pattern's root."""

    def __init__(self, name: str, rules: Sequence[Rule]):
        self.name = name
        self.rules = tuple(rules)
        self._by_op: dict[str, list[Rule]] = {}
        self._any: list[Rule] = []
        for r in self.rules:
            root = r.pattern
            if isinstance(root, OpPat):
                self._by_op.setdefault(root.op, []).append(r)
            else:
                self._any.append(r)

    def candidates(self, node: Node) -> list[Rule]:
        return self._by_op.get(node.op.name, []) + self._any

    def __add__(self, other: RuleTable) -> RuleTable:
        return RuleTable(f"{self.name}+{other.name}", self.rules + other.rules)

    def __len__(self) -> int:
        return len(self.rules)

    def __iter__(self):
        return iter(self.rules)

    def __repr__(self) -> str:
        return f"RuleTable({self.name!r}, {len(self.rules)} rules)"


def apply(outputs, table: RuleTable, max_steps: int = 10_000):
    """Apply ``table`` everywhere to a fixed point: bottom-up passes, each node rewritten until
    no rule fires there, until a pass changes nothing. Raises RewriteError after ``max_steps``
    rewrites (a table that keeps rewriting is a bug). Returns the structure it was given."""
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    steps = 0
    while True:
        uses = use_counts(outs)
        mapped: dict[Node, Node] = {}
        changed = False
        for n in nodes(outs):
            new_inputs = tuple(mapped[i] for i in n.inputs)
            cur = n if new_inputs == n.inputs else Node.make(n.op, new_inputs, n.attrs, n.name)
            uses.setdefault(cur, uses.get(n, 0))
            while True:
                for r in table.candidates(cur):
                    out = r.rewrite(cur, uses)
                    if out is not None:
                        break
                else:
                    break
                steps += 1
                if steps > max_steps:
                    raise RewriteError(f"rule table '{table.name}' did not reach a fixed point "
                                       f"in {max_steps} steps (last rule: {r.name or r.pattern})")
                uses.setdefault(out, uses.get(cur, 0))
                cur, changed = out, True
            mapped[n] = cur
        outs = [mapped[o] for o in outs]
        if not changed:
            return outs[0] if single else outs


__all__ = ["Pat", "Var", "Many", "Const", "OpPat", "Match", "Rule", "RuleTable", "RewriteError",
           "var", "many", "op", "as_pat", "match", "iter_matches", "rule", "apply", "same_type",
           "constant_equals"]
