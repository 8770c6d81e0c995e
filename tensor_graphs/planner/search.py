"""Path search: every way to compute a graph, the cheapest one within tolerance, and counts.

For every slot (a node's value on a device kind, ``plan.Slot``) the planner lists its options
(``plan.Option``): each kernel whose pattern matches a subgraph rooted at the node (fused
kernels included; a fused kernel's inner nodes must have no other users), the decomposition of
a composite (planned like any graph: its nodes get options too), equivalent forms of the node
under ``PLANNING_RULES`` (matrix-product reassociation and transposition, a bounded number of
rewrites deep), a copy from another device, or the leaf itself.

``best`` is dynamic programming over slots: an option's cost is its step's estimate plus the
steps of the slots only it needs, each counted once; values the graph shares are costed where
they are made (``total``). Options whose error exceeds the tolerance are dropped (see
``plan`` for how errors combine). Across devices: fed leaves live where ``HOMES`` says, a
boundary's copy to another device is paid by its readers there, a shared value is made where
that is cheapest and copied elsewhere unless making it again costs less (``_makes``), and a
static step (once per binding) is weighed at a share of its time (``AMORTIZED_CALLS``).
``extract`` turns the chosen options into a ``Plan`` by a depth-first walk from the outputs;
the same walk replays a lock file's decisions. ``paths`` enumerates every consistent choice
lazily, cheapest-first at each decision; ``count`` counts them without enumerating (dynamic
programming over the set of values still needed, consumers before producers).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator, Mapping, Sequence

from tensor_graphs.db.cost import FREE, CostModel, Estimate, call_features
from tensor_graphs.db.features import features, nbytes
from tensor_graphs.db.store import signature_text
from tensor_graphs.errors import NoPathError, PlanFileError
from tensor_graphs.ir import builder
from tensor_graphs.ir.algebra import ELEMENTWISE, STRIDED_VIEWS
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.graph import is_static, nodes, root_state, use_counts
from tensor_graphs.ir.node import ConstValue, Node, expand_composite
from tensor_graphs.ir.ops.names import (
    CAST,
    CONSTANT,
    DIM,
    EXPAND,
    INPUT,
    PERMUTE,
    RESHAPE,
    SLICE,
    STATE,
    STATE_UPDATE,
    WEIGHT,
)
from tensor_graphs.ir.shapes import format_shape
from tensor_graphs.kernels import copy as copies
from tensor_graphs.kernels import generated, registry
from tensor_graphs.planner.plan import (
    COPY,
    DECOMPOSE,
    GENERATED,
    KERNEL,
    LEAF,
    REWRITE,
    Option,
    Plan,
    Slot,
    Step,
    launches,
)
from tensor_graphs.progress import Progress
from tensor_graphs.rewrite.enumerate import pm_matmul, rewrites

BLOCK = "block"
# a slot whose value a generated kernel stores beside its root (``Candidate.also``: the residual
# stream its norm reads): filled by that kernel's step, no step of its own; its decision label
# is ``also:<kernel name>``
ALSO = "also"
PLANNING_RULES = pm_matmul  # cost-changing rewrites worth planning (a 10x cheaper matmul chain)
MAX_REWRITE_DEPTH = 3  # rewrites of rewrites of ... an original node
LOCAL = "local"  # a movable slot filled by the value made on the same device
LOW_PRECISION_ROUNDING = {"float16": 2.0 ** -10, "bfloat16": 2.0 ** -7}
NO_ROUNDING = 1e-12  # a kernel declaring at most this is bit-exact (movement, comparisons)
# estimates answered from a kernel's own rows (db/cost.py): its recorded accuracy is asked
MEASURED_SOURCES = frozenset({"measured", "interpolated"})
# Where each kind of fed leaf lives: the one rule for placing leaves (``Planner.home``), which the
# runtime follows (runtime/program.py keeps weights and states on the target's device). A value
# read elsewhere reaches there through a copy step; a kept state's new version is delivered
# where the state lives (``output_slots``), so a KV cache stays put between calls.
HOMES = {
    INPUT: "host",  # the caller's arrays (a GPU tensor fed as is skips the copy at run time)
    WEIGHT: "weights",  # bound once per binding, onto the target device
    STATE: "weights",  # kept with the weights, even when only host steps read it: moving it
    # to its readers would need the runtime to keep states per device (not done)
}
# A static step (``ir.graph.is_static``: a weight's copy to another device, a transposed
# weight) runs once per binding, in the prelude, not per call: the planner weighs it at its
# time amortized over this many calls (a binding serves many calls; the small share still
# picks the fastest of otherwise free options), and the plan's per-call time leaves it out.
AMORTIZED_CALLS = 1000
# The native loop (runtime/native.py) runs a program whose steps are all C as one foreign call:
# a C step costs it ~0.003-0.04 us besides the kernel, where the Python loop spends ~3 us per
# step (the calibrated "dispatch"). One numpy or torch step keeps the whole program in Python,
# so C steps are priced at the native loop's cost and the others at the Python loop's: a plan
# that can run natively wins by what it saves (GPT-2 decode: 3.5-4.5 ms a token, 238 steps).
# Only a host plan runs natively: a program with GPU steps runs the Python loop, so there a C
# step pays the Python dispatch too (priced at 0.05 us, host C steps took GPT-2's layers at
# width 256 off the GPU, between copies).
NATIVE_BACKENDS = frozenset({"c"})
NATIVE_DISPATCH = 5e-8
INF = math.inf
PROGRESS_DELAY = 2.0  # seconds of planning before its bar appears (most plans end sooner)


def _kept_state(node: Node) -> bool:
    """A new version of a ``tg.state`` (a state_update chain on a state leaf)."""
    return node.op.name == STATE_UPDATE and root_state(node).op.name == STATE


def json_attr(value):
    """An attribute value as JSON for a measurement signature."""
    if isinstance(value, DType):
        return value.name
    if isinstance(value, ConstValue):
        return f"const:{hash(value) & 0xFFFFFFFF:08x}"
    if isinstance(value, tuple):
        return [json_attr(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def signature(arguments: Sequence[Node], attrs: Mapping) -> str:
    """The measurement signature of a kernel call: its inputs' shapes and dtypes and the root
    node's attributes (the database key next to the kernel's name)."""
    return signature_text([(a.shape, a.dtype.name) for a in arguments],
                          {k: json_attr(v) for k, v in attrs.items()})


def step_error(kernel, node: Node) -> float:
    """The kernel's tolerance, and a half-precision result's rounding against the float64
    reference where the step rounds one: not at a cast (the rounding is the op the user
    wrote, exactly rounded arithmetic on its input), nor in a kernel that never rounds
    (a reshape, copy or comparison of float16 values is bit-exact)."""
    if node.op.name == CAST or kernel.tolerance <= NO_ROUNDING:
        return kernel.tolerance
    return max(kernel.tolerance, LOW_PRECISION_ROUNDING.get(node.dtype.name, 0.0))


class Planner:
    """Options, best choices, paths and counts for one prepared graph (concrete shapes)."""

    def __init__(self, outputs: Sequence[Node], *, target: str, cost: CostModel,
                 tolerance: float, backends: Sequence[str] | None = None,
                 weights_on: str | None = None, blocks: bool = False,
                 output_device: str = "cpu", dims: Mapping | None = None,
                 generate: bool = True, refused: frozenset[str] = frozenset(),
                 block_inputs: frozenset[Node] | None = None, stay: bool = False,
                 streams: bool | None = None, progress: bool = False):
        self.outputs = list(outputs)
        self.progress = progress  # a bar over the graph's nodes while ``solve`` runs
        # compute on the target wherever it can (the other devices only for what it cannot
        # compute): the single-device plan ``plan`` weighs against the mixed one
        self.stay = stay
        # planning one repeated block (``BlockInstancePlan``): the placeholders of the values
        # it reads from outside. Each is wanted on whatever device a step here reads it and is
        # not placed here: the outer plan makes it there or copies it in (as an input leaf it
        # was homed on the host, so every block's input was made on the host and copied up)
        self.block_inputs = block_inputs
        self.generate = generate  # offer generated kernels (kernels/generated.py)
        self.refused = refused  # generated kernels refused for this plan (checks, accuracy)
        self.dims = dict(dims or {})  # values of symbolic dims: costs and constraints use them
        self._twins: dict[Node, Node] = {}  # symbolic node -> node at ``dims``
        self.output_device = output_device
        self.target = target
        self.kinds = tuple(dict.fromkeys((target, "cpu")))
        self.cost = cost
        self.tolerance = tolerance
        self.backends = None if backends is None else set(backends) | {"copy"}
        self.weights_on = weights_on or target
        self.dispatch = cost.rates(target).get("dispatch", 0.0)
        self.native = target == "cpu"  # its programs may run natively (NATIVE_DISPATCH)
        self.uses = use_counts(self.outputs)
        self.shared = {n for n, c in self.uses.items() if c > 1}
        # the program's weights exceed the cache, so a step reads its static inputs from
        # memory every call (``CostModel.from_memory``); a block's planner is told by the whole
        # graph's (one layer's weights fit where the model's do not)
        self.streams = cost.weights_stream(self._static_bytes(), target) \
            if streams is None else streams
        # what a generated region sees: an output is also read by the caller, so a region
        # never computes one only inside it ([h, rms_norm(h + 1)] recomputed h beside c_add)
        self._decomposed: dict[Node, Node] = {}
        self._composite_of: dict[Node, Node] = {}  # decomposition node -> its composite
        self._region_uses = _ReadOutside(self.uses, set(self.outputs), self._composite_of,
                                         self._decomposed)
        self.depth: dict[Node, int] = {n: 0 for n in self.uses}
        self._options: dict[Slot, list[Option]] = {}
        self._rejected: dict[Slot, list[Option]] = {}
        self._best: dict[Slot, tuple[float, Option | None, frozenset]] = {}
        # a solved slot's chosen option's own seconds, and those plus its closure's (``_total``
        # sums them over closures of thousands of slots, an unrolled GRU's; where the needs'
        # closures are disjoint, it adds the needs' sums instead)
        self._own_of: dict[Slot, float] = {}
        self._paid_of: dict[Slot, float] = {}
        self._active: set[Slot] = set()
        self._filled: set[Node] = set()  # nodes whose slots ``solve``/``_fill`` solved in order
        self._made_on: dict[Node, str] = {}  # shared value -> where making it is cheapest
        self.stats = {"slots": 0, "options": 0, "estimates": 0, "blocks": 0,
                      "blocks_planned": 0, "block_cache_hits": 0}
        self._blocks: dict[Node, BlockInstancePlan] = {}
        self._inside: set[Node] = set()
        self._multi_output: set[Node] = set()  # the nodes of blocks with several outputs
        # generated kernels storing values whose readers the plan would run before them (a
        # stored value feeding one of the kernel's own inputs): not offered again here
        self._unordered: set[str] = set()
        self._credits: dict[int, tuple[Option, dict]] = {}  # option id -> (it, _absorbed)
        if blocks:
            self._find_blocks()

    # ------------------------------------------------------------------------ options
    @property
    def output_slots(self) -> list[Slot]:
        """Outputs are wanted on ``output_device``; a new version of a kept state stays where
        the state lives (a KV cache on the GPU is not copied to the host and back per call).
        A block's sub-plan makes its outputs on the device (unmoved slots): the outer option
        stands for those slots, and consumers elsewhere copy from there."""
        moved = self.block_inputs is None  # a block fills its outputs' own slots: see below
        return [Slot(o, self.weights_on if _kept_state(o) else self.output_device, moved)
                for o in self.outputs]

    def options(self, slot: Slot) -> list[Option]:
        """The slot's options within tolerance, in a fixed order."""
        found = self._options.get(slot)
        if found is None:
            found, rejected = [], []
            for opt in self._all_options(slot):
                (found if opt.error <= self.tolerance else rejected).append(opt)
            self._options[slot] = found
            self._rejected[slot] = rejected
            self.stats["slots"] += 1
            self.stats["options"] += len(found)
        return found

    def _all_options(self, slot: Slot) -> list[Option]:
        node, kind, moved = slot
        if self.block_inputs is not None and node in self.block_inputs:
            return [Option(LEAF, slot, label=LEAF)] if moved else []
        if moved:
            out = [Option(LOCAL, slot, (Slot(node, kind, False),), label=LOCAL)]
            for other in self.kinds:
                if other != kind:
                    out.extend(self._copy(slot, other))
            return out
        if node.op.is_leaf:
            return self._leaf(slot)
        if node in self._blocks and kind == self.target:
            return [self._blocks[node].option(slot, self)]
        if self.stay and kind != self.target \
                and self._solve_slot(Slot(node, self.target, False))[0] < INF:
            return []
        out = self._kernels(slot) + self._generated(slot)
        if not node.op.is_atomic:
            d = self._decomposition(node)
            out.append(Option(DECOMPOSE, slot, (Slot(d, kind, False),), label=DECOMPOSE))
        out.extend(self._rewrites(slot))
        return out

    def _leaf(self, slot: Slot) -> list[Option]:
        home = self.home(slot.node)
        if home is not None and home != slot.device:
            return []
        return [Option(LEAF, slot, label=LEAF)]

    def home(self, leaf: Node) -> str | None:
        """The device kind a fed leaf lives on (``HOMES``); None for constants and dims, which
        are wherever they are read."""
        where = HOMES.get(leaf.op.name)
        return None if where is None else "cpu" if where == "host" else self.weights_on

    def _kernels(self, slot: Slot) -> list[Option]:
        node, kind, _ = slot
        out = []
        for k, m in registry.matching(node, self.uses, dims=self.dims):
            if self.backends is not None and k.backend not in self.backends:
                continue
            source, result = copies.placement(k)
            if result != kind:
                continue
            args = k.arguments(m)
            if k.prepare and not all(is_static(args[i])
                                     for i in k.prepared_positions(len(args))):
                continue  # prepared once per binding: only for static values (weights)
            covers = _region(node, args)
            if not covers or not self._exclusive(covers, node):
                continue
            attrs = {a: node.attrs[a] for a in k.attrs if a in node.attrs}
            sig, feats, static = self._measure_key(covers, args, node, k)
            hint = copies.cost_hint(k)
            est = FREE if hint == 0.0 else self._streamed(k, self.cost.estimate(k, sig, feats),
                                                          static, node)
            self.stats["estimates"] += 1
            cold = 0.0 if est is FREE else self._cold(args, node)
            out.append(Option(KERNEL, slot, tuple(Slot(a, source, True) for a in args), k,
                              covers, attrs, est, step_error(k, node), sig, feats,
                              label=f"kernel:{k.name}",
                              densify=self._densify(args) if k.contiguous else 0.0, cold=cold,
                              static=is_static(node)))
        return out

    def _generated(self, slot: Slot) -> list[Option]:
        """The generated kernels' options at the slot: regions rooted at its node that a
        generator can render (``kernels.generated``), costed like any kernel; nothing is
        compiled here (the chosen ones are built and verified after planning)."""
        node, kind, _ = slot
        if not self.generate or not node.op.is_atomic or node.op.is_leaf:
            return []
        out = []
        for cand in generated.candidates(node, self._region_uses, self._decomposition, kind):
            if cand.device != kind or cand.name in self.refused or \
                    cand.name in self._unordered or \
                    (self.backends is not None and cand.backend not in self.backends):
                continue
            if any(n in self._multi_output for n in cand.covers if n is not node):
                continue  # see _exclusive
            if cand.also and (kind != self.target or any(
                    n in self._blocks or n in self._inside for n in cand.covers
                    if n is not node)):
                continue  # stored on the target only (a host kernel storing the GPU's
                # residual stream copied it both ways); and a repeated block makes what it
                # covers: storing it again is waste
            if not all(is_static(cand.inputs[i]) for i in cand.prepared):
                continue  # see _kernels: prepared once per binding
            sig, feats, static = self._measure_key(cand.covers, cand.inputs, node, cand)
            est = self._streamed(cand, self.cost.estimate(cand, sig, feats), static, node)
            self.stats["estimates"] += 1
            # the accuracy a profiler admitted it at, where one measured it (the rows' error:
            # CostModel.accuracy); an unmeasured candidate has no row to ask
            error = step_error(cand, node)
            if est.source in MEASURED_SOURCES:
                error = max(error, self.cost.accuracy(cand) or 0.0)
            out.append(Option(KERNEL, slot, tuple(Slot(a, kind, True) for a in cand.inputs),
                              cand, cand.covers, {}, est, error, sig,
                              feats, label=f"{GENERATED}:{cand.name}",
                              cold=self._cold(cand.inputs, node, cand.also),
                              static=is_static(node)))
        return out

    def _cold(self, args: Sequence[Node], node: Node, also: Sequence[Node] = ()) -> float:
        """Seconds for a step's activations (inputs that are not static, and its result) to
        go through memory once at the calibrated bandwidth: what the database's time lacks.
        It times a kernel in a loop on the same buffers, so a small step measures with its
        operands hot in L2 (MiniLM's bias add, (8, 128, 384) + (384,): 0.028 ms), while in a
        program they come from the kernel before it and the step costs ~0.15-0.2 ms more; a
        fused epilogue costs nothing, but a near tie between the fused GEMM and the pair went
        to the pair on measurement noise. Added to every step, so alternatives with the same
        operands keep their measured order, and the pair pays for its intermediate twice
        (written, read back). Static inputs are left out: the estimate itself includes their
        bytes at the memory's read bandwidth where the program's weights exceed the cache
        (``_streamed``). A decision term only: the plan's predicted time stays the
        estimates'. ``also``: values the step stores besides its result (written once more
        each)."""
        rate = self.cost.rates(self.target)["bytes"]
        moved = [a for a in dict.fromkeys(args) if not is_static(a)] + [node, *also]
        return sum(nbytes(t) for t in self._concrete(moved)) / rate

    def _concrete(self, nodes_: Sequence[Node]) -> list[Node]:
        """The nodes at ``self.dims`` (themselves when the graph has no symbolic dims)."""
        if not self.dims:
            return list(nodes_)
        from tensor_graphs.ir.graph import specialize_map

        specialize_map(nodes_, self.dims, self._twins)
        return [self._twins[n] for n in nodes_]

    def _measure_key(self, covers, args, node, kernel) -> tuple[str, object, float]:
        """The database signature, the work features of a kernel call and the bytes of
        static values it reads (``db.cost.call_features``), at ``self.dims``."""
        twins = self._concrete([*covers, *args, node])
        c_covers, c_args, c_node = twins[:len(covers)], twins[len(covers):-1], twins[-1]
        feats, static = call_features(kernel, c_covers, c_args, c_node)
        return signature(c_args, c_node.attrs), feats, static

    def _streamed(self, kernel, est: Estimate, static: float, node: Node) -> Estimate:
        """``est`` with the step's static inputs read from memory (``CostModel.from_memory``)
        where the program's weights exceed the cache, for a step that runs per call."""
        if not self.streams or is_static(node):
            return est
        return self.cost.from_memory(kernel, est, static)

    def _static_bytes(self) -> int:
        """Bytes of the graph's static leaves (weights, constants) at their bound width."""
        leaves = [n for n in nodes(self.outputs) if n.op.is_leaf and is_static(n)]
        return sum(nbytes(t) for t in self._concrete(leaves)) if leaves else 0

    def _densify(self, args: Sequence[Node]) -> float:
        """Seconds the runtime spends copying strided views (a permute, a slice) into dense
        buffers for a kernel that reads its inputs densely: read and write at peak bandwidth.
        A view of weights only is made dense once per binding, so it costs nothing per call."""
        rate = self.cost.rates(self.target)["bytes"]
        total = 0.0
        for a in dict.fromkeys(args):
            if _weights_only(a):
                continue
            (twin,) = self._concrete([a])
            if _strided(twin):
                total += 2 * nbytes(twin) / rate
        return total

    def _exclusive(self, covers: tuple[Node, ...], root: Node) -> bool:
        """A fused kernel may cover inner nodes only when nothing else reads them, and none
        of a block that runs for another output: a kernel fusing one output of a KV-cache
        layer (its residual add, into the next layer norm) recomputed the layer's attention
        and MLP beside the block, which ran anyway for its cache updates."""
        if len(covers) == 1:
            return True
        if any(n in self._multi_output for n in covers if n is not root):
            return False
        inside = set(covers)
        reads: dict[Node, int] = {}
        for n in covers:
            for i in n.inputs:
                if i in inside:
                    reads[i] = reads.get(i, 0) + 1
        return all(reads.get(n, 0) >= self.uses.get(n, 0) for n in covers if n is not root
                   and not n.op.is_leaf)

    def _copy(self, slot: Slot, other: str) -> list[Option]:
        k = copies.route_kind(other, slot.device)
        args = (slot.node,)
        (twin,) = self._concrete(args)
        sig = signature((twin,), {"device": slot.device})
        feats = features((), (twin,), twin)
        est = FREE if copies.cost_hint(k) == 0.0 else self.cost.estimate(k, sig, feats)
        attrs = {"device": slot.device} if "device" in k.attrs else {}  # (the runtime's GPU)
        return [Option(COPY, slot, (Slot(slot.node, other, False),), k, (), attrs, est,
                       step_error(k, slot.node), sig, feats, label=f"copy:{k.name}",
                       static=is_static(slot.node))]

    def _decomposition(self, node: Node) -> Node:
        d = self._decomposed.get(node)
        if d is None:
            d = expand_composite(node.op, node.inputs, node.attrs)
            self._decomposed[node] = d
            self._composite_of.setdefault(d, node)
            for n in self._adopt(d, self.depth.get(node, 0)):
                self._composite_of.setdefault(n, node)
        return d

    def _adopt(self, root: Node, depth: int) -> list[Node]:
        """Count the users of a new subgraph's nodes (an expansion or a rewrite); the walk
        stops at nodes already known, so it costs the new part only. Returns the new nodes."""
        if root in self.uses:
            return []
        new: list[Node] = []
        stack, seen = [root], {root}
        while stack:
            n = stack.pop()
            new.append(n)
            for i in n.inputs:
                if i not in self.uses and i not in seen:
                    seen.add(i)
                    stack.append(i)
        for n in new:
            self.uses[n] = 0
            self.depth[n] = depth
        self.uses[root] = 1
        for n in new:
            for i in n.inputs:
                if i in seen:
                    self.uses[i] += 1
        return new

    def _rewrites(self, slot: Slot) -> list[Option]:
        node = slot.node
        depth = self.depth.get(node, 0)
        if depth >= MAX_REWRITE_DEPTH:
            return []
        out = []
        for rule in PLANNING_RULES.candidates(node):
            for i, other in enumerate(rewrites(rule, node, self.uses)):
                known = self.depth.get(other)
                if known is not None and known <= depth:
                    continue  # rewriting back: the rewrite graph stays acyclic
                self._adopt(other, depth + 1)
                self.depth[other] = depth + 1
                out.append(Option(REWRITE, slot, (Slot(other, slot.device, False),),
                                  label=f"rewrite:{rule.name}:{i}"))
        return out

    def _find_blocks(self) -> None:
        """Plan each distinct repeated block once (see ``BlockInstancePlan``)."""
        from tensor_graphs.rewrite.blocks import find_repeated_blocks

        shared: dict = {}
        claimed: set[Node] = set()
        for group in find_repeated_blocks(self.outputs):
            if self.generate and _pointwise_only(group.instances[0].nodes, self._decomposition):
                continue  # planned whole, its instances fuse together into generated loops
            for inst in group.instances:
                if inst.nodes & claimed or any(o in self._blocks for o in inst.outputs):
                    continue
                outer = inst.inputs + inst.leaves
                holders = [_placeholder(i, n) for i, n in enumerate(outer)]
                abstract = _abstract(inst.outputs, dict(zip(outer, holders)))
                if abstract is None:
                    continue
                claimed |= inst.nodes
                record = BlockInstancePlan(inst, abstract, dict(zip(holders, outer)), shared)
                for o in inst.outputs:
                    self._blocks[o] = record
                if len(inst.outputs) > 1:
                    self._multi_output |= inst.nodes
                self.stats["blocks"] += 1
        self._inside = claimed - set(self._blocks)

    # ------------------------------------------------------------------------ best
    def best(self, slot: Slot) -> tuple[float, Option | None]:
        """(cost, chosen option) of the cheapest way to fill ``slot``: the step times of the
        slot and of everything only it needs (see ``total``)."""
        found = self._best.get(slot)
        if found is None:
            found = self._solve_slot(slot)
        return found[0], found[1]

    def _solve_slot(self, slot: Slot) -> tuple[float, Option | None, frozenset]:
        found = self._best.get(slot)
        if found is not None:
            return found
        if slot in self._active:  # a rewrite cycle: never cheaper than what started it
            return INF, None, frozenset()
        self._active.add(slot)
        result: tuple[float, Option | None, frozenset] = (INF, None, frozenset())
        paid = 0.0
        for opt in self.options(slot):
            if opt.how == DECOMPOSE:
                self._fill(opt.needs[0].node)
            total, closure, below = self._total(opt)
            if total < result[0]:
                result, paid = (total, opt, closure), below
        self._active.discard(slot)
        self._best[slot] = result
        if result[1] is not None:
            self._own_of[slot] = own = self._own(result[1])
            self._paid_of[slot] = own + paid
        return result

    def total(self, opt: Option) -> float:
        """The option's cost: its own step plus the steps of every slot it needs that nothing
        else in the graph needs, each counted once. Values the graph shares (used more than
        once) and leaves are boundaries: computed once whatever a consumer chooses, so they
        are costed where they are made, not split among consumers; a boundary's copy to the
        consumer's device is the consumer's (``_total``)."""
        return self._total(opt)[0]

    def _total(self, opt: Option) -> tuple[float, frozenset, float]:
        """(``total``, the closure, the own seconds summed over the closure)."""
        closure: set[Slot] = set()
        paid, counted = 0.0, 0  # the needs' sums, and their closures' sizes
        for need in opt.needs:
            cost, chosen, below = self._solve_slot(need)
            if cost == INF:
                return INF, frozenset(), INF
            if not self._boundary(need.node) or self._makes(opt, need):
                closure.add(need)
                closure |= below
                paid, counted = paid + self._paid_of[need], counted + 1 + len(below)
            elif chosen.how == COPY:
                # a boundary (a leaf, a shared value) copied here from where it is made: the
                # copy is this device's, so its readers pay it (each one: a copy several read
                # counts once per reader, which errs toward staying on one device); before,
                # nothing paid it, and a GPU step reading a host input looked free of its copy
                closure.add(need)
                paid, counted = paid + self._own_of[need], counted + 1
        if len(closure) != counted:  # the closures overlap: what they share counts once
            paid = sum(map(self._own_of.__getitem__, closure))
        return self._own(opt) + paid - self._absorbed(opt), frozenset(closure), paid

    def _makes(self, opt: Option, need: Slot) -> bool:
        """Whether filling a device's slot of a shared value by ``opt`` pays for making the
        value: made there (``LOCAL``), or copied from a device other than the one where it is
        cheapest to make (``_cheapest``), where it would be made for this copy alone. A copy
        from there pays the copy only: the readers there make it anyway. So that device makes
        it, and another copies it unless making it again costs less than the copy. Before,
        making it was free on every side (shared values are costed where they are made), and
        a value two devices read was made on each (GPT-2's embedding sum). A value only the
        other device reads is still copied from there when that is cheaper than making it
        again, its making unpaid: the DP does not know who reads it where."""
        if opt.how == LOCAL:
            return True
        return opt.how == COPY and need.device != self._cheapest(need.node)

    def _cheapest(self, node: Node) -> str:
        """The device kind where making ``node`` is cheapest (ties: the target)."""
        found = self._made_on.get(node)
        if found is None:
            slots = [Slot(node, k, False) for k in self.kinds]
            found = min(slots, key=lambda s: self._solve_slot(s)[0]).device
            if not any(s in self._active for s in slots):  # (an open rewrite cycle: INF)
                self._made_on[node] = found
        return found

    def _absorbed(self, opt: Option) -> float:
        """The credit of ``_absorbed_values``; an option that only names another slot for the
        same value (a composite's decomposition, a rewrite, the value made on this device)
        takes the credit of the step that slot's best option runs, so the composite's own
        kernel and its decomposition compete at their true costs."""
        if opt.how in (DECOMPOSE, REWRITE, LOCAL) and opt.needs \
                and not self._boundary(opt.needs[0].node):
            found = self._best.get(opt.needs[0])
            return 0.0 if found is None or found[1] is None else self._absorbed(found[1])
        return sum(self._absorbed_values(opt).values())

    def _absorbed_values(self, opt: Option) -> Mapping[Node, float]:
        """What a kernel saves by computing shared values inside it: a value the graph uses
        twice is a boundary, costed where it is made and not by its consumers, but a kernel
        covers one only when every user is inside it (``_exclusive``, ``generated.grow``), so
        choosing it makes that value's own step unnecessary. Without this credit the kernel
        paid for the value and its rival did not: Mish after a matmul, ``h * tanh(softplus(h))``
        with ``h`` read twice, planned the GEMM and the epilogue apart. A generated kernel that
        stores a value beside its root (``Candidate.also``: the residual stream its norm
        reads) makes that value's own step unnecessary too, while others still read it.
        {value: its own step's cost}."""
        if opt.how != KERNEL or len(opt.covers) < 2:
            return {}
        found = self._credits.get(id(opt))
        if found is not None:
            return found[1]
        root = opt.slot.node
        saved: dict[Node, float] = {}
        settled = True
        for n in opt.covers:
            if n is not root and n in self.shared and not n.op.is_leaf \
                    and n not in self._blocks:  # (a block runs for its other values anyway)
                slot = Slot(n, opt.slot.device, False)
                settled = settled and slot not in self._active  # (a rewrite cycle: INF)
                cost = self._solve_slot(slot)[0]
                if cost < INF:
                    saved[n] = cost
        if settled:
            self._credits[id(opt)] = (opt, saved)
        return saved

    def _own(self, opt: Option) -> float:
        """An option's own seconds; a step that runs also costs its activations' traffic
        (``_cold``), the runtime's dispatch (so fewer, fused steps win ties; a C step at the
        native loop's price, see NATIVE_DISPATCH; a view on a GPU none: ``launches``) and
        any densifying copies of its inputs. A static step (a weight's copy to the other
        device) runs once per binding: its share of ``AMORTIZED_CALLS`` calls, so a weight
        copy a call never pays does not push a step to the device that holds the weights."""
        if opt.runs and opt.estimate is not FREE:
            dispatch = NATIVE_DISPATCH if self.native and opt.kernel.backend in NATIVE_BACKENDS \
                else self.dispatch if launches(opt.kernel, opt.slot.device) else 0.0
            seconds = opt.seconds + opt.cold + dispatch + opt.densify
            return seconds / AMORTIZED_CALLS if opt.static else seconds
        return opt.seconds

    def _boundary(self, node: Node) -> bool:
        return node.op.is_leaf or node in self.shared

    def solve(self) -> float:
        """Fill the DP table bottom-up (keeps recursion shallow) and return the outputs' cost.
        With ``progress``, a bar counts the graph's nodes solved once planning has taken
        ``PROGRESS_DELAY`` seconds (an unrolled recurrence's layers take tens of seconds)."""
        order = nodes(*self.outputs)
        with Progress(len(order), "planning", delay=PROGRESS_DELAY) if self.progress \
                else contextlib.nullcontext() as bar:
            for n in order:
                self._fill(n)
                if bar is not None:
                    bar.step()
        costs = [self.best(s)[0] for s in self.output_slots]
        if any(c == INF for c in costs):
            raise self.no_path_error()
        return sum(costs)

    def _fill(self, *roots: Node) -> None:
        """Solve the slots of the nodes below ``roots`` inputs first, each node's slots on
        every device; nodes already filled are not entered again. ``solve`` fills the graph,
        ``_solve_slot`` a composite's decomposition before costing it: solved from its root, an
        unrolled recurrence (a 2-layer bidirectional GRU's 32 steps) recursed once per value
        of every step and exceeded Python's recursion limit."""
        for n in nodes(*roots, stop=self._filled):
            if n in self._filled or n in self._inside:
                continue  # (a block's inner nodes: planned with its block)
            self._filled.add(n)
            for kind in self.kinds:
                self.best(Slot(n, kind, False))
                self.best(Slot(n, kind, True))

    def plan(self) -> Plan:
        """The cheapest plan found: the DP's, or, where it leaves on another device steps the
        target can compute, the plan that computes everything it can on the target, when that
        is predicted no slower. The DP places each value on its own (a shared value where it
        is cheapest to make, its copies paid by its readers), which can settle on a chain of
        copies where one device would do: a 3-layer GPT-2 at width 256 on a GPU, its
        residual stream made on the host (C calls are cheaper than launches), 13 copies a
        call, predicted 878 us, against 828 us all on the GPU with 2."""
        mixed = self._extracted()
        if self.stay or not self._movable(mixed):
            return mixed
        single = Planner(self.outputs, target=self.target, cost=self.cost,
                         tolerance=self.tolerance, backends=self.backends,
                         weights_on=self.weights_on, blocks=bool(self._blocks),
                         output_device=self.output_device, dims=self.dims,
                         generate=self.generate, refused=self.refused,
                         block_inputs=self.block_inputs, stay=True, streams=self.streams)
        try:
            alone = single._extracted()  # noqa: SLF001 - the same class
        except NoPathError:
            return mixed
        for key in ("slots", "options", "estimates"):
            self.stats[key] += single.stats[key]
        return alone if alone.cost <= mixed.cost else mixed

    def _extracted(self) -> Plan:
        while True:
            self.solve()
            chosen: dict[Slot, Option] = {}
            try:
                while True:  # each round makes one more value where it is read: it ends
                    plan = self.extract(lambda slot, c=chosen: c.get(slot) or self.best(slot)[1])
                    better = self._lone_copies(plan) or self._stored_twice(plan, chosen)
                    if not better:
                        return plan
                    chosen.update(better)
            except _UnorderedError as exc:  # planned again without that kernel
                self._unordered.add(exc.name)
                self._options.clear()
                self._rejected.clear()
                self._best.clear()
                self._own_of.clear()
                self._paid_of.clear()
                self._filled.clear()
                self._made_on.clear()
                self._credits.clear()

    def _stored_twice(self, plan: Plan, chosen: Mapping[Slot, Option]) -> dict[Slot, Option]:
        """Values a generated kernel of the plan stores beside its root (``Candidate.also``)
        that another step makes too: the walk met the value's slot before the kernel's root
        and chose its own step (the DP credited the kernel with that step's cost: it is to
        go). {the value's slot: the ALSO option that leaves it to the kernel} to extract
        again; a value two kernels store is left to the first."""
        made = {plan.resolve(st.slot): st for st in plan.steps}
        better: dict[Slot, Option] = {}
        for st in plan.steps:
            for n, kept in zip(getattr(st.kernel, "also", ()), st.also):
                slot = Slot(n, st.device, False)
                if kept is not None or slot in chosen or slot in better:
                    continue
                other = made.get(slot)
                if other is not None:
                    better[slot] = Option(ALSO, slot, label=f"{ALSO}:{st.kernel.name}")
        return better

    def _movable(self, plan: Plan) -> bool:
        """Whether the plan computes off the target what the target could compute (inside
        a repeated block, its sub-planner judged that). A block's output made off the target
        is the DP's choice, not the block's (whose sub-plan leaves its outputs on the target):
        a 3-layer GPT-2 at width 256 on a GPU made each layer's residual sum on the host from
        two copies down, and copied it back up, once a GPU kernel cost 3 us."""
        return any(st.device != self.target and not st.is_copy and st.node not in self._inside
                   and self.best(Slot(st.node, self.target, False))[0] < INF
                   for st in plan.steps)

    def _lone_copies(self, plan: Plan) -> dict[Slot, Option]:
        """Copies of shared values made on their source device for the copy alone, where
        making the value on the device that reads it costs less: the DP took the copy for
        the copy's price (``_makes``: the value's cheapest device makes it for its readers
        there), and the plan shows no such reader (a KV cache's new version made on the host
        and copied up, for GPU steps only). {moved slot: its LOCAL option} to extract again."""
        read: set[Slot] = {plan.resolve(s) for s in plan.outputs}
        for st in plan.steps:
            if not st.is_copy:
                read.update(plan.resolve(i) for i in st.inputs)
        better: dict[Slot, Option] = {}
        for st in plan.steps:
            if not (st.is_copy and st.slot.moved and st.node in self.shared) \
                    or st.inputs[0] in read or st.node in self._inside:
                continue  # (inside a repeated block, its sub-planner judged it)
            copy = next(o for o in self.options(st.slot) if o.how == COPY
                        and o.needs == st.inputs)
            local = next((o for o in self.options(st.slot) if o.how == LOCAL), None)
            if local is None:
                continue
            made_here = self._solve_slot(local.needs[0])[0]
            if made_here < self._own(copy) + self._solve_slot(st.inputs[0])[0]:
                better[st.slot] = local
        return better

    def replay(self, decisions: Sequence[str]) -> Plan:
        """The plan whose options are ``decisions`` (a lock file or the plan cache), in
        extraction order. Only options within the tolerance are taken: a decision for a less
        accurate kernel (a hand-edited lock file) is refused, not run and not re-planned. The
        ``PlanFileError`` says what does not fit; the caller names the file and the fix."""
        queue = list(reversed(decisions))

        def choose(slot: Slot) -> Option:
            if not queue:
                raise PlanFileError(f"its {len(decisions)} decisions are fewer than this graph "
                                    "needs (it was saved for another graph)")
            label = queue.pop()
            if label.startswith(ALSO + ":"):  # stored by a generated kernel (``extract``)
                return Option(ALSO, slot, label=label)
            if label.startswith(BLOCK + ":") and slot.node in self._blocks:
                return self._blocks[slot.node].option(slot, self, label)
            for opt in self.options(slot):
                if opt.label == label:
                    return opt
            for opt in self._rejected.get(slot, []):
                if opt.label == label:
                    raise PlanFileError(
                        f"it chooses {label!r} for {_describe(slot.node)}, whose error "
                        f"{opt.error:.1e} is above the tolerance {self.tolerance:g} asked for")
            raise PlanFileError(f"it chooses {label!r} for {_describe(slot.node)}, which is not "
                                "available here (another graph, kernel set or device)")

        def claim(slot: Slot, label: str) -> None:
            found = queue.pop() if queue else None
            if found != label:
                raise PlanFileError(f"it chooses {found!r} for {_describe(slot.node)}, which "
                                    f"the generated kernel chosen before stores ({label!r})")

        plan = self.extract(choose, claim)
        if queue:
            raise PlanFileError(f"it has {len(queue)} decisions more than this graph needs (it "
                                "was saved for another graph)")
        return plan

    def extract(self, choose: Callable[[Slot], Option | None],
                claim: Callable[[Slot, str], None] | None = None) -> Plan:
        """Walk from the outputs choosing an option per needed slot; steps in execution order.
        A generated kernel that stores values besides its root (``Candidate.also``) fills
        their slots not chosen yet (an ``ALSO`` decision each, after its own; ``claim`` is
        told, so a replay checks its lock file says the same); a stored value whose slot
        another step fills is dropped by the kernel (its ``also`` entry None)."""
        chosen: dict[Slot, Option] = {}
        steps: list[Step] = []
        aliases: dict[Slot, Slot] = {}
        leaves: list[Slot] = []
        decisions: list[str] = []
        emitted: set[int] = set()  # block instances whose steps are in
        made: set[Slot] = set()  # the slots the steps so far fill
        stored: set[Slot] = set()  # ALSO slots a kernel's step fills
        stack: list[tuple[Slot, bool]] = [(s, False) for s in reversed(self.output_slots)]
        while stack:
            slot, ready = stack.pop()
            if ready:
                opt = chosen[slot]
                if opt.how == BLOCK:
                    if id(opt.kernel) not in emitted:
                        emitted.add(id(opt.kernel))
                        opt.kernel.emit(steps, aliases, made)
                elif opt.how == ALSO:
                    pass  # filled by the step of the kernel that stores it
                elif opt.runs:
                    also = []
                    for n in getattr(opt.kernel, "also", ()):
                        s = Slot(n, slot.device, False)
                        mine = getattr(chosen.get(s), "how", None) == ALSO and s not in stored
                        also.append(n if mine else None)
                        if mine:
                            stored.add(s)
                    step = Step(opt.kernel, slot.node, slot.device, opt.needs, opt.covers,
                                opt.attrs, opt.estimate, opt.error, opt.signature,
                                opt.features, opt.densify, opt.static, tuple(also))
                    if step.slot not in made or any(also):  # (a block's step made it)
                        made.add(step.slot)
                        steps.append(step)
                elif opt.how == LEAF:
                    leaves.append(slot)
                else:
                    aliases[slot] = opt.needs[0]
                continue
            if slot in chosen:
                continue
            opt = choose(slot)
            if opt is None:
                raise self.no_path_error()
            chosen[slot] = opt
            decisions.append(opt.label)
            if opt.how == KERNEL:
                for n in getattr(opt.kernel, "also", ()):
                    s = Slot(n, slot.device, False)
                    if s not in chosen:
                        label = f"{ALSO}:{opt.kernel.name}"
                        if claim is not None:
                            claim(s, label)
                        chosen[s] = Option(ALSO, s, label=label)
                        decisions.append(label)
            stack.append((slot, True))
            stack.extend((need, False) for need in reversed(opt.needs) if need not in chosen)
        unfilled = [s for s, o in chosen.items() if o.how == ALSO and s not in stored]
        if unfilled:
            raise PlanFileError(f"it leaves {_describe(unfilled[0].node)} to a generated "
                                "kernel that the plan does not run")
        plan = Plan(tuple(steps), tuple(self.output_slots), aliases, tuple(leaves),
                    tuple(decisions), self.tolerance, self.dispatch)
        return _ordered(plan) if stored else plan

    # ------------------------------------------------------------------------ errors
    def no_path_error(self) -> NoPathError:
        """The first node (inputs first) with no path whose inputs all have one: the op to
        name, with the tolerance it needs where only accuracy rules its kernels out. A
        repeated block's sub-planner skips the block's input placeholders: they are fed moved
        (``_all_options``), so their unmoved slot has no option and would be named instead
        of the op inside the block ("no kernel computes input() -> ..." for a float16 Llama
        at tolerance 1e-5)."""
        for n in nodes(self.outputs):
            if self.block_inputs is not None and n in self.block_inputs:
                continue
            slot = Slot(n, self.target if not n.op.is_leaf else self.home(n) or "cpu", False)
            if self.best(slot)[0] < INF:
                continue
            if any(self.best(Slot(i, k, True))[0] == INF for i in n.inputs
                   for k in self.kinds[:1]):
                continue  # an input is the problem: report the first failing node
            rejected = sorted(self._rejected.get(slot, []), key=lambda o: o.error)
            if rejected:
                o = rejected[0]
                return NoPathError(
                    f"no path computes {_describe(n)} within tolerance {self.tolerance:g}: the "
                    f"most accurate kernel available, {o.kernel.name}, has error "
                    f"{o.error:.1e}; use tolerance >= {o.error:.1e} or register a more "
                    "accurate kernel")
            return NoPathError(
                f"no kernel on {', '.join(self.kinds)} computes {_describe(n)} "
                f"(backends {sorted(self.backends) if self.backends else 'all'}); register "
                "one with @tg.kernel or allow more backends")
        return NoPathError("no path computes the graph's outputs on the host")

    # ------------------------------------------------------------------------ paths
    def _ranked(self, slot: Slot) -> list[Option]:
        ranked = [(self.total(o), i, o) for i, o in enumerate(self.options(slot))]
        return [o for t, i, o in sorted(ranked, key=lambda r: (r[0], r[1])) if t < INF]

    def paths(self) -> Iterator[Plan]:
        """Every valid path, lazily; at each decision the cheapest option first (so the first
        path is the best plan)."""
        self.solve()
        start = tuple(dict.fromkeys(self.output_slots))
        stack = [(start, {}, iter(self._ranked(start[0])))]
        while stack:
            pending, decided, options = stack[-1]
            opt = next(options, None)
            if opt is None:
                stack.pop()
                continue
            now = {**decided, pending[0]: opt}
            rest = tuple(dict.fromkeys(s for s in pending[1:] + opt.needs if s not in now))
            if not rest:
                yield self.extract(now.__getitem__)
                continue
            stack.append((rest, now, iter(self._ranked(rest[0]))))

    def count(self) -> int:
        """How many paths ``paths`` yields, without enumerating them."""
        self.solve()
        order = self._slot_order()
        states: dict[frozenset, int] = {frozenset(self.output_slots): 1}
        for slot in order:
            nxt: dict[frozenset, int] = {}
            for state, c in states.items():
                if slot not in state:
                    nxt[state] = nxt.get(state, 0) + c
                    continue
                rest = state - {slot}
                for opt in self._ranked(slot):
                    key = rest | frozenset(opt.needs)
                    nxt[key] = nxt.get(key, 0) + c
            states = nxt
        return sum(c for state, c in states.items() if not state)

    def _slot_order(self) -> list[Slot]:
        """Every slot a valid option can reach, consumers before producers."""
        post: list[Slot] = []
        seen: set[Slot] = set()
        for root in self.output_slots:
            if root in seen:
                continue
            seen.add(root)
            stack = [(root, iter(self._needed(root)))]
            while stack:
                slot, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    stack.pop()
                    post.append(slot)
                elif nxt not in seen:
                    seen.add(nxt)
                    stack.append((nxt, iter(self._needed(nxt))))
        return post[::-1]

    def _needed(self, slot: Slot) -> list[Slot]:
        return [n for o in self._ranked(slot) for n in o.needs]


