"""Repeated-block discovery: the regions of a graph that compute the same function (the layers
of a transformer), found without knowing any block type, so expensive work (planning, kernel
search) can be done once per distinct block.

The algorithm (every pass iterative; linear in the graph except step 4, which works on the
much shorter string of segments):

1. **Data path.** The primary activation source is the input (or state) leaf with the most
   dependent nodes. The data path D is the set of non-leaf nodes that depend on it and, when
   the graph has weights at all, on some weight too. Everything else is a *boundary value* that
   blocks consume but that is not part of the chain of blocks: weights, constants, position
   embeddings, a causal mask built from iota, and also values computed from the raw input alone
   (a padding mask built from the ids), which would otherwise tie every layer to the start.
2. **Cuts.** In the topological order of D, a node v is a cut when no edge of D jumps over it
   (no u -> w with pos(u) < pos(v) < pos(w)): what was computed before v reaches the rest of D
   only through v. One pass over a difference array finds all cuts. Consecutive cuts split D
   into segments, each ending at its cut. In a residual network every residual add is a cut,
   so a pre-norm transformer layer is two segments (attention, MLP). The source counts as the
   first node of D (its direct uses tie the first block together as a residual add ties the
   others), and an associative-commutative chain counts as one node, its root: ``(x + b) + y``
   and ``(x + y) + b`` cut alike, whatever operand order canonicalisation chose.
3. **Regions and digests.** A segment's region is its D nodes plus the non-D nodes used only by
   it (its weights, their transposes, per-layer constants); values used by several segments
   (hash-consed scalar constants, the causal mask, the source) stay outside. A region is
   hashed with ``canonical.digests(named=False, placeholders=...)``: its boundary inputs
   (outside values) and its named leaves (weights, states) are positional placeholders;
   constants hash by value (a kernel may depend on them, so blocks with different constants
   are different blocks). Positions follow a canonical depth-first walk from the region's
   outputs, sorted by an *anonymous* digest (every placeholder alike). Commutative operands
   and the terms of associative-commutative chains are visited in anonymous-digest order; a
   chain is flattened only through nodes used by it alone, so its terms are interchangeable;
   equal-looking terms (two weights of one shape) are ordered by a top-down *context* digest
   of how the region uses them. So positions depend neither on names nor on the operand order
   and tree shape canonicalisation happened to choose.
4. **Units.** Segments become a string of digest ids. For each period p, the maximal spans
   where segment k equals segment k + p are periodic; a span of at least 2p segments holds
   repeated units of p consecutive segments (the offset inside the span that covers the most
   nodes wins). Candidates are taken greedily by covered nodes, ties going to the smaller p
   (more instances) and then to the earlier span; a candidate that overlaps a taken one is
   trimmed to its free parts and queued again. So a transformer whose residual adds split
   attention from MLP still yields one group of whole layers (unit = attention + MLP), and a
   model with two kinds of repeated block yields two groups. Segments left over that repeat
   apart (not consecutively) are grouped as single-segment units.
5. **Check.** Each chosen unit becomes one region (ownership of non-D nodes is recomputed, so a
   value shared by the attention and MLP of one layer only joins that layer), is hashed as in
   step 3, and instances are grouped by this digest: a group's instances always have equal
   digests, equal node counts and positionally corresponding inputs, leaves and outputs.
"""

from __future__ import annotations

import hashlib
import heapq
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tensor_graphs.ir.algebra import ASSOCIATIVE_COMMUTATIVE, COMMUTATIVE, chain_terms
from tensor_graphs.ir.graph import FED_LEAVES, _as_list, nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import INPUT, STATE, WEIGHT
from tensor_graphs.rewrite.canonical import DIGEST_SIZE, digests

SOURCE_LEAVES = (INPUT, STATE)  # where the data path starts (weights when a graph has neither)
_SHARED = -1


@dataclass(frozen=True, eq=False)
class BlockInstance:
    """One occurrence of a repeated block.

    - ``nodes``: the region (its data-path nodes, exclusive weights and constants);
    - ``inputs``: values from outside the region that it reads, in positional order;
    - ``leaves``: its exclusive named leaves (weights, states), in positional order;
    - ``outputs``: region nodes used outside it or returned by the graph, in canonical order.

    Placeholder ``i`` of the block's function is ``(inputs + leaves)[i]``; the instances of a
    group correspond position by position.
    """

    nodes: frozenset[Node]
    inputs: tuple[Node, ...]
    leaves: tuple[Node, ...]
    outputs: tuple[Node, ...]
    digest: str

    @property
    def placeholders(self) -> dict[Node, int]:
        return {n: i for i, n in enumerate(self.inputs + self.leaves)}

    def named_digest(self) -> str:
        """The region's digest with its inputs as placeholders but leaves by name: differs
        between instances that use different weights."""
        positions = {n: i for i, n in enumerate(self.inputs)}
        table = digests(self.outputs, named=True, placeholders=positions)
        return _combine([b"named", *(table[o] for o in self.outputs)])

    def __repr__(self) -> str:
        return (f"<BlockInstance {len(self.nodes)} nodes, {len(self.inputs)} inputs, "
                f"{len(self.leaves)} leaves, {len(self.outputs)} outputs>")


