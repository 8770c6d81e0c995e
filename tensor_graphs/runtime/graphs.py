"""CUDA graphs: a GPU program's steps captured once per dims and replayed as one launch.

Launching is the cost of a small GPU step: torch spends ~7 us of host time per kernel and
Triton's launcher 20-40 us (an H200), so a GPT-2 decode step of ~150 launches costs 2-5 ms of
host time in the Python loop, more than its GPU work. A CUDA graph records the launches once
and replays them with one call.

What is captured: a program's per-call instructions fall in three runs. The *prefix* runs on
the host before any GPU step: host steps and the copies that bring inputs (and values the host
computed) to the GPU, each into its arena place, which is where the graph reads them. A copy
of an input that the plan puts among the GPU steps (a second input read late: an attention
mask) joins the prefix: the memory plan keeps its place live from step 0, so no earlier GPU
step writes there. The *region* runs from the first step that reads on the GPU to the last
step that writes there, less those copies: GPU steps only, which the graph captures. The
*suffix* copies results to the host and finishes there. The first call with some dims runs in
the Python loop and notes them; the second stages its feeds, warms the region up (its results
are the call's) and captures it; later ones run the prefix (the feeds are copied into their
places, outside the graph), replay the graph, and run the suffix on what the graph left in
place. Decode meets each cache length once per generation, so one generation captures
nothing, and a repeated one (serving, a benchmark) captures, then replays.

Every address that the suffix or the caller reads after a replay must be the one the warm-up
left it at: a result that leaves the region (an output, a value the suffix reads, a kept
state) is written into its arena place, or is memory of a value made before the region (a
view, an in-place append to a state). A result used only inside the region may be allocated
by its kernel (torch SDPA or rotary without out=, a strided input made dense): torch's graph
pool replays the allocation at its captured address, and the same kernels read it there. So
``analyze`` refuses a program (the reason is in ``prog.loop``) where a host step runs inside
the region, a result that leaves it has no place of its own, a copy to the GPU has no place,
or an input lives on the GPU. The warm-up before a capture (``Checker``: a side stream on a
real GPU) refuses dims where a result that leaves was allocated after all, or a step
synchronized with the host (``.item()``, a shape that depends on values). Kernels read their
shapes from the dims, and decode's ``past`` changes the grids, so there is one graph per dims
value (``Graphs``, an LRU of ``LIMIT``). Graphs take no memory of their own beyond CUDA's
record of their launches and what their steps allocate inside (from one private torch pool
that a program's graphs share): they read and write the program's arena, weights and state
buffers.

On the simulated GPU (``devices.simulated_cuda``) there is no CUDA graph: ``SimulatedGraph``
keeps the region's run over the values staged at capture and runs it again at each replay,
through the same value slots: a result allocated inside is allocated anew and handed to its
readers (where a real graph replays the allocation at its address), every result that leaves
must land in its place, and the launches must be the warm-up's. So CI checks what a real
graph depends on: static places, results that leave written in place, in-place appends, the
LRU, the refusals. What only a real GPU shows: that a capture with allocations inside replays
them at their captured addresses (torch's guarantee), and the bit-for-bit decode check.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from tensor_graphs.devices import simulated_cuda, torch_device
from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.ops.names import INPUT, STATE, STATE_UPDATE

LIMIT = 64  # graphs kept per program: decode keeps its last 64 cache lengths
SEEN = 4096  # dims keys remembered as met (a key is captured on its second sighting)


class Refused(Exception):  # noqa: N818 - a reason, not a failure: the Python loop runs instead
    """Why a program, or one dims binding of it, is not captured."""


def _source(ins) -> int | None:
    """The argument whose memory the step's result is, when it takes none of its own: a view
    (of its input 0), an in-place kernel (of the input it overwrites); None otherwise. A kept
    state's append (``torch_cuda_state_update``) writes into the state's buffer: -1."""
    k = ins.kernel
    if k is None:
        return None
    if k.op == STATE_UPDATE:
        return -1
    if k.view and ins.args:
        return ins.args[0]
    if k.inplace is not None and 0 <= k.inplace < len(ins.args):
        return ins.args[k.inplace]
    return None


@dataclass(frozen=True)
class Context:
    """What the region rules read beside the instruction: the values made in the region that
    leave it (the suffix or the outputs read them) without an address fixed before the graph
    (an arena place, or memory of a value made before the region)."""

    loose: frozenset[int]


# Steps the region may not hold: the first row that holds gives the reason (``{name}`` is the
# kernel's name).
REGION_RULES: tuple[tuple[Callable, str], ...] = (
    # a graph replays GPU work only; a host step between GPU steps would be skipped
    (lambda ins, cx: ins.reads == "cpu" or ins.device == "cpu",
     "{name} runs on the host, or copies to it, between the first and the last GPU step"),
    # a result allocated inside the graph is replayed at the address of its capture (torch's
    # graph pool): fine for steps of the graph, but what the suffix or the caller reads must
    # be where the warm-up left it, in the arena
    (lambda ins, cx: ins.out in cx.loose,
     "{name} allocates its result (no out= place in the arena) and the result leaves the "
     "graph (an output, or read after the last GPU step)"),
)
# Steps before the region (host steps, copies to the GPU) that would break the graph.
PREFIX_RULES: tuple[tuple[Callable, str], ...] = (
    # a copy without an arena place hands the GPU a new tensor per call
    (lambda ins, cx: ins.device != "cpu" and ins.place is None,
     "{name} brings a value to the GPU outside the arena (no place)"),
)


@dataclass(frozen=True)
class Split:
    """Where a program's instructions divide (see the module doc), and what a replay keeps."""

    first: int  # the region lies in instructions[first:last]
    last: int
    prefix: tuple[int, ...]  # instructions[:first] and the input copies staged before the region
    region: tuple[int, ...]  # instructions[first:last] less the staged copies: GPU steps only
    live: tuple[int, ...]  # values the region makes that the suffix or the outputs read
    leaving: frozenset[int]  # the same, as a set (the warm-up checks where they are)
    states: tuple[int, ...]  # kept states' leaf values on the GPU (their buffers' addresses)
    held: tuple[int, ...]  # other GPU leaves made per call (a dim's value): kept from capture