class _ReadOutside(Mapping):
    """The planner's use counts with each output read once more (by the caller), live as the
    planner adds decompositions to them; its length is theirs, O(1) (a ChainMap's is a union
    of keys, and a generator asks for it at every node). ``enclosing(node)``: the composites
    whose decompositions ``node`` lies in (``generated.grow`` counts their reads of their
    inputs as the use counts do: once per composite, not per decomposition node)."""

    def __init__(self, uses: Mapping[Node, int], outputs: set[Node],
                 composites: Mapping[Node, Node] | None = None,
                 decomposed: Mapping[Node, Node] | None = None):
        self.uses, self.outputs = uses, outputs
        self.composites = {} if composites is None else composites
        self.decomposed = {} if decomposed is None else decomposed

    def enclosing(self, node: Node) -> list[tuple[Node, bool]]:
        """(composite, whether ``node`` is its decomposition's root) for each composite whose
        decomposition holds ``node``, innermost first (a composite's node is in its own
        parent's decomposition, and so on)."""
        chain: list[tuple[Node, bool]] = []
        while node in self.composites and len(chain) < 64:
            composite = self.composites[node]
            chain.append((composite, self.decomposed.get(composite) is node))
            node = composite
        return chain

    def __getitem__(self, node: Node) -> int:
        return self.uses[node] + (node in self.outputs)

    def __iter__(self):
        return iter(self.uses)

    def __len__(self) -> int:
        return len(self.uses)


