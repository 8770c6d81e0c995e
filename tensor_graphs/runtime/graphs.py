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
value (``Graphs``, an LRU of ``LIMIT``), or, for a program planned for bounds, one per
bucket of padded dims, checked on the call it is captured on (``run_padded``, below). Graphs
take no memory of their own beyond CUDA's record of their launches and what their steps
allocate inside (from one private torch pool that a program's graphs share): they read and
write the program's arena, weights and state buffers.

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

import numpy as np

from tensor_graphs.devices import raising_syncs, simulated_cuda, torch_device
from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.ops.names import INPUT, STATE, STATE_UPDATE
from tensor_graphs.ir.shapes import dim_name
from tensor_graphs.kernels.staging import current_stream

LIMIT = 64  # graphs kept per program: decode keeps its last 64 cache lengths
SEEN = 4096  # dims keys remembered as met (a key is captured on its second sighting)
MIN_BUCKET = 16  # padded graphs' smallest length: the first 16 cache lengths share a graph
PADDING = "pow2"  # padded graphs: one per power-of-two bucket; "bound": one graph; None: off
VIEWS = 1024  # a padded graph's narrowed results kept, by shape (a bucket's lengths, each once)


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


def places_overlap(a: tuple, b: tuple) -> bool:
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
                      is not None and places_overlap(instructions[m].place, ins.place)), None)
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
    try:
        with raising_syncs(), torch.cuda.stream(side):
            yield Checker(region, outs, leaving)
    finally:
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
    states: tuple  # (value index, address, shape, strides) of each kept state's prefix
    message: str
    prefix: object = None  # program._Part: the host steps and the staged feeds, per call
    suffix: object = None  # program._Part: what runs after the graph, per call

    def fits(self, values: Sequence) -> bool:
        """The kept states are the prefixes the graph captured (a rebound state may live in
        a new buffer)."""
        for i, ptr, shape, strides in self.states:
            v = values[i]
            if address(v) != ptr or tuple(v.shape) != shape or v.stride() != strides:
                return False
        return True


def address(v) -> int:
    """Where a tensor starts in its buffer's memory, also when it holds no elements: torch
    gives such a tensor a ``data_ptr()`` of 0, so a prefill's empty cache (past = 0) never
    matched the prefix its graph captured, and every generation captured the prefill again
    (and ran its padded check: three runs of the step instead of one replay). A replay
    checks every kept state (24 a GPT-2 token): one call where the tensor has elements."""
    return v.data_ptr() or v.untyped_storage().data_ptr() + v.storage_offset() * v.element_size()


