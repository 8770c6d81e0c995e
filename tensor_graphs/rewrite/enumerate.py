"""Equivalent graphs for search: rules that hold in real arithmetic but are not simplifications,
and ``equivalents``, a bounded breadth-first walk over the graphs they reach.

    for g in tg.rewrite.equivalents(y, limit=20, time_limit=0.5):
        ...  # cost g; the first one is y itself in normal form

The rule tables here (``pm_*``) are never applied by ``simplify``: each rule has a reverse, so
applying them to a fixed point would never stop, and whether a rewrite pays depends on shapes
and measured kernel times, which only the planner knows. They are ordinary rules (``pat.rule``), so
``pat.match`` / ``Rule.rewrite`` work on them too; builders decline (return None) where shapes,
ranks or broadcasting do not allow a rewrite.

Exactness. Every rule is an identity of real arithmetic, and of integer arithmetic modulo 2^n
(add/mul distributivity, reassociation and transposition wrap identically). In floating point
the results differ by rounding, as expected, and ``exp(a) * exp(b)`` can overflow or underflow
where ``exp(a + b)`` does not (and vice versa): the planner checks every candidate against the
float64 reference within its tolerance, so an equivalent is a candidate, not a promise.

Normal form and distinctness (the balanced-tree decision). Canonical digests flatten
associative-commutative chains, so a balanced ``(a+b)+(c+d)`` and the left-deep ``((a+b)+c)+d``
have the same ``canonical_hash``, and ``canonicalize`` turns the first into the second. Yet a
balanced chain is worth yielding: less depth, more parallelism. So every yielded graph is in a
*normal form* that is ``canonicalize``'s except that each chain of four or more terms has one of
two groupings: left-deep (the default, as ``canonicalize`` builds it) or balanced (halves split
recursively, as shallow as a binary tree can be), both over the canonical term order. Which one
a chain gets is read from its structure: a chain already as shallow as possible stays balanced,
any other grouping becomes left-deep; and a chain that a rewrite rebuilds (one above the
rewritten node) becomes left-deep unless the rewrite was the rebalancing itself, so balance never
appears by accident. Equivalents are told apart by ``equivalence_key``: the canonical digest with
each chain's grouping folded in. It equals ``canonical_hash`` for a graph with no balanced chain,
so the yielded graphs have distinct canonical hashes except for pairs that differ only in the
grouping of some chain. Nothing else distinguishes groupings: ``(a+b)+(c+d)`` and
``(a+c)+(b+d)`` are one equivalent (same depth, same cost), and so are all left-deep orders.

Sharing. A rewrite replaces one node through ``graph.substitute``, which rebuilds only the nodes
above it; hash-consing keeps everything else shared, and a node used twice is rewritten once
for both users. The normal form cuts chains where ``canonicalize`` does: at outputs and at
shared nodes, which stay chains of their own.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import NamedTuple

from tensor_graphs.errors import ArgumentError, TensorGraphsError
from tensor_graphs.ir import builder
from tensor_graphs.ir.algebra import ASSOCIATIVE_COMMUTATIVE, COMMUTATIVE, build_chain
from tensor_graphs.ir.graph import _as_list, nodes, substitute, use_counts
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import ADD, MUL, PERMUTE
from tensor_graphs.rewrite import pattern as pat
from tensor_graphs.rewrite.canonical import DIGEST_SIZE, digests
from tensor_graphs.rewrite.pattern import Rule, RuleTable, iter_matches, same_type

MIN_BALANCED_TERMS = 4  # with three terms every grouping has the same depth


# ---------------------------------------------------------------------------- chains
def chain(node: Node, stop: Collection[Node] = ()) -> tuple[list[Node], int]:
    """The terms of the associative-commutative chain rooted at ``node`` (left to right, as
    ``algebra.chain_terms``; a node in ``stop`` is a term, not entered) and its height: the
    number of chain nodes on the longest path from the root to a term (n - 1 for a left-deep
    chain of n terms, ceil(log2 n) when balanced)."""
    op, dtype = node.op.name, node.dtype
    terms: list[Node] = []
    height = 0
    stack = [(node, 0)]
    while stack:
        n, depth = stack.pop()
        if n is node or (n.op.name == op and n.dtype == dtype and n not in stop):
            height = max(height, depth + 1)
            stack.extend((c, depth + 1) for c in reversed(n.inputs))
        else:
            terms.append(n)
    return terms, height


def min_height(n_terms: int) -> int:
    """The height of a balanced binary tree over ``n_terms`` leaves: ceil(log2 n)."""
    return (n_terms - 1).bit_length()


def is_balanced(node: Node) -> bool:
    """An associative-commutative chain of at least four terms that is as shallow as possible."""
    if node.op.name not in ASSOCIATIVE_COMMUTATIVE:
        return False
    terms, height = chain(node)
    return len(terms) >= MIN_BALANCED_TERMS and height == min_height(len(terms))


def balanced_tree(like: Node, terms: list[Node]) -> Node:
    """``terms`` combined with ``like``'s op as a balanced tree: the first half on the left."""
    if len(terms) == 1:
        return terms[0]
    half = len(terms) // 2
    return Node.make(like.op, (balanced_tree(like, terms[:half]),
                               balanced_tree(like, terms[half:])), like.attrs)