def _overlap(a: tuple, b: tuple) -> bool:
    """Two arena places (device, offset, bytes) share bytes."""
    return a[0] == b[0] and a[1] < b[1] + b[2] and b[1] < a[1] + a[2]


def analyze(instructions: Sequence, leaves: Sequence, kinds: Mapping[int, str],
            static: set[int], outputs: Sequence[int]) -> Split:
    """The program's split, or Refused with the first rule it breaks. The copies of inputs to
    the GPU that lie among the GPU steps (a second input, read late) run before the region:
    the memory plan keeps their places live from step 0 (``memory/liveness.py``), which is
    checked here, as no earlier GPU step may write there."""
    gpu_reads = [n for n, ins in enumerate(instructions) if ins.reads != "cpu"]
    gpu_writes = [n for n, ins in enumerate(instructions) if ins.device != "cpu"]
    if not gpu_reads:
        raise Refused("no step runs on the GPU per call")
    first, last = gpu_reads[0], gpu_writes[-1] + 1
    for i, node in leaves:
        if node.op.name == INPUT and kinds.get(i, "cpu") != "cpu":
            raise Refused(f"input '{node.name}' lives on the GPU (a graph would read the "
                          "first feed's memory)")
    staged = tuple(n for n in range(first, last) if instructions[n].copy_in)
    region = tuple(n for n in range(first, last) if not instructions[n].copy_in)
    prefix = (*range(first), *staged)
    made = {instructions[n].out for n in region}
    read_after = {a for ins in instructions[last:] for a in ins.args} | set(outputs)
    fixed: set[int] = set()  # region values at addresses fixed before the graph runs
    for n in region:
        ins = instructions[n]
        src = _source(ins)
        if ins.place is not None or src == -1 or (src is not None and (
                src not in made or src in fixed)):
            fixed.add(ins.out)
    leaving = made & read_after
    cx = Context(frozenset(leaving - fixed))
    for rules, part in ((PREFIX_RULES, prefix), (REGION_RULES, region)):
        for n in part:
            for broken, reason in rules:
                if broken(instructions[n], cx):
                    raise Refused(reason.format(name=instructions[n].name))
    for n in staged:
        ins = instructions[n]
        early = next((instructions[m] for m in range(first, n) if instructions[m].place
                      is not None and _overlap(instructions[m].place, ins.place)), None)
        if early is not None:
            raise Refused(f"{ins.name} (a feed, staged before the graph) shares its arena "
                          f"place with {early.name}, an earlier GPU step")
    gpu_leaves = [(i, node) for i, node in leaves
                  if i not in static and kinds.get(i, "cpu") != "cpu"]
    return Split(first, last, prefix, region, tuple(sorted(leaving)), frozenset(leaving),
                 tuple(i for i, node in gpu_leaves if node.op.name == STATE),
                 tuple(i for i, node in gpu_leaves if node.op.name != STATE))


