"""Canonical form and stable digests.

A digest is a blake2b hash over op, attributes, dtype, shape and the digests of the inputs,
computed bottom-up once per node (shared subexpressions cost nothing extra). Associative-
commutative chains (add, mul, maximum) hash as the multiset of their terms — the sum of the
terms' digests modulo 2**128, an incremental multiset hash, so an n-term chain costs O(n) for
all of its nodes together — and commutative
operands are sorted by digest, so ``a+b``, ``b+a`` and ``(a+b)+c`` / ``a+(c+b)`` agree while
``a-b`` / ``b-a`` and ``a@b`` / ``b@a`` do not. Everything hashed is encoded explicitly (never
Python's ``hash()``), so digests are stable across processes and machines.

Two flavours: *named* digests identify leaves by name (``canonical_hash``); *structural*
digests see a leaf only as its kind, shape and dtype (``structural_hash``), so two transformer
blocks with differently named weights agree.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import numpy as np
import sympy

from tensor_graphs.ir.algebra import ASSOCIATIVE_COMMUTATIVE, COMMUTATIVE, chain_terms
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.graph import _as_list, nodes
from tensor_graphs.ir.node import ConstValue, Node

DIGEST_SIZE = 16
_SYMPY_CODES: dict = {}  # sympy expression -> encoding (== on sympy is exact: 2.0*x != 2*x)


def encode(value) -> bytes:
    """A stable byte encoding of an attribute value or dim (NaN payloads collapse to one NaN;
    -0.0 stays distinct from 0.0 because 1/-0.0 differs from 1/0.0)."""
    if value is None or isinstance(value, (bool, int, str)):
        return f"{type(value).__name__}:{value!r}".encode()
    if isinstance(value, float):
        return b"float:nan" if value != value else f"float:{value.hex()}".encode()
    if isinstance(value, tuple):
        return b"(" + b",".join(encode(v) for v in value) + b")"
    if isinstance(value, DType):
        return f"dtype:{value.name}".encode()
    if isinstance(value, sympy.Basic):  # srepr is slow; dims repeat on every node: memoise
        found = _SYMPY_CODES.get(value)
        if found is None:
            if len(_SYMPY_CODES) > 4096:
                _SYMPY_CODES.clear()
            found = _SYMPY_CODES[value] = f"sym:{sympy.srepr(value)}".encode()
        return found
    if isinstance(value, ConstValue):
        arr = value.array
        if arr.dtype.kind == "f" and np.isnan(arr).any():
            arr = np.where(np.isnan(arr), np.nan, arr).astype(arr.dtype)
        return (f"array:{arr.dtype.str}:{arr.shape}:".encode()
                + hashlib.blake2b(np.ascontiguousarray(arr).tobytes(), digest_size=16).digest())
    raise TypeError(f"cannot encode attribute value {value!r} of type {type(value).__name__}")


def digests(outputs, *, named: bool = True,
            placeholders: Mapping[Node, int] | None = None) -> dict[Node, bytes]:
    """The digest of every node the outputs depend on.

    ``placeholders`` maps boundary nodes to positions: each hashes as "argument i" of its shape
    and dtype, and what lies below it is not visited (region hashing for repeated blocks).
    """
    stop = placeholders or {}
    out: dict[Node, bytes] = {}
    chain_sum: dict[Node, int] = {}  # AC chains: sum of term digests mod 2**128 (a multiset hash)
    for node in nodes(_as_list(outputs), stop=stop):  # placeholders: listed, not entered
        if node in stop:
            parts = [b"arg", str(stop[node]).encode()]
        elif node.op.is_leaf:
            parts = [b"leaf", node.op.name.encode()]
            if named and node.name is not None:
                parts.append(f"name:{node.name}".encode())
            parts += [encode(v) for k, v in sorted(node.attrs.items())]
        else:
            name = node.op.name
            if name in ASSOCIATIVE_COMMUTATIVE:
                total = sum(chain_sum[c] if c in chain_sum and _joins_chain(c, node, stop)
                            else int.from_bytes(out[c], "little") for c in node.inputs)
                chain_sum[node] = total % _MODULUS
                children = [chain_sum[node].to_bytes(DIGEST_SIZE, "little")]
            elif name in COMMUTATIVE:
                children = sorted(out[c] for c in node.inputs)
            else:
                children = [out[c] for c in node.inputs]
            parts = [b"op", name.encode(),
                     *(k.encode() + b"=" + encode(v) for k, v in sorted(node.attrs.items())),
                     b"|", *children]
        parts += [b"|", encode(node.shape), encode(node.dtype)]
        out[node] = hashlib.blake2b(b"\x00".join(parts), digest_size=DIGEST_SIZE).digest()
    return out


_MODULUS = 1 << (8 * DIGEST_SIZE)


def _joins_chain(child: Node, parent: Node, stop) -> bool:
    """The rule of algebra.chain_terms: same op, same dtype, not a region boundary."""
    return child.op.name == parent.op.name and child.dtype == parent.dtype and child not in stop


def canonical_hash(outputs) -> str:
    """Hex digest of the graph with leaves identified by name."""
    return _graph_hash(outputs, named=True)


def structural_hash(outputs) -> str:
    """Hex digest of the graph with leaves abstracted to kind, shape and dtype."""
    return _graph_hash(outputs, named=False)


def _graph_hash(outputs, named: bool) -> str:
    outs = _as_list(outputs)
    table = digests(outs, named=named)
    return hashlib.blake2b(b"".join(table[o] for o in outs), digest_size=DIGEST_SIZE).hexdigest()


def canonicalize(outputs):
    """The same graph in canonical form: associative-commutative chains flattened, their terms
    ordered by named digest (duplicates kept) and rebuilt as left-deep binary trees; the two
    operands of other commutative ops sorted likewise. Returns the structure it was given."""
    single = isinstance(outputs, Node)
    outs = _as_list(outputs)
    table = digests(outs, named=True)
    interior = _interior_chain_nodes(outs)
    order = nodes(outs)
    # a chain stops at a shared chain node (a root of its own): flattening through it would
    # rebuild its sum inside every user, e.g. the residual stream once per layer (O(L**2))
    roots = {n for n in order if n.op.name in ASSOCIATIVE_COMMUTATIVE and n not in interior}
    mapped: dict[Node, Node] = {}
    for node in order:
        name = node.op.name
        if node.op.is_leaf:
            mapped[node] = node
        elif node in interior:
            continue  # flattened into the chain above it; never referenced on its own
        elif name in ASSOCIATIVE_COMMUTATIVE:
            terms = sorted(chain_terms(node, roots), key=table.__getitem__)
            acc = mapped[terms[0]]
            for t in terms[1:]:
                acc = Node.make(node.op, (acc, mapped[t]), node.attrs)
            mapped[node] = acc
        else:
            inputs = node.inputs
            if name in COMMUTATIVE:
                inputs = tuple(sorted(inputs, key=table.__getitem__))
            new = tuple(mapped[i] for i in inputs)
            mapped[node] = node if new == node.inputs else Node.make(node.op, new, node.attrs,
                                                                      node.name)
    return mapped[outs[0]] if single else [mapped[o] for o in outs]


def _interior_chain_nodes(outs: list[Node]) -> set[Node]:
    """AC nodes used only inside a longer chain of their own op: only chain roots are rebuilt,
    so canonicalising an n-term chain costs O(n), not O(n**2)."""
    users: dict[Node, list[Node]] = {}
    for n in nodes(outs):
        for i in n.inputs:
            users.setdefault(i, []).append(n)
    roots = set(outs)
    # used once, counting repeats: x + x uses x twice, so x is a root. Counting distinct users
    # instead made canonicalize non-idempotent: the chain (p+p) + (p+(p+p)) becomes
    # ((p+p) + (p+p)) + p, whose p+p then had one user and was flattened again.
    return {n for n, us in users.items()
            if n.op.name in ASSOCIATIVE_COMMUTATIVE and n not in roots
            and len(us) == 1 and _joins_chain(n, us[0], ())}  # shared: a root (no copies)


def hashes_equal(a, b, *, named: bool = True) -> bool:
    return _graph_hash(a, named) == _graph_hash(b, named)


__all__ = ["canonicalize", "canonical_hash", "structural_hash", "digests", "encode"]
