"""CompiledGraph: a planned graph that runs, called like a function.

A call validates its feeds exactly as ``tg.evaluate`` does (names, kinds, shapes, dims), picks
the plan for the dims it binds (planned at compile time, or on the first call with new dims
when the graph has symbolic dims and no bounds), and runs that plan's steps as a flat list:
each instruction calls a kernel function on the values of earlier slots and drops every value
after its last use. Weights are bound once (``bind``) in the user's layout.
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from tensor_graphs.devices import track
from tensor_graphs.errors import ArgumentError, EvaluationError, FeedError, ShapeError
from tensor_graphs.ir.evaluate import bind_feeds
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.shapes import format_shape, is_static, resolve
from tensor_graphs.planner.plan import Plan, Slot


@dataclass(frozen=True, eq=False)
class Instruction:
    fn: object
    args: tuple[int, ...]  # value indices
    attrs: dict
    out: int
    free: tuple[int, ...]  # values whose last use is here
    name: str  # the kernel's name, for errors
    shape: tuple  # the result's expected shape
    contiguous: bool  # the kernel reads its inputs as dense C-order buffers
    place: tuple | None = None  # (device, byte offset, dtype): write the result into the arena
    fresh: bool = True  # the kernel returns a new array (not a view, not into the arena)


STATIC_LEAVES = ("weight", "constant", "dim")  # fixed for a binding and dims


class Executable:
    """One plan flattened: leaf loaders, instructions over numbered values, outputs."""

    def __init__(self, plan: Plan, memory=None):
        self.plan = plan
        self.memory = memory  # the MemoryPlan: arena offsets of transient values
        index: dict[Slot, int] = {}

        def slot_index(slot: Slot) -> int:
            slot = plan.resolve(slot)
            if slot not in index:
                index[slot] = len(index)
            return index[slot]

        self.leaves = [(slot_index(s), s.node) for s in plan.leaves]
        steps = [(tuple(slot_index(i) for i in s.inputs), slot_index(Slot(s.node, s.device,
                                                                            False)), s)
                 for s in plan.steps]
        self.outputs = [slot_index(s) for s in plan.outputs]
        # Steps that read only weights and constants (a transposed or re-laid-out weight)
        # run once per binding, not per call: the prelude.
        static = {i for i, node in self.leaves if node.op.name in STATIC_LEAVES}
        prelude, main = [], []
        for args, out, s in steps:
            if all(a in static for a in args):
                static.add(out)
                prelude.append((args, out, s))
            else:
                main.append((args, out, s))
        self.prelude = self._instructions(prelude, keep=static)
        self.instructions = self._instructions(main, keep=static | set(self.outputs), arena=True)
        needed = {a for ins in self.instructions for a in ins.args} | set(self.outputs)
        self.static = sorted(i for i in static if i in needed)
        self._static_values: list | None = None
        self.arenas: dict[str, np.ndarray] = {}
        self.size = len(index)

    def _instructions(self, steps, keep: set[int], arena: bool = False) -> list[Instruction]:
        last: dict[int, int] = {}
        for pos, (args, _, _) in enumerate(steps):
            for a in args:
                last[a] = pos
        out = []
        for pos, (args, result, s) in enumerate(steps):
            free = tuple(sorted({a for a in args if last[a] == pos and a not in keep}))
            place = self._place(s) if arena else None
            out.append(Instruction(s.kernel.fn, args, dict(s.attrs), result, free,
                                   s.kernel.name, tuple(int(d) for d in s.node.shape),
                                   s.kernel.contiguous, place,
                                   place is None and not s.kernel.view))
        return out

    def _place(self, step) -> tuple | None:
        """Where the step writes its result in the arena, for kernels that take ``out=``."""
        if self.memory is None or not getattr(step.kernel, "writes_out", False):
            return None
        p = self.memory.placements.get(self.plan.resolve(Slot(step.node, step.device, False)))
        dtype = step.node.dtype.np_dtype
        if p is None or p.kind != "arena" or not p.nbytes or (
                p.alias_of is not None and step.kernel.inplace is None):
            return None
        if p.strides is not None and p.strides != _c_strides(step.node.shape, dtype):
            return None
        return (p.device, p.offset, dtype)

    def _arena_outputs(self) -> list:
        """Per instruction, the arena array it writes into (None: the kernel allocates)."""
        found = getattr(self, "_outs", None)
        if found is None:
            arenas = {d: np.empty(n, np.uint8) for d, n in self.memory.arena.items()} \
                if self.memory is not None else {}
            found = self._outs = [
                None if ins.place is None else np.ndarray(
                    ins.shape, ins.place[2], buffer=arenas[ins.place[0]], offset=ins.place[1])
                for ins in self.instructions]
            self.arenas = arenas
            for device, arena in arenas.items():  # Device.allocated counts them until freed
                track(device, arena.nbytes)
                weakref.finalize(self, track, device, -arena.nbytes)
        return found

    def invalidate(self) -> None:
        """Weights changed: the prelude runs again on the next call."""
        self._static_values = None

    def run(self, arrays: Mapping[str, np.ndarray], dims: Mapping,
            cache_static: bool = True) -> list[np.ndarray]:
        """One call. ``cache_static``: the weights are the bound ones, so the prelude's results
        from an earlier call stand (False when a call feeds weights itself)."""
        values: list = [None] * self.size
        for i, node in self.leaves:
            if node.op.name not in STATIC_LEAVES or self._static_values is None \
                    or not cache_static:
                values[i] = leaf_value(node, arrays, dims)
        if self._static_values is None or not cache_static:
            _execute(self.prelude, values)
            static = [(i, values[i]) for i in self.static]
            if cache_static:
                self._static_values = static
        for i, v in self._static_values if cache_static else ():
            values[i] = v
        _execute(self.instructions, values, self._arena_outputs(), self.arenas)
        return [values[i] for i in self.outputs]


def _execute(instructions: list[Instruction], values: list, outs=None, arenas=None) -> None:
    """Run ``instructions`` over ``values``; ``outs[i]`` is where instruction i writes (its
    arena place) or None. A kernel that allocates but hands back memory inside an arena (an
    undeclared alias of an input) gets its result copied out, so arena reuse stays safe."""
    outs = outs or [None] * len(instructions)
    regions = list((arenas or {}).values())
    with np.errstate(all="ignore"):
        for ins, buf in zip(instructions, outs):
            args = [values[a] for a in ins.args]
            if ins.contiguous:  # views (a permute, a slice) are made dense first
                args = [a if a.flags.c_contiguous else dense(a) for a in args]
            try:
                if buf is not None:
                    out = ins.fn(*args, out=buf, **ins.attrs)
                else:
                    out = ins.fn(*args, **ins.attrs)
                    if ins.fresh and regions and out.base is not None and any(
                            np.may_share_memory(out, r) for r in regions):
                        out = out.copy()
                if out.shape != ins.shape:
                    raise ValueError(f"returned shape {format_shape(out.shape)}, the plan "
                                     f"expects {format_shape(ins.shape)}")
            except Exception as exc:
                shapes = ", ".join(format_shape(values[a].shape) for a in ins.args)
                raise EvaluationError(f"kernel {ins.name} on inputs of shapes {shapes}: "
                                      f"{type(exc).__name__}: {exc}") from exc
            values[ins.out] = out
            for f in ins.free:
                values[f] = None


def _c_strides(shape, dtype) -> tuple[int, ...]:
    return _strides(tuple(int(d) for d in shape), np.dtype(dtype).itemsize)


def _strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    out, step = [], itemsize
    for d in reversed(shape):
        out.append(step)
        step *= max(d, 1)
    return tuple(reversed(out))


def dense(a, dtype=None) -> np.ndarray:
    """``a`` as a C-contiguous array (itself when it already is; 0-d stays 0-d, unlike
    ``np.ascontiguousarray``)."""
    a = np.asarray(a, dtype=dtype)
    return a if a.flags.c_contiguous else a.copy(order="C")


def leaf_value(node: Node, arrays: Mapping[str, np.ndarray], dims: Mapping) -> np.ndarray:
    kind = node.op.name
    if kind == "constant":
        return node.attrs["value"].array.astype(node.dtype.np_dtype, copy=False)
    if kind == "dim":
        return np.asarray(resolve(node.attrs["expr"], dims), dtype=node.dtype.np_dtype)
    return dense(arrays[node.name], node.dtype.np_dtype)


class CompiledGraph:
    """``prog(**feeds)`` runs the plan; see ``tg.compile``. Attributes: ``plan`` (the steps),
    ``stats`` (planner runs, plan-cache hits, slots, options), ``explain()``, ``bind()``,
    ``save_plan()``."""

    def __init__(self, outputs: list[Node], single: bool, planner):
        self._outputs = outputs
        self._single = single
        self._planner = planner  # dims -> Plan, with the compile's settings and cache
        self._leaves = leaves(outputs)
        self._by_name = {leaf.name: leaf for leaf in self._leaves}
        self._bound: dict[str, np.ndarray] = {}
        self._executables: dict[tuple, Executable] = {}
        self._last: Executable | None = None
        self.stats: dict[str, int] = {"planner_runs": 0, "plan_cache_hits": 0, "plans": 0,
                                      "replayed": 0, "slots": 0, "options": 0,
                                      "estimates": 0, "measured": 0, "calls": 0, "blocks": 0,
                                      "blocks_planned": 0, "block_cache_hits": 0}

    # ------------------------------------------------------------------------ planning
    def _executable(self, dims: Mapping) -> Executable:
        key = tuple(sorted((str(k), int(v)) for k, v in dims.items()))
        found = self._executables.get(key)
        if found is None:
            from tensor_graphs.memory import check_fits, plan_memory

            plan = self._planner(dict(dims), self.stats)
            memory = plan_memory(plan)
            device = self._planner.device
            check_fits(memory, {device.kind: device})  # OutOfMemory before anything runs
            found = self._executables[key] = Executable(plan, memory)
            self.stats["plans"] += 1
        self._last = found
        return found

    @property
    def plan(self) -> Plan:
        """The plan of the last call (or the one made at compile time)."""
        if self._last is None:
            raise ArgumentError("this program has symbolic dims and no bounds, so nothing is "
                                "planned until the first call (or compile with bounds=...)")
        return self._last.plan

    def explain(self, limit: int | None = None) -> str:
        return self.plan.explain(limit)

    def memory(self) -> dict[str, int]:
        """Bytes per device of the current plan: arena (transient values, reused after their
        last use) + weights (and weight-only results) + state; known before anything runs."""
        self.plan  # noqa: B018 - raises when nothing is planned yet
        return self._last.memory.totals()

    def save_plan(self, path) -> None:
        from tensor_graphs.planner.lockfile import save

        save(self.plan, path, self._planner)

    # ------------------------------------------------------------------------ weights
    def bind(self, **arrays) -> CompiledGraph:
        """Give weights (and initial states) once, in the user's layout; later calls use them.
        Returns the program, so ``prog.bind(...)(x=...)`` reads well."""
        for name, value in arrays.items():
            leaf = self._by_name.get(name)
            if leaf is None or leaf.op.name == "input":
                known = sorted(n for n, lf in self._by_name.items() if lf.op.name != "input")
                what = "an input: feed it at call time" if leaf is not None else "unknown"
                raise FeedError(f"bind: '{name}' is {what}; the graph's weights and states "
                                f"are {known or 'none'}")
            array = np.asarray(value)
            if is_static(leaf.shape) and array.shape != tuple(leaf.shape):
                raise ShapeError(f"bind: weight '{name}' has shape {format_shape(array.shape)}"
                                 f", the graph declares {format_shape(leaf.shape)}")
            bind_feeds([leaf], {name: array}, lift=False)  # kinds and dims, as evaluate
            self._bound[name] = dense(array, leaf.dtype.np_dtype)
        for exe in self._executables.values():
            exe.invalidate()
        return self

    def bind_safetensors(self, path, *, strict: bool = False, rename=None) -> CompiledGraph:
        """Bind every weight the file holds, by name (``rename`` maps file names to leaf names,
        or to None to skip one). The file is memory-mapped and each tensor copied once into
        its final buffer; weights the graph has but the file lacks raise before anything is
        bound (bind them with ``bind`` first to allow that). ``strict``: the file may hold
        nothing else."""
        from tensor_graphs.runtime.weights import read_safetensors

        wanted = {n: (tuple(int(d) for d in leaf.shape), leaf.dtype)
                  for n, leaf in self._by_name.items()
                  if leaf.op.name != "input" and n not in self._bound}
        unsized = sorted(n for n, leaf in self._by_name.items()
                         if n in wanted and not is_static(leaf.shape))
        if unsized:
            raise ShapeError(f"bind_safetensors: weights {unsized} have symbolic shapes; bind "
                             "them with prog.bind(...)")
        arrays = read_safetensors(path, wanted, strict=strict, rename=rename)
        self._bound.update(arrays)  # read_safetensors checked names, shapes and dtypes
        for exe in self._executables.values():
            exe.invalidate()
        return self

    # ------------------------------------------------------------------------ running
    def __call__(self, **feeds):
        overlap = sorted(set(feeds) & set(self._bound))
        if overlap:
            raise FeedError(f"{overlap} are bound weights; pass them to bind(), not the call")
        unbound = sorted(n for n, lf in self._by_name.items()
                         if lf.op.name != "input" and n not in self._bound and n not in feeds)
        if unbound:
            raise FeedError(f"weight(s) {unbound} are not bound: call prog.bind("
                            + ", ".join(f"{n}=..." for n in unbound) + ") first")
        arrays, dims = bind_feeds(self._leaves, {**self._bound, **feeds}, lift=False)
        exe = self._executable(dims)
        self.stats["calls"] += 1
        fed_weights = any(self._by_name[n].op.name == "weight" for n in feeds)
        results = exe.run(arrays, dims, cache_static=not fed_weights)
        fed = {id(a) for a in arrays.values()} | {id(a) for a in self._bound.values()}
        fed |= {id(v) for _, v in exe._static_values or ()}  # kept for later calls
        out, seen = [], set()
        for r in results:
            r = np.asarray(r)
            own = r.flags.owndata and r.base is None and id(r) not in fed and id(r) not in seen
            seen.add(id(r))
            out.append(r if own else r.copy())
        return out[0] if self._single else out