# ----------------------------------------------------------------------------- syncs
# Torch functions that wait for the GPU (a value or a shape read on the host): a real GPU's
# warm-up finds them with torch.cuda.set_sync_debug_mode("error"); the simulated GPU, whose
# tensors are the host's, watches for these calls instead. (function path, what it reads)
SYNCS: tuple[tuple[str, str], ...] = (
    ("Tensor.item", "a value read on the host (.item())"),
    ("Tensor.tolist", "values read on the host (.tolist())"),
    ("Tensor.numpy", "values read on the host (.numpy())"),
    ("Tensor.cpu", "a copy to the host (.cpu())"),
    ("Tensor.__bool__", "a truth value read on the host (bool(tensor))"),
    ("Tensor.__int__", "a value read on the host (int(tensor))"),
    ("Tensor.__float__", "a value read on the host (float(tensor))"),
    ("Tensor.__index__", "a value read on the host (an index from a tensor)"),
    ("Tensor.nonzero", "a shape that depends on the values (nonzero)"),
    ("nonzero", "a shape that depends on the values (nonzero)"),
    ("Tensor.masked_select", "a shape that depends on the values (masked_select)"),
    ("masked_select", "a shape that depends on the values (masked_select)"),
    ("unique", "a shape that depends on the values (unique)"),
    ("Tensor.unique", "a shape that depends on the values (unique)"),
)
MASK_INDEX = "a shape that depends on the values (indexing with a boolean mask)"


class Synced(Exception):  # noqa: N818 - raised inside a kernel, turned into a refusal
    """A kernel called a function that waits for the GPU (``SYNCS``)."""


def _watch():
    """A TorchFunctionMode raising Synced on the calls in ``SYNCS`` while ``active``."""
    import torch
    from torch.overrides import TorchFunctionMode

    table = {}
    for path, why in SYNCS:
        obj = torch
        for part in path.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            table[obj] = why

    def mask_index(args) -> bool:
        index = args[1] if len(args) > 1 else None
        parts = index if isinstance(index, tuple) else (index,)
        return any(isinstance(p, torch.Tensor) and p.dtype == torch.bool for p in parts)

    class Watch(TorchFunctionMode):
        active = True

        def __torch_function__(self, func, types, args=(), kwargs=None):
            if self.active:
                why = table.get(func)
                if why is None and func is torch.Tensor.__getitem__ and mask_index(args):
                    why = MASK_INDEX
                if why is not None:
                    raise Synced(why)
            return func(*args, **(kwargs or {}))

    return Watch()


def sync_reason(exc: BaseException) -> str | None:
    """What a kernel waited for, when ``exc`` (raised by a warm-up or a capture) says it
    synchronized with the host; None for any other error."""
    seen = exc
    while seen is not None:
        if isinstance(seen, Synced):
            return str(seen)
        text = str(seen)
        if "synchronizing CUDA operation" in text or "operation not permitted when stream is " \
                "capturing" in text or "cudaErrorStreamCapture" in text:
            return text.splitlines()[0]
        seen = seen.__cause__
    return None


# ----------------------------------------------------------------------------- warm-up
class Steps:
    """A recorder for ``program._execute`` that only notes which step runs (a capture's: a
    refusal names the kernel)."""

    step = 0

    def begin_step(self, name: str, n: int) -> None:
        self.step = n

    def after(self, ins, kw, given, args, raw, out) -> None:
        pass