MOVEMENT_VIEWS = STRIDED_VIEWS | {RESHAPE}  # STRIDED_VIEWS: ir/algebra.py


def _strided(node: Node) -> bool:
    """The node is a view that is not dense: a permute, slice or expand, or a reshape of one
    that keeps it a view. A reshape that cannot be a view copies (``numpy_reshape``), so its
    result is dense and a consumer needs no copy: attention's output permuted from (batch,
    heads, seq, d) to (batch, seq, heads, d) and reshaped to (batch, seq, heads * d) is one
    (charging a copy there had the planner pick torch's linear, which reads strides, over the
    faster packed GEMM)."""
    chain = []
    while node.op.name in MOVEMENT_VIEWS:
        chain.append(node)
        node = node.inputs[0]
    if not any(n.op.name in STRIDED_VIEWS for n in chain):
        return False
    layout = _replay_views(node, chain[::-1])
    return True if layout is None else not layout.flags.c_contiguous


def _static_shape(node: Node) -> tuple[int, ...] | None:
    try:
        return tuple(int(d) for d in node.shape)
    except TypeError:  # a symbolic dim
        return None


def _replay_views(base: Node, chain: Sequence[Node]):
    """An array laid out as ``chain`` (movement views, innermost first) leaves ``base``'s
    dense buffer: the views replayed by numpy on byte strides over no buffer
    (``_dense_layout``), a reshape that cannot be a view starting a new dense layout as
    ``numpy_reshape``'s copy does. None when a shape is symbolic or too large to index."""
    import numpy as np

    shape = _static_shape(base)
    x = None if shape is None else _dense_layout(shape)
    if x is None:
        return None
    for n in chain:
        out = _static_shape(n)
        if out is None:
            return None
        a = n.attrs
        if n.op.name == PERMUTE:
            x = np.transpose(x, tuple(a["perm"]))
        elif n.op.name == EXPAND:
            x = np.broadcast_to(x, out)
        elif n.op.name == SLICE:
            x = x[tuple(slice(0, 0) if b < 0 else slice(b, None if e < 0 else e, st)
                        for b, e, st in zip(a["starts"], a["stops"], a["steps"]))]
        else:  # reshape
            try:
                x = np.reshape(x, out, copy=False)
            except ValueError:  # numpy_reshape copies here: a dense result
                x = _dense_layout(out)
        if x is None or x.shape != out:
            return None
    return x