@dataclass(frozen=True, eq=False)
class BlockGroup:
    """Identical regions: ``instances`` (in graph order), their structural ``digest`` and the
    node count ``size`` of each instance."""

    instances: tuple[BlockInstance, ...]
    digest: str
    size: int

    @property
    def covered(self) -> int:
        """Nodes covered by all instances together."""
        return self.size * len(self.instances)

    def __repr__(self) -> str:
        return (f"<BlockGroup {len(self.instances)} x {self.size} nodes, "
                f"digest {self.digest[:12]}>")


def find_repeated_blocks(outputs, *, min_ops: int = 2) -> list[BlockGroup]:
    """Groups of identical regions of the graph, largest coverage first (see the module doc).

    ``min_ops``: instances with fewer non-leaf nodes are not reported (planning a single op
    once per block saves nothing).
    """
    outs = _as_list(outputs)
    order = nodes(outs)
    out_set = set(outs)
    users: dict[Node, list[Node]] = {n: [] for n in order}
    for n in order:
        for i in n.inputs:
            users[i].append(n)

    source, data = _data_path(order)
    if not data:
        return []
    segments = _segments(source, data, users, out_set)
    seg_of = {n: k for k, seg in enumerate(segments) for n in seg}

    # 3. one region and digest per segment
    unowned = out_set | {source}  # the source feeds the first block but is no part of it
    regions = _regions(order, seg_of, users, unowned)
    ids: list[int] = []
    id_of: dict[str, int] = {}
    sizes, ops = [], []
    for k in range(len(segments)):
        region = regions[k]
        inst = _describe(region, users, out_set)
        ids.append(id_of.setdefault(inst.digest, len(id_of)))
        sizes.append(len(region))
        ops.append(sum(1 for n in region if not n.op.is_leaf))

    # 4. repeated units of consecutive segments
    units = _choose_units(ids, sizes, ops, min_ops)
    if not units:
        return []

    # 5. one region per unit, hashed again; group by digest
    key = {}
    unit_of_seg = {k: u for u, unit in enumerate(units) for k in unit}
    for n, k in seg_of.items():
        key[n] = unit_of_seg.get(k, len(units) + k)
    regions = _regions(order, key, users, unowned)
    pos = {n: i for i, n in enumerate(order)}
    by_digest: dict[str, list[BlockInstance]] = {}
    for u in range(len(units)):
        inst = _describe(regions[u], users, out_set)
        by_digest.setdefault(inst.digest, []).append(inst)

    def last(inst: BlockInstance) -> int:  # leaves may come early in graph order; outputs not
        return max(pos[o] for o in inst.outputs)

    groups = []
    for digest, insts in by_digest.items():
        if len(insts) < 2:
            continue
        insts.sort(key=last)
        groups.append(BlockGroup(tuple(insts), digest, len(insts[0].nodes)))
    groups.sort(key=lambda g: (-g.covered, last(g.instances[0])))
    return groups


# ---------------------------------------------------------------------------- 1. data path
def _data_path(order: list[Node]) -> tuple[Node | None, list[Node]]:
    """The primary source and the non-leaf nodes that depend on it (and on a weight, if the
    graph has any), in topological order."""
    sources = [n for n in order if n.op.name in SOURCE_LEAVES]
    if not sources:
        sources = [n for n in order if n.op.name == WEIGHT]
    if not sources:
        return None, []
    bit = {s: 1 << k for k, s in enumerate(sources)}
    mask: dict[Node, int] = {}
    weighted: dict[Node, bool] = {}
    counts = [0] * len(sources)
    for n in order:
        if n.op.is_leaf:
            mask[n] = bit.get(n, 0)
            weighted[n] = n.op.name == WEIGHT
            continue
        m, w = 0, False
        for i in n.inputs:
            m |= mask[i]
            w = w or weighted[i]
        mask[n], weighted[n] = m, w
        while m:
            low = m & -m
            counts[low.bit_length() - 1] += 1
            m ^= low
    best = max(range(len(sources)), key=lambda k: (counts[k], -k))
    need_weight = any(n.op.name == WEIGHT for n in order)
    return sources[best], [n for n in order if not n.op.is_leaf and mask[n] & (1 << best)
                           and (weighted[n] or not need_weight)]