class Checker(Steps):
    """The warm-up's recorder (``program._execute`` calls ``begin_step`` and ``after``): a
    step whose result leaves the region (``leaving``: the suffix or the outputs read it)
    writes into its out= place, or returns memory of one of its arguments (a view; a kept
    state appended in place). Anything else it allocated would move at the next replay while
    the call's results are read where the warm-up left them. A result used only inside the
    region may be allocated (a kernel without out=, a strided input made dense): the graph
    replays its allocation at the same address. ``outs``: the region's out= places, by
    position. ``calls`` records each launch (the kernel's name and function, the argument
    tensors, its keywords and out= place; a view launches nothing)."""

    def __init__(self, region: Sequence, outs: Sequence, leaving: frozenset = frozenset(),
                 watch=None):
        self.region, self.outs, self.leaving, self.watch = region, outs, leaving, watch
        self.calls: list[tuple] = []

    def begin_step(self, name: str, n: int) -> None:
        self.step = n
        if self.watch is not None:  # the interpreter runs Triton on the host: not a sync
            self.watch.active = self.region[n].kernel is None or \
                self.region[n].kernel.backend != "triton"

    def after(self, ins, kw, given, args, raw, out) -> None:
        buf = self.outs[self.step]
        if ins.out in self.leaving:
            if buf is not None:
                if raw is not buf or out is not buf:
                    raise Refused(f"{ins.name} allocated its result instead of writing into "
                                  "its out= place (and the result leaves the graph)")
            elif not any(_shares(out, g) for g in given):  # (not the dense copies made here)
                raise Refused(f"{ins.name} allocated its result (it is neither a view of its "
                              "inputs nor an in-place append) and the result leaves the graph")
        if ins.kernel is None or not ins.kernel.view:
            self.calls.append((ins.name, ins.fn, tuple(args), kw, buf))


def _shares(a, b) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    except AttributeError:  # not tensors (a host value): nothing shared on the GPU
        return False


def allocated(values: Sequence, live: Sequence[int], before: Sequence) -> int | None:
    """The first of ``live`` (values the region hands on) whose memory the region allocated:
    none of ``before`` (the arenas, and the values made before the region: weights, states,
    staged feeds) holds it. A view of a result allocated inside lands here (the step that
    allocated passed the warm-up's check, its own result staying inside)."""
    roots = set()
    for v in before:
        try:
            roots.add(v.untyped_storage().data_ptr())
        except AttributeError:
            continue
    for i in live:
        v = values[i]
        try:
            root = v.untyped_storage().data_ptr()
        except AttributeError:
            continue
        if root not in roots:
            return i
    return None