def _dense_layout(shape: tuple[int, ...]):
    """A C-ordered uint8 array of ``shape`` whose strides lie over one byte: numpy works out
    views' strides on it as on a real buffer, and nothing of the shape's size is allocated
    (``np.empty`` of the real size asked for 2.25 TiB when planning GPT-2 at seq=2**30). None
    when a byte offset would not fit numpy's index type."""
    import numpy as np

    strides, step = [], 1
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    if step >= 2**62:
        return None
    return np.lib.stride_tricks.as_strided(np.empty(1, np.uint8), shape, strides[::-1])


def _weights_only(node: Node) -> bool:
    """The node is a chain of views over a weight or constant (made dense once per binding)."""
    while node.op.name in MOVEMENT_VIEWS:
        node = node.inputs[0]
    return node.op.name in (WEIGHT, CONSTANT)


def _region(root: Node, arguments: Sequence[Node]) -> tuple[Node, ...]:
    """The nodes a kernel computes: everything under ``root`` above its arguments (constants a
    pattern matched are inside), in topological order, root last."""
    stop = set(arguments)
    order: list[Node] = []
    seen: set[Node] = set()
    stack = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if ready:
            order.append(n)
            continue
        if n in seen or n in stop:
            continue
        seen.add(n)
        if n.op.is_leaf and n.op.name not in (CONSTANT, DIM):
            return ()  # the pattern reached a fed leaf it does not take: not a valid cover
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(n.inputs))
    return tuple(order)