def left_deep(like: Node, terms: list[Node]) -> Node:
    """``terms`` combined with ``like``'s op as a left-deep chain ``((t0 op t1) op t2) ...``."""
    out = terms[0]
    for t in terms[1:]:
        out = Node.make(like.op, (out, t), like.attrs)
    return out


# ---------------------------------------------------------------------------- normal form
def _units(outs: list[Node]) -> tuple[list[Node], dict[Node, tuple[list[Node], int]]]:
    """Post-order of the graph with associative-commutative chains as units, as
    ``canonicalize`` sees them: a chain root's children are its terms, and a chain stops at an
    output or a shared node (one with a user that is not the same chain), which is a root of
    its own. Returns the order (nodes inside a chain are not in it) and each root's chain."""
    users: dict[Node, list[Node]] = {}
    for n in nodes(outs):
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    outset = set(outs)
    roots = {n for n, us in users.items() if n.op.name in ASSOCIATIVE_COMMUTATIVE and (
        n in outset or any(u.op.name != n.op.name or u.dtype != n.dtype for u in us))}
    roots.update(o for o in outs if o.op.name in ASSOCIATIVE_COMMUTATIVE)
    chains: dict[Node, tuple[list[Node], int]] = {}
    order: list[Node] = []
    seen: set[Node] = set()
    stack = [(o, False) for o in reversed(outs)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        if node in roots:
            chains[node] = chain(node, roots)
            children = chains[node][0]
        else:
            children = node.inputs
        stack.extend((c, False) for c in reversed(children) if c not in seen)
    return order, chains


def _digest(*parts: bytes) -> bytes:
    return hashlib.blake2b(b"\x00".join(parts), digest_size=DIGEST_SIZE).digest()


def normal_form(outputs, keep: Iterable[Node] | None = None):
    """``(graph, key)``: the graph in normal form (``canonicalize``'s, with each chain of four or
    more terms left-deep or balanced; see the module doc) and its equivalence key (bytes).

    A chain keeps a balanced grouping when it is balanced now and, if ``keep`` is given, its root
    is in ``keep`` (the enumerator passes the nodes that existed before a rewrite plus the
    rewrite's result, so a chain rebuilt above a rewritten node becomes left-deep)."""
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    keep = None if keep is None else set(keep)
    table = digests(outs, named=True)
    order, chains = _units(outs)
    mapped: dict[Node, Node] = {}
    key: dict[Node, bytes] = {}  # equals the canonical digest unless a balanced chain is below
    for node in order:
        if node.op.is_leaf:
            mapped[node], key[node] = node, table[node]
            continue
        if node in chains:
            terms, height = chains[node]
            terms = sorted(terms, key=lambda t: (table[t], key[t]))
            balanced = (len(terms) >= MIN_BALANCED_TERMS and height == min_height(len(terms))
                        and (keep is None or node in keep))
            build = balanced_tree if balanced else left_deep
            mapped[node] = build(node, [mapped[t] for t in terms])
            children = terms
        else:
            children = node.inputs
            if node.op.name in COMMUTATIVE:
                children = tuple(sorted(children, key=lambda t: (table[t], key[t])))
            new = tuple(mapped[c] for c in children)
            mapped[node] = node if new == node.inputs else Node.make(node.op, new, node.attrs,
                                                                      node.name)
            balanced = False
        if balanced or any(key[c] is not table[c] for c in children):
            key[node] = _digest(table[node], b"B" if balanced else b"L",
                                *(key[c] for c in children))
        else:
            key[node] = table[node]
    graph_key = hashlib.blake2b(b"".join(key[o] for o in outs), digest_size=DIGEST_SIZE).digest()
    return (mapped[outs[0]] if single else [mapped[o] for o in outs]), graph_key


def equivalence_key(outputs) -> str:
    """Hex key that tells equivalents apart: ``canonical_hash`` with chain groupings folded in
    (equal to ``canonical_hash`` when no chain of four or more terms is balanced)."""
    return normal_form(outputs)[1].hex()


# ---------------------------------------------------------------------------- rule helpers
def _declines(build: Callable[..., Node | None]) -> Callable[..., Node | None]:
    """A builder that returns None (declines) where the ops it builds reject their operands
    (shapes that do not broadcast, contractions that do not line up)."""
    def wrapped(**bindings):
        try:
            return build(**bindings)
        except TensorGraphsError:
            return None
    wrapped.__name__ = wrapped.__qualname__ = build.__name__
    return wrapped


def _is_op(name: str) -> Callable[[Node], bool]:
    return lambda n: n.op.name == name


def _terms(node: Node) -> list[Node]:
    return chain(node)[0]


def _product(terms: list[Node]) -> Node:
    return build_chain(MUL, terms)


def _is_swap(perm) -> bool:
    """A permutation that swaps the last two axes and keeps the others (a matrix transpose)."""
    r = len(perm)
    return r >= 2 and tuple(perm) == tuple(range(r - 2)) + (r - 1, r - 2)


def swap_last_two(x: Node) -> Node:
    """``x`` with its last two axes swapped; a permute under it is composed, not stacked."""
    swap = tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2)
    if x.op.name == PERMUTE:
        inner = x.attrs["perm"]
        return builder.permute(x.inputs[0], tuple(inner[i] for i in swap))
    return builder.permute(x, swap)


