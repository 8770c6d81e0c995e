"""The kernel registry: what each kernel implements (a pattern), where it runs, what it accepts.

A kernel is the reference graph it implements — one op, atomic or composite, or a fused
subgraph, in the pattern language — plus a backend ("numpy", "c", "torch", ...), a device kind
("cpu", "cuda"), constraints, a declared tolerance (the largest norm-wise relative error
against the float64 reference it may show) and a function. One decorator next to the function
registers it:

    @tg.kernel("tanh", backend="c", dtypes=("float32",))
    def c_tanh(x): ...

    @tg.kernel(lambda a, b, c: a * b + c, backend="numpy", name="fma")
    def fma(a, b, c):
        return a * b + c

The pattern is an op name, a function of pattern variables (traced: operators and tg.* calls on
pattern variables build the pattern), or a ``tg.pat`` pattern. The kernel function takes the
pattern's variables positionally (in the order of the traced function's parameters, or of the
op's tensor parameters) and, as keyword arguments, any attributes of the matched root node it
names in its signature (``def c_softmax(x, axis)``). It returns a new array; ``inplace=i`` says
it may write its result into input i's buffer and ``view=True`` that it returns a view of
input 0 (both matter to the memory planner). ``signatures=[{"x": (7, 33), "w": ((33, 5),
"float64"), "attrs": {...}}, ...]`` tells the verifier which inputs to try, for fused patterns
whose shapes it cannot guess (``kernels/signatures.py``).

Registration does not verify (that would run every kernel at import): ``tg.kernels.verify``
does, the test suite verifies every registered kernel, ``tg.kernels.load`` admits a user's file
only after verification, and the planner verifies a kernel before its first use.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from tensor_graphs.errors import ArgumentError, KernelConstraintError
from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.rewrite import pattern as pat

BACKENDS = ("numpy", "c", "torch", "triton", "copy")
DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True, eq=False)
class Kernel:
    """One implementation of a pattern on a backend; call it like its function."""

    name: str
    pattern: pat.Pat
    backend: str
    device: str
    fn: Callable
    inputs: tuple[str, ...]  # pattern variables, in the order fn takes them
    attrs: tuple[str, ...] = ()  # root-node attributes fn takes as keywords
    dtypes: tuple[DType, ...] | None = None  # every input's dtype must be one of these
    ranks: tuple[int, ...] | None = None  # every input's rank must be one of these
    contiguous: bool = False  # inputs must be C-contiguous
    where: Callable | None = None  # where(shapes, dtypes, attrs) -> True, or a reason string
    tolerance: float = 1e-6
    inplace: int | None = None
    view: bool = False
    doc: str = ""
    source_hash: str = field(default="", compare=False)
    signatures: object = None  # verification cases for fused patterns (see kernels.verify)

    @property
    def op(self) -> str | None:
        """The op at the pattern's root (None for a bare-variable pattern)."""
        return self.pattern.op if isinstance(self.pattern, pat.OpPat) else None

    @property
    def fused(self) -> bool:
        """True when the pattern covers more than one op."""
        root = self.pattern
        return isinstance(root, pat.OpPat) and any(isinstance(i, pat.OpPat) for i in root.inputs)

    def constraint_failure(self, shapes: Sequence[tuple], dtypes: Sequence[DType],
                           attrs: dict | None = None, contiguous: Sequence[bool] | None = None
                           ) -> str | None:
        """Why these inputs are outside the kernel's constraints, or None when they fit."""
        if len(shapes) != len(self.inputs):
            return f"takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), got {len(shapes)}"
        for name, shape, dtype in zip(self.inputs, shapes, dtypes):
            if self.dtypes is not None and dtype not in self.dtypes:
                return (f"input '{name}' has dtype {dtype.name}; accepts "
                        f"{', '.join(d.name for d in self.dtypes)}")
            if self.ranks is not None and len(shape) not in self.ranks:
                return (f"input '{name}' has rank {len(shape)} (shape {tuple(shape)}); accepts "
                        f"rank {' or '.join(map(str, self.ranks))}")
        if self.contiguous and contiguous is not None and not builtins.all(contiguous):
            bad = [n for n, c in zip(self.inputs, contiguous) if not c]
            return f"input(s) {bad} are not C-contiguous; this kernel needs contiguous inputs"
        if self.where is not None:
            verdict = self.where(tuple(map(tuple, shapes)), tuple(dtypes), dict(attrs or {}))
            if verdict is not True:
                return verdict if isinstance(verdict, str) else "its shape constraint failed"
        return None

    def check(self, arrays: Sequence, attrs: dict | None = None) -> None:
        dts = [_dtypes.from_numpy(a.dtype) for a in arrays]
        if any(d is None for d in dts):
            shown = ", ".join(str(a.dtype) for a in arrays)
            raise KernelConstraintError(f"kernel {self.name}: unsupported input dtypes {shown}")
        reason = self.constraint_failure([a.shape for a in arrays], dts, attrs,
                                         [getattr(a, "flags", None) is None or
                                          a.flags.c_contiguous for a in arrays])
        if reason is not None:
            raise KernelConstraintError(f"kernel {self.name} ({self.backend}): {reason}")

    def __call__(self, *arrays, **attrs):
        self.check(arrays, attrs)
        return self.fn(*arrays, **{k: v for k, v in attrs.items() if k in self.attrs})

    def match(self, node: Node, uses=None) -> pat.Match | None:
        """The match of this kernel's pattern rooted at ``node`` that fits its constraints."""
        for m in pat.iter_matches(self.pattern, node, uses, partial=False):
            try:
                bound = [m.bindings[v] for v in self.inputs]
            except KeyError:
                continue
            if self.constraint_failure([b.shape for b in bound], [b.dtype for b in bound],
                                       dict(node.attrs)) is None:
                return m
        return None

    def __repr__(self) -> str:
        return f"<kernel {self.name} ({self.backend}, {self.device}) {describe(self.pattern)}>"


