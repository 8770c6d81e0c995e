"""A torch.compile backend: ``torch.compile(model, backend="tensor_graphs")``.

Dynamo hands a backend one FX graph per region it captured (graph breaks run in eager torch
between them) with the region's inputs: parameters and buffers (as graph inputs, since Dynamo
inlines nn modules), user tensors, and the symbolic sizes it chose. Each graph is re-exported
with ``torch.export`` so the importer that serves ``tg.from_torch`` (torch's decompositions for
what the ATen table lacks, one refusal listing every unmapped op) maps it unchanged:
parameters become weights bound once, Dynamo's symbolic sizes become named symbolic dims, and
the program is planned with the measurement database. A graph we cannot take (an unmapped op,
a graph that needs gradients) runs in eager torch with a warning, so a user's torch.compile
never fails because of us, unless ``options={"fallback": False}`` asks for the error.
"""

from __future__ import annotations

import math
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from tensor_graphs import compiler
from tensor_graphs.errors import ArgumentError, ShapeError, TensorGraphsError
from tensor_graphs.frontend.aten.common import UnsupportedOpError, torch_module
from tensor_graphs.frontend.dynamo_graph import (
    RefusedGraphError,
    dim_names,
    dynamic_shapes,
    export,
    exportable,
    written_inputs,
)
from tensor_graphs.frontend.torch_export import _shape_carriers, import_exported
from tensor_graphs.ir import graph as ir_graph
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import INPUT, WEIGHT
from tensor_graphs.kernels.torch.convert import to_host, to_torch

# option: default                   what it does
OPTIONS: dict[str, object] = {
    "tolerance": None,   # tg.compile's tolerance (largest relative error a step may add)
    "db": None,          # tg.compile's measurement database (path or Database; None: $TG_DB)
    "profile": None,     # tg.compile's profile: "never" or "missing" (None: by torch's mode)
    "fallback": True,    # False: raise where a graph would run in eager torch
    "bound": None,       # largest value of every symbolic size (None: twice the first seen)
}

# torch.compile's ``mode``: the profile it implies where options name none
MODES = {
    None: "never",                            # plan from what the database knows
    "default": "never",                       # the same
    "reduce-overhead": "never",               # the same (a cpu program has no launch cost)
    "max-autotune": "missing",                # measure every kernel call the plan lacks first
    "max-autotune-no-cudagraphs": "missing",  # the same
}

# a symbolic size's first bound is at least this (a few decode steps fit before a re-plan)
MIN_BOUND = 64


class EagerFallbackWarning(UserWarning):
    """A graph Dynamo handed over runs in eager torch instead of a tensor_graphs program."""


class _OutsidePlanError(ShapeError):
    """A call outside what the program assumed where Dynamo assumed less: sizes that differ
    where the program took them as one dim (duck shaping), a number it took as a constant."""


def tensor_graphs_backend(gm, example_inputs: Sequence, *, options: Mapping | None = None,
                          mode: str | None = None) -> Callable:
    """Dynamo's backend entry point (``torch.compile(model, backend="tensor_graphs",
    options={...})``): a callable running ``gm`` as a tensor_graphs program, or ``gm`` itself
    (eager torch) with an ``EagerFallbackWarning`` where we cannot take it."""
    opts = _options(options)
    profile = opts["profile"] or MODES.get(mode, "never")
    try:
        return DynamoProgram(gm, list(example_inputs), opts, profile)
    except Exception as exc:  # noqa: BLE001  (torch's own errors too: eager must stay possible)
        if not opts["fallback"]:
            raise
        _warn_fallback(exc)
        return gm