# ---------------------------------------------------------------------------- the rules
x, y, z = pat.var("x"), pat.var("y"), pat.var("z")
mat_y = pat.var("y", where=lambda n: n.ndim >= 2)  # a matrix (or a batch of them)
mat_x = pat.var("x", where=lambda n: n.ndim >= 2)
a_sum = pat.var("s", where=_is_op(ADD))
a_product = {v: pat.var(v, where=_is_op(MUL)) for v in "pq"}


@_declines
def _distribute(x: Node, s: Node) -> Node:
    return build_chain(ADD, [builder.mul(x, t) for t in _terms(s)])


@_declines
def _factor(p: Node, q: Node) -> Node | None:
    """The largest common factor (as a multiset of terms) of two products, factored out."""
    tp, rq = _terms(p), _terms(q)
    common, rp = [], []
    for t in tp:
        if t in rq:
            rq.remove(t)
            common.append(t)
        else:
            rp.append(t)
    if not common or not rp or not rq:  # a*b + a needs a constant one: not here
        return None
    return _product([*common, builder.add(_product(rp), _product(rq))])


@_declines
def _merge_exp(x: Node, y: Node) -> Node:
    return builder.exp(builder.add(x, y))


@_declines
def _split_exp(s: Node) -> Node:
    return _product([builder.exp(t) for t in _terms(s)])


def _rebalance(chain_: Node) -> Node:
    return balanced_tree(chain_, _terms(chain_))


def _linearize(chain_: Node) -> Node:
    return left_deep(chain_, _terms(chain_))


def _long_chain(n: Node) -> bool:
    if n.op.name not in ASSOCIATIVE_COMMUTATIVE:
        return False
    terms, height = chain(n)
    return len(terms) >= MIN_BALANCED_TERMS and height > min_height(len(terms))


