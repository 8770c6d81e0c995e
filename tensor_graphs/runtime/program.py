"""CompiledGraph: a planned graph that runs, called like a function.

A call validates its feeds exactly as ``tg.evaluate`` does (names, kinds, shapes, dims), picks
the plan for the dims it binds (planned at compile time, or on the first call with new dims
when the graph has symbolic dims and no bounds; tg.compile's pipeline builds it), and runs
its program (``runtime/lower.py``) as a flat list: each instruction calls a kernel function on
the values of earlier slots and drops every value after its last use. Weights are bound once
(``bind``) in the user's layout. Where every instruction is a C kernel, a dims binding seen
before runs as one foreign call instead (``runtime/native.py``); a GPU program runs as a CUDA
graph captured once per dims (``runtime/graphs.py``); ``prog.loop`` says which loop ran and
why.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import weakref
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import sympy

from tensor_graphs.devices import as_device, release_later, track
from tensor_graphs.errors import (
    ArgumentError,
    EvaluationError,
    FeedError,
    ShapeError,
    StateError,
    TensorGraphsError,
)
from tensor_graphs.ir.evaluate import bind_feeds, check_int_range, require_feeds
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.index_limits import check_indices, index_limits
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import CONSTANT, DIM, INPUT, STATE, WEIGHT
from tensor_graphs.ir.shapes import dim_name, format_shape, free_symbols, is_static, resolve
from tensor_graphs.kernels import storage
from tensor_graphs.kernels.torch import bound
from tensor_graphs.kernels.torch import state as gpu_state
from tensor_graphs.planner.plan import Plan
from tensor_graphs.runtime import graphs as _graphs
from tensor_graphs.runtime import native as _native
from tensor_graphs.runtime import values as dv
from tensor_graphs.runtime.lower import Instruction, Program
from tensor_graphs.runtime.state import State, kept_states

if TYPE_CHECKING:
    from torch import Tensor as torch_Tensor

# (the native loop runs host C kernels only; a GPU program runs as a CUDA graph where it can)
GPU_LOOP = "python loop: the program has GPU steps"


class OutsideConstraintsError(Exception):
    """A program planned for bounds meets dims where a chosen kernel does not apply."""


class Executable:
    """A lowered program (``runtime/lower.py``) that runs: leaf loaders, the prelude once per
    weight binding, the instructions per call.

    A program lowered from a plan made for bounds has symbolic shapes; ``bound(dims)``
    resolves its attributes, shapes and arena places for one set of dims (cached), and checks
    every kernel's constraints there. The arena is laid out once, at the bounds: a value never
    needs more bytes at smaller dims, so its place still fits (checked; otherwise it is
    allocated)."""

    def __init__(self, program: Program, devices: Mapping[str, str] | None = None):
        """``devices``: the device each kind of the plan means ({"cuda": "cuda:1"}; a GPU
        kind defaults to its device 0)."""
        self.program = program
        self.names = {"cpu": "cpu", "cuda": "cuda:0", **dict(devices or {})}
        self.kinds = program.devices  # value index -> the device kind holding it
        self.gpu = any(kind != "cpu" for kind in program.kinds)
        self.plan = program.plan
        self.memory = program.memory  # the MemoryPlan of ``twin`` (the plan at the bounds)
        self.twin = program.at
        self.size = program.size
        self.leaves = list(program.leaves)
        self.prelude = list(program.prelude)
        # (tools time them by replacing fns); a copy names the GPU it moves to
        self.instructions = [self._named(ins) for ins in program.instructions]
        self.prepared = list(program.prepared)
        self.outputs = list(program.outputs)
        self.static = list(program.static)
        self._static_set = set(self.static)
        # the leaves a call loads once the prelude's results are cached (a decode step: its
        # token, states and dims, not the ~150 weights of GPT-2)
        self._per_call = [(i, node) for i, node in self.leaves if i not in self._static_set]
        self._dense_static = list(program.dense_static)
        self.symbols = list(program.symbols)
        self._inputs = list(program.inputs)
        self._static_values: list | None = None
        self.arenas: dict = {}  # device kind -> its arena (numpy bytes, or a torch tensor)
        self._bindings: dict[tuple, tuple] = {}
        self._resolvers: list | None = None
        self._checks: list | None = None  # instructions whose constraints depend on the dims
        self._checked: dict[tuple, None] = {}  # dims whose constraints hold
        self._generation = 0  # counts prelude runs: a native recording holds their results
        self.native = _native.NativeLoop()
        self._fit: tuple | None = None  # (dims the native loop fits over, Domain, DIM leaves)
        self.shared_results = False  # the last run's results live in memory runs reuse
        self.owned_results: frozenset[int] = frozenset()  # ... except these (own_outputs)
        self.graphs = _graphs.Graphs()  # CUDA graphs by dims (a GPU program's, runtime/graphs.py)
        self.bounds: dict | None = None  # a program planned for bounds: they (padded graphs)

    def own_outputs(self, kept: Collection[int] = ()) -> None:
        """Outputs a host kernel would write into the arena are made by the kernel in an array
        of their own each call instead, and handed to the caller as they are: an arena
        result is copied out (GPT-2's 25.7 MB of prefill logits: 1 ms of its ~68). The
        native loop relocates their pointers to new arrays per call, as it does an input's
        (``runtime/native.py``). Not for ``kept`` output positions (the kept states, which
        live in buffers of their own), values stored beside a result, a GPU program's, or
        one whose shape follows the dims (a recording fitted over dims sizes no per-call
        buffer, ``native_dims``). Before the first call (bindings and resolvers are made
        from the instructions)."""
        if self.gpu:  # (its outputs' copies to the host go where a CUDA graph expects them)
            return
        kept_values = {self.outputs[p] for p in kept}
        made = {ins.out: j for j, ins in enumerate(self.instructions)}
        for v in set(self.outputs) - kept_values:
            j = made.get(v)
            ins = self.instructions[j] if j is not None else None
            if ins is None or ins.place is None or ins.device != "cpu" or ins.also \
                    or ins.overwrite is not None or not all(isinstance(d, int) for d in ins.shape):
                continue  # (a shape of the dims: the native loop's fit needs arena bytes)
            self.instructions[j] = dataclasses.replace(ins, place=None, fresh=True,
                                                       own_output=True)
        self._bindings.clear()
        self._resolvers = self._checks = None

    def _named(self, ins: Instruction) -> Instruction:
        """A copy's target device kind ("cuda") as the device it means ("cuda:0")."""
        target = ins.attrs.get("device")
        if ins.kernel is None or ins.kernel.backend != "copy" or target not in self.names:
            return ins
        return dataclasses.replace(ins, attrs={**ins.attrs, "device": self.names[target]})

    def _arenas(self) -> dict:
        """One arena per device, allocated on first use: numpy bytes on the host, a torch
        uint8 tensor on a GPU; each counted in its Device.allocated."""
        if not self.arenas and self.memory is not None:
            for kind, n in self.memory.arena.items():
                name = as_device(self.names.get(kind, kind)).name
                self.arenas[kind] = dv.new_arena(name, n)
                track(name, n)
                weakref.finalize(self, release_later, name, n)
        return self.arenas

    def _resolvers_made(self) -> list:
        if self._resolvers is None:
            self._resolvers = [_InstructionResolver(ins, self.symbols)
                               for ins in self.instructions]
        return self._resolvers

    def check(self, dims: Mapping) -> None:
        """Raises OutsideConstraintsError when a kernel's constraints fail at ``dims``. Only
        the instructions whose constraints read shapes that depend on the dims are checked,
        each distinct (kernel, shapes, attributes) once (a model's layers share them), and
        dims that passed are remembered: a decode step checks its attention once, not per
        layer."""
        key = dims_key(dims)
        if key in self._checked:
            return
        if self._checks is None:
            groups: dict = {}
            for ins, r in zip(self.instructions, self._resolvers_made()):
                if r.shape_dependent_check:
                    groups.setdefault(_check_key(ins), (ins, r))
            self._checks = list(groups.values())
        values = tuple(int(dims[s]) for s in self.symbols)
        for ins, r in self._checks:
            reason = ins.kernel.constraint_failure(r.inputs(values), ins.dtypes, r.attrs(values))
            if reason is not None:
                raise OutsideConstraintsError(f"{ins.name} at {dict(key)}: {reason}")
        if len(self._checked) >= 256:
            self._checked.pop(next(iter(self._checked)))
        self._checked[key] = None

    def bound(self, dims: Mapping) -> tuple[list, list, list]:
        """Per instruction at ``dims``: attributes, result shape and arena array (or None).
        Raises OutsideConstraintsError when a kernel's constraints fail there."""
        key = dims_key(dims)
        found = self._bindings.get(key)
        if found is not None:
            return found
        self.check(dims)
        arenas = self._arenas()
        values = tuple(int(dims[s]) for s in self.symbols)
        attrs, shapes, outs = [], [], []
        for ins, r in zip(self.instructions, self._resolvers_made()):
            shape, a = r.shape(values), r.attrs(values)
            if min(shape, default=0) < 0:
                raise ShapeError(_below_zero(ins, shape, key))
            buf = None
            if ins.place is not None:
                device, offset, room = ins.place
                if math.prod(shape) * ins.dtype.itemsize <= room:
                    buf = dv.arena_view(arenas[device], offset, shape, ins.dtype)
            attrs.append(a)
            shapes.append(shape)
            outs.append(buf)
        found = (attrs, shapes, outs)
        if len(self._bindings) >= 64:
            self._bindings.pop(next(iter(self._bindings)))
        self._bindings[key] = found
        return found

    def invalidate(self) -> None:
        """Weights changed: the prelude runs again on the next call."""
        self._static_values = None
        self._generation += 1
        self.graphs.clear()  # they read the old weights' memory

    def run(self, arrays: Mapping[str, np.ndarray], dims: Mapping,
            cache_static: bool = True, native: bool = True,
            graphs: bool = True) -> list[np.ndarray]:
        """One call. ``cache_static``: the weights are the bound ones, so the prelude's results
        from an earlier call stand (False when a call feeds weights itself). ``native``: the
        native loop may run it (``runtime/native.py``, at dims never seen before through
        ``runtime/native_dims.py``); ``graphs``: a GPU program may run as a CUDA graph
        (``runtime/graphs.py``). After the call ``native.last`` says which loop ran and why,
        and ``shared_results`` whether the results must be copied (but ``owned_results``)."""
        loop, recorder, sample = self.native, None, None
        self.shared_results, self.owned_results = False, frozenset()
        if self.gpu:
            if graphs and cache_static:
                got = self._graph_run(arrays, dims)
                if got is not None:
                    return got
            else:
                loop.last = (f"{GPU_LOOP} and CUDA graphs are off for this call "
                             "(prog.cuda_graphs is False, or the call feeds weights or states)")
        elif not (native and cache_static):
            loop.last = ("python loop: the native loop is off for this call (prog.native is "
                         "False, or the call feeds weights or states)")
        elif self._static_values is not None:
            key = dims_key(dims)
            recording = loop.lookup(key, self._generation, arrays)
            if recording is not None:
                made = recording.fresh()  # the outputs' arrays of this call (own_outputs)
                if recording.run(self._feeds(arrays) + made) == 0:
                    loop.last = (f"native loop: {recording.count} C calls in one foreign call")
                    self.shared_results = True
                    self.owned_results = recording.owned
                    return recording.results(made)
                # a C function reported an error: the Python loop runs it again and raises
            else:
                point = self._fit_values(dims)
                if point is not None:
                    fitted = loop.fitted(self._generation, arrays, point)
                    if fitted is not None:
                        got = fitted.run(point, self._feeds(arrays))
                        if not isinstance(got, int):
                            loop.last = (f"native loop: {fitted.count} C calls in one foreign "
                                         "call (fitted over dims)")
                            self.shared_results = True
                            return got
                        # a C function reported an error: the Python loop raises it
                    elif loop.wants_sample(self._generation, point):
                        sample = point
                if (sample is not None or loop.wants(key)) \
                        and _native.RECORD_LOCK.acquire(blocking=False):
                    # (another thread recording: not this call); a recording fitted over dims
                    # keeps its outputs in its own buffers
                    recorder = _native.Recorder(own_outputs=sample is None)
                else:
                    sample = None
                    found = loop.recordings.get(key)
                    if isinstance(found, str):
                        loop.last = found
                    elif isinstance(loop.symbolic, str):  # why no fit over dims
                        loop.last = loop.symbolic
                    elif loop.symbolic is not None:
                        loop.last = ("python loop: dims outside those the native loop was "
                                     "fitted over (a dim that never varied took another value, "
                                     "or an extent is below 2)")
                    else:
                        loop.last = ("python loop: first call with these dims (the next one "
                                     "is recorded)")
        else:
            loop.wants(dims_key(dims))  # a sighting all the same: the next call records
            loop.last = "python loop: the prelude runs (weights bound since the last call)"
        attrs, shapes, outs = self.bound(dims)
        values, feeds = self._load(arrays, dims, cache_static)
        if recorder is None:
            _execute(self.instructions, values, attrs, shapes, outs, self.arenas, None, feeds)
            return [values[i] for i in self.outputs]
        try:
            return self._record(recorder, arrays, dims, values, attrs, shapes, outs, sample)
        finally:
            _native.RECORD_LOCK.release()

    def _load(self, arrays: Mapping, dims: Mapping, cache_static: bool,
              skip: Mapping | None = None) -> tuple[list, dict]:
        """The values a call starts from: its leaves, and the prelude's results (run when the
        weights changed, or every call that feeds weights). Returns (values, the inputs fed
        as GPU tensors). ``skip``: leaves not loaded but set to the value given (a CUDA
        graph's per-dims leaves, kept from its capture)."""
        values: list = [None] * self.size
        cached = cache_static and self._static_values is not None
        feeds: dict[int, object] = {}  # input values fed as GPU tensors: copies skip them
        for i, node in self._per_call if cached else self.leaves:
            if skip and i in skip:
                values[i] = skip[i]
            elif not (cached and i in self._static_set):
                values[i] = self._leaf(i, node, arrays, dims, feeds)
        if self._static_values is None or not cache_static:
            _execute(self.prelude, values, [ins.attrs for ins in self.prelude],
                     [ins.shape for ins in self.prelude], [None] * len(self.prelude), {})
            for i in self._dense_static:  # made dense once per binding, not per call
                values[i] = dense(values[i])
            for p in self.prepared:  # e.g. packed weights
                v = values[p.source]
                values[p.index] = p.prepare(dense(v) if p.dense else v)
            static = [(i, values[i]) for i in self.static]
            if cache_static:
                self._static_values = static
        for i, v in self._static_values if cache_static else ():
            values[i] = v
        return values, feeds

    def _split(self) -> _graphs.Split | str:
        """Where the instructions divide for a CUDA graph, or why they cannot be captured
        (``runtime/graphs.py``), analysed once per instruction list."""
        return self.graphs.split(self.instructions, lambda: _graphs.analyze(
            self.instructions, self.leaves, self.kinds, self._static_set, self.outputs))

    def _graph_run(self, arrays: Mapping, dims: Mapping) -> list | None:
        """One call through the CUDA graph of these dims (captured first when there is
        none), or None, with the reason in ``native.last``, where the Python loop must run
        it instead: a first sighting of the dims, or a refusal. The feeds go into their arena
        places outside the graph (the prefix); results are read from where the graph leaves
        them."""
        loop = self.native
        got = _graphs.run_padded(self, arrays, dims)  # one graph per bucket of lengths
        if got is not _graphs.NOT_PADDED:
            return got
        split = self._split()
        if isinstance(split, str):
            loop.last = f"{GPU_LOOP} and no CUDA graph: {split}"
            return None
        key = dims_key(dims)
        entry = self.graphs.get(key)
        if isinstance(entry, str):
            loop.last = entry
            return None
        if entry is None and not self.graphs.sighted(key):
            loop.last = (f"{GPU_LOOP}, first call with these dims (the next one captures a "
                         "CUDA graph)")
            return None
        values, feeds = self._load(arrays, dims, True, entry.held if entry else None)
        if entry is not None and not entry.fits(values):  # a state moved to a new buffer
            values, feeds = self._load(arrays, dims, True)
            entry = None
        if entry is None:  # the warm-up's results are this call's
            try:
                entry = self._capture(split, dims, values, feeds)
            except _graphs.Refused as exc:
                loop.last = f"{GPU_LOOP} and no CUDA graph at {dict(key)}: {exc}"
                self.graphs.put(key, loop.last)
                return None  # (the Python loop runs the call again from its leaves)
            self.graphs.put(key, entry)
        else:
            loop.last = entry.message
            entry.prefix.run(values, feeds=feeds, stage=True)
            entry.graph.replay()
        for i, v in entry.live.items():
            values[i] = v
        entry.suffix.run(values)
        return [values[i] for i in self.outputs]

    def _parts(self, split: _graphs.Split, dims: Mapping) -> tuple[_Part, _Part, _Part]:
        """The prefix (with the staged feeds), the region and the suffix at ``dims``."""
        attrs, shapes, outs = self.bound(dims)

        def part(positions) -> _Part:
            return _Part([self.instructions[n] for n in positions], [attrs[n] for n in positions],
                         [shapes[n] for n in positions], [outs[n] for n in positions],
                         self.arenas)

        return (part(split.prefix), part(split.region),
                part(range(split.last, len(self.instructions))))

    def _capture(self, split: _graphs.Split, dims: Mapping, values: list,
                 feeds: dict) -> _graphs.Captured:
        """Stage the feeds, warm the region up (each kernel once, checked:
        ``graphs.Checker``), then capture it; raises graphs.Refused where it cannot be. The
        warm-up computes this call (a capture runs nothing), so its values are the results;
        the capture starts again from the staged values (the warm-up dropped some)."""
        device = self.names.get("cuda", "cuda:0")
        prefix, region, suffix = self._parts(split, dims)
        held = {i: values[i] for i in split.held}
        marks = _graphs.state_marks(values, split.states)
        prefix.run(values, feeds=feeds, stage=True)
        reads = {a for ins in region.instructions for a in ins.args}
        staged = [v if i in reads else None for i, v in enumerate(values)]
        checker = None
        try:
            with _graphs.warming(device, region.instructions, region.outs,
                                 split.leaving) as checker:
                region.run(values, checker)
        except _graphs.Refused:
            raise
        except Exception as exc:  # a kernel that synchronized (else the call's own error)
            why = _graphs.sync_reason(exc)
            if why is None or checker is None:
                raise
            name = region.instructions[checker.step].name
            raise _graphs.Refused(f"{name} synchronizes with the host: {why}") from None
        moved = _graphs.allocated(values, split.live, [*self.arenas.values(), *staged])
        if moved is not None:
            name = next(ins.name for ins in region.instructions if ins.out == moved)
            raise _graphs.Refused(f"{name}'s result leaves the graph in memory allocated "
                                  "inside it (a view of a result without an out= place)")
        live = {i: values[i] for i in split.live}
        graph, at = self.graphs.new_graph(device), _graphs.Steps()
        try:
            graph.capture(lambda recorder=at: region.run(list(staged), recorder), checker)
        except Exception as exc:  # the warm-up ran it: what failed is the capture itself
            name = region.instructions[at.step].name
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise _graphs.Refused(f"capturing {name} failed: {why}") from None
        self.graphs.captures += 1
        steps = len(region.instructions)
        self.native.last = (f"cuda graph: captured {steps} GPU steps at "
                            f"{dict(dims_key(dims))} (later calls with these dims replay it)")
        return _graphs.Captured(graph, live, held, marks,
                                f"cuda graph: replayed {steps} GPU steps in one launch",
                                prefix, suffix)

    def _leaf(self, i: int, node: Node, arrays: Mapping, dims: Mapping, feeds: dict):
        """Leaf ``i``'s value where the plan holds it: a host value as numpy, a GPU value as a
        tensor on that GPU (bound weights are there already; a constant or a weight fed per
        call crosses through the copy kernel). An input fed as a GPU tensor goes to ``feeds``
        (the copy that would bring it there is skipped) and to the host only where a host
        kernel reads it."""
        kind = self.kinds.get(i, "cpu")
        given = arrays.get(node.name)
        if self.gpu and node.op.name == INPUT and kind == "cpu" \
                and dv.is_on(given, self.names["cuda"]):
            feeds[i] = dv.dense(given, node.dtype.np_dtype)
            return dv.on_host(given, node.dtype.np_dtype) \
                if i in self.program.host_reads else None
        value = leaf_value(node, arrays, dims)
        if kind == "cpu":
            return dv.on_host(value, node.dtype.np_dtype) if dv.is_tensor(value) else value
        name = self.names.get(kind, kind)
        if dv.is_on(value, name):
            return value  # (a kept state's prefix stays the strided view it is)
        return dv.on_device(value, name, node.dtype.np_dtype)

    def _feeds(self, arrays: Mapping) -> list[np.ndarray]:
        return [dense(dv.on_host(arrays[node.name]), node.dtype.np_dtype)
                for _, node in self._inputs]

    def _fit_values(self, dims: Mapping) -> tuple[int, ...] | None:
        """The values of the dims the native loop fits its recordings over, when these dims
        lie where it may (``native_dims``: symbolic extents >= 2); None otherwise, and for a
        program without symbolic dims or one whose recordings cannot be fitted."""
        if self._fit is None:
            self._fit = self._fit_setup()
        symbols, domain, _ = self._fit
        if domain is None:
            return None
        values = tuple(int(dims[s]) for s in symbols)
        return values if domain.holds(values) else None

    def _fit_setup(self) -> tuple:
        """(dims, Domain or None, DIM leaves' functions) for ``native_dims``; the dims are
        the instructions' and those per-dims leaves read (a ``size(past)`` fed to a kernel)."""
        from tensor_graphs.runtime import native_dims

        symbols = set(self.symbols)
        exprs = {}
        for i, node in self.leaves:
            if node.op.name == DIM and i not in self._static_set:
                exprs[i] = sympy.sympify(node.attrs["expr"])
                symbols |= exprs[i].free_symbols
        symbols = sorted(symbols, key=str)
        if not symbols:
            return symbols, None, {}
        domain = native_dims.analyze(self.instructions, symbols)
        bad = next((e for e in exprs.values() if not e.is_polynomial(*symbols)), None)
        if bad is not None:
            domain = f"a per-dims leaf is {bad}, not a polynomial of the dims"
        if isinstance(domain, str):
            self.native.refuse(f"python loop: dims change every call and {domain}")
            return symbols, None, {}
        return symbols, domain, {i: _resolver(e, symbols) for i, e in exprs.items()}

    def _record(self, recorder, arrays, dims, values, attrs, shapes, outs, sample) -> list:
        """Run the Python loop while ``recorder`` notes the C calls; keep the recording when
        the native loop can replay it (see ``runtime/native.py``), and when ``sample`` (the
        fitted dims' values) is given, offer it to the fit over dims (``native_dims``)."""
        from tensor_graphs.errors import CCompileError
        from tensor_graphs.kernels.c import lib
        from tensor_graphs.runtime.native_dims import Context

        key, loop = dims_key(dims), self.native
        for device, arena in self.arenas.items():
            recorder.fixed(arena, ("arena", device))
        for i, v in self._static_values:
            recorder.fixed(v, ("static", i))
        states = []
        for i, node in self.leaves:
            v = values[i]
            if i in self._static_set or dv.is_tensor(v):  # (a GPU value only the prelude reads)
                continue
            if node.op.name == INPUT:
                recorder.input(v)
            elif node.op.name == STATE:
                if v is not arrays[node.name]:
                    recorder.fail(f"state '{node.name}' is not a view of its buffer")
                recorder.fixed(v, ("state", node.name))
                states.append((node.name, storage._root(v), v.__array_interface__["data"][0],
                               v.strides))
            else:
                recorder.fixed(v, ("leaf", i))  # dims and constants of these dims: as recorded
        if recorder.overlapping():  # an input shares bytes with another or with the program
            _execute(self.instructions, values, attrs, shapes, outs, self.arenas)
            loop.last = "python loop: an input overlaps another input or the program's memory"
            return [values[i] for i in self.outputs]
        lib.recording = recorder
        try:
            _execute(self.instructions, values, attrs, shapes, outs, self.arenas, recorder)
        finally:
            lib.recording = None
        results = [values[i] for i in self.outputs]
        try:
            recording = recorder.finish(results)
        except (_native.NotNativeError, CCompileError) as exc:
            loop.last = f"python loop: {exc}"
            loop.store(key, loop.last)
            if sample is not None:
                loop.refuse(loop.last)
            return results
        loop.store(key, (recording, self._generation, states))
        loop.last = f"python loop: recorded {recording.count} C calls for the native loop"
        self.shared_results = True  # kernel-allocated results are reused by later runs,
        self.owned_results = recording.owned  # but for the outputs replays make anew
        if sample is not None:
            symbols, _, leaves = self._fit
            try:
                loop.add_sample(recorder.sample(results, sample, states),
                                Context(tuple(map(str, symbols)), leaves, self._generation))
            except (_native.NotNativeError, CCompileError) as exc:
                loop.refuse(f"python loop: dims change every call and {exc}")
            if not (loop.symbolic is None or isinstance(loop.symbolic, str)):
                loop.last += " (and fitted a native loop over dims)"
        return results


def _below_zero(ins: Instruction, shape: tuple, key: tuple) -> str:
    """Why dims make a step's result shape negative. A symbolic dim is planned as at least 1,
    so ``x[1:]`` of a dim ``n`` is ``n - 1`` long; a call that binds ``n=0`` made it -1, and
    the arena view of it failed with numpy's bare "negative dimensions are not allowed"."""
    bound = ", ".join(f"{k}={v}" for k, v in key)
    return (f"{ins.name}: its result of shape {format_shape(ins.shape)} is "
            f"{format_shape(shape)} at {bound}: a slice or index reaches past the end of a "
            f"dim that small (x[1:] of an empty axis)")


def _check_key(ins: Instruction):
    """Instructions with one key have the same constraints at any dims."""
    key = (ins.name, tuple(ins.input_shapes), tuple(ins.dtypes),
           tuple(sorted(ins.attrs.items(), key=lambda kv: kv[0])))
    try:
        hash(key)
    except TypeError:
        return id(ins)
    return key


_RESOLVERS: dict = {}  # (value, symbols) -> resolver: the layers of a model share their shapes


def _resolver(value, symbols: list):
    """A fast function of the dims' values (in ``symbols`` order) giving ``value`` with its
    dims resolved: compiled once with sympy.lambdify, so a new sequence length costs
    microseconds per instruction, not a symbolic substitution."""
    key = (value, tuple(symbols))
    found = _RESOLVERS.get(key)
    if found is None:
        found = _RESOLVERS[key] = _make_resolver(value, symbols)
    return found


def _make_resolver(value, symbols: list):
    if not free_symbols(value):
        return lambda _: value
    if isinstance(value, tuple) and all(not isinstance(v, tuple) for v in value):
        fn = sympy.lambdify(symbols, list(value), "math")  # one call for a whole shape
        return lambda d: tuple(int(v) for v in fn(*d))
    if isinstance(value, tuple):
        parts = [_resolver(v, symbols) for v in value]
        return lambda d: tuple(p(d) for p in parts)
    fn = sympy.lambdify(symbols, value, "math")
    return lambda d: int(fn(*d))


class _InstructionResolver:
    """An instruction's shape, attributes and input shapes as functions of the dims."""

    def __init__(self, ins: Instruction, symbols: list):
        self.shape = _resolver(tuple(ins.shape), symbols)
        symbolic = {k: _resolver(v, symbols) for k, v in ins.attrs.items()
                    if isinstance(v, (sympy.Basic, tuple)) and free_symbols(v)}
        fixed = dict(ins.attrs)
        self.attrs = (lambda d: {**fixed, **{k: f(d) for k, f in symbolic.items()}}) \
            if symbolic else (lambda _: fixed)
        self.inputs = _resolver(tuple(ins.input_shapes), symbols)
        k = ins.kernel
        self.shape_dependent_check = k is not None and k.where is not None and bool(
            free_symbols(tuple(ins.input_shapes)) or symbolic)


class _Part(NamedTuple):
    """A run of instructions with what ``_execute`` needs at one dims binding."""

    instructions: list
    attrs: list
    shapes: list
    outs: list
    arenas: Mapping

    def run(self, values: list, recorder=None, feeds: Mapping | None = None,
            stage: bool = False) -> None:
        _execute(self.instructions, values, self.attrs, self.shapes, self.outs, self.arenas,
                 recorder, feeds, stage)


def _execute(instructions: list[Instruction], values: list, attrs: list, shapes: list,
             outs: list, arenas: Mapping, recorder=None, feeds: Mapping | None = None,
             stage: bool = False) -> None:
    """Run ``instructions`` over ``values``; ``outs[i]`` is where instruction i writes (its
    arena place) or None. A kernel that allocates but hands back memory inside an arena (an
    undeclared alias of an input) gets its result copied out, so arena reuse stays safe.
    ``recorder``: a native-loop recorder told about each instruction after it ran. ``feeds``:
    inputs fed as GPU tensors, which the copies of those inputs to the GPU hand on as they are,
    or with ``stage`` copy into their arena places (a CUDA graph reads its inputs there).
    Host values are numpy arrays, GPU values torch tensors (``runtime/values.py``)."""
    regions = list(arenas.values())
    with np.errstate(all="ignore"):
        for n, (ins, kw, shape, buf) in enumerate(zip(instructions, attrs, shapes, outs)):
            if ins.copy_in and feeds and ins.args[0] in feeds:  # already on the GPU
                fed = feeds[ins.args[0]]
                values[ins.out] = buf.copy_(fed) if stage and buf is not None else fed
                for f in ins.free:
                    values[f] = None
                continue
            given = args = [values[a] for a in ins.args]
            if ins.contiguous:  # views (a permute, a slice) are made dense first
                args = [a if dv.is_dense(a) else dense(a) for a in args]
            if recorder is not None:
                recorder.begin_step(ins.name, n)
            stored = _stored(ins, shape, arenas) if getattr(ins, "also", ()) else None
            call = kw if stored is None else {**kw, "also": stored}  # values the kernel
            try:  # stores besides its result, each an array of its own
                if getattr(ins, "overwrite", None) is not None and _overwrite(ins, kw, values):
                    out = raw = given[0]  # the state, its new version written over it
                elif buf is not None:
                    out = raw = ins.fn(*args, out=buf, **call)
                    if out is not buf and dv.is_tensor(out) and any(  # a GPU kernel may
                            dv.inside(out, r) for r in regions):  # allocate after all
                        out = dv.copy(out)
                else:
                    out = raw = ins.fn(*args, **call)
                    if ins.fresh and regions and not dv.fresh(out) and any(
                            dv.inside(out, r) for r in regions):
                        out = dv.copy(out)
                if tuple(out.shape) != tuple(shape):
                    raise ValueError(f"returned shape {format_shape(out.shape)}, the plan "
                                     f"expects {format_shape(shape)}")
            except Exception as exc:
                shown = ", ".join(format_shape(tuple(values[a].shape)) for a in ins.args)
                raise EvaluationError(f"kernel {ins.name} on inputs of shapes {shown}: "
                                      f"{type(exc).__name__}: {exc}") from exc
            if recorder is not None:
                recorder.after(ins, kw, given, args, raw, out)
            values[ins.out] = out
            for a, v in zip(getattr(ins, "also", ()), stored or ()):
                if a >= 0:
                    values[a] = v
            for f in ins.free:
                values[f] = None


def _overwrite(ins: Instruction, attrs: Mapping, values: list) -> bool:
    """Write a state's new version over the old one in place, where the lowering allowed it
    (``lower._overwrites``: nothing later reads the old version) and the call agrees: offset 0
    and the whole length, the state a prefix of a buffer the program owns (never a user's
    array fed for it), and no value still to be read sharing its memory. False: the kernel
    copies, as for any other write inside the state."""
    state, value = values[ins.args[0]], values[ins.args[1]]
    if dv.is_tensor(state) or dv.is_tensor(value) or int(attrs["offset"]) != 0 \
            or state.shape != value.shape or state.dtype != value.dtype:
        return False
    axis = int(attrs["axis"])
    if storage.grown(state, axis, state.shape[axis]) is None:  # not the program's buffer
        return False
    for a in ins.overwrite:  # (a GPU tensor never shares a host array's memory)
        v = values[a]
        if isinstance(v, np.ndarray) and np.may_share_memory(v, state):
            return False
    np.copyto(state, value)  # (numpy copies through a buffer where the two overlap)
    return True


def _stored(ins: Instruction, shape: tuple, arenas: Mapping) -> list:
    """The arrays a kernel stores its ``also`` values into: their arena places where the
    memory plan gave them room at this shape, else new arrays; None for a dropped value."""
    out = []
    for a, place, dtype in zip(ins.also, ins.also_places, ins.also_dtypes):
        if a < 0:
            out.append(None)
            continue
        if place is not None and math.prod(shape) * np.dtype(dtype).itemsize <= place[2]:
            out.append(dv.arena_view(arenas[place[0]], place[1], shape, dtype))
        else:
            out.append(np.empty(shape, dtype))
    return out


def dims_key(dims: Mapping) -> tuple:
    return tuple(sorted((dim_name(k), int(v)) for k, v in dims.items()))


def dense(a, dtype=None):
    """``a`` as a C-contiguous array or GPU tensor (itself when it already is; 0-d stays 0-d,
    unlike ``np.ascontiguousarray``)."""
    return dv.dense(a, dtype)


def _check_tensor_ints(name: str, leaf: Node, value) -> None:
    """``check_int_range`` for a tensor fed or bound, whose stand-in in the feeds' checks
    holds zeros: read where it lies on the host. A GPU tensor's values are not read (that
    would wait for the GPU), so there the cast wraps as torch's ``.to`` does."""
    if leaf.dtype.is_int and value.device.type == "cpu":
        check_int_range(name, leaf, dv.plain(value).numpy())


def leaf_value(node: Node, arrays: Mapping[str, np.ndarray], dims: Mapping):
    """A leaf's value as given (an array, or a tensor where one was bound or fed)."""
    kind = node.op.name
    if kind == CONSTANT:
        return node.attrs["value"].array.astype(node.dtype.np_dtype, copy=False)
    if kind == DIM:
        return np.asarray(resolve(node.attrs["expr"], dims), dtype=node.dtype.np_dtype)
    if kind == STATE:  # a kept state's active prefix: strided, appended in place, not copied
        value = arrays[node.name]
        return value if dv.is_tensor(value) else np.asarray(value, node.dtype.np_dtype)
    return dense(arrays[node.name], node.dtype.np_dtype)


class CompiledGraph:
    """``prog(**feeds)`` runs the plan; see ``tg.compile``. Attributes: ``plan`` (the steps),
    ``stats`` (planner runs, plan-cache hits, slots, options), ``explain()``, ``bind()``,
    ``save_plan()``."""

    def __init__(self, outputs: list[Node], single: bool, pipeline):
        self._outputs = outputs
        self._single = single
        # tg.compile's passes with its settings (compiler.Pipeline): builds the executable for
        # dims the program meets first (a graph with symbolic dims and no bounds)
        self._pipeline = pipeline
        device = getattr(pipeline, "device", None)
        # where weights and kept states live: the planner keeps them on the target device
        self._weights_on = device.name if device is not None and device.kind != "cpu" \
            else "cpu"
        self._leaves = leaves(outputs)
        self._by_name = {leaf.name: leaf for leaf in self._leaves}
        self._bound: dict[str, object] = {}  # arrays, or tensors on the GPU weights live on
        # a weight's other names in checkpoints -> its leaf's (tg.from_torch sets a module's
        # tied parameters': bind_safetensors reads a tensor saved once under either name)
        self.aliases: dict[str, str] = {}
        self._executables: dict[tuple, Executable] = {}
        self._symbolic: Executable | None = None
        self._last: Executable | None = None
        self._kept = kept_states(outputs)  # output position -> (state name, axis)
        self._index_limits = index_limits(outputs)  # fed ids: checked before a call runs
        self._states = {name: State(self._by_name[name], axis, self._weights_on)
                        for name, axis in self._kept.values()}
        # a state the graph reads but never updates (an optimizer's learning rate) is held the
        # same way, so binding a new value writes into its buffer and drops no prelude and no
        # native recording, as binding a weight does (a 0-d one, without an axis, is a weight)
        self._states.update((lf.name, State(lf, 0, self._weights_on)) for lf in self._leaves
                            if lf.op.name == STATE and lf.ndim and lf.name not in self._states)
        self._capacity: dict[str, int] = {}  # a kept state's length at the bounds
        self.stats: dict[str, int] = {"planner_runs": 0, "plan_cache_hits": 0, "plans": 0,
                                      "replayed": 0, "slots": 0, "options": 0,
                                      "estimates": 0, "measured": 0, "calls": 0, "blocks": 0,
                                      "blocks_planned": 0, "block_cache_hits": 0,
                                      "native_runs": 0, "graph_runs": 0, "graph_captures": 0}
        # where every instruction is C, calls run as one foreign call (runtime/native.py);
        # False keeps the Python loop (benchmarks compare the two)
        self.native = True
        # a GPU program runs as a CUDA graph per dims where it can (runtime/graphs.py); False
        # keeps the Python loop
        self.cuda_graphs = True
        # one call or bind at a time: calls share the arenas, the kept states and the values
        # of the steps (two threads calling one program got each other's results, silently)
        self._one_at_a_time = threading.RLock()
        self._leaf_sets()

    def _leaf_sets(self) -> None:
        """What a call checks, given what is bound (made again by every bind): the weights and
        states not bound, the leaves a call must feed, and those it validates (fed, or bound
        with a shape that binds dims)."""
        self._unbound = sorted(n for n, lf in self._by_name.items()
                               if lf.op.name != INPUT and n not in self._bound)
        self._open = [lf for lf in self._leaves if lf.name not in self._bound]
        self._checked_leaves = [lf for lf in self._leaves
                                if lf.name not in self._bound or not is_static(lf.shape)]

    # ------------------------------------------------------------------------ planning
    def _executable(self, dims: Mapping) -> Executable:
        if self._symbolic is not None:  # planned once for the bounds
            self._pipeline.check_bounds(dims)
            try:
                self._symbolic.check(dims)  # (resolved only if the Python loop runs)
                self._last = self._symbolic
                return self._symbolic
            except OutsideConstraintsError:  # a kernel chosen at the bounds does not apply
                self.stats["outside_bounds_plans"] = self.stats.get("outside_bounds_plans",
                                                                    0) + 1
        found = self._executables.get(dims_key(dims))
        if found is None:
            try:
                exe = self._pipeline.build(dims, self.stats)
            except ShapeError as exc:
                raise self._empty_dims_said(exc, dims) from None
            found = self.adopt(exe, dims)
        self._last = found
        return found

    def _empty_dims_said(self, exc: ShapeError, dims: Mapping) -> ShapeError:
        """``exc``, where the call binds a dim to 0, with the feeds that did: an empty
        prompt failed deep in a composite (``scaled_dot_product_attention(...): max: cannot
        reduce the empty axis``) without a word of the input. (A dim of 0 is no error in
        itself: a prefill from empty caches binds ``past=0``.)"""
        empty = {k for k, v in dims.items() if int(v) == 0}
        fed = [f"'{lf.name}' {format_shape(lf.shape)}" for lf in self._leaves
               if lf.op.name == INPUT and free_symbols(tuple(lf.shape)) & empty]
        if not fed:
            return exc
        named = ", ".join(f"{dim_name(k)}=0" for k in sorted(empty, key=str))
        return ShapeError(f"{exc} (this call binds {named} from the feed(s) {', '.join(fed)}: "
                          "an empty input this graph cannot compute on; feed at least one "
                          "element along that axis)")

    def adopt(self, exe: Executable, dims: Mapping | None = None) -> Executable:
        """Hold ``exe`` as the program for ``dims``; None: the program planned for the bounds,
        which runs every call with dims up to them (``Executable.bound``)."""
        exe.own_outputs(self._kept)
        if dims is not None:
            self._executables[dims_key(dims)] = exe
        else:
            bounds = self._pipeline.bounds
            for i, (name, axis) in self._kept.items():
                self._capacity[name] = int(resolve(tuple(self._outputs[i].shape), bounds)[axis])
            self._symbolic = exe
            exe.bounds = {str(k): int(v) for k, v in bounds.items()}
            exe.bound(bounds)  # kernels' constraints at the bounds
        self._last = exe
        return exe

    def _all_executables(self) -> list[Executable]:
        return list(self._executables.values()) + ([self._symbolic] if self._symbolic else [])

    @property
    def plan(self) -> Plan:
        """The plan of the last call (or the one made at compile time)."""
        if self._last is None:
            raise ArgumentError("this program has symbolic dims and no bounds, so nothing is "
                                "planned until the first call (or compile with bounds=...)")
        return self._last.plan

    @property
    def concrete_plan(self) -> Plan:
        """The plan with its symbolic dims at the bounds' values: what the memory plan lays
        out (the plan itself when the graph has no symbolic dims)."""
        self.plan  # noqa: B018 - raises when nothing is planned yet
        return self._last.twin

    @property
    def memory_plan(self):
        """The MemoryPlan of ``concrete_plan``: arena offsets, liveness, totals."""
        self.plan  # noqa: B018
        return self._last.memory

    def explain(self, limit: int | None = None, *, html=None, feeds: Mapping | None = None,
                runs: int = 3) -> str:
        """The plan's table and totals, where its steps run and what crosses between devices
        (``devices:``, ``copies:``), and which loop ran the last call. ``html``: also write
        the plan as one self-contained page there (``runtime/plan_html.py``); with ``feeds``
        it first times ``runs`` real calls per step (``runtime/trace.py``) for the page's
        measured column."""
        text = self.plan.explain(limit) + "".join(
            f"\n{line}" for line in self._placement()) + f"\nloop: {self.loop}"
        if html is not None:
            from tensor_graphs.runtime.explain_html import write_program_html

            write_program_html(self, html, feeds, runs, text.splitlines()[-1:])
        return text

    def trace(self, path, feeds: Mapping | None = None, runs: int = 3) -> dict:
        """Write a Chrome/Perfetto trace (JSON) of ``runs`` real calls with ``feeds``: one
        slice per step per call (``runtime/trace.py``); returns the trace object."""
        from tensor_graphs.runtime.trace import write_trace

        return write_trace(self, path, feeds, runs)

    def _placement(self) -> list[str]:
        """Steps per device and copies per direction (per call, or once per binding)."""
        if not any(s.device != "cpu" or s.is_copy for s in self.plan.steps):
            return []
        runs: dict[str, dict[str, int]] = {}
        moves: dict[tuple, int] = {}
        static = self._last.memory.liveness.static if self._last.memory is not None else set()
        plan = self.concrete_plan
        for step in plan.steps:
            if step.is_copy:
                once = plan.resolve(step.slot) in static
                key = (self.device_name(step.inputs[0].device), self.device_name(step.device),
                       once)
                moves[key] = moves.get(key, 0) + 1
                continue
            backends = runs.setdefault(self.device_name(step.device), {})
            backends[step.kernel.backend] = backends.get(step.kernel.backend, 0) + 1
        lines = ["devices: " + "; ".join(
            f"{d} {sum(b.values())} steps (" + ", ".join(f"{k} {n}" for k, n in
                                                        sorted(b.items())) + ")"
            for d, b in sorted(runs.items()))]
        if moves:
            lines.append("copies: " + "; ".join(
                f"{n} {src} -> {dst}" + (" once per binding" if once else " per call")
                for (src, dst, once), n in sorted(moves.items())))
        return lines

    def device_name(self, kind: str) -> str:
        """The device a plan's device kind means here ("cuda" -> "cuda:0")."""
        if kind == "cpu":
            return "cpu"
        device = getattr(self._pipeline, "device", None)
        return device.name if device is not None and device.kind == kind else f"{kind}:0"

    @property
    def loop(self) -> str:
        """Which loop ran the last call and why: "native loop: N C calls in one foreign call",
        or "python loop: <reason>" (a numpy kernel, a copy per call, first sighting...)."""
        if self._last is None:
            return "python loop: not run yet"
        return self._last.native.last

    def memory(self) -> dict[str, int]:
        """Bytes per device of the current plan: arena (transient values, reused after their
        last use) + weights (with weight-only results and packed copies) + state; known before
        anything runs (the memory plan's totals: ``tg.estimate_memory`` gives the same). A
        kept state counts at its buffer's capacity (the length at the bounds, or what the
        buffer holds once grown), not at the active length the plan binds."""
        self.plan  # noqa: B018 - raises when nothing is planned yet
        memory = self._last.memory
        totals = memory.totals()
        for b in memory.liveness.buffers:  # kept states at the room their buffer holds
            st = self._states.get(b.node.name) if b.node.op.name == STATE else None
            if st is None or b.kind != "state":
                continue
            shape = [int(d) for d in b.node.shape]
            shape[st.axis] = self._capacity.get(st.leaf.name, shape[st.axis])
            room = math.prod(shape) * b.node.dtype.itemsize
            if st.buffer is not None:
                room = max(room, st.nbytes)
            totals[b.device] = totals.get(b.device, 0) + max(room - b.nbytes, 0)
        return {self.device_name(kind): n for kind, n in totals.items()}

    def save_plan(self, path) -> None:
        from tensor_graphs.planner.lockfile import save

        save(self.plan, path, self._pipeline)

    # ------------------------------------------------------------------------ weights
    def bind(self, **arrays) -> CompiledGraph:
        """Give weights (and initial states) in the user's layout; later calls use them.
        Binding a name again replaces its value. Returns the program, so
        ``prog.bind(...)(x=...)`` reads well.

        A weight already where the weights live is held as it is, not copied: on the host a
        C-contiguous numpy array of the leaf's dtype, on a GPU a tensor already there (other
        values are converted or moved: a copy of the program's own; a state is always copied
        into its buffer). Changing a held array in place afterwards (an optimizer's step, a
        reused buffer) reaches the kernels that read it but not what the program derived
        from it once per binding (a transposed or packed copy), so results mix old and new
        values: bind it again after changing it, or bind a copy (``w.copy()``). Not copied
        because a copy would be a second host copy of the model for as long as the caller
        keeps its arrays."""
        self._rebind(arrays, "bind")
        return self

    def bind_safetensors(self, path, *, strict: bool = False, rename=None) -> CompiledGraph:
        """Bind every weight the checkpoint holds, by name: a safetensors file, a model's
        folder or a sharded checkpoint's index, as ``save_pretrained`` writes them (``rename``
        maps file names to leaf names, or to None to skip one: a function, or a dict whose
        missing names stay as they are), replacing values bound before. The file is
        memory-mapped and each tensor copied once into its own buffer; weights the graph
        has but the file lacks raise before anything is bound, unless already bound (bind
        them with ``bind`` first to allow that); a weight the file holds under another name
        of the same tensor (``aliases``: an imported module's tied parameters) is read from
        there. ``strict``: the file may hold nothing else.
        A program whose weights live on a GPU loads them there directly (safetensors' torch
        loader: no numpy stage)."""
        from tensor_graphs.runtime.weights import aliased, checkpoint_names, read_checkpoint

        # kept states (KV caches) are bound with prog.bind, never read from a checkpoint
        wanted = {n: (tuple(leaf.shape), leaf.dtype) for n, leaf in self._by_name.items()
                  if leaf.op.name != INPUT and n not in self._states}
        if self.aliases:
            rename = aliased(rename, self.aliases, checkpoint_names(path))
        on_gpu = self._weights_on != "cpu"  # then straight onto the GPU, no numpy stage
        arrays = read_checkpoint(path, wanted, strict=strict, rename=rename,
                                 optional=set(self._bound),
                                 device=self._weights_on if on_gpu else None)
        self._rebind(arrays, f"bind_safetensors({path})")
        return self

    def _rebind(self, arrays: Mapping[str, object], what: str) -> None:
        """The one way values get bound (``bind``, ``bind_safetensors``). Every array is
        checked first, all together: a known weight or state, its shape against the leaf's
        with the dims the arrays bind, its kind of dtype; an error changes nothing. Then the
        values are replaced and all that was derived from the old weights is dropped: the
        prelude's results (transposed and packed weights) and the native loop's recordings,
        which hold the old buffers' addresses. Never while another thread's call runs."""
        with self._one_at_a_time:
            self._rebind_now(arrays, what)

    def _rebind_now(self, arrays: Mapping[str, object], what: str) -> None:
        weights, states = {}, {}
        for name, value in arrays.items():
            leaf = self._by_name.get(name)
            if leaf is None or leaf.op.name == INPUT:
                known = sorted(n for n, lf in self._by_name.items() if lf.op.name != INPUT)
                kind = "an input: feed it at call time" if leaf is not None else "unknown"
                raise FeedError(f"{what}: '{name}' is {kind}; the graph's weights and states "
                                f"are {known or 'none'}")
            array = dv.placeholder(value) if dv.is_tensor(value) else np.asarray(value)
            if is_static(leaf.shape) and array.shape != tuple(leaf.shape):
                raise ShapeError(f"{what}: {leaf.op.name} '{name}' has shape "
                                 f"{format_shape(array.shape)}, the graph declares "
                                 f"{format_shape(leaf.shape)}")
            (states if name in self._states else weights)[name] = array
        # weights share their dims (checked together, as a call checks its feeds); a state's
        # length is its own, changed by every call
        groups = [weights] + [{name: array} for name, array in states.items()]
        for group in groups:
            try:
                bind_feeds([self._by_name[n] for n in group], group, lift=False)
                for name in group:
                    if dv.is_tensor(arrays[name]):
                        _check_tensor_ints(name, self._by_name[name], arrays[name])
            except TensorGraphsError as exc:
                raise type(exc)(f"{what}: {exc}") from None
        values = {n: self._held(a, self._by_name[n]) for n, a in arrays.items()}
        for name in states:  # kept state: into its buffer, grown by later calls
            self._states[name].set(values[name], self._capacity.get(name, 0))
        if weights:  # (a state keeps its buffer: the prelude and recordings still hold)
            self._bound.update((n, values[n]) for n in weights)
            for n in weights:  # what a kernel started early may read (kernels/torch/bound.py)
                if dv.is_tensor(values[n]) and gpu_state.owner(values[n]) is None:
                    bound.mark(values[n])  # (not another program's state: its kernels write)
            self._leaf_sets()
            for exe in self._all_executables():
                exe.invalidate()

    def _held(self, value, leaf: Node):
        """A bound value where the program keeps it: a dense array in its dtype on the host,
        a tensor on the GPU weights live on (moved there once, by the copy kernel; a tensor
        already there is held as is, as an array is on the host)."""
        dtype = leaf.dtype.np_dtype
        if self._weights_on == "cpu":
            return dense(dv.on_host(value) if dv.is_tensor(value) else value, dtype)
        return dv.on_device(value, self._weights_on, dtype)

    # ------------------------------------------------------------------------ running
    def __call__(self, **feeds):
        """The outputs for ``feeds``. Threads may share a program: their calls run one at a
        time (each call reuses the program's memory; for calls side by side, compile a
        program per thread)."""
        with self._one_at_a_time:
            return self._call(feeds)

    def _call(self, feeds: Mapping):
        unknown = sorted(set(feeds) - set(self._by_name))
        if unknown:
            raise FeedError(f"unknown feed(s) {unknown}; the graph's leaves are "
                            f"{sorted(self._by_name) or 'none'}")
        overlap = sorted(set(feeds) & set(self._bound))
        if overlap:
            raise FeedError(f"{overlap} are bound weights; pass them to bind(), not the call")
        kept = {n: st.prefix() for n, st in self._states.items()
                if n not in feeds and st.buffer is not None}
        unbound = [n for n in self._unbound if n not in feeds and n not in kept]
        if unbound:
            raise FeedError(f"weight(s) or state(s) {unbound} are not bound: call prog.bind("
                            + ", ".join(f"{n}=..." for n in unbound) + ") first (a state "
                            "starts as what you bind, an empty cache included)")
        # bound weights were checked by bind: only what this call brings is validated
        given = {**kept, **feeds}
        require_feeds(self._open, given)  # (a bound leaf is never missing)
        # the kept states are the program's own (checked when bound or made by it): they only
        # bind their dims, read off their shapes (``_state_dims``), unless that is ambiguous
        state_dims = self._state_dims(kept)
        skip = kept if state_dims is not None else {}
        raw, arrays, dims = self._checked(given, skip)
        if state_dims and any(dims.get(d, v) != v for d, v in state_dims.items()):
            self._checked(given, {})  # a feed disagrees with a state on a dim: this names both
        if state_dims is not None:
            dims.update(state_dims)
            arrays.update(skip)
        for name, value in raw.items():
            if dv.is_tensor(value):
                arrays[name] = dv.retyped(value, self._by_name[name].dtype.np_dtype)
                if arrays[name].dtype != value.dtype:  # cast: an int one may wrap
                    _check_tensor_ints(name, self._by_name[name], value)
        if self._index_limits:
            self._check_indices(feeds, arrays, dims)
        arrays = {**self._bound, **arrays}  # (a call's feeds win; no Python loop per weight)
        exe = self._executable(dims)
        self.stats["calls"] += 1
        fed_weights = any(self._by_name[n].op.name == WEIGHT for n in feeds)
        only_inputs = all(self._by_name[n].op.name == INPUT for n in feeds)
        try:
            results = exe.run(arrays, dims, cache_static=not fed_weights,
                              native=self.native and only_inputs,
                              graphs=self.cuda_graphs and only_inputs)
        except ShapeError as exc:  # dims a step cannot be sized at (``Executable.bound``)
            raise self._empty_dims_said(exc, dims) from None
        if exe.native.last.startswith("native"):
            self.stats["native_runs"] += 1
        elif exe.native.last.startswith("cuda graph"):  # captured (warmed up) or replayed
            self.stats["graph_runs"] += 1
            self.stats["graph_captures"] += exe.native.last.startswith("cuda graph: captured")
        fed = None  # ids of what later calls keep: made only where a result may be one

        def kept_later(r) -> bool:
            nonlocal fed
            if fed is None:
                fed = {id(a) for a in arrays.values()} | \
                    {id(v) for _, v in exe._static_values or ()}
            return id(r) in fed

        out, seen, kept = [], set(), []
        for i, r in enumerate(results):
            r = r if dv.is_tensor(r) else np.asarray(r)
            if i in self._kept:  # the new state: kept after the other results are copied
                kept.append((i, r))  # out (one may view the old version, which this
                out.append(None)  # writes over when the kernel computed the new apart)
                continue
            # a result the program may write again (arena, weights, feeds) is copied, on the
            # device that holds it (outputs="device": no copy to the host)
            own = (not exe.shared_results or i in exe.owned_results) and dv.fresh(r) \
                and id(r) not in seen \
                and not kept_later(r) and not any(dv.inside(r, a) for a in exe.arenas.values())
            seen.add(id(r))
            out.append(r if own else dv.copy(r))
        for i, r in kept:  # shown read-only (no copy)
            name = self._kept[i][0]
            self._states[name].set(r, self._capacity.get(name, 0))
            out[i] = self._states[name].view()
        return out[0] if self._single else out

    def _check_indices(self, feeds: Mapping, arrays: Mapping, dims: Mapping) -> None:
        """The fed ids a gather or scatter reads, in range (``ir/index_limits``), read where
        they are: a GPU tensor's are not (reading them would wait for the GPU), so an id out of
        range there meets torch's device-side assert, as it would in torch."""
        for name, limits in self._index_limits.items():
            value = arrays[name] if name in feeds else None
            if value is None or getattr(value, "is_cuda", False):  # (no call for a tensor)
                continue
            check_indices(name, value.numpy() if dv.is_tensor(value) else np.asarray(value),
                          limits, dims)

    def _checked(self, given: Mapping, skip: Mapping) -> tuple[dict, dict, dict]:
        """(the values checked, their arrays, the dims they bind): what the call brings and
        the bound leaves whose shapes bind dims, but those in ``skip``. Tensors are checked
        through stand-ins of their shape and dtype: they stay where they are (a GPU feed is
        not copied to the host to be checked)."""
        check = [lf for lf in self._checked_leaves
                 if (lf.name in given or lf.name in self._bound) and lf.name not in skip]
        raw = {lf.name: given.get(lf.name, self._bound.get(lf.name)) for lf in check}
        arrays, dims = bind_feeds(check, {n: dv.placeholder(v) for n, v in raw.items()},
                                  lift=False)
        return raw, arrays, dims

    def _state_dims(self, kept: Mapping) -> dict | None:
        """The dims the kept states bind, read off their shapes: a decode token's 24 caches
        went through the feeds' checks (a stand-in each, its dtype and every axis), ~600 of
        its ~1860 host calls, for what the program made itself. None where a state's shape
        holds an expression of dims (``bind_feeds`` solves those) or two states disagree."""
        dims: dict = {}
        for name, value in kept.items():
            for want, got in zip(self._by_name[name].shape, value.shape):
                if isinstance(want, int):
                    continue
                if not isinstance(want, sympy.Symbol) or dims.setdefault(want, got) != got:
                    return None
        return dims

    def bound_weights(self, names=None, *, on_host: bool = True
                      ) -> dict[str, np.ndarray | torch_Tensor]:
        """The weights this program has bound, by name, as host arrays (a GPU's copied, a
        host array as it is): ``names`` of them, or all. What ``save_quantized`` of a
        generator or an imported module writes from: read back when it is called rather than
        kept from the caller, since a reference held for a save that may never come keeps a
        second host copy of the float model alive wherever the program holds its own.
        ``on_host=False``: as the program holds them (a GPU's tensors there), so that another
        program binds the same memory (a generator's padded programs)."""
        names = list(self._bound) if names is None else list(names)
        missing = sorted(n for n in names if n not in self._bound)
        if missing:
            raise ArgumentError(f"the program has no weight bound as {missing[:5]}"
                                f"{' ...' if len(missing) > 5 else ''}: bind it first "
                                "(prog.bind(name=array))")
        return {n: dv.on_host(self._bound[n]) if on_host else self._bound[n] for n in names}

    def state(self, name: str) -> np.ndarray | torch_Tensor:
        """The current value of a kept state (read-only view of its active prefix). A state
        kept on a GPU is returned as the torch tensor there, not copied to the host: a decode
        program binds a prefill's caches from it without a round trip (``.cpu()`` copies)."""
        st = self._states.get(name)
        if st is None:
            raise FeedError(f"'{name}' is not a state this program keeps; it keeps "
                            f"{sorted(self._states) or 'none'} (a state is kept when the graph "
                            "returns a new version of it)")
        if st.buffer is None:
            raise StateError(f"state '{name}' has no value yet: prog.bind({name}=...)")
        return st.view()