_KERNELS: dict[str, Kernel] = {}
_BY_OP: dict[str | None, list[Kernel]] = {}


_PENDING: list | None = None  # set by kernels.load: collect kernels instead of registering


def register(k: Kernel, replace: bool = False) -> Kernel:
    if _PENDING is not None:  # tg.kernels.load registers them only after verification
        _PENDING.append((k, replace))
        return k
    if k.name in _KERNELS and not replace:
        raise ArgumentError(f"a kernel named '{k.name}' is already registered "
                            f"({_KERNELS[k.name].backend}); pick another name")
    unregister(k.name)
    _KERNELS[k.name] = k
    _BY_OP.setdefault(k.op, []).append(k)
    return k


def unregister(name: str) -> None:
    k = _KERNELS.pop(name, None)
    if k is not None:
        _BY_OP[k.op].remove(k)


def all() -> list[Kernel]:  # noqa: A001 - tg.kernels.all()
    """Every registered kernel, in registration order."""
    return list(_KERNELS.values())


def get(name: str) -> Kernel:
    try:
        return _KERNELS[name]
    except KeyError:
        raise ArgumentError(f"no kernel named '{name}'; tg.kernels.all() lists them") from None


def for_op(op_name: str) -> list[Kernel]:
    """Kernels whose pattern is rooted at ``op_name`` (candidates for a node of that op)."""
    return list(_BY_OP.get(op_name, ())) + list(_BY_OP.get(None, ()))


def matching(node: Node, uses=None, backends: Iterable[str] | None = None
             ) -> list[tuple[Kernel, pat.Match]]:
    """Every kernel whose pattern matches a subgraph rooted at ``node``, with its match."""
    allowed = None if backends is None else set(backends)
    out = []
    for k in for_op(node.op.name):
        if allowed is not None and k.backend not in allowed:
            continue
        m = k.match(node, uses)
        if m is not None:
            out.append((k, m))
    return out