# ---------------------------------------------------------------------------- 2. cuts
def _segments(source: Node, data: list[Node], users, out_set) -> list[list[Node]]:
    """Split the data path at its cut nodes (no data edge jumps over them).

    The source counts as the path's first node, so its direct uses tie the first block
    together as a residual add ties the others. An associative-commutative chain counts as one
    node (its root): ``(x + b) + y`` and ``(x + y) + b`` then cut alike, whatever operand order
    canonicalisation chose.
    """
    rep: dict[Node, Node] = {source: source}
    for n in reversed(data):
        rep[n] = n
        if n.op.name in ASSOCIATIVE_COMMUTATIVE and n not in out_set:
            us = set(users[n])
            if len(us) == 1:
                u = us.pop()
                if u.op.name == n.op.name and u.dtype == n.dtype:
                    rep[n] = rep[u]
    heads = [source] + [n for n in data if rep[n] is n]
    index = {n: j for j, n in enumerate(heads)}
    cover = [0] * (len(heads) + 1)
    for w in data:
        j = index[rep[w]]
        for u in w.inputs:
            if u in rep:
                i = index[rep[u]]
                if j - i > 1:
                    cover[i + 1] += 1
                    cover[j] -= 1
    seg_of_head: dict[Node, int] = {}
    open_edges, k = 0, 0
    for j, n in enumerate(heads):
        open_edges += cover[j]
        seg_of_head[n] = k
        if open_edges == 0:
            k += 1
    segments: list[list[Node]] = [[] for _ in range(k)]
    for n in data:  # the last head is always a cut, so every head has a closed segment
        segments[seg_of_head[rep[n]]].append(n)
    return [seg for seg in segments if seg]  # the source alone leaves an empty first one


# ---------------------------------------------------------------------------- 3. regions
def _regions(order: list[Node], key: Mapping[Node, int], users,
             unowned) -> dict[int, list[Node]]:
    """Region id -> its nodes in topological order: data-path nodes by ``key``, every other
    node joins the region of all its users when they agree (``unowned`` nodes never join)."""
    owner: dict[Node, int] = {}
    for n in reversed(order):
        if n in key:
            continue
        if n in unowned:
            owner[n] = _SHARED
            continue
        o = None
        for u in users[n]:
            k = key[u] if u in key else owner[u]
            if k == _SHARED or (o is not None and k != o):
                o = _SHARED
                break
            o = k
        owner[n] = _SHARED if o is None else o
    regions: dict[int, list[Node]] = {}
    for n in order:
        k = key[n] if n in key else owner[n]
        if k != _SHARED:
            regions.setdefault(k, []).append(n)
    return regions


def _describe(region: list[Node], users, out_set) -> BlockInstance:
    """Boundary inputs, leaves, outputs and positional digest of one region (step 3)."""
    inside = set(region)
    boundary: dict[Node, None] = {}
    named: list[Node] = []
    for n in region:
        if n.op.is_leaf:
            if n.op.name in FED_LEAVES:  # placeholders; constant and dim leaves are literals
                named.append(n)
            continue
        for i in n.inputs:
            if i not in inside and (not i.op.is_leaf or i.op.name in FED_LEAVES):
                boundary[i] = None
    outputs = [n for n in region if n in out_set or any(u not in inside for u in users[n])]
    stop = {**boundary, **dict.fromkeys(named)}
    anon = digests(outputs, named=False, placeholders=dict.fromkeys(stop, 0))
    outputs.sort(key=anon.__getitem__)  # stable: graph order breaks ties

    # canonical depth-first walk: placeholders numbered by first visit. A chain is flattened
    # only through nodes used by it alone, so its terms are truly interchangeable: a node used
    # elsewhere too (the residual stream) is a term, and its own chain is walked separately.
    ends = {**stop, **{n: None for n in region if n.op.name in ASSOCIATIVE_COMMUTATIVE
                       and (n in out_set or len(set(users[n])) > 1)}}
    root: dict[Node, Node] = {}  # a node flattened into a chain -> the chain's root
    for n in reversed(region):
        if n.op.name in ASSOCIATIVE_COMMUTATIVE and n not in ends:
            u = users[n][0]
            if u.op.name == n.op.name and u.dtype == n.dtype:
                root[n] = root.get(u, u)
    context: dict[Node, bytes] = {}

    def ordered(children: list[Node]) -> list[Node]:
        """Children by anonymous digest; equal ones (two placeholders of one shape) by how the
        region uses them, so e.g. add(w1, w2) vs add(w2, w1) number w1 and w2 alike."""
        children = sorted(children, key=anon.__getitem__)
        if any(anon[a] == anon[b] for a, b in zip(children, children[1:])):
            if not context:
                context.update(_contexts(anon, inside, users, outputs, root))
            children.sort(key=lambda c: (anon[c], context[c]))
        return children

    found_inputs: dict[Node, None] = {}
    found_leaves: dict[Node, None] = {}
    seen: set[Node] = set()
    stack = list(reversed(outputs))
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if n in stop:
            (found_inputs if n in boundary else found_leaves)[n] = None
            continue
        if n.op.is_leaf or n not in inside:
            continue
        name = n.op.name
        if name in ASSOCIATIVE_COMMUTATIVE:
            children = ordered(chain_terms(n, ends))
        elif name in COMMUTATIVE:
            children = ordered(list(n.inputs))
        else:
            children = list(n.inputs)
        stack.extend(reversed(children))
    inputs = tuple(found_inputs) + tuple(b for b in boundary if b not in found_inputs)
    leaves = tuple(found_leaves) + tuple(x for x in named if x not in found_leaves)
    positions = {n: i for i, n in enumerate(inputs + leaves)}
    table = digests(outputs, named=False, placeholders=positions)
    head = f"block:{len(region)}:{len(inputs)}:{len(leaves)}".encode()
    digest = _combine([head, *(table[o] for o in outputs)])
    return BlockInstance(frozenset(region), inputs, leaves, tuple(outputs), digest)