def _options(options: Mapping | None) -> dict:
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ArgumentError(f"torch.compile(backend='tensor_graphs', options={options!r}): "
                            f"options must be a dict with keys among {sorted(OPTIONS)}")
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ArgumentError(f"torch.compile(backend='tensor_graphs'): unknown option(s) "
                            f"{unknown}; the options are {sorted(OPTIONS)}")
    checks = {  # option: (is the value valid, what it must be)
        "tolerance": (lambda v: v is None or (isinstance(v, (int, float))
                                             and not isinstance(v, bool) and v > 0),
                      "a positive number (a norm-wise relative error such as 1e-5), or None"),
        "profile": (lambda v: v in (None, "never", "missing"), "'never', 'missing' or None"),
        "fallback": (lambda v: isinstance(v, bool), "True or False"),
    }
    for key, (valid, what) in checks.items():
        if key in options and not valid(options[key]):
            raise ArgumentError(f"torch.compile(backend='tensor_graphs', options={{{key!r}: "
                                f"{options[key]!r}}}): {key} must be {what}")
    bound = options.get("bound")
    if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)
                              or bound < 2):
        raise ArgumentError(f"torch.compile(backend='tensor_graphs', options={{'bound': "
                            f"{bound!r}}}): the bound is an int >= 2 (the largest value of "
                            "every symbolic size), or None")
    return {**OPTIONS, **options}


def _warn_fallback(exc: BaseException) -> None:
    if isinstance(exc, UnsupportedOpError) and exc.ops:
        ops = sorted({op for op, _ in exc.ops})
        what = f"no tensor_graphs mapping for {', '.join(ops)}"
    else:
        what = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    warnings.warn(f"tensor_graphs backend: this graph runs in eager torch ({what}). "
                  "Pass options={'fallback': False} to raise instead.\n" + str(exc),
                  EagerFallbackWarning, stacklevel=3)