def kernel(pattern, *, backend: str, name: str | None = None, device: str = "cpu",
           dtypes: Iterable | None = None, ranks: Iterable[int] | None = None,
           contiguous: bool = False, where: Callable | None = None, tolerance: float = 1e-6,
           inplace: int | None = None, view: bool = False, replace: bool = False,
           signatures=None):
    """Register the decorated function as a kernel for ``pattern`` (see the module docstring)."""
    if backend not in BACKENDS:
        raise ArgumentError(f"unknown backend {backend!r}; use one of {BACKENDS}")
    if device not in DEVICE_KINDS:
        raise ArgumentError(f"unknown device kind {device!r}; use one of {DEVICE_KINDS}")
    if not (isinstance(tolerance, (int, float)) and tolerance > 0):
        raise ArgumentError(f"tolerance must be a positive number, got {tolerance!r}")

    def decorate(fn: Callable) -> Kernel:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        compiled, var_names = trace_pattern(pattern, [p.name for p in params])
        if len(params) < len(var_names):
            raise ArgumentError(f"kernel {name or fn.__name__} takes {len(params)} arguments but "
                                f"its pattern has {len(var_names)} inputs {list(var_names)}")
        keywords = tuple(p.name for p in params[len(var_names):])  # attributes it reads
        k = Kernel(
            name=name or fn.__name__, pattern=compiled, backend=backend, device=device, fn=fn,
            inputs=var_names, attrs=keywords,
            dtypes=None if dtypes is None else tuple(_dtypes.as_dtype(d) for d in dtypes),
            ranks=None if ranks is None else tuple(ranks), contiguous=contiguous, where=where,
            tolerance=float(tolerance), inplace=inplace, view=view,
            doc=inspect.cleandoc(fn.__doc__ or "").split("\n")[0],
            source_hash=source_hash(fn), signatures=signatures)
        return register(k, replace=replace)

    return decorate


def trace_pattern(pattern, fn_params: Sequence[str]) -> tuple[pat.Pat, tuple[str, ...]]:
    """The pattern and its variables in kernel-argument order, from an op name, a function of
    pattern variables, or a pattern (whose variables the kernel function's first parameters
    name). The kernel function's parameters after those are attributes."""
    if isinstance(pattern, str):
        if pattern not in OPS or OPS[pattern].is_leaf:
            raise ArgumentError(f"unknown op {pattern!r} for a kernel pattern")
        op = OPS[pattern]
        names = op.params
        built = pat.OpPat(op.name, tuple(pat.var(n) for n in names))
        return built, tuple(names)
    if isinstance(pattern, pat.Pat):
        found = {v.name for v in pattern_vars(pattern)}
        names = tuple(fn_params[:len(found)])
        if set(names) != found:
            raise ArgumentError(f"the kernel function's parameters {list(names)} must name the "
                                f"pattern's variables {sorted(found)}")
        return pattern, names
    if callable(pattern):
        params = [p.name for p in inspect.signature(pattern).parameters.values()]
        built = pattern(*(pat.var(n) for n in params))
        if not isinstance(built, pat.Pat):
            raise ArgumentError("a kernel pattern function must build a pattern from its "
                                "arguments (operators and tg.* calls on them)")
        return built, tuple(params)
    raise ArgumentError(f"a kernel pattern is an op name, a function or a tg.pat pattern, "
                        f"not {type(pattern).__name__}")


def pattern_vars(p: pat.Pat) -> list[pat.Var]:
    out, seen, stack = [], set(), [p]
    while stack:
        q = stack.pop()
        if isinstance(q, pat.Var):
            if q.name not in seen:
                seen.add(q.name)
                out.append(q)
        elif isinstance(q, pat.OpPat):
            stack.extend(reversed(q.inputs))
    return out


def describe(p: pat.Pat, _seen: set | None = None) -> str:
    """A pattern as readable text: ``add(mul(a, b), c)``. A named (shared) sub-pattern is
    written in full once, as ``name:op(...)``, and by its name after that."""
    seen = set() if _seen is None else _seen
    if isinstance(p, pat.Var):
        return p.name
    if isinstance(p, pat.Const):
        return repr(p.value)
    if p.name is not None and p.name in seen:
        return p.name
    args = [describe(i, seen) for i in p.inputs]
    args += [f"{k}={v!r}" for k, v in p.attrs.items()]
    if p.name is not None:
        seen.add(p.name)
        return f"{p.name}:{p.op}({', '.join(args)})"
    return f"{p.op}({', '.join(args)})"


def source_hash(fn: Callable) -> str:
    """A hash of the kernel's source, so measurements of an edited kernel stop counting."""
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        text = getattr(fn, "__qualname__", repr(fn))
    extra = getattr(fn, "source_text", "")  # C kernels add their C source here
    return hashlib.blake2b((text + extra).encode(), digest_size=8).hexdigest()