def _pointwise_only(members, expand: Callable[[Node], Node]) -> bool:
    """Every node of a block instance is an elementwise op or a composite made of them: a
    block that only a generated loop would compute (planned once per instance, its instances
    could not fuse across the block boundary: a 12-op chain made 4 steps, not 1)."""
    stack = [(n, frozenset()) for n in members if not n.op.is_leaf]
    seen: set[Node] = set()
    while stack:
        n, stop = stack.pop()
        if n in seen or n in stop or n.op.is_leaf:
            continue
        seen.add(n)
        if not n.op.is_atomic:  # its decomposition, down to the composite's own inputs
            d = expand(n)
            if d is None:
                return False
            stack.append((d, frozenset(n.inputs)))
        elif n.op.name not in ELEMENTWISE:
            return False
        elif stop:  # inside a decomposition
            stack.extend((i, stop) for i in n.inputs)
    return True


class _UnorderedError(Exception):
    """A generated kernel stores a value that one of its own inputs is computed from: no
    order of the plan's steps runs it (``_ordered``); the planner plans again without it."""

    def __init__(self, name: str):
        super().__init__(name)
        self.name = name


def _ordered(plan: Plan) -> Plan:
    """The plan with its steps in an order where each runs after the steps making what it
    reads: the walk emits a stored value's readers when it meets them, which can be before
    the kernel storing it (its root met later). Stable: the walk's order where it holds.
    ``_UnorderedError`` when a kernel reads, through other steps, a value it stores itself."""
    import heapq

    maker: dict[Slot, int] = {}
    for i, st in enumerate(plan.steps):
        maker[plan.resolve(st.slot)] = i
        for s in st.also_slots:
            if s is not None:
                maker[plan.resolve(s)] = i
    after: list[list[int]] = [[] for _ in plan.steps]
    waits = [0] * len(plan.steps)
    for i, st in enumerate(plan.steps):
        for need in {maker.get(plan.resolve(s)) for s in st.inputs} - {None, i}:
            after[need].append(i)
            waits[i] += 1
    ready = [i for i, w in enumerate(waits) if not w]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in after[i]:
            waits[j] -= 1
            if not waits[j]:
                heapq.heappush(ready, j)
    if len(order) < len(plan.steps):
        stuck = next(st for i, st in enumerate(plan.steps) if waits[i] and st.also)
        raise _UnorderedError(stuck.kernel.name)
    if order == list(range(len(plan.steps))):
        return plan
    return Plan(tuple(plan.steps[i] for i in order), plan.outputs, plan.aliases, plan.leaves,
                plan.decisions, plan.tolerance, plan.dispatch)