class DynamoProgram:
    """One Dynamo graph as a tensor_graphs program, called with Dynamo's flat arguments
    (sizes, user tensors, parameters) and returning torch tensors.

    Symbolic sizes are bounded so one plan serves every smaller size (replayed, not
    searched); a size past the bound compiles again with the bound doubled past it, so a
    growing length (generation's cache) re-plans a logarithmic number of times.
    ``compiles`` counts those compiles, ``calls`` the calls that ran our program."""

    def __init__(self, gm, example_inputs: list, opts: dict, profile: str):
        torch = torch_module()
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise RefusedGraphError("this graph needs gradients (grad mode is on and an input "
                                    "or parameter requires grad); the tensor_graphs backend "
                                    "compiles inference only: call the model under "
                                    "torch.no_grad() or torch.inference_mode()")
        devices = sorted({str(t.device) for t in tensors if t.device.type != "cpu"})
        if devices:
            raise RefusedGraphError(f"inputs on {', '.join(devices)}: the tensor_graphs "
                                    "backend plans cpu programs only; use "
                                    "tg.from_torch(..., device='cuda') for GPUs")
        self.gm = gm
        self.compiles = 0
        self.calls = 0
        self._fallback = opts["fallback"]
        self._eager = False
        self._told_outside = False  # the first call outside the plan was warned of
        found = exportable(gm, example_inputs)
        self._user, self._weights, self._scalars = found.user, found.weights, found.scalars
        args = [example_inputs[i] for i in self._user]
        try:
            spec = dynamic_shapes(found.values, duck=False)
            outputs, leaves, weights, _ = _import(export(found.module, args, spec), spec)
        except ShapeError:
            # Dynamo keeps sizes apart that the graph needs equal but torch's meta kernels
            # never compare (sdpa's key and value lengths): one dim per size equal in the
            # example, as torch's duck shaping does; a call where they differ runs eagerly
            spec = dynamic_shapes(found.values, duck=True)
            outputs, leaves, weights, _ = _import(export(found.module, args, spec), spec)
        self._leaves = leaves  # the user tensors' leaves, in self._user's order
        # per graph output: ("ours", index into the program's outputs), ("size", a symbolic
        # size, evaluated on each call's input shapes) or ("value", a constant)
        self._outputs: list[tuple[str, object]] = []
        nodes = []
        read = {str(d) for leaf in leaves for d in leaf.shape if getattr(d, "is_Symbol", False)}
        for out in outputs:
            if isinstance(out, Node):
                self._outputs.append(("ours", len(nodes)))
                nodes.append(out)
            elif getattr(out, "free_symbols", None):
                # a size the code after a graph break reads (print(x.shape), a view's
                # shape): known from the inputs' shapes, as Dynamo's own graph knows it
                unknown = sorted(str(s) for s in out.free_symbols if str(s) not in read)
                if unknown:
                    raise RefusedGraphError(f"the graph returns the symbolic size {out}, "
                                            f"whose {', '.join(unknown)} no input's shape "
                                            "gives")
                self._outputs.append(("size", out))
            else:
                self._outputs.append(("value", out))
        self._nodes = nodes
        self._program = None
        self._options = {"profile": profile}
        if opts["tolerance"] is not None:
            self._options["tolerance"] = opts["tolerance"]
        if opts["db"] is not None:
            self._options["db"] = opts["db"]
        self._fixed_bound = opts["bound"]
        self.bounds: dict[str, int] = {}  # the symbolic sizes' bounds the program runs with
        # weight -> (the tensor bound, its state then: version and memory)
        self._versions: dict[str, tuple[object, tuple[int | None, int]]] = {}
        # held while re-binding or re-planning: another thread's call must not see the new
        # bounds before the plan made for them (it ran the old plan past its bound)
        self._lock = threading.Lock()
        self._weight_arrays = weights
        if nodes:
            self._nodes += _shape_carriers(nodes, leaves, self._used_dims())
            self._compile(self._first_bounds(example_inputs))
            self._bind({name: example_inputs[i] for i, name in self._weights.items()},
                       weights)

    # ------------------------------------------------------------------ compiling
    def _used_dims(self) -> set[str]:
        return {str(s) for n in ir_graph.nodes(self._nodes)
                for d in (*n.shape, *n.attrs.values())
                for s in getattr(d, "free_symbols", ())}

    def _dims_of(self, arrays: Sequence) -> dict[str, int]:
        """The value of each symbolic size, read from the user tensors' shapes."""
        dims: dict[str, int] = {}
        for leaf, arr in zip(self._leaves, arrays):
            for d, size in zip(leaf.shape, arr.shape):
                if getattr(d, "is_Symbol", False):
                    if dims.setdefault(str(d), int(size)) != size:
                        raise _OutsidePlanError(f"inputs give the dim {d} the sizes "
                                                f"{dims[str(d)]} and {size}, one dim when the "
                                                "graph was compiled")
        return dims

    def _first_bounds(self, example_inputs) -> dict[str, int]:
        dims = self._dims_of([example_inputs[i] for i in self._user])
        return {name: self._fixed_bound or max(MIN_BOUND, _pow2(2 * size))
                for name, size in dims.items()}

    def _compile(self, bounds: dict[str, int]) -> None:
        used = self._used_dims()
        self.bounds = {k: v for k, v in bounds.items() if k in used}
        self._program = compiler.compile(self._nodes, bounds=self.bounds or None,
                                         **self._options)
        self.compiles += 1
        self._present = {leaf.name for leaf in ir_graph.nodes(self._nodes)
                         if leaf.op.name == WEIGHT}
        self._read = {leaf.name for leaf in ir_graph.nodes(self._nodes)
                      if leaf.op.name == INPUT}
        if self._versions:  # a re-compile: the weights as last seen
            self._program.bind(**{n: a for n, a in self._weight_arrays.items()
                                  if n in self._present})

    def _bind(self, tensors: Mapping, arrays: Mapping | None = None) -> None:
        """Bind weights (copies: the program owns them) and remember each tensor's version,
        so an in-place update of a parameter (``load_state_dict``, an optimizer step) is
        seen by the next call."""
        for name, tensor in tensors.items():
            self._versions[name] = (tensor, _state(tensor))
            if arrays is None or name not in arrays:
                self._weight_arrays[name] = to_host(tensor).copy()
        self._program.bind(**{n: self._weight_arrays[n] for n in tensors if n in self._present})

    @property
    def program(self):
        """The CompiledGraph that runs now (None for a graph without tensor outputs)."""
        return self._program

    # ------------------------------------------------------------------ calling
    def __call__(self, *args):
        if self._eager:
            return self.gm(*args)
        try:
            return self._run(args)
        except _OutsidePlanError as exc:
            self._warn_outside(exc)
            return self.gm(*args)  # this call only: the sizes Dynamo allows, the plan does not
        except TensorGraphsError as exc:
            if not self._fallback:
                raise
            _warn_fallback(exc)
            self._eager = True
            return self.gm(*args)

    def _warn_outside(self, exc: _OutsidePlanError) -> None:
        """Once per program: calls outside its plan run in eager torch, each of them, which
        a loop passing a new float per call (a forward argument Dynamo does not specialize)
        paid on every step without a word."""
        if self._told_outside:
            return
        self._told_outside = True
        warnings.warn(f"tensor_graphs backend: {exc}: this call, and every call like it, "
                      "runs in eager torch (the others run the program). For a number, pass "
                      "it as a tensor, or set torch._dynamo.config.specialize_float = True "
                      "for a graph per value", EagerFallbackWarning, stacklevel=3)

    def _run(self, args):
        if any(args[i].item() != v for i, v in self._scalars.items()):
            raise _OutsidePlanError("a number the program took as a constant "
                                    f"({', '.join(str(v) for v in self._scalars.values())}) "
                                    "has another value")
        arrays = [to_host(args[i]) for i in self._user]
        dims = self._dims_of(arrays)
        results: list = []
        if self._program is not None:
            results = self._execute(args, arrays, dims)
            self.calls += 1
        out = []
        for kind, o in self._outputs:
            if kind == "value":
                out.append(o)
            elif kind == "size":
                out.append(int(o.subs({s: dims[str(s)] for s in o.free_symbols})))
            else:
                r = np.asarray(results[o])  # a copy where the program keeps it read-only
                out.append(to_torch(r if r.flags.writeable else r.copy()))
        return tuple(out)

    def _execute(self, args, arrays: list, dims: dict) -> list:
        """The program's outputs on this call's arrays: weights changed in place are bound
        again, a size past its bound compiles first."""
        with self._lock:
            changed = {name: args[i] for i, name in self._weights.items()
                       if args[i] is not self._versions[name][0]
                       or _state(args[i]) != self._versions[name][1]}
            if changed:
                self._bind(changed)
            over = {k: v for k, v in dims.items() if k in self.bounds and v > self.bounds[k]}
            if over:
                self._compile({**self.bounds, **{k: _pow2(2 * v) for k, v in over.items()}})
            program = self._program
        feeds = {leaf.name: a for leaf, a in zip(self._leaves, arrays) if leaf.name in self._read}
        results = program(**feeds)
        return [results] if isinstance(results, np.ndarray) else results


def _import(exported, spec: list):
    """import_exported, refusing first a graph that writes its inputs or weights in place
    (our programs never write what they are fed)."""
    written = written_inputs(exported)
    if written:
        raise RefusedGraphError(f"this graph writes its inputs in place ({', '.join(written)}),"
                                " which a tensor_graphs program does not do")
    return import_exported(exported, dim_names(spec))


def _state(tensor) -> tuple[int | None, int]:
    """What tells a weight's values changed in place since they were bound: its version (an
    in-place write) and its memory (``param.data = w`` keeps the version; a write through
    ``param.data``, ``param.data.mul_(2)``, changes neither and goes unseen)."""
    return _version(tensor), tensor.data_ptr()


def _version(tensor) -> int | None:
    """The tensor's in-place version counter (None for an inference tensor, which has none
    and cannot be changed in place outside inference mode)."""
    try:
        return tensor._version
    except RuntimeError:
        return None


def _pow2(n: int) -> int:
    return 1 << max(1, math.ceil(math.log2(max(n, 2))))
