"""Generated kernels as planner options: regions found in the graph, compiled only when chosen.

A hand-written kernel applies where its pattern matches; a generated one applies to whatever
region of the graph a generator can render. For each node on each device kind the planner asks
the generators of ``generators()`` that render for that kind for a ``Candidate``: the region
rooted at the node (the nodes it computes, the values it reads), the kernel's name and source
hash, and a declared error, all known from the rendered source without compiling it. The
candidate competes with the registered kernels and the decomposition on its estimated or
measured time; only the candidates a plan (or the profiler) actually uses are built
(``realize``): compiled (cached on disk by the hash of their source and flags) and verified
against the float64 reference, once per process. A candidate that fails to compile or verify
is refused for the rest of the process (``refused``) and its plan is made again without it;
the profiler records it as a failure row, so no later plan on that database considers it.

Regions are described on the graph itself (atomic nodes between boundary values), which is
backend-neutral: a generator turns one into source for its backend (``kernels/c/codegen.py``
renders elementwise regions as one C loop). Each row of ``generators()`` names the device kind
its generator renders for, and the planner asks only the generators of its slot's kind
(``candidates(..., device=)``): a C generator never runs for a GPU slot, nor a Triton one for a
host slot. Each generator is ``fn(root, uses, expand) -> Candidate | None``: ``uses`` counts
each node's users in the whole graph being planned (a node read outside the region cannot be
computed only inside it) and ``expand(node)`` is the planner's decomposition of a composite
node (the same node object every time, so a region may reach through a composite input into
its decomposition: an ``add`` after a ``gelu`` is one loop, not a hand kernel and an add).
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass

from tensor_graphs.ir.node import Node

Expand = Callable[[Node], "Node | None"]
# atomic nodes one region may hold: checking a kernel walks its pattern recursively (a chain of
# 1000 ops overflowed Python's stack), and past this a longer loop body saves nothing
MAX_NODES = 192


@dataclass(frozen=True, eq=False)
class Candidate:
    """A region the planner may compute with one generated kernel, before anything is built.

    It stands in for the kernel in a planner option (``name``, ``backend``, ``device``,
    ``source_hash``: what the cost model and the database key on); ``build`` compiles and
    verifies it and returns the registry Kernel (raising on failure); ``realize`` calls it once.
    """

    generator: str  # which entry of generators() found it
    root: Node  # the planner's node the kernel computes
    covers: tuple[Node, ...]  # the atomic nodes it computes, in topological order, root last
    inputs: tuple[Node, ...]  # the values it reads, in argument order
    name: str  # the kernel's name: a hash of its source, so one structure is one kernel
    source_hash: str
    tolerance: float  # declared before checking; the checks may raise it (see realize)
    summary: str  # what explain() shows: which ops it fuses
    build: Callable[[], object]
    computes: Node | None = None  # the root over atomic ops and the inputs (``rebuilt``):
    # what a profiler evaluates (the planner's root may read a composite it reached through)
    prepared: tuple[int, ...] = ()  # argument positions prepared once per binding (a packed
    # GEMM weight): offered only where those arguments are static (weights), as for kernels
    backend: str = "c"
    device: str = "cpu"
    also: tuple[Node, ...] = ()  # values besides the root it stores, each read outside the
    # region (the residual stream a norm reads): the planner's nodes, in the kernel's order
    view: bool = False
    contiguous: bool = False  # generated loops read strided inputs themselves
    generated: bool = True
    fn: None = None  # not callable before realize
    draft: Callable[[], object] | None = None  # ``build`` without the checks: the kernel for
    # a process that reads another's verification outcome (``share``); None: never shared

    def __repr__(self) -> str:
        return f"<generated {self.name} ({self.backend}, {self.device}) {self.summary}>"


_lock = threading.Lock()  # guards the tables below, never held while a kernel is built
_built: dict[str, object] = {}  # candidate name -> its verified Kernel
refused: dict[str, str] = {}  # candidate name -> why it was refused (compile or verification)
_building: dict[str, threading.Lock] = {}  # candidate name -> held while one thread builds it
# how ``realize`` builds a candidate with a ``draft`` in this thread's context: None,
# ``build()`` here; else fn(candidate) -> the kernel, which may verify it once for several
# processes (``sharing``). A context variable, set only inside ``with sharing(fn)``: a
# module-wide hook set by one compile's profiling sent every later compile of the process
# (another database's, another test's) through the first database's outcomes.
_sharing: ContextVar[Callable[[Candidate], object] | None] = ContextVar(
    "tensor_graphs_generated_sharing", default=None)


@contextlib.contextmanager
def sharing(fn: Callable[[Candidate], object] | None) -> Iterator[None]:
    """Inside the block (this thread's context only), ``fn(candidate)`` builds the
    candidates ``realize`` builds (None: each built and verified here). A profiling compile
    wraps its profiling and its own kernel builds in it (``profiler/shared_verify.sharing``)
    so that the profilers of one database verify a candidate once: the first builds it, the
    others read its outcome and take its ``draft`` with the tolerance the checks declared.
    On leaving, the hook before it is back."""
    token = _sharing.set(fn)
    try:
        yield
    finally:
        _sharing.reset(token)


def realize(kernel):
    """The runnable, verified kernel for a planner option's kernel: a Candidate is built once
    per process (compiled, verified); anything else is returned as it is. A candidate that
    fails is remembered in ``refused`` and the error is raised again on every later call.
    The build runs under the candidate's own lock, not the module's: a sharing hook may wait
    minutes for another process's verification (``shared_verify.PATIENCE``), and other
    threads realizing other candidates go on meanwhile; one realizing the same one waits."""
    if not isinstance(kernel, Candidate):
        return kernel
    while True:
        with _lock:
            found = _found(kernel)
            if found is not None:
                return found
            mine = _building.setdefault(kernel.name, threading.Lock())
        with mine:
            with _lock:
                if _building.get(kernel.name) is not mine:  # built (or refused) meanwhile
                    continue
                found = _found(kernel)
                if found is not None:
                    return found
            hook = _sharing.get()
            try:
                built = kernel.build() if hook is None or kernel.draft is None \
                    else hook(kernel)
            except Exception as exc:
                with _lock:
                    refused[kernel.name] = f"{type(exc).__name__}: {exc}"
                    del _building[kernel.name]
                raise
            with _lock:
                _built[kernel.name] = built
                del _building[kernel.name]
            return built


def _found(kernel: Candidate):
    """``kernel``'s built kernel, or None when not built yet; raises where it was refused.
    Called under ``_lock``."""
    found = _built.get(kernel.name)
    if found is not None:
        return found
    if kernel.name in refused:
        from tensor_graphs.errors import KernelVerificationError

        raise KernelVerificationError(f"generated kernel {kernel.name} "
                                      f"({kernel.summary}) was refused: "
                                      f"{refused[kernel.name]}")
    return None


def candidates(root: Node, uses: Mapping[Node, int], expand: Expand,
               device: str | None = None) -> list[Candidate]:
    """The candidates for the region rooted at ``root`` (refused ones left out) of the
    generators that render for ``device`` (a device kind: "cpu", "cuda"), or of every
    generator when it is None. The planner asks per slot, so only the slot's kind runs."""
    found = []
    for _name, kind, generator in generators():
        if device is not None and kind != device:
            continue
        cand = generator(root, uses, expand)
        if cand is not None and cand.name not in refused:
            found.append(cand)
    return found


def generators() -> tuple[tuple[str, str, Callable], ...]:
    """The generators as rows (name, device kind it renders for, function), imported on first
    use; a generator's candidates have that device."""
    from tensor_graphs.kernels.c import codegen, gemm_epilogue, rowgen
    from tensor_graphs.kernels.triton import generate as triton

    return (
        # elementwise DAGs of any shape: one C loop over the broadcast output
        ("elementwise", "cpu", codegen.elementwise_candidate),
        # last-axis sum/max with their elementwise prologue and epilogue: one pass per level
        ("rows", "cpu", rowgen.row_candidate),
        # the same, storing values also read outside beside the root (the residual stream a
        # norm reads): one kernel for the add and the norm, several outputs
        ("rows_stored", "cpu", rowgen.stored_row_candidate),
        # rows reached through a reshape: GroupNorm's (N, G, rest) statistics and its
        # per-channel scale and shift after the reshape back, one kernel
        ("rows_grouped", "cpu", rowgen.grouped_row_candidate),
        # a matmul on a static weight and the elementwise region after it, in the GEMM's store
        ("gemm_epilogue", "cpu", gemm_epilogue.gemm_candidate),
        # on a GPU (real or simulated), the same elementwise and row regions as Triton
        # kernels, one row per launch configuration (kernels/triton/generate.py)
        *((name, triton.DEVICE, fn) for name, fn in triton.generator_rows()),
    )


def grow(root: Node, uses: Mapping[Node, int], expand: Expand,
         inside: Callable[[Node], bool]) -> tuple[tuple[Node, ...], tuple[Node, ...],
                                                   dict[Node, Node]] | None:
    """The largest region rooted at ``root`` whose nodes satisfy ``inside`` and are read only
    inside it: ``(covers, boundary, through)``. ``covers`` are its atomic nodes in topological
    order (root last); ``boundary`` the values it reads, in first-use order; ``through`` maps
    each composite it reached through to that composite's decomposition root. A node that is
    also read outside the region is a boundary (its value is made by another step anyway);
    None when the region is the root alone. Where ``root`` is the decomposition root of a
    composite (``uses.enclosing(root)``, the planner's), the region is that composite's: its
    reads of its inputs count once, as in the use counts (its decomposition reading ``h``
    twice hid the caller's read of ``h``, and the region recomputed ``h`` beside its step)."""
    excluded: set[Node] = set()
    start = _start(root, uses)
    members = _reach(root, expand, inside, excluded, start)
    while True:  # drop nodes read outside, and what only they needed, until none is left
        reads = _reads(members, expand, start)
        outside = {n for n in members if n is not root and reads.get(n, 0) < uses.get(n, 1)}
        if not outside:
            break
        excluded |= outside
        members = _reach(root, expand, inside, excluded, start)
    return _region(root, members, expand)


def grow_stored(root: Node, uses: Mapping[Node, int], expand: Expand,
                inside: Callable[[Node], bool], keep: Callable[[Node], bool],
                limit: int = 1) -> tuple[tuple[Node, ...], tuple[Node, ...],
                                         dict[Node, Node], tuple[Node, ...]] | None:
    """``grow`` where a member also read outside may stay in the region as one more output
    (``keep`` accepts it: an atomic node the renderer can store) rather than become its
    boundary: ``(covers, boundary, through, stored)``, ``stored`` in topological order. The
    residual stream ``h = x + r`` that a norm reads and the next block reads too is then made
    by the norm's kernel, which stores it beside the norm. At most ``limit`` values are stored,
    the nearest the root (breadth first): the values a stored one is made from that others
    read too are the region's inputs (a norm's region stores the stream it reads, not the
    stream before it as well, which the previous norm's kernel stores). None when nothing is
    stored (the region is ``grow``'s) or the region is the root alone. Whether a stored value
    feeds one of the region's inputs through the outside (the kernel would need it before it
    runs) is not known here: the planner checks that its plan's steps still order
    (``planner/search.py``)."""
    excluded: set[Node] = set()
    start = _start(root, uses)
    members = _reach(root, expand, inside, excluded, start)
    while True:
        reads = _reads(members, expand, start)
        outside = [n for n in members if n is not root and reads.get(n, 0) < uses.get(n, 1)]
        dropped = {n for n in outside if not (n.op.is_atomic and keep(n))}
        dropped |= set([n for n in outside if n not in dropped][limit:])  # (breadth first)
        if not dropped:
            break
        excluded |= dropped
        members = _reach(root, expand, inside, excluded, start)
    found = _region(root, members, expand) if outside else None
    if found is None:
        return None
    covers = found[0]
    return (*found, tuple(n for n in covers if n in outside))


def _region(root: Node, members: Mapping[Node, Context], expand: Expand
            ) -> tuple[tuple[Node, ...], tuple[Node, ...], dict[Node, Node]] | None:
    """(covers in topological order, the values read from outside, composites expanded) of
    the members, or None for the root alone."""
    through = {n: expand(n) for n in members if not n.op.is_atomic}
    covers = _topological(root, members, expand)
    if len(covers) < 2:
        return None
    boundary: list[Node] = []
    for n in covers:
        for i in _inputs(n, members, expand):
            if i not in members and i not in boundary:
                boundary.append(i)
    return tuple(covers), tuple(boundary), through


# A member's context: the inputs of each composite whose decomposition it lies in, innermost
# last. The graph's use counts see a composite read its inputs once; its decomposition's reads
# of those inputs are not counted there, so they are not counted here either.
Context = tuple[frozenset, ...]


def _start(root: Node, uses: Mapping[Node, int]) -> tuple[Context, tuple[Node, ...]]:
    """Where ``root`` lies: (its context, the reads made by the composites it is the whole
    decomposition of). A root inside composites' decompositions (``uses.enclosing``, the
    planner's: innermost first) starts inside their contexts, so its region's reads of their
    inputs are theirs, which the use counts do not hold; for each composite whose whole
    decomposition the region computes (the root is its decomposition's root, and so on
    outward), the composite's own reads count once: all of them at the outermost such level,
    and at an inner one those of values made inside the next one out. () and () where
    ``uses`` does not say."""
    enclosing = getattr(uses, "enclosing", None)
    chain = list(enclosing(root)) if enclosing is not None else []
    if not chain:
        return (), ()
    ctx = tuple(frozenset(c.inputs) for c, _ in reversed(chain))  # innermost last
    reads: list[Node] = []
    for j, (composite, whole) in enumerate(chain):
        if not whole:
            break
        outer = set().union(*(c.inputs for c, _ in chain[j + 1:]))
        reads.extend(i for i in composite.inputs if i not in outer)
    return ctx, tuple(reads)


def _reach(root: Node, expand: Expand, inside: Callable[[Node], bool],
           excluded: set[Node], start: tuple[Context, tuple[Node, ...]] = ((), ())
           ) -> dict[Node, Context]:
    """Nodes reachable from ``root`` through members (with their contexts): atomic nodes
    ``inside`` accepts and composites whose decomposition root it accepts (the composite and
    that root both). ``start``: ``_start``'s (the root's own context)."""
    members: dict[Node, Context] = {}
    queue: deque[tuple[Node, Context]] = deque([(root, start[0])])
    atomic = 0
    while queue:  # breadth first: a region cut at MAX_NODES keeps the nodes nearest the root
        n, ctx = queue.popleft()
        if n in members:
            continue
        if n is not root and (n in excluded or not _joins(n, expand, inside)
                              or atomic >= MAX_NODES):
            continue
        members[n] = ctx
        atomic += n.op.is_atomic
        if n.op.is_atomic:
            queue.extend((i, _leave(ctx, i)) for i in n.inputs)
        else:
            queue.append((expand(n), ctx + (frozenset(n.inputs),)))
    return members


def _leave(ctx: Context, node: Node) -> Context:
    """The context of ``node`` read from inside ``ctx``: out of every decomposition whose
    composite's inputs it is."""
    while ctx and node in ctx[-1]:
        ctx = ctx[:-1]
    return ctx


def _reads(members: Mapping[Node, Context], expand: Expand,
           start: tuple[Context, tuple[Node, ...]] = ((), ())) -> dict[Node, int]:
    """How often members read each node, counted as the graph's use counts are (``start``:
    ``_start``'s, whose reads count once each). A member inside a decomposition reading that
    composite's input is the composite's read, not counted again (a composite member too)."""
    reads: dict[Node, int] = {}
    for i in start[1]:
        reads[i] = reads.get(i, 0) + 1
    for n, ctx in members.items():
        ins = [i for i in n.inputs if not (ctx and i in ctx[-1])]
        if not n.op.is_atomic:
            ins.append(expand(n))
        for i in ins:
            reads[i] = reads.get(i, 0) + 1
    return reads


def _joins(n: Node, expand: Expand, inside: Callable[[Node], bool]) -> bool:
    if n.op.is_leaf:
        return False
    if n.op.is_atomic:
        return inside(n)
    d = expand(n)
    return d is not None and _joins(d, expand, inside)


def _inputs(n: Node, members: set[Node], expand: Expand) -> tuple[Node, ...]:
    """What member ``n`` reads: its inputs, or for a composite its decomposition root."""
    return n.inputs if n.op.is_atomic else (expand(n),)


def _topological(root: Node, members: set[Node], expand: Expand) -> list[Node]:
    """The atomic members, inputs before users, root last."""
    order: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if ready:
            if n.op.is_atomic:
                order.append(n)
            continue
        if n in seen or n not in members:
            continue
        seen.add(n)
        stack.append((n, True))
        stack.extend((i, False) for i in reversed(_inputs(n, members, expand)))
    return order


def rebuilt(covers: tuple[Node, ...], through: Mapping[Node, Node],
            fold: Callable[[Node], Node] | None = None) -> Node:
    """The region's root rebuilt so that each composite input it reached through is replaced by
    its decomposition (what a renderer walks: atomic ops only), each rebuilt node passed through
    ``fold`` (a renderer folds ops on constants alone into constants). Only covered nodes are
    rebuilt; the rest of the graph is not touched."""
    return rebuilt_map(covers, through, fold)[covers[-1]]


def rebuilt_map(covers: tuple[Node, ...], through: Mapping[Node, Node],
                fold: Callable[[Node], Node] | None = None) -> dict[Node, Node]:
    """``rebuilt`` for every covered node: {planner's node: its rebuilt node} (a region that
    stores several values renders each one's rebuilt node)."""
    built: dict[Node, Node] = {}

    def value(n: Node) -> Node:
        if n in through:
            return value(through[n])
        return built.get(n, n)

    for n in covers:
        inputs = tuple(value(i) for i in n.inputs)
        node = n if inputs == n.inputs else Node.make(n.op, inputs, n.attrs, n.name)
        built[n] = node if fold is None else fold(node)
    return built


__all__ = ["Candidate", "candidates", "generators", "grow", "grow_stored", "realize", "rebuilt",
           "rebuilt_map", "refused", "sharing"]