def state_marks(values: Sequence, states: Sequence[int]) -> tuple:
    return tuple((i, address(values[i]), tuple(values[i].shape), values[i].stride())
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
    # padded graphs (below): "pow2" buckets, "bound" (one graph), None (one per dims value)
    padding: str | None = PADDING
    _padding: object = None  # Padding, or why the program's graph is not padded

    def split(self, instructions: Sequence, analyzed: Callable[[], Split]) -> Split | str:
        if self._for is not instructions:
            self.clear()
            self.seen.clear()
            self._for = instructions
            self._padding = None
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
        """Weights rebound (every graph read the old ones), or a new instruction list. The
        pool goes with the graphs: torch refuses to capture into a pool whose graphs are all
        gone ("use_count > 0"), which sent every call after a ``bind`` to the Python loop."""
        self.entries.clear()
        self._pool = None

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


# ----------------------------------------------------------------------------- padded dims
# One graph for many lengths. A decode step's ``past`` changes every call, and with it the
# cache prefix's shape, the append's offset and the attention's key count: one graph per value
# met (above) never replays a long generation past the LRU. A padded graph is captured at a
# bucket of each padded dim instead (``bucket``: the next power of two, at most the bound) and
# serves every value up to it: shapes are the bucket's (the cache viewed at the bucket's length
# in its buffer, an iota of the bucket's length), while every value-level use of the dim reads
# the call's own value from the GPU: the program's dim leaves (``size(past)``: positions, the
# causal mask's row) and each kept state's append rows (``device_append``: ``index_copy_`` at
# rows the GPU holds, instead of the host's offset attribute) are written before each replay
# into one small GPU buffer (``DimsFeed``: one copy, from functions of the dims compiled at the
# capture, so a replay does the exact graph's host work plus that copy: no sympy, no views
# made again, no arithmetic kernels in the graph). The keys between the call's length and
# the bucket's are masked by the graph itself (``tg.nn``'s attention masks keys past
# ``past``, built from those device values), so the results are the call's; a kept state's
# new version and every result that leaves are narrowed to the call's shapes (a prefix of the
# padded layout). Whether a program is that kind of program is checked, not assumed: at each
# padded capture the call first runs at its own dims in the Python loop, the cache past its
# length is filled with noise, and the padded warm-up must give the same results and the
# same cache (``check``); a difference refuses padding for the program, which keeps one
# graph per dims. ``padding_rules`` refuses it before anything runs where a dim reaches a
# step outside the region (an input's copy, a host step), or an append's offset is not
# linear in the dims.


def bucket(value: int, bound: int, mode: str = PADDING) -> int:
    """The padded value a graph is captured at: ``value`` itself at or past the bound."""
    if value >= bound or mode == "bound":
        return max(value, bound)
    b = MIN_BUCKET
    while b < value:
        b *= 2
    return min(b, bound)


@dataclass(frozen=True)
class Padding:
    """What padding a program's dims needs (``padding_rules``): the dims padded (names), and
    the region's appends whose offset becomes a GPU value: region position -> (constant,
    ((dim position in ``symbols``, coefficient), ...))."""

    symbols: tuple[str, ...]
    appends: Mapping[int, tuple[int, tuple[tuple[int, int], ...]]]

    def dims(self, dims: Mapping, bounds: Mapping, mode: str = PADDING) -> dict:
        out = {}
        for k, v in dims.items():
            out[k] = bucket(int(v), int(bounds[str(k)]), mode) if str(k) in self.symbols \
                else int(v)
        return out

    def key(self, named: Mapping[str, int], bounds: Mapping, mode: str = PADDING) -> tuple:
        """The graph key of the dims by name (``_key`` of ``dims(...)``), each dim's name
        made once per call: a sympy symbol's ``str`` runs its printer."""
        return ("padded", *sorted((k, bucket(v, int(bounds[k]), mode) if k in self.symbols
                                   else v) for k, v in named.items()))


def _symbols_in(value) -> set[str]:
    """Names of the dims a shape or attribute value mentions (nested tuples, lists, dicts)."""
    import sympy

    if isinstance(value, sympy.Basic):
        return {str(s) for s in value.free_symbols}
    if isinstance(value, (tuple, list)):
        return set().union(*(_symbols_in(v) for v in value)) if value else set()
    if isinstance(value, dict):
        return _symbols_in(tuple(value.values()))
    return set()


def _linear(expr, names: Sequence[str]) -> tuple[int, tuple[tuple[int, int], ...]] | None:
    """``expr`` as c0 + sum(c_i * dim_i) with integer c (None otherwise)."""
    import sympy

    expr = sympy.sympify(expr)
    free = {str(s): s for s in expr.free_symbols}
    if not set(free) <= set(names):
        return None
    try:
        poly = sympy.Poly(expr, *free.values()) if free else None
    except sympy.PolynomialError:
        return None
    if poly is not None and poly.total_degree() > 1:
        return None
    const = expr.subs({s: 0 for s in free.values()})
    if not sympy.sympify(const).is_Integer:
        return None
    terms = []
    for name, s in free.items():
        c = sympy.sympify(expr.coeff(s))
        if not c.is_Integer:
            return None
        terms.append((list(names).index(name), int(c)))
    return int(const), tuple(terms)


def padding_rules(instructions: Sequence, leaves: Sequence, split: Split,
                  bounds: Mapping | None) -> Padding | str:
    """The dims a program's graph may be padded in, or why none: a dim with a bound that no
    step outside the region and no input reads; in the region, a kept state's append whose
    offset is linear in the dims (it is moved onto the GPU)."""
    if not bounds:
        return "no bounds (a padded graph is captured at a bucket up to a dim's bound)"
    outside = [instructions[n] for n in split.prefix] + list(instructions[split.last:])
    named = set()
    for ins in outside:
        named |= _symbols_in(ins.shape) | _symbols_in(ins.attrs)
    for _, node in leaves:
        if node.op.name == INPUT:
            named |= _symbols_in(tuple(node.shape))
    symbols = tuple(sorted(str(k) for k in bounds if str(k) not in named))
    if not symbols:
        return "every bounded dim reaches an input or a step outside the graph"
    appends = {}
    for pos, n in enumerate(split.region):
        ins = instructions[n]
        if ins.kernel is None or ins.kernel.op != STATE_UPDATE \
                or not _symbols_in(ins.attrs.get("offset")) & set(symbols):
            continue
        if ins.kernel.name != "torch_cuda_state_update":
            return f"{ins.name} appends at an offset of the dims on the host"
        lin = _linear(ins.attrs["offset"], symbols)
        if lin is None:
            return f"{ins.name}'s offset {ins.attrs['offset']} is not linear in {symbols}"
        appends[pos] = lin
    return Padding(symbols, appends)


def device_append(index) -> Callable:
    """``state_update`` for a padded graph: the state is the cache at the bucket's length,
    the new rows go at the rows ``index`` holds on the GPU (the call's offset and the rows
    after it, written by ``DimsFeed`` before each replay), and the result is the cache at the
    bucket's length plus the new rows, a view of the buffer (the host's ``offset`` attribute,
    the bucket's, is not read). The index is computed on the host: arithmetic on the GPU
    would add a handful of one-element kernels per append to every replay (24 appends in
    GPT-2: ~150 launches), each one costing a launch's time inside the graph."""

    def append(state, value, *, axis: int, offset=None, out=None):
        longer = grown(state, value, axis=axis)
        longer.index_copy_(axis, index, value)
        return longer

    return append


def grown(state, value, *, axis: int, offset=None, out=None):
    """The cache ``state`` viewed with room for ``value``'s rows along ``axis`` (its buffer
    holds them: the padded graph's bucket is within the bound): ``device_append`` copies the
    rows there; a fold into the attention (``runtime/appends.py``) leaves that to it."""
    shape = list(state.shape)
    shape[axis] += value.shape[axis]
    return state.as_strided(tuple(shape), state.stride(), state.storage_offset())


def _evaluator(value) -> Callable[[Mapping[str, int]], object]:
    """``value`` (a dim expression, or a flat tuple of them: a shape) as a function of the
    dims by name, compiled once (sympy.lambdify) at a capture: a replay then resolves no
    sympy expression (``shapes.resolve`` costs ~20 us a shape, and a padded replay resolved
    ~50 of them per token)."""
    import sympy

    from tensor_graphs.ir.shapes import free_symbols, resolve

    symbols = sorted(free_symbols(value), key=str)
    names = tuple(str(s) for s in symbols)
    if not symbols:
        return lambda named: value
    if isinstance(value, tuple) and any(isinstance(v, tuple) for v in value):
        return lambda named: resolve(value, {s: named[n] for s, n in zip(symbols, names)})
    if isinstance(value, tuple):
        fn = sympy.lambdify(symbols, list(value), "math")
        return lambda named: tuple(int(v) for v in fn(*[named[n] for n in names]))
    fn = sympy.lambdify(symbols, value, "math")
    return lambda named: int(fn(*[named[n] for n in names]))


def _rows_at(symbols: Sequence[str], const: int, terms: tuple[tuple[int, int], ...],
             rows: int) -> Callable[[Mapping[str, int]], np.ndarray]:
    """The rows an append writes, as a function of the dims by name: its offset (``const +
    sum(c * dim)``, ``padding_rules``) and the ``rows - 1`` after it."""
    base = np.arange(rows, dtype=np.int64)

    def rows_at(named: Mapping[str, int]) -> np.ndarray:
        start = const
        for k, c in terms:
            start += c * named[symbols[k]]
        return base + start

    return rows_at


class DimsFeed:
    """What a padded graph reads of the call's dims on the GPU, in one buffer: each slot a
    dim leaf (``size(past)``: positions, the mask's row) or an append's row index, at an
    8-byte aligned offset. ``write`` fills a host copy of it from the dims (compiled
    functions, no sympy) and moves it in one host->GPU copy per replay, where refreshing
    each tensor apart cost a synchronous copy each (pageable host memory: torch waits for
    the copy) and a sympy substitution each. On a real GPU the host copy is pinned and the
    move asynchronous; an event recorded after it is waited on before the host copy is
    written again (a host that runs ahead may find the last move not yet done)."""

    def __init__(self, device: str):
        self.device = device
        self.slots: list[tuple[int, np.dtype, tuple, Callable]] = []  # offset, dtype, shape, fn
        self.size = 0
        self.host = self.gpu = self.done = None
        self.real = False  # a real GPU: pinned host copy, asynchronous move
        self._fill: list[tuple[np.ndarray, Callable]] = []

    def add(self, fn: Callable[[Mapping[str, int]], object], dtype, shape: tuple) -> int:
        """A slot for ``fn(named dims)`` (an array of ``shape`` in ``dtype``): its number."""
        dtype = np.dtype(dtype)
        offset = -(-self.size // 8) * 8
        self.size = offset + max(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 1)
        self.slots.append((offset, dtype, tuple(shape), fn))
        return len(self.slots) - 1

    def allocate(self) -> None:
        import torch

        self.real = simulated_cuda() is None
        size = -(-self.size // 8) * 8 or 8
        self.host = torch.zeros(size, dtype=torch.uint8, pin_memory=self.real)
        self.gpu = torch.zeros(size, dtype=torch.uint8, device=torch_device(self.device))
        raw = self.host.numpy()
        self._fill = []
        for offset, dtype, shape, fn in self.slots:
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            self._fill.append((raw[offset:offset + n].view(dtype).reshape(shape), fn))

    def view(self, slot: int):
        """Slot ``slot`` of the GPU buffer, the tensor a graph reads (its address is fixed)."""
        from tensor_graphs.kernels.torch import convert

        offset, dtype, shape, _ = self.slots[slot]
        n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return self.gpu[offset:offset + n].view(convert.torch_dtype(dtype)).reshape(shape)

    def write(self, named: Mapping[str, int]) -> None:
        """The call's dims into the GPU buffer: one copy (none where the graph reads none)."""
        if not self.slots:
            return
        if self.done is not None:
            self.done.synchronize()  # the last copy has read the host buffer
        for part, fn in self._fill:
            part[...] = fn(named)
        if not self.real:
            self.gpu.copy_(self.host)
            return
        import torch

        self.gpu.copy_(self.host, non_blocking=True)
        if self.done is None:
            self.done = torch.cuda.Event()
        self.done.record(current_stream(self.gpu.device.index))


def widen(value, shape: tuple):
    """A kept state's prefix viewed at a padded shape in its buffer (same strides); None
    where the buffer has no room."""
    import torch

    if tuple(value.shape) == tuple(shape):
        return value
    end = value.storage_offset() + sum((n - 1) * s for n, s in zip(shape, value.stride())) + 1
    if min(shape, default=1) > 0 and end * value.element_size() > value.untyped_storage().nbytes():
        return None
    return torch.as_strided(value, tuple(shape), value.stride(), value.storage_offset())


def narrow(value, shape: tuple):
    """A padded result seen at the call's shape: its leading part along each axis."""
    if not hasattr(value, "stride") or tuple(value.shape) == tuple(shape):
        return value
    return value.as_strided(tuple(shape), value.stride(), value.storage_offset())


def noise(value, axis: int, start: int, seed: int = 0) -> None:
    """Fill a kept state past ``start`` along ``axis`` with finite noise: a padded graph that
    read it unmasked would differ from the call's own run."""
    import torch

    n = value.shape[axis] - start
    if n <= 0:
        return
    part = value.narrow(axis, start, n)
    g = torch.Generator().manual_seed(seed)
    part.copy_((torch.randn(tuple(part.shape), generator=g) * 2).to(part.dtype))


def _tolerance(dtype) -> float:
    """How far a padded run's float result may be from the call's own: the same kernels on
    the same values, reductions over masked keys of weight exactly 0 (differences are
    reduction order only, never the masked noise)."""
    name = str(dtype)
    return 2e-2 if ("float16" in name or "bfloat16" in name) else 1e-4


def compare(got: Sequence, want: Sequence) -> str | None:
    """Why a padded run's results are not the call's own (None: they are)."""
    import torch

    for k, (a, b) in enumerate(zip(got, want)):
        a, b = (t if isinstance(t, torch.Tensor) else torch.as_tensor(np.asarray(t))
                for t in (a, b))
        if tuple(a.shape) != tuple(b.shape):
            return f"result {k} has shape {tuple(a.shape)}, the call's {tuple(b.shape)}"
        if a.is_floating_point():
            x, y = a.double().cpu(), b.double().cpu()
            if not bool(torch.isfinite(x).all()) and not bool(torch.equal(x.isnan(), y.isnan())):
                return f"result {k} is not finite where the call's is"
            x, y = torch.nan_to_num(x), torch.nan_to_num(y)
            den = float(torch.linalg.vector_norm(y)) or 1.0
            err = float(torch.linalg.vector_norm(x - y)) / den
            if err > _tolerance(a.dtype):
                return f"result {k} differs from the call's by {err:.1e}"
        elif not bool(torch.equal(a.cpu(), b.cpu())):
            return f"result {k} differs from the call's"
    return None


NOT_PADDED = object()  # run_padded's answer where the per-dims graphs (above) take the call
GPU_LOOP = "python loop: the program has GPU steps"


@dataclass
class PaddedCapture(Captured):
    """A padded graph: ``Captured`` plus what a replay refreshes (the call's dims on the GPU,
    in one copy) and how it reads results back at the call's shapes. What a replay needs of
    the dims is compiled at its capture: no sympy per token, the kept states' padded views
    kept (not made again), the result shapes from compiled functions."""

    feed: DimsFeed | None = None  # the dim leaves and append indices the graph reads
    wide: tuple = ()  # (value index, padded view, address, strides) per kept state
    narrowing: tuple = ()  # (shape's evaluator, ((value index, padded result, strides,
    #                         storage offset), ...)): results that leave, by symbolic shape
    steps: int = 0
    views: dict = field(default_factory=dict)  # (group, shape) -> narrowed results, made once

    def adopt(self, values: list) -> bool:
        """The kept states' prefixes (``values``, the call's) swapped for the padded views of
        the same buffers the graph captured; False where one moved (a rebound state in a new
        buffer: the captured view holds the old one, so an equal address is the same)."""
        for i, wide, ptr, strides in self.wide:
            v = values[i]
            if address(v) != ptr or v.stride() != strides:
                return False
            values[i] = wide
        return True

    def narrowed(self, values: list, named: Mapping[str, int]) -> None:
        """The results that leave, at the call's shapes: each a leading part of its padded
        layout, the shapes evaluated once per symbolic shape (a model's layers share them)
        and the views made once per shape (a decode meets each length once a generation;
        ``as_strided`` costs ~4 us, 24 of them a GPT-2 token), at most ``VIEWS`` shapes."""
        for i, v in self.live.items():
            values[i] = v
        for k, (shape_of, group) in enumerate(self.narrowing):
            shape = shape_of(named)
            views = self.views.get((k, shape))
            if views is None:
                if len(self.views) >= VIEWS:
                    self.views.clear()
                views = self.views[k, shape] = tuple(
                    (i, v.as_strided(shape, strides, offset)) for i, v, strides, offset in group)
            for i, view in views:
                values[i] = view


def _key(dims: Mapping) -> tuple:
    return ("padded", *sorted((str(k), int(v)) for k, v in dims.items()))


def _widened(exe, values: list, states: Sequence[int], gdims: Mapping) -> bool:
    """The kept states' prefixes viewed at the padded dims' shapes; False where a buffer is
    too short (a state bound beyond its bound's room)."""
    from tensor_graphs.ir.shapes import resolve

    nodes = dict(exe.leaves)
    for i in states:
        wide = widen(values[i], tuple(resolve(tuple(nodes[i].shape), gdims)))
        if wide is None:
            return False
        values[i] = wide
    return True


def _clone(v):
    return v.clone() if hasattr(v, "clone") else np.array(v, copy=True)


def run_padded(exe, arrays: Mapping, dims: Mapping):
    """One call of ``exe`` (a ``program.Executable``) through the padded graph of its dims'
    bucket (captured first on the bucket's second sighting); None where the Python loop runs
    it (``exe.native.last`` says why); ``NOT_PADDED`` where padding does not apply and the
    per-dims graphs take the call."""
    graphs = exe.graphs
    bounds = getattr(exe, "bounds", None)
    if graphs.padding is None or not bounds:
        return NOT_PADDED
    split = exe._split()
    if isinstance(split, str):
        return NOT_PADDED
    if graphs._padding is None:
        graphs._padding = padding_rules(exe.instructions, exe.leaves, split, bounds)
    pad = graphs._padding
    if isinstance(pad, str):
        return NOT_PADDED
    named = {dim_name(k): int(v) for k, v in dims.items()}
    key = pad.key(named, bounds, graphs.padding)
    gdims = None  # the padded dims with the call's keys, made where no graph replays
    entry = graphs.get(key)
    if isinstance(entry, str):
        exe.native.last = entry
        return None
    if entry is None:
        gdims = pad.dims(dims, bounds, graphs.padding)
        try:
            exe.bound(gdims)  # the kernels' constraints at the bucket
        except Exception:  # noqa: BLE001 - a kernel chosen at the bounds refuses the bucket
            return NOT_PADDED
        if not graphs.sighted(key):
            exe.native.last = (f"{GPU_LOOP}, first call with these dims (padded to "
                               f"{dict(key[1:])}: the next one captures a CUDA graph)")
            return None
    values, feeds = exe._load(arrays, dims, True, entry.held if entry else None)
    if entry is not None and entry.adopt(values):  # a replay
        exe.native.last = entry.message
        entry.feed.write(named)
        entry.prefix.run(values, feeds=feeds, stage=True)
        entry.graph.replay()
        entry.narrowed(values, named)
        entry.suffix.run(values)
        return [values[i] for i in exe.outputs]
    if entry is not None:  # a state moved to a new buffer: captured again
        values, feeds = exe._load(arrays, dims, True)
        gdims = pad.dims(dims, bounds, graphs.padding)
    if not _widened(exe, values, split.states, gdims):
        return NOT_PADDED
    try:
        entry, results = _capture_padded(exe, split, pad, dims, gdims, arrays, values, feeds)
    except Refused as exc:
        graphs._padding = f"padding refused: {exc}"
        graphs.entries.pop(key, None)
        exe.native.last = f"{GPU_LOOP} and no padded CUDA graph: {exc}"
        return None  # (the Python loop runs the call again from its leaves)
    graphs.put(key, entry)
    return results


def _capture_padded(exe, split: Split, pad: Padding, dims: Mapping, gdims: Mapping,
                    arrays: Mapping, values: list, feeds: dict) -> tuple[PaddedCapture, list]:
    """Check padding on this call (its own run, then the padded warm-up over noise past its
    length: the same results), then capture the padded region. Returns the entry and the
    call's results (the warm-up's)."""
    import dataclasses

    from tensor_graphs.ir.ops.names import DIM
    from tensor_graphs.ir.shapes import resolve
    from tensor_graphs.runtime.appends import fold as fold_appends
    from tensor_graphs.runtime.chains import fold as fold_chains

    device = exe.names.get("cuda", "cuda:0")
    nodes = dict(exe.leaves)
    # the call at its own dims, in the Python loop: what the padded run must give
    own, own_feeds = exe._load(arrays, dims, True)
    prefix, region_own, suffix = exe._parts(split, dims)
    prefix.run(own, feeds=own_feeds, stage=True)
    region_own.run(own)
    suffix.run(own)
    want = [_clone(own[i]) for i in exe.outputs]
    for i in split.states:  # noise past each state's length (the new rows included)
        real = tuple(resolve(tuple(nodes[i].shape), dims))
        wide = tuple(values[i].shape)
        axes = [a for a, (x, y) in enumerate(zip(real, wide)) if x != y]
        if len(axes) > 1:
            raise Refused(f"state '{nodes[i].name}' is padded along several axes")
        if axes:
            more = list(wide)
            more[axes[0]] += 1
            room = widen(values[i], tuple(more))
            noise(room if room is not None else values[i], axes[0], real[axes[0]])
    # the padded warm-up, reading the dims it needs on the GPU from one buffer
    _, region, _ = exe._parts(split, gdims)
    named = {dim_name(k): int(v) for k, v in dims.items()}
    feed = DimsFeed(device)
    dim_slots = {i: feed.add(_evaluator(nodes[i].attrs["expr"]), nodes[i].dtype.np_dtype,
                             tuple(values[i].shape))
                 for i in split.held if nodes[i].op.name == DIM}
    index_slots: dict[tuple, int] = {}  # (const, terms, rows) -> slot: appends share one
    appends = {}
    for pos, (const, terms) in pad.appends.items():
        ins = region.instructions[pos]
        rows = resolve(tuple(ins.input_shapes[1]), gdims)[int(region.attrs[pos]["axis"])]
        slot = (const, terms, rows)
        if slot not in index_slots:
            index_slots[slot] = feed.add(_rows_at(pad.symbols, const, terms, rows), np.int64,
                                         (rows,))
        appends[pos] = index_slots[slot]
    feed.allocate()
    for i, slot in dim_slots.items():
        values[i] = feed.view(slot)
    feed.write(named)
    swapped = [dataclasses.replace(ins, fn=device_append(feed.view(appends[pos])))
               if pos in appends else ins for pos, ins in enumerate(region.instructions)]
    swapped = fold_appends(swapped, appends, feed.view)  # into the attention reading them
    swapped = fold_chains(swapped)  # consecutive GEMVs: one launch
    region = region._replace(instructions=swapped)
    held = {i: values[i] for i in split.held}
    marks = state_marks(values, split.states)
    wide = tuple((i, values[i], address(values[i]), values[i].stride()) for i in split.states)
    prefix.run(values, feeds=feeds, stage=True)
    reads = {a for ins in region.instructions for a in ins.args}
    staged = [v if i in reads else None for i, v in enumerate(values)]
    checker = None
    try:
        with warming(device, region.instructions, region.outs, split.leaving) as checker:
            region.run(values, checker)
    except Refused:
        raise
    except Exception as exc:
        why = sync_reason(exc)
        if why is None or checker is None:
            raise
        raise Refused(f"{region.instructions[checker.step].name} synchronizes with the "
                      f"host: {why}") from None
    moved = allocated(values, split.live, [*exe.arenas.values(), *staged])
    if moved is not None:
        name = next(ins.name for ins in region.instructions if ins.out == moved)
        raise Refused(f"{name}'s result leaves the graph in memory allocated inside it")
    live = {i: values[i] for i in split.live}
    shapes = {exe.instructions[n].out: tuple(exe.instructions[n].shape) for n in split.region}
    narrowing: dict[tuple, list] = {}
    for i, v in live.items():
        if hasattr(v, "as_strided") and _symbols_in(shapes[i]):
            narrowing.setdefault(shapes[i], []).append((i, v, v.stride(), v.storage_offset()))
    entry = PaddedCapture(None, live, held, marks, "", prefix, suffix, feed, wide,
                          tuple((_evaluator(shape), tuple(group))
                                for shape, group in narrowing.items()),
                          len(region.instructions))
    entry.narrowed(values, named)
    suffix.run(values)
    got = [values[i] for i in exe.outputs]
    why = compare(got, want)
    if why is not None:
        raise Refused(f"the graph padded to {dict(_key(gdims)[1:])} does not give the call's "
                      f"results ({why}): its kernels read past the dims' own length")
    graph, at = exe.graphs.new_graph(device), Steps()
    try:
        graph.capture(lambda recorder=at: region.run(list(staged), recorder), checker)
    except Exception as exc:
        name = region.instructions[at.step].name
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise Refused(f"capturing {name} failed: {why}") from None
    exe.graphs.captures += 1
    padded = ", ".join(f"{s} <= {gdims_value(gdims, s)}" for s in pad.symbols)
    entry.graph = graph
    entry.message = (f"cuda graph: replayed {entry.steps} GPU steps in one launch (padded: "
                     f"{padded})")
    exe.native.last = (f"cuda graph: captured {entry.steps} GPU steps padded to {padded} "
                       "(later calls up to there replay it)")
    return entry, got


def gdims_value(dims: Mapping, name: str) -> int:
    return next(int(v) for k, v in dims.items() if str(k) == name)