def _contexts(anon: dict[Node, bytes], inside: set[Node], users, outputs: list[Node],
              root: Mapping[Node, Node]) -> dict[Node, bytes]:
    """A top-down digest of how the region uses each node: its users' anonymous digests, the
    operand slot it fills (any slot of a commutative op) and their own contexts. A term of a
    flattened chain is used by the chain's root, whatever the tree shape inside the chain."""
    out_set = set(outputs)
    context: dict[Node, bytes] = {}
    for n in reversed(anon):  # anon is in topological order: users come first here
        parts = []
        for u in users[n]:
            if u in root:
                u = root[u]
            if u in inside and u in context:
                slot = b"c" if u.op.name in COMMUTATIVE else str(u.inputs.index(n)).encode()
                parts.append(anon[u] + slot + context[u])
        parts.sort()
        if n in out_set:
            parts.append(b"output")
        context[n] = hashlib.blake2b(b"\x00".join(parts), digest_size=DIGEST_SIZE).digest()
    return context


def _combine(parts: list[bytes]) -> str:
    return hashlib.blake2b(b"\x00".join(parts), digest_size=DIGEST_SIZE).hexdigest()


# ---------------------------------------------------------------------------- 4. units
def _choose_units(ids: list[int], sizes: list[int], ops: list[int],
                  min_ops: int) -> list[list[int]]:
    """Runs of repeated units of consecutive segments, then leftover repeats (step 4).

    Returns the units as lists of segment indices.
    """
    m = len(ids)
    arr = np.asarray(ids, dtype=np.int64)
    size_sum = np.concatenate(([0], np.cumsum(sizes))).tolist()
    ops_sum = np.concatenate(([0], np.cumsum(ops))).tolist()

    def best(s: int, e: int, p: int):
        """The offset in span [s, e) whose units of p segments cover the most nodes."""
        count = (e - s) // p
        top = None
        for o in range(s, s + (e - s) % p + 1):
            if ops_sum[o + p] - ops_sum[o] < min_ops:
                continue
            covered = count * (size_sum[o + p] - size_sum[o])
            if top is None or covered > top[0]:
                top = (covered, o, count)
        return top

    heap: list[tuple] = []

    def push(s: int, e: int, p: int) -> None:
        if e - s >= 2 * p:
            found = best(s, e, p)
            if found is not None:
                covered, o, count = found
                heapq.heappush(heap, (-covered, p, o, s, e, count))

    for p in range(1, m // 2 + 1):
        eq = np.concatenate(([0], (arr[:-p] == arr[p:]).astype(np.int8), [0]))
        edges = np.diff(eq)
        for a, b in zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()):
            push(a, b + p, p)

    taken = np.zeros(m, dtype=bool)
    units: list[list[int]] = []
    while heap:
        _, p, o, s, e, count = heapq.heappop(heap)
        if taken[s:e].any():
            free = np.concatenate(([0], (~taken[s:e]).astype(np.int8), [0]))
            edges = np.diff(free)
            for a, b in zip(np.flatnonzero(edges == 1).tolist(),
                            np.flatnonzero(edges == -1).tolist()):
                push(s + a, s + b, p)
            continue
        taken[o:o + count * p] = True
        units.extend(list(range(o + j * p, o + (j + 1) * p)) for j in range(count))

    leftover: dict[int, list[int]] = {}
    for k in np.flatnonzero(~taken).tolist():
        if ops[k] >= min_ops:
            leftover.setdefault(ids[k], []).append(k)
    units.extend([k] for same in leftover.values() if len(same) > 1 for k in same)
    return units


__all__ = ["BlockGroup", "BlockInstance", "find_repeated_blocks"]