def _shallow_chain(n: Node) -> bool:
    if n.op.name not in ASSOCIATIVE_COMMUTATIVE:
        return False
    terms, height = chain(n)
    return len(terms) >= MIN_BALANCED_TERMS and height < len(terms) - 1


def _associative(x: Node, y: Node, z: Node) -> bool:
    """Whether ``(x @ y) @ z == x @ (y @ z)`` under numpy's rules. A 1-D left operand is a row
    whose axis is dropped from the product (a 1-D right one a column): when the middle operand
    is a batch, that product keeps the batch axes and the next matmul reads the last of them as
    a matrix axis. So the middle must be a matrix, and a plain one next to a vector."""
    return y.ndim >= 2 and (y.ndim == 2 or (x.ndim >= 2 and z.ndim >= 2))


@_declines
def _matmul_right(x: Node, y: Node, z: Node) -> Node | None:
    return builder.matmul(x, builder.matmul(y, z)) if _associative(x, y, z) else None


@_declines
def _matmul_left(x: Node, y: Node, z: Node) -> Node | None:
    return builder.matmul(builder.matmul(x, y), z) if _associative(x, y, z) else None


@_declines
def _transpose_into(x: Node, y: Node) -> Node:
    return builder.matmul(swap_last_two(y), swap_last_two(x))


@_declines
def _transpose_out(x: Node, y: Node) -> Node:
    return swap_last_two(builder.matmul(y, x))


pm_distributivity = RuleTable("distributivity", [
    # a * (b + c + ...) -> a*b + a*c + ...   (any number of terms; `a` may be a sum too)
    pat.rule(x * a_sum, _distribute, "distribute"),
    # a*b*c + a*b*d -> a*b * (c + d)   (the whole common factor of any two products in a sum)
    pat.rule(a_product["p"] + a_product["q"], _factor, "factor"),
])

pm_exp = RuleTable("exp", [
    # exp(a) * exp(b) -> exp(a + b)   (one exp fewer; may overflow differently)
    pat.rule(pat.exp(x) * pat.exp(y), _merge_exp, "merge_exp"),
    # exp(a + b + ...) -> exp(a) * exp(b) * ...
    pat.rule(pat.exp(a_sum), _split_exp, "split_exp"),
])

pm_chains = RuleTable("chains", [
    # ((a + b) + c) + d -> (a + b) + (c + d)   (add, mul, maximum; depth n-1 -> ceil(log2 n))
    pat.rule(pat.var("chain_", where=_long_chain), _rebalance, "rebalance"),
    # (a + b) + (c + d) -> ((a + b) + c) + d   (back to the canonical left-deep chain)
    pat.rule(pat.var("chain_", where=_shallow_chain), _linearize, "linearize"),
])

pm_matmul = RuleTable("matmul", [
    # (A @ B) @ C -> A @ (B @ C)   (B a matrix, and a plain one next to a 1-D A or C)
    pat.rule((x @ mat_y) @ z, _matmul_right, "matmul_assoc_right"),
    # A @ (B @ C) -> (A @ B) @ C
    pat.rule(x @ (mat_y @ z), _matmul_left, "matmul_assoc_left"),
    # (A @ B)^T -> B^T @ A^T   (T swaps the last two axes; A and B matrices, batches broadcast)
    pat.rule(pat.permute(mat_x @ mat_y, perm=_is_swap), _transpose_into, "transpose_into_matmul"),
    # B^T @ A^T -> (A @ B)^T
    pat.rule(pat.permute(x, perm=_is_swap) @ pat.permute(y, perm=_is_swap), _transpose_out,
             "transpose_out_of_matmul"),
])

pm_equivalents = pm_distributivity + pm_exp + pm_chains + pm_matmul


# ---------------------------------------------------------------------------- enumeration
def rewrites(rule: Rule, node: Node, uses: Mapping[Node, int] | None = None) -> Iterator[Node]:
    """Every distinct replacement ``rule`` offers for ``node`` (one per match, unlike
    ``Rule.rewrite``, which takes the first): same shape and dtype, never ``node`` itself."""
    found: set[Node] = set()
    for m in iter_matches(rule.pattern, node, uses):
        out = rule.build(**m.bindings)
        if out is None:
            continue
        if m.rest:
            try:
                out = build_chain(node.op.name, [out, *m.rest])
            except TensorGraphsError:
                continue
        if out is not node and out not in found and same_type(out, node):
            found.add(out)
            yield out