def _describe(n: Node) -> str:
    ins = ", ".join(f"{format_shape(i.shape)} {i.dtype.name}" for i in n.inputs)
    return f"{n.op.name}({ins}) -> {format_shape(n.shape)} {n.dtype.name}"


# ---------------------------------------------------------------------------- repeated blocks
class BlockInstancePlan:
    """One instance of a repeated block, planned through its abstract form.

    The abstract form replaces the instance's inputs and exclusive leaves by placeholder leaves
    named by position; hash-consing makes every instance of a group build the same abstract
    nodes, so the block is planned once (a sub-planner over the abstract outputs) and each
    instance's steps are that plan with its placeholders mapped back (``concrete``). Kernels
    inside the block cannot fuse across its boundary, and its inside is not enumerated by
    ``paths`` (which plans without blocks)."""

    def __init__(self, inst, abstract: tuple[Node, ...], mapping: dict[Node, Node], shared):
        self.inst = inst
        self.abstract = abstract
        self.mapping = dict(mapping)  # placeholder -> concrete node
        # placeholders of values read from outside (not weights or states, which have homes)
        self.inputs = frozenset(p for p in mapping if p.op.name == INPUT)
        self.shared = shared  # {abstract outputs: sub-plan}, one per group
        self.plan: Plan | None = None
        self._concrete: dict[Node, Node] = {}

    def sub_plan(self, planner: Planner, decisions: Sequence[str] | None) -> Plan:
        if self.plan is not None:
            return self.plan
        found = self.shared.get(self.abstract)
        if found is not None and (decisions is None or found.decisions == tuple(decisions)):
            planner.stats["block_cache_hits"] += 1
            self.plan = found
            return found
        sub = Planner(self.abstract, target=planner.target, cost=planner.cost,
                      tolerance=planner.tolerance, backends=planner.backends,
                      weights_on=planner.weights_on, output_device=planner.target,
                      dims=planner.dims, generate=planner.generate, refused=planner.refused,
                      block_inputs=self.inputs, stay=planner.stay, streams=planner.streams)
        self.plan = sub.plan() if decisions is None else sub.replay(decisions)
        planner.stats["blocks_planned"] += 1
        for key in ("slots", "options", "estimates"):
            planner.stats[key] += sub.stats[key]
        self.shared.setdefault(self.abstract, self.plan)
        return self.plan

    def option(self, slot: Slot, planner: Planner, label: str | None = None) -> Option:
        decisions = None if label is None else label[len(BLOCK) + 1:].split("|")
        plan = self.sub_plan(planner, decisions)
        needs = tuple(Slot(self.concrete(s.node), s.device, s.moved) for s in plan.leaves)
        est = Estimate(plan.cost, "block", 1.0)
        return Option(BLOCK, slot, needs, self, (), {}, est, plan.error,
                      label=BLOCK + ":" + "|".join(plan.decisions))

    def concrete(self, n: Node) -> Node:
        """The instance's node for an abstract node of the sub-plan."""
        found = self.mapping.get(n)
        if found is None:
            found = self._concrete.get(n)
        if found is not None:
            return found
        order = [m for m in nodes(n) if m not in self.mapping and m not in self._concrete]
        for m in order:
            inputs = tuple(self.mapping[i] if i in self.mapping else self._concrete[i]
                           for i in m.inputs)
            self._concrete[m] = m if inputs == m.inputs else Node.make(m.op, inputs, m.attrs,
                                                                      m.name)
        return self._concrete[n]

    def _slot(self, s: Slot) -> Slot:
        return Slot(self.concrete(s.node), s.device, s.moved)

    def emit(self, steps: list[Step], aliases: dict[Slot, Slot], made: set[Slot]) -> None:
        """Append the instance's steps (the sub-plan's, mapped) and aliases, but not a step
        whose slot ``made`` holds: a value that reads nothing from the block's inputs (the
        causal mask's iota and reshapes, from the dims) is the same node in every instance
        and outside, and was made once per layer."""
        plan = self.plan
        for st in plan.steps:
            step = Step(st.kernel, self.concrete(st.node), st.device,
                        tuple(self._slot(i) for i in st.inputs),
                        tuple(self.concrete(n) for n in st.nodes), st.attrs, st.estimate,
                        st.error, st.signature, st.features, st.densify, st.static,
                        tuple(None if n is None else self.concrete(n) for n in st.also))
            if step.slot not in made:
                made.add(step.slot)
                steps.append(step)
        for a, b in plan.aliases.items():
            aliases[self._slot(a)] = self._slot(b)


PLACEHOLDER_KIND = {WEIGHT: builder.weight, STATE: builder.state}  # else an input


def _placeholder(i: int, node: Node) -> Node:
    make = PLACEHOLDER_KIND.get(node.op.name, builder.input)
    return make(f"%block{i}", node.shape, node.dtype)


def _abstract(outputs: Sequence[Node], mapping: dict[Node, Node]) -> tuple[Node, ...] | None:
    """The region above ``mapping``'s keys rebuilt on its values; None when the walk leaves
    the region (reaches a computed node that is not a mapped input)."""
    built: dict[Node, Node] = dict(mapping)
    stack: list[tuple[Node, bool]] = [(o, False) for o in outputs]
    while stack:
        n, ready = stack.pop()
        if n in built:
            continue
        if ready:
            inputs = tuple(built[i] for i in n.inputs)
            built[n] = n if inputs == n.inputs else Node.make(n.op, inputs, n.attrs, n.name)
            continue
        if n.op.is_leaf:
            if n.op.name not in (CONSTANT, DIM):
                return None  # a named leaf that is not a placeholder
            built[n] = n
            continue
        stack.append((n, True))
        stack.extend((i, False) for i in n.inputs if i not in built)
    return tuple(built[o] for o in outputs)