@contextlib.contextmanager
def warming(device: str, region: Sequence, outs: Sequence, leaving: frozenset = frozenset()
            ) -> Iterator[Checker]:
    """The warm-up of a capture: every kernel runs once before it is captured (Triton compiles,
    cuBLAS picks its algorithms and allocates its workspace), on a side stream on a real GPU
    with torch's sync debug mode raising on a synchronizing call; the simulated GPU watches
    for the calls in ``SYNCS``. The mode is torch's, process-wide: the caller's is given back
    when the warm-up ends, also on an error, but while it runs another thread's synchronizing
    GPU call raises too."""
    import torch

    if simulated_cuda() is not None:
        watch = _watch()
        with watch:
            yield Checker(region, outs, leaving, watch)
        return
    dev = torch.device(torch_device(device))
    side = torch.cuda.Stream(device=dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    mode = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.stream(side):
            yield Checker(region, outs, leaving)
    finally:
        torch.cuda.set_sync_debug_mode(mode)
        torch.cuda.current_stream(dev).wait_stream(side)


# ----------------------------------------------------------------------------- graphs
class CudaGraph:
    """torch.cuda.CUDAGraph over the region, in the pool the program's graphs share."""

    def __init__(self, device: str, pool):
        import torch

        self.torch = torch
        self.device = torch.device(torch_device(device))
        self.pool = pool
        self.graph = torch.cuda.CUDAGraph()

    def capture(self, run: Callable, warmed: Checker) -> None:
        """Record the launches of ``run()`` (the region over the staged values, after
        ``warmed``, its warm-up); nothing runs."""
        with self.torch.cuda.device(self.device), \
                self.torch.cuda.graph(self.graph, pool=self.pool):
            run()

    def replay(self) -> None:
        with self.torch.cuda.device(self.device):
            self.graph.replay()


class SimulatedGraph:
    """The simulated GPU's stand-in for a CUDA graph, with its interface. ``capture`` keeps
    the region's run over the values staged at capture (``run(recorder)``: the addresses a
    graph would hold) and the warm-up's launches (``calls``); ``replay`` runs the region again
    through those value slots, as a graph replays its kernels on the same addresses. A result
    allocated inside (a kernel without out=) is allocated anew and handed to the later steps,
    where a real graph replays the allocation at its captured address: the same bytes to the
    same readers. The replay checks what a graph depends on: the same launches in the same
    order, and every result that leaves the region written where the warm-up left it."""

    def __init__(self):
        self.calls: list[tuple] = []
        self._run: Callable | None = None
        self._checker: Callable[[], Checker] | None = None

    def capture(self, run: Callable, warmed: Checker) -> None:
        self.calls = list(warmed.calls)
        self._run = run
        self._checker = lambda: Checker(warmed.region, warmed.outs, warmed.leaving)

    def replay(self) -> None:
        checker = self._checker()
        try:
            self._run(checker)
        except Refused as exc:
            raise EvaluationError(f"CUDA graph replay: {exc} (at replay)") from None
        names = [c[0] for c in checker.calls]
        if names != [c[0] for c in self.calls]:
            raise EvaluationError(f"CUDA graph replay: launched {names}, the capture "
                                  f"{[c[0] for c in self.calls]}")


@dataclass
class Captured:
    """One dims binding's graph, and the values a replay reads back or keeps."""

    graph: CudaGraph | SimulatedGraph
    live: dict[int, object]  # value index -> the tensor the region leaves it in
    held: dict[int, object]  # per-call GPU leaves as captured (functions of the dims)
    states: tuple  # (value index, data_ptr, shape, strides) of each kept state's prefix
    message: str
    prefix: object = None  # program._Part: the host steps and the staged feeds, per call
    suffix: object = None  # program._Part: what runs after the graph, per call

    def fits(self, values: Sequence) -> bool:
        """The kept states are the prefixes the graph captured (a rebound state may live in
        a new buffer)."""
        for i, ptr, shape, strides in self.states:
            v = values[i]
            if v.data_ptr() != ptr or tuple(v.shape) != shape or v.stride() != strides:
                return False
        return True


def state_marks(values: Sequence, states: Sequence[int]) -> tuple:
    return tuple((i, values[i].data_ptr(), tuple(values[i].shape), values[i].stride())
                 for i in states)


@dataclass
class Graphs:
    """A program's graphs by dims key, the least recently used dropped beyond ``limit``; a
    key refused holds its reason instead. ``split`` is analysed once per instruction list
    (tools that swap the list, like ``runtime/steps.py``, get a new analysis)."""

    limit: int = LIMIT
    entries: OrderedDict = field(default_factory=OrderedDict)
    seen: OrderedDict = field(default_factory=OrderedDict)  # dims keys met once, not captured
    captures: int = 0  # graphs captured, ever (evicted ones included)
    _split: object = None  # Split, or the reason the program is refused
    _for: object = None  # the instruction list it was made for
    _pool: object = None

    def split(self, instructions: Sequence, analyzed: Callable[[], Split]) -> Split | str:
        if self._for is not instructions:
            self.entries.clear()
            self.seen.clear()
            self._for = instructions
            try:
                self._split = analyzed()
            except Refused as exc:
                self._split = str(exc)
        return self._split

    def get(self, key: tuple):
        found = self.entries.get(key)
        if found is not None:
            self.entries.move_to_end(key)
        return found

    def sighted(self, key: tuple) -> bool:
        """Whether ``key`` was met before (then it is captured now, or again once evicted); a
        first sighting is noted and runs in the Python loop. Decode meets each cache length
        once per generation: capturing on sight would pay a capture per token and never
        replay within it, while repeated generations (serving, benchmarks) meet them again.
        The native loop records on the second sighting too (``native.RECORD_AFTER``)."""
        if key in self.seen:
            self.seen.move_to_end(key)
            return True
        self.seen[key] = None
        while len(self.seen) > SEEN:
            self.seen.popitem(last=False)
        return False

    def put(self, key: tuple, entry) -> None:
        self.entries[key] = entry
        self.entries.move_to_end(key)
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        """Weights rebound: every graph read the old ones."""
        self.entries.clear()

    def new_graph(self, device: str):
        """A CUDA graph on a real GPU, the stand-in on the simulated one. A program's graphs
        share one pool: they never run at once and none reads memory of the pool after it
        ends (results are in the arena), which makes any replay order safe (the case
        pytorch/pytorch#166975 documents)."""
        if simulated_cuda() is not None:
            return SimulatedGraph()
        import torch

        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return CudaGraph(device, self._pool)