def _as_table(rules) -> RuleTable:
    if rules is None:
        return pm_equivalents
    if isinstance(rules, RuleTable):
        return rules
    if isinstance(rules, Rule):
        return RuleTable(rules.name or "rule", [rules])
    rules = list(rules)
    if not all(isinstance(r, Rule) for r in rules):
        raise ArgumentError("equivalents: rules must be a RuleTable or a list of pat.rule(...)")
    return RuleTable("rules", rules)


class Step(NamedTuple):
    """One rewrite: ``rule`` replaced ``node`` by ``replacement``, giving ``outputs``."""

    rule: Rule
    node: Node
    replacement: Node
    outputs: Node | list[Node]


def neighbours(outputs, rules=None) -> Iterator[Step]:
    """Every graph one rewrite away: a ``Step`` for each rule at each node (chain roots, not the
    nodes inside a chain) and each of its distinct replacements there. ``Step.outputs`` is not
    normalised; it has the structure ``outputs`` had."""
    table = _as_table(rules)
    outs = _as_list(outputs)
    uses = use_counts(outs)
    for site in _units(outs)[0]:
        if site.op.is_leaf:
            continue
        for r in table.candidates(site):
            for out in rewrites(r, site, uses):
                new = substitute(outs, {site: out})
                yield Step(r, site, out, new[0] if isinstance(outputs, Node) else new)


def equivalents(outputs, rules=None, limit: int = 20, time_limit: float = 1.0,
                max_nodes: int | None = None) -> Iterator[Node | list[Node]]:
    """Lazily yield distinct graphs equivalent to ``outputs``, breadth-first: the input itself
    in normal form first, then every graph one rewrite away, then two, ...

    - ``rules``: a RuleTable or list of rules (default ``pm_equivalents``: distributivity,
      factoring, exp merging/splitting, chain rebalancing, matmul reassociation and
      transposition);
    - ``limit``: the most graphs yielded (the input included);
    - ``time_limit``: seconds of search, counted only while the generator runs (the time the
      caller spends between two ``next`` calls, costing a graph say, is not counted); the
      input is yielded even when it is 0;
    - ``max_nodes``: graphs with more nodes are skipped, not yielded nor expanded (default: twice
      the input's node count plus 16), so distributing cannot grow graphs without bound.

    Yields the structure it was given (a node, or a list of output nodes). Distinct means
    distinct ``equivalence_key``; see the module doc for how it relates to ``canonical_hash``.
    Deterministic: the same graph and rules give the same sequence (time limits aside).
    """
    if limit < 0 or time_limit < 0:
        raise ArgumentError(f"equivalents: limit and time_limit must be >= 0, got {limit} and "
                            f"{time_limit}")
    return _search(outputs, _as_table(rules), limit, time_limit, max_nodes)


def _search(outputs, table: RuleTable, limit: int, time_limit: float,
            max_nodes: int | None) -> Iterator[Node | list[Node]]:
    if limit == 0:
        return
    single = isinstance(outputs, Node)
    start, key = normal_form(_as_list(outputs))
    if max_nodes is None:
        max_nodes = 2 * len(nodes(start)) + 16
    yield start[0] if single else start
    emitted, seen, frontier = 1, {key}, deque([start])
    spent, resumed = 0.0, time.perf_counter()
    while frontier and emitted < limit:
        graph = frontier.popleft()
        before = set(nodes(graph))
        for step in neighbours(graph, table):
            if spent + time.perf_counter() - resumed > time_limit:
                return
            # chains rebuilt above the rewritten node become left-deep; the rewrite's own
            # result keeps its grouping (that is how a rebalanced chain survives)
            candidate, k = normal_form(step.outputs, before | {step.replacement})
            if k in seen:
                continue
            seen.add(k)
            if len(nodes(candidate)) > max_nodes:
                continue
            frontier.append(candidate)
            emitted += 1
            spent += time.perf_counter() - resumed
            yield candidate[0] if single else candidate
            resumed = time.perf_counter()
            if emitted >= limit:
                return
