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

Variadic kernels. A pattern may hold one ``pat.many(name)`` operand, which binds the tuple of
the node's inputs it covers; the kernel function takes it as its ``*name`` parameter, after
the fixed variables. So one kernel covers a concat of any number of inputs:

    @tg.kernel("concat", backend="numpy")        # a variadic op's name: concat(*xs)
    def numpy_concat(*xs, axis):
        return np.concatenate(xs, axis=axis)

    @tg.kernel(lambda *xs: tg.pat.concat(*xs), backend="numpy")   # the same pattern
    @tg.kernel(tg.pat.concat(tg.pat.many("xs", dtype="float")), backend="numpy")

``Kernel.inputs`` names the pattern's variables (``("xs",)``; the variadic one, if any, last:
``Kernel.variadic``), and ``match.bindings["xs"]`` is a tuple of nodes. **How to call a
kernel on a match** (fixed or variadic alike): ``Kernel.arguments(match)`` is the flat list of
nodes to pass positionally, a variadic binding spread in place, and

    k.fn(*[value_of[n] for n in k.arguments(m)], **{a: node.attrs[a] for a in k.attrs})

For a fixed-arity kernel ``arguments(m) == [m.bindings[v] for v in k.inputs]``. Constraints
(``dtypes``, ``ranks``, ``contiguous``, ``where``) see the flat list too: ``where`` gets one
shape and one dtype per argument, ``inplace=i`` counts arguments.

Writing into a given buffer (``writes_out=True``). A compiled program keeps every transient
value at a planned offset in one arena per device, so a kernel may be handed the buffer its
result goes to. The contract of a kernel declared ``writes_out=True``:

- ``k.fn(*args, out=buf, **attrs)`` writes the result into ``buf`` and returns ``buf``
  itself (the very object, not a copy or a view of it). ``buf`` is a writeable C-contiguous
  numpy array of the result's exact shape and dtype (0-d for a 0-d result), possibly holding
  garbage; it does not overlap any input, unless the kernel is declared ``inplace=i`` and
  ``buf`` is input i's buffer (then input i may be read and written in place).
- Called without ``out`` (or with ``out=None``) it allocates its result as every kernel does.
- The function takes ``out`` as a keyword parameter (``def c_exp(x, *, out=None)``); ``out``
  is not an attribute (``Kernel.attrs`` leaves it out), and no kernel without ``writes_out``
  may name a parameter ``out``.
- The runtime passes ``out`` only to kernels with ``writes_out``; view kernels
  (``view=True``) never take it. ``Kernel.__call__(*arrays, out=buf, **attrs)`` checks the
  buffer (shape and dtype are the caller's business; writeable and C-contiguous are checked)
  and passes it on.

``tg.kernels.verify`` checks the contract: each case of a ``writes_out`` kernel is also run
with a poisoned (NaN / 0xFF-filled) ``out`` buffer, which must come back as the result, holding
exactly what the call without ``out`` returned (and, for ``inplace=i``, with ``out`` being a
copy of input i passed as that input).

Bind-time preparation of an argument (``prepare={"w": fn}``). A kernel may declare that it
takes one or more of its arguments in a prepared form: ``fn(array)`` (or a ``Preparation``,
which adds ``nbytes(shape, dtype)``, the prepared form's size, for memory accounting) turns
the array into what the kernel function receives (a GEMM's weight packed into the panels its
micro-kernel streams). Preparing is meant to happen once per weight binding, so:

- the planner offers such a kernel only where every prepared argument is static, a weight or
  a value computed from weights and constants alone, not depending on the call's dims (the
  runtime's prelude rule, ``ir/graph.py: is_static``);
- the runtime prepares those arguments once per binding, after the prelude, keeps the
  prepared values with the weights (stable buffers: the native loop records their
  addresses) and passes them instead of the arrays; ``bind`` invalidates them;
- ``Kernel.__call__`` (and so the verifier) prepares per call, and the profiler prepares once
  before timing (``Kernel.prepare_arguments``), so a kernel is verified and measured on the
  inputs it will run on. A function may also accept the unprepared array (the packed GEMMs
  do: they pack per call), but nothing relies on it.

Registration does not verify (that would run every kernel at import): ``tg.kernels.verify``
does, the test suite verifies every registered kernel, ``tg.kernels.load`` admits a user's file
only after verification, and the planner verifies a kernel before its first use.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import sympy

from tensor_graphs.errors import ArgumentError, KernelConstraintError
from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.dtypes import DType
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.shapes import resolve
from tensor_graphs.rewrite import pattern as pat

BACKENDS = ("numpy", "c", "torch", "triton", "copy")
DEVICE_KINDS = ("cpu", "cuda")


@dataclass(frozen=True, eq=False)
class Preparation:
    """A bind-time preparation of a kernel argument: ``fn(array) -> prepared`` (a numpy array
    whose buffer stays put), ``nbytes(shape, dtype)`` its size in bytes where known;
    ``strided``: ``fn`` reads a strided view as it is (else a contiguous kernel's argument is
    made dense first)."""

    fn: Callable
    nbytes: Callable | None = None
    name: str = ""
    strided: bool = False  # fn reads any strides: the runtime need not make a view dense

    def __call__(self, array):
        return self.fn(array)


@dataclass(frozen=True)
class Occupancy:
    """How much of a GPU one call keeps busy, for the kernel's estimate until it is measured.
    A grid of fewer programs than the device has SMs leaves the others idle (a one-row
    product's 12 column tiles on an H100's 132), and a tile wider than the data computes padding (a
    16-row ``tl.dot`` tile on one row does 16 rows' arithmetic): a roofline at the device's
    peaks would call both as fast as a kernel that fills the GPU."""

    programs: int  # the grid's programs (of the call's widest launch)
    useful: float = 1.0  # the share of the arithmetic done that the result needs


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
    writes_out: bool = False  # fn(*args, out=buf, **attrs) fills buf and returns it
    doc: str = ""
    source_hash: str = field(default="", compare=False)
    signatures: object = None  # verification cases for fused patterns (see kernels.verify)
    prepare: dict = field(default_factory=dict)  # argument name -> Preparation (bind time)
    # input dtype name -> the share of the device's peak flop rate its arithmetic reaches,
    # for the planner's estimate until the kernel is measured (absent: 1)
    efficiency: dict = field(default_factory=dict)
    # occupancy(shapes) -> Occupancy of one call at these input shapes (all concrete), for
    # a GPU kernel's estimate (absent: it fills the device)
    occupancy: Callable | None = None

    @property
    def op(self) -> str | None:
        """The op at the pattern's root (None for a bare-variable pattern)."""
        return self.pattern.op if isinstance(self.pattern, pat.OpPat) else None

    @property
    def variadic(self) -> str | None:
        """The name of the pattern's ``pat.many`` variable (the last of ``inputs``; the function
        takes it as ``*name``), or None for a fixed-arity kernel."""
        return _variadic_name(self.pattern)

    def arguments(self, match: pat.Match) -> list[Node]:
        """The nodes to pass to ``fn`` positionally for ``match``, in order: each variable's
        node, a variadic variable's tuple spread in place (see the module docstring)."""
        out: list[Node] = []
        for v in self.inputs:
            bound = match.bindings[v]
            if isinstance(bound, tuple):
                out.extend(bound)
            else:
                out.append(bound)
        return out

    def argument_names(self, count: int) -> list[str]:
        """A name for each of ``count`` arguments: the variables, ``xs[0]``, ``xs[1]``, ... for
        the elements of a variadic one (the names verification cases use)."""
        if self.variadic is None:
            return list(self.inputs)
        fixed = list(self.inputs[:-1])
        return fixed + [element_name(self.inputs[-1], i) for i in range(count - len(fixed))]

    def arity_failure(self, count: int) -> str | None:
        """Why ``count`` arguments do not fit the pattern's arity, or None."""
        star = self.variadic
        if star is None:
            if count != len(self.inputs):
                return (f"takes {len(self.inputs)} inputs ({', '.join(self.inputs)}), "
                        f"got {count}")
            return None
        least = len(self.inputs) - 1 + _many(self.pattern).min
        if count < least:
            shown = ", ".join(self.inputs[:-1] + ("*" + star,))
            return f"takes at least {least} inputs ({shown}), got {count}"
        return None

    def prepared_positions(self, count: int) -> dict[int, Preparation]:
        """Argument position -> its bind-time preparation (see ``prepare=``)."""
        if not self.prepare:
            return {}
        names = self.argument_names(count)
        return {i: self.prepare[n] for i, n in enumerate(names) if n in self.prepare}

    def prepare_arguments(self, arrays: Sequence) -> list:
        """``arrays`` with the declared arguments prepared (what ``fn`` receives)."""
        out = list(arrays)
        for i, prep in self.prepared_positions(len(out)).items():
            out[i] = prep(out[i])
        return out

    @property
    def fused(self) -> bool:
        """True when the pattern covers more than one op."""
        root = self.pattern
        return isinstance(root, pat.OpPat) and any(isinstance(i, pat.OpPat) for i in root.inputs)

    def constraint_failure(self, shapes: Sequence[tuple], dtypes: Sequence[DType],
                           attrs: dict | None = None, contiguous: Sequence[bool] | None = None
                           ) -> str | None:
        """Why these inputs (one shape and dtype per argument, as ``arguments`` lists them) are
        outside the kernel's constraints, or None when they fit."""
        reason = self.arity_failure(len(shapes))
        if reason is not None:
            return reason
        names = self.argument_names(len(shapes))
        for name, shape, dtype in zip(names, shapes, dtypes):
            if self.dtypes is not None and dtype not in self.dtypes:
                return (f"input '{name}' has dtype {dtype.name}; accepts "
                        f"{', '.join(d.name for d in self.dtypes)}")
            if self.ranks is not None and len(shape) not in self.ranks:
                return (f"input '{name}' has rank {len(shape)} (shape {tuple(shape)}); accepts "
                        f"rank {' or '.join(map(str, self.ranks))}")
        if self.contiguous and contiguous is not None and not builtins.all(contiguous):
            bad = [n for n, c in zip(names, contiguous) if not c]
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

    def __call__(self, *arrays, out=None, **attrs):
        """``fn(*arrays, **attrs)`` after ``check``: arrays as ``arguments`` orders them.
        ``out=buf`` (only for a ``writes_out`` kernel) writes the result into ``buf``."""
        self.check(arrays, attrs)
        kw = {k: v for k, v in attrs.items() if k in self.attrs}
        if self.prepare:  # prepared per call here; the runtime prepares once per binding
            arrays = self.prepare_arguments(arrays)
        if out is None:
            return self.fn(*arrays, **kw)
        if not self.writes_out:
            raise ArgumentError(f"kernel {self.name} does not write into a given buffer "
                                "(declared without writes_out=True); call it without out=")
        flags = getattr(out, "flags", None)
        if flags is None or not (flags.writeable and flags.c_contiguous):
            raise ArgumentError(f"kernel {self.name}: out must be a writeable C-contiguous "
                                f"numpy array, got {type(out).__name__}")
        return self.fn(*arrays, out=out, **kw)

    def match(self, node: Node, uses=None, dims=None) -> pat.Match | None:
        """The match of this kernel's pattern rooted at ``node`` that fits its constraints.
        ``dims`` gives symbolic dims values, so constraints see the shapes they will run at
        (a program planned for bounds checks them at the bounds)."""
        for m in pat.iter_matches(self.pattern, node, uses, partial=False, flat=False):
            try:
                bound = self.arguments(m)
            except KeyError:
                continue
            shapes = [concrete(b.shape, dims) for b in bound]
            if self.constraint_failure(shapes, [b.dtype for b in bound],
                                       concrete_attrs(node.attrs, dims)) is None:
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


def concrete(shape, dims) -> tuple:
    """``shape`` with symbolic dims replaced by their values in ``dims`` (as is without)."""
    return tuple(shape) if not dims else tuple(resolve(tuple(shape), dims))


def concrete_attrs(attrs, dims) -> dict:
    if not dims:
        return dict(attrs)
    return {k: resolve(v, dims) if isinstance(v, (sympy.Basic, tuple)) else v
            for k, v in attrs.items()}


def matching(node: Node, uses=None, backends: Iterable[str] | None = None, dims=None
             ) -> list[tuple[Kernel, pat.Match]]:
    """Every kernel whose pattern matches a subgraph rooted at ``node``, with its match
    (constraints checked at ``dims`` when the shapes are symbolic)."""
    allowed = None if backends is None else set(backends)
    out = []
    for k in for_op(node.op.name):
        if allowed is not None and k.backend not in allowed:
            continue
        m = k.match(node, uses, dims)
        if m is not None:
            out.append((k, m))
    return out


def unregistered(pattern, fn: Callable, *, backend: str = "numpy", **options) -> Kernel:
    """The Kernel ``@kernel(pattern, backend=..., **options)`` would register for ``fn``, without
    registering it (tests and tools that must leave the registry as they found it)."""
    global _PENDING
    saved = _PENDING
    _PENDING = []
    try:
        kernel(pattern, backend=backend, name=options.pop("name", fn.__name__), **options)(fn)
        return _PENDING[0][0]
    finally:
        _PENDING = saved


def kernel(pattern, *, backend: str, name: str | None = None, device: str = "cpu",
           dtypes: Iterable | None = None, ranks: Iterable[int] | None = None,
           contiguous: bool = False, where: Callable | None = None, tolerance: float = 1e-6,
           inplace: int | None = None, view: bool = False, replace: bool = False,
           signatures=None, writes_out: bool = False, prepare: dict | None = None,
           efficiency: dict | None = None, occupancy: Callable | None = None):
    """Register the decorated function as a kernel for ``pattern`` (see the module docstring;
    ``writes_out=True``: the function takes ``out=`` and writes its result there;
    ``efficiency``: {input dtype: the share of the device's peak flop rate the kernel's
    arithmetic reaches}, what its estimate assumes until it is measured; ``occupancy``:
    ``occupancy(shapes) -> Occupancy``, how much of a GPU a call at those input shapes keeps
    busy, which the estimate also takes until measured)."""
    if backend not in BACKENDS:
        raise ArgumentError(f"unknown backend {backend!r}; use one of {BACKENDS}")
    if device not in DEVICE_KINDS:
        raise ArgumentError(f"unknown device kind {device!r}; use one of {DEVICE_KINDS}")
    if not (isinstance(tolerance, (int, float)) and tolerance > 0):
        raise ArgumentError(f"tolerance must be a positive number, got {tolerance!r}")

    preps = {}
    for arg, prep in (prepare or {}).items():
        if not callable(prep):
            raise ArgumentError(f"prepare[{arg!r}] must be a function or a Preparation")
        preps[arg] = prep if isinstance(prep, Preparation) else Preparation(
            prep, name=getattr(prep, "__name__", ""))
    if writes_out and view:
        raise ArgumentError("a view kernel (view=True) returns a view of its input; it cannot "
                            "also write into a given buffer (writes_out=True)")
    shares = {_dtypes.as_dtype(d).name: f for d, f in (efficiency or {}).items()}
    if not builtins.all(isinstance(f, (int, float)) and 0 < f <= 1 for f in shares.values()):
        raise ArgumentError(f"efficiency must map dtypes to shares in (0, 1], got {efficiency!r}")

    def decorate(fn: Callable) -> Kernel:
        every = list(inspect.signature(fn).parameters.values())
        label = name or fn.__name__
        takes_out = builtins.any(p.name == "out" and p.kind in (p.KEYWORD_ONLY,
                                                               p.POSITIONAL_OR_KEYWORD)
                                 for p in every)
        if writes_out and not (takes_out or builtins.any(p.kind == p.VAR_KEYWORD
                                                         for p in every)):
            raise ArgumentError(f"kernel {label} is declared writes_out=True; its function "
                                "must take an out= keyword (out=None: allocate)")
        if takes_out and not writes_out:
            raise ArgumentError(f"kernel {label} takes a parameter named 'out'; declare "
                                "writes_out=True if it writes into a given buffer ('out' "
                                "is not an attribute)")
        every = [p for p in every if p.name != "out"]
        star = next((p.name for p in every if p.kind == p.VAR_POSITIONAL), None)
        params = [p for p in every if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        compiled, var_names = trace_pattern(pattern, [p.name for p in params], star)
        variadic = _variadic_name(compiled)
        fixed = len(var_names) - (variadic is not None)
        if variadic is not None and star is None:
            raise ArgumentError(f"kernel {label}: its pattern has the variadic input "
                                f"'{variadic}'; the function takes it as *{variadic}")
        if variadic is None and star is not None and \
                builtins.any(p.kind == p.KEYWORD_ONLY for p in every):
            raise ArgumentError(f"kernel {label}: *{star} takes a variadic input, but the "
                                "pattern has none (use pat.many or a variadic op's name)")
        if len(params) < fixed or builtins.any(p.kind == p.KEYWORD_ONLY
                                               for p in params[:fixed]):
            raise ArgumentError(f"kernel {label} takes {len(params)} arguments but "
                                f"its pattern has {len(var_names)} inputs {list(var_names)}")
        keywords = tuple(p.name for p in params[fixed:])  # attributes it reads
        k = Kernel(
            name=name or fn.__name__, pattern=compiled, backend=backend, device=device, fn=fn,
            inputs=var_names, attrs=keywords,
            dtypes=None if dtypes is None else tuple(_dtypes.as_dtype(d) for d in dtypes),
            ranks=None if ranks is None else tuple(ranks), contiguous=contiguous, where=where,
            tolerance=float(tolerance), inplace=inplace, view=view,
            writes_out=bool(writes_out), doc=inspect.cleandoc(fn.__doc__ or "").split("\n")[0],
            source_hash=source_hash(fn), signatures=signatures, prepare=preps,
            efficiency={d: float(f) for d, f in shares.items()}, occupancy=occupancy)
        unknown = sorted(set(preps) - set(var_names))
        if unknown or (preps and variadic in preps):
            raise ArgumentError(f"kernel {label}: prepare names {unknown or [variadic]}, not "
                                f"fixed pattern variables {list(var_names)}")
        return register(k, replace=replace)

    return decorate


def trace_pattern(pattern, fn_params: Sequence[str], star: str | None = None
                  ) -> tuple[pat.Pat, tuple[str, ...]]:
    """The pattern and its variables in kernel-argument order, from an op name, a function of
    pattern variables, or a pattern (whose fixed variables the kernel function's first
    parameters name, and whose ``pat.many`` variable its ``*star`` parameter names). The
    kernel function's parameters after those are attributes. A variadic op's name gives
    ``op(*params)`` with one ``pat.many``; a function with ``*args`` gets a ``pat.many``."""
    if isinstance(pattern, str):
        if pattern not in OPS or OPS[pattern].is_leaf:
            raise ArgumentError(f"unknown op {pattern!r} for a kernel pattern")
        op = OPS[pattern]
        names = op.params
        if op.variadic:
            built = pat.OpPat(op.name, tuple(pat.many(n) for n in names))
        else:
            built = pat.OpPat(op.name, tuple(pat.var(n) for n in names))
        return built, tuple(names)
    if isinstance(pattern, pat.Pat):
        found = pattern_vars(pattern)
        fixed = {v.name for v in found if isinstance(v, pat.Var)}
        varargs = [v.name for v in found if isinstance(v, pat.Many)]
        names = tuple(fn_params[:len(fixed)])
        if set(names) != fixed:
            raise ArgumentError(f"the kernel function's parameters {list(names)} must name the "
                                f"pattern's variables {sorted(fixed)}")
        if varargs:
            if len(set(varargs)) > 1:
                raise ArgumentError(f"a kernel pattern has at most one pat.many variable, got "
                                    f"{sorted(set(varargs))}")
            if star is not None and star != varargs[0]:
                raise ArgumentError(f"the kernel function's *{star} must name the pattern's "
                                    f"variadic variable '{varargs[0]}'")
            if varargs[0] in fixed:
                raise ArgumentError(f"'{varargs[0]}' is both a pat.var and a pat.many")
            names += (varargs[0],)
        return pattern, names
    if callable(pattern):
        sig = list(inspect.signature(pattern).parameters.values())
        params = [p.name for p in sig if p.kind != p.VAR_POSITIONAL]
        star_p = [p.name for p in sig if p.kind == p.VAR_POSITIONAL]
        args = [pat.var(n) for n in params] + [pat.many(n) for n in star_p]
        built = pattern(*args)
        if not isinstance(built, pat.Pat):
            raise ArgumentError("a kernel pattern function must build a pattern from its "
                                "arguments (operators and tg.* calls on them)")
        return built, tuple(params + star_p)
    raise ArgumentError(f"a kernel pattern is an op name, a function or a tg.pat pattern, "
                        f"not {type(pattern).__name__}")


def pattern_vars(p: pat.Pat) -> list[pat.Var | pat.Many]:
    """The pattern's variables (``Var``s and ``Many``s), each once, in first-seen order. A
    sub-pattern shared in a DAG is walked once (generated C patterns share heavily)."""
    out, seen, stack, visited = [], set(), [p], set()
    while stack:
        q = stack.pop()
        if id(q) in visited:
            continue
        visited.add(id(q))
        if isinstance(q, (pat.Var, pat.Many)):
            if q.name not in seen:
                seen.add(q.name)
                out.append(q)
        elif isinstance(q, pat.OpPat):
            stack.extend(reversed(q.inputs))
    return out


def element_name(name: str, i: int) -> str:
    """The name of element ``i`` of the variadic variable ``name``: ``xs[3]``."""
    return f"{name}[{i}]"


def _many(p: pat.Pat) -> pat.Many | None:
    """The pattern's ``pat.many`` variable (remembered per pattern object), or None."""
    try:
        return _MANY[p]
    except KeyError:
        found = _MANY[p] = next((v for v in pattern_vars(p) if isinstance(v, pat.Many)), None)
        return found


_MANY: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _variadic_name(p: pat.Pat) -> str | None:
    found = _many(p)
    return None if found is None else found.name


def describe(p: pat.Pat, _seen: set | None = None) -> str:
    """A pattern as readable text: ``add(mul(a, b), c)``, ``concat(*xs)``. A named (shared)
    sub-pattern is written in full once, as ``name:op(...)``, and by its name after that."""
    seen = set() if _seen is None else _seen
    if isinstance(p, pat.Var):
        return p.name
    if isinstance(p, pat.Many):
        return f"*{p.name}"
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
