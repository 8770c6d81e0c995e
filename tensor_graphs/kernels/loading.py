"""Kernels from outside: ``tg.kernels.load(file)`` admits a file's kernels after verification,
and ``tg.kernels.prompt(pattern)`` writes the request a person or a language model needs to
write one.

    tg.kernels.load("my_kernels.py")     # a file of @tg.kernel definitions
    print(tg.kernels.prompt("layer_norm"))
    print(tg.kernels.prompt("gelu(x @ w + b)"))   # a fused pattern: free names are inputs
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import keyword
import math
import sys
import types
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from tensor_graphs.errors import ArgumentError, TensorGraphsError
from tensor_graphs.files import check_trusted_file, read_regular
from tensor_graphs.ir import api as tg  # the builders: what a pattern's text may call
from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.graph import decompose, format_graph, nodes
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.registry import Kernel, describe, pattern_vars
from tensor_graphs.kernels.signatures import VARIADIC_ARITIES, Case, as_spec
from tensor_graphs.kernels.verify import (
    Built,
    build_case,
    kernel_cases,
    verification_error,
    verify,
)
from tensor_graphs.rewrite import pattern as pat


def load(path) -> list[Kernel]:
    """Import ``path`` (a Python file of ``@tg.kernel`` definitions), verify every kernel it
    defines and register those that pass. Returns the admitted kernels; if any failed, raises
    ``KernelVerificationError`` (``.reports``, ``.admitted``) after registering the others.
    A kernel whose name is taken by a kernel from another file raises ArgumentError (nothing
    from the file is registered); loading the same file again replaces its kernels.

    The file is run as code, so it must be one only this user (or root) can have written
    (``files.check_trusted_file``, else ``UntrustedPathError``), and it is compiled from its
    source as read here: never from a ``__pycache__`` file beside it, which in a shared folder
    such as /tmp another user could have planted to match the source's size and time."""
    path = Path(path).resolve()
    source = read_regular(path, "kernel file", "give a Python file of @tg.kernel definitions",
                          ArgumentError)
    check_trusted_file(path, "kernel file")  # before a line of it runs
    try:
        code = compile(source, str(path), "exec", dont_inherit=True)
    except (SyntaxError, ValueError) as exc:
        raise ArgumentError(f"tg.kernels.load: cannot read {path} as Python: "
                            f"{type(exc).__name__}: {exc}") from None
    digest = hashlib.blake2b(str(path).encode(), digest_size=6).hexdigest()
    module_name = f"tg_user_kernels_{_identifier(path.stem)}_{digest}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    outer = registry._PENDING
    registry._PENDING = pending = []
    sys.modules[module_name] = module
    try:
        exec(code, module.__dict__)  # noqa: S102 - the user's own, checked file
    except TensorGraphsError:
        sys.modules.pop(module_name, None)
        raise
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ArgumentError(f"tg.kernels.load: importing {path} raised "
                            f"{type(exc).__name__}: {exc}") from exc
    finally:
        registry._PENDING = outer
    for k, replace in pending:
        existing = registry._KERNELS.get(k.name)
        if existing is not None and not replace and _source_file(existing) != str(path):
            raise ArgumentError(f"tg.kernels.load: {path.name} defines kernel '{k.name}', but "
                                f"that name is taken by a {existing.backend} kernel; rename it "
                                f"(or pass replace=True to @tg.kernel)")
    admitted, failed = [], []
    for k, _ in pending:
        report = verify(k)
        if report.ok:
            registry.register(k, replace=True)
            admitted.append(k)
        else:
            failed.append(report)
    if failed:
        err = verification_error(failed)
        err.admitted = admitted
        raise err
    return admitted


def _shown(text: str) -> str:
    """A pattern's text for an error message: quoted, at most 60 characters of it."""
    return repr(text) if len(text) <= 60 else repr(text[:60]) + "..."


def _identifier(text: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in text)


def _source_file(k: Kernel) -> str:
    try:
        return str(Path(inspect.getsourcefile(k.fn)).resolve())
    except (TypeError, OSError):
        return ""


# ---------------------------------------------------------------------------- patterns
def parse_pattern(text) -> tuple[pat.Pat, tuple[str, ...], str]:
    """(pattern, input names, how @tg.kernel names it) from an op name ("layer_norm"), a
    registered kernel's name, a lambda ("lambda a, b: a * b") or an expression whose free names
    are the inputs ("gelu(x @ w + b)", "softmax(x, axis=-1)"); a pattern object or a function
    of pattern variables works too."""
    if isinstance(text, pat.Pat):
        found = pattern_vars(text)  # fixed variables first, a variadic one (pat.many) last
        names = tuple(v.name for v in found if isinstance(v, pat.Var)) + tuple(
            v.name for v in found if isinstance(v, pat.Many))
        return text, names, "pattern"
    if callable(text) and not isinstance(text, str):
        built, names = registry.trace_pattern(text, ())
        return built, names, "pattern"
    if not isinstance(text, str) or not text.strip():
        raise ArgumentError(f"a pattern is an op name or an expression, got {text!r}")
    text = text.strip()
    if text in OPS and not OPS[text].is_leaf:  # a variadic op: op(*xs), any number of inputs
        built, names = registry.trace_pattern(text, ())
        return built, names, repr(text)
    if text in registry._KERNELS:
        k = registry._KERNELS[text]
        return k.pattern, k.inputs, f"tg.kernels.get({text!r}).pattern"
    namespace = {"tg": tg, "pat": pat, "np": np}
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, RecursionError, MemoryError) as exc:  # the last two: nested too deep
        why = exc.msg if isinstance(exc, SyntaxError) else "nested too deeply to parse"
        raise ArgumentError(f"cannot read pattern {_shown(text)}: not an op name, a kernel name "
                            f"or a Python expression ({why})") from None
    if isinstance(tree.body, ast.Lambda):
        fn = eval(compile(tree, "<pattern>", "eval"), namespace)  # noqa: S307 - user's own text
        built, names = registry.trace_pattern(fn, ())
        return built, names, text
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call)
              and isinstance(n.func, ast.Name)}
    free = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Name)
                   and n.id not in called and n.id not in namespace),
                  key=lambda n: (n.lineno, n.col_offset))
    names = tuple(dict.fromkeys(n.id for n in free))
    for name in called:
        fn = getattr(tg, name, None)
        if fn is None and name in OPS:
            fn = getattr(pat, name)
        if fn is None:
            raise ArgumentError(f"pattern {_shown(text)}: unknown function '{name}' (use tg.* "
                                "names such as gelu, softmax, matmul, or an op name)")
        namespace[name] = fn
    namespace.update({n: pat.var(n) for n in names})
    spelled = f"lambda {', '.join(names)}: {ast.unparse(_qualify(tree, called)).strip()}"
    try:
        built = eval(compile(tree, "<pattern>", "eval"), namespace)  # noqa: S307
    except TensorGraphsError:
        raise
    except Exception as exc:
        raise ArgumentError(f"pattern {_shown(text)} does not build: {type(exc).__name__}: "
                            f"{exc}") from None
    if not isinstance(built, pat.Pat):
        raise ArgumentError(f"pattern {_shown(text)} does not use any input")
    return built, names, spelled


def _qualify(tree: ast.Expression, called: set[str]) -> ast.AST:
    """The expression with its function names written tg.<name> (as a kernel file spells it)."""

    class Qualify(ast.NodeTransformer):
        def visit_Call(self, node):  # noqa: N802 - ast's naming
            self.generic_visit(node)
            if isinstance(node.func, ast.Name) and node.func.id in called:
                node.func = ast.Attribute(ast.Name("tg", ast.Load()), node.func.id, ast.Load())
            return node

    return ast.fix_missing_locations(Qualify().visit(ast.parse(ast.unparse(tree),
                                                               mode="eval"))).body


# ---------------------------------------------------------------------------- pattern text
def pattern_source(p: pat.Pat, target: str = "PATTERN") -> str | None:
    """Python lines that rebuild ``p`` with ``tg.pat`` and assign it to ``target``: how a kernel
    file spells a pattern that exists only as an object (a generated region's), exactly —
    dtype guards, constants, attributes and shared sub-patterns included. One line per op, as
    the reference graph is listed (a nested expression of a 192-op region would pass Python's
    nesting limit). None when the pattern holds something text cannot carry (a predicate), or
    when the text does not rebuild the same pattern."""
    lines: list[str] = []
    done: dict[int, str] = {}  # id(sub-pattern) -> the expression naming it
    taken = {"tg", "np", target}
    counter = [0]

    def fresh(hint: str) -> str:
        if hint.isidentifier() and not keyword.iskeyword(hint) and hint not in taken:
            taken.add(hint)
            return hint
        while True:
            counter[0] += 1
            name = f"p{counter[0]}"
            if name not in taken:
                taken.add(name)
                return name

    def guards(v: pat.Var) -> str | None:
        out = []
        if v.dtype is not None:
            text = _dtype_guard(v.dtype)
            if text is None:
                return None
            out.append(f"dtype={text}")
        if v.rank is not None:
            out.append(f"rank={v.rank!r}")
        if v.const is not None:
            text = _value(v.const)
            if text is None:
                return None
            out.append(f"const={text}")
        if v.single_use:
            out.append("single_use=True")
        if v.shape is not None or v.where is not None:
            return None
        return "".join(", " + g for g in out)

    def expr(q: pat.Pat) -> str | None:
        if id(q) in done:
            return done[id(q)]
        if isinstance(q, pat.Const):
            return _value(q.value)
        if isinstance(q, pat.Var):
            g = guards(q)
            if g is None:
                return None
            name = fresh(q.name)
            lines.append(f"{name} = tg.pat.var({q.name!r}{g})")
        elif isinstance(q, pat.Many):
            g = "" if q.each is None else guards(q.each)
            if g is None:
                return None
            name = fresh(q.name)
            lines.append(f"{name} = tg.pat.many({q.name!r}, min={q.min!r}{g})")
        elif isinstance(q, pat.OpPat):
            args = []
            for i in q.inputs:
                text = expr(i)
                if text is None:
                    return None
                args.append(text)
            for k, v in q.attrs.items():
                text = _value(v)
                if text is None or not k.isidentifier():
                    return None
                args.append(f"{k}={text}")
            call = f"tg.pat.op({', '.join([repr(q.op)] + args)})"
            if q.name is not None:
                call += f".bind({q.name!r})"
            name = fresh(q.name or "")
            lines.append(f"{name} = {call}")
        else:
            return None
        done[id(q)] = name
        return name

    try:
        last = expr(p)
    except RecursionError:
        return None
    if last is None or isinstance(p, pat.Const):
        return None
    # the last line assigns the whole pattern: give it the target's name
    lines[-1] = f"{target} = " + lines[-1].split(" = ", 1)[1]
    text = "\n".join(lines)
    return text if _rebuilds(text, target, p) else None


def _dtype_guard(d) -> str | None:
    if isinstance(d, (tuple, list)):
        parts = [_dtype_guard(x) for x in d]
        return None if None in parts else f"({', '.join(parts)}{',' if len(parts) == 1 else ''})"
    if isinstance(d, str) and d in ("float", "int", "bool"):
        return repr(d)
    try:
        return repr(_dtypes.as_dtype(d).name)
    except (TensorGraphsError, TypeError, ValueError):
        return None


def _value(v) -> str | None:
    """A pattern constant or attribute as Python text (None: it cannot be written)."""
    if isinstance(v, _dtypes.DType):
        return "tg.bool_" if v.name == "bool" else f"tg.{v.name}"
    if isinstance(v, np.generic):
        v = v.item()
    if v is None or isinstance(v, (bool, int, str)):
        return repr(v)
    if isinstance(v, float):
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("inf")' if v > 0 else '-float("inf")'
        return repr(v)
    if isinstance(v, (tuple, list)):
        parts = [_value(x) for x in v]
        if None in parts:
            return None
        inner = ", ".join(parts) + ("," if len(parts) == 1 and isinstance(v, tuple) else "")
        return f"({inner})" if isinstance(v, tuple) else f"[{inner}]"
    return None


def _rebuilds(text: str, target: str, p: pat.Pat) -> bool:
    """Whether running ``text`` gives a pattern written out as ``p`` is (same ops, attributes,
    constants, variables and guards, same sharing)."""
    names = {d: getattr(_dtypes, d) for d in ("bfloat16", "bool_", "float16", "float32",
                                               "float64", "int8", "int32", "int64", "uint8")}
    space = {"tg": types.SimpleNamespace(pat=pat, **names)}
    try:
        exec(compile(text, "<pattern>", "exec", dont_inherit=True), space)  # noqa: S102 - ours
    except Exception:  # noqa: BLE001 - text we could not write faithfully: not offered
        return False
    got = space.get(target)
    return isinstance(got, pat.Pat) and _shape_of(got) == _shape_of(p)


def _shape_of(p: pat.Pat) -> tuple:
    """A pattern as comparable data: ops, attributes, constants (with their Python type),
    variables with their guards, and a sub-pattern used twice as a reference to its first
    appearance."""
    seen: dict[int, int] = {}

    def key(q: pat.Pat):
        if isinstance(q, pat.Const):
            return ("const", repr(q.value), type(q.value).__name__)
        if isinstance(q, pat.Var):  # a dtype guard as a DType or its name is the same guard
            return ("var", q.name, _dtype_guard(q.dtype), q.rank, repr(q.const), q.single_use)
        if isinstance(q, pat.Many):
            return ("many", q.name, q.min, None if q.each is None else key(q.each))
        if id(q) in seen:
            return ("ref", seen[id(q)])
        seen[id(q)] = len(seen)
        attrs = tuple(sorted((k, repr(v)) for k, v in q.attrs.items()))
        return ("op", q.op, q.name, attrs, tuple(key(i) for i in q.inputs))

    return key(p)


# ---------------------------------------------------------------------------- prompt
def prompt(pattern, name: str | None = None, backend: str = "numpy", *,
           calls: Sequence[Mapping[str, object]] | None = None, tolerance: float | None = None,
           signatures: Sequence[Mapping[str, object]] | None = None) -> str:
    """A request to write a kernel for ``pattern`` (see ``parse_pattern``): the reference graph
    for an example signature, its atomic decomposition with the ops' meanings, the function
    signature expected, the calling convention with an example kernel, the rules and how
    ``tg.kernels.load`` will check it.

    For a pattern that exists only as an object (a generated region's), the template spells it
    with ``tg.pat`` (``pattern_source``). ``calls``: the signatures (input name -> shape,
    (shape, dtype) or Spec) the kernel will be called with — a plan's; the reference graph is
    shown for the first and all are listed. ``tolerance``: the largest error the kernel may
    declare (written into the template). ``signatures``: the verification signatures to put in
    the template (``signatures=``), for a fused pattern whose shapes cannot be guessed."""
    built, names, spelled = parse_pattern(pattern)
    root_op = OPS.get(built.op) if isinstance(built, pat.OpPat) else None
    label = root_op.name if root_op is not None and not any(
        isinstance(i, pat.OpPat) for i in built.inputs) else "fused"
    fname = name or f"my_{label}"
    attr_names = _attr_names(built)
    star = registry._variadic_name(built)  # the function takes it as *name
    params = [f"*{n}" if n == star else n for n in names]
    defined = pattern_source(built) if spelled == "pattern" else None
    sigs = [dict(s) for s in signatures] if signatures else None
    probe = Kernel(name=fname, pattern=built, backend=backend, device="cpu",
                   fn=lambda *a, **k: None, inputs=names, attrs=tuple(attr_names),
                   signatures=sigs)
    examples: list[tuple] = []
    for case in kernel_cases(probe):
        b = build_case(probe, case)
        if isinstance(b, Built):
            examples.append((case, b))
    planned: list[tuple] = []
    for call in calls or ():
        case = Case({k: as_spec(v) for k, v in call.items() if k != "attrs"},
                    dict(call.get("attrs", {})), "this plan")
        b = build_case(probe, case)
        if isinstance(b, Built):
            planned.append((case, b))
    title = describe(built)
    if len(title) <= 200:
        lines = [f"# Write a tensor_graphs kernel for `{title}`", ""]
    else:  # a generated region: its text would fill the screen; PATTERN spells it out
        title = f"a fused pattern of {_op_count(built)} ops"
        lines = [f"# Write a tensor_graphs kernel for {title} (PATTERN below)", ""]
    lines += [
        "A kernel is a Python function registered with `@tg.kernel`. It must compute exactly "
        "what the reference graph below computes (the numpy reference interpreter, evaluated "
        "in float64, is the judge), for every input signature its constraints accept.", ""]
    shown_case = planned[0] if planned else (_pick_example(examples) if examples else None)
    if shown_case is None:
        lines += ["(No example signature could be built for this pattern; give the kernel "
                  "`signatures=[{input: shape, ...}]` so it can be verified.)", ""]
    else:
        case, b = shown_case
        where = "the signature it is called with" if planned else "example signature"
        lines += [f"## Reference graph ({where}: {case.describe()})", "", "```",
                  format_graph(b.root), "```", ""]
        atomic = decompose(b.root)
        if atomic is not b.root:
            lines += ["## The same graph in atomic ops", "", "```", format_graph(atomic), "```",
                      ""]
        used = []
        for n in nodes(atomic):
            if not n.op.is_leaf and n.op.name not in used:
                used.append(n.op.name)
        lines += ["## Meaning of the ops used", ""]
        lines += [f"- `{op}`: {OPS[op].doc}" for op in used]
        lines += [f"- `{n.op.name}` (composite): {n.op.doc}" for n in nodes(b.root)
                  if n.op.kind == "composite"][:8]
        lines += [""]
    if planned:
        lines += ["## The calls it must serve", "",
                  "The program this kernel is for calls it with these inputs (it may "
                  "accept more; it must accept these):", ""]
        lines += [f"- {c.describe()} -> {tuple(b.root.shape)} {b.root.dtype.name}"
                  for c, b in planned]
        lines += [""]
    options = [f"backend={backend!r}", f"name={fname!r}"]
    if tolerance is not None:
        options.append(f"tolerance={tolerance:g}")
    if sigs:
        options.append("signatures=SIGNATURES")
    header = ["import numpy as np", "import tensor_graphs as tg", ""]
    if defined:
        header += ["# the pattern (keep it as it is: it says what the kernel computes)",
                   *defined.splitlines(), ""]
    if sigs:
        header += ["# the inputs it is verified on (keep them)",
                   f"SIGNATURES = {_signatures_text(sigs)}", ""]
    arg = "PATTERN" if defined else spelled
    lines += ["## The kernel expected", "", "```python", *header,
              f"@tg.kernel({arg}, {', '.join(options)})",
              f"def {fname}({', '.join(params + attr_names)}):",
              f'    """{title}."""',
              "    ...  # compute with numpy (or call your library)",
              "    return result  # a new array", "```", ""]
    lines += ["- Positional parameters: the inputs, in this order: "
              + ", ".join(f"`{n}`" for n in params) + "; numpy arrays (they may be "
              "non-contiguous or broadcast views: pass `contiguous=True` to @tg.kernel if the "
              "kernel needs C-contiguous inputs)."]
    if star is not None:
        lines += [f"- `*{star}` is variadic: one array per input of the node, any number of "
                  f"them (the verifier tries {', '.join(map(str, VARIADIC_ARITIES))})."]
    if attr_names:
        shown_attrs = ", ".join(f"`{a}`" for a in attr_names)
        lines += [f"- After them, the root node's attributes it needs, by name: {shown_attrs} "
                  "(leave out the ones it does not read)."]
    if shown_case is not None:
        root = shown_case[1].root
        lines += [f"- Return a new numpy array of the output's shape and dtype "
                  f"(here {tuple(root.shape)} {root.dtype.name}); "
                  "never modify an input, never return an input or a view of one (unless you "
                  "declare `view=True`)."]
    lines += [
        "- Or write into the program's own buffer: declare `writes_out=True` and take "
        "`out=None` as a keyword. When `out` is given it is a writeable C-contiguous array of "
        "the result's exact shape and dtype, possibly holding garbage, never overlapping an "
        "input: fill it and return that very array. Called without `out`, allocate as usual.",
        "- Keep each op's dtype semantics: float16/bfloat16 may compute in float32 and round "
        "once; int arithmetic wraps. NaN and +-inf must propagate exactly as in the reference "
        "(no fast-math).",
        "- Optional arguments of @tg.kernel: `dtypes=(...)`, `ranks=(...)`, "
        "`contiguous=True`, `where=lambda shapes, dtypes, attrs: True or 'reason'` to narrow "
        "the inputs it takes; `tolerance=` the largest error it may show (default 1e-6); "
        "`signatures=[{input: shape or (shape, dtype), 'attrs': {...}}]` to say which inputs "
        "to verify it on (needed when the pattern's shapes cannot be guessed)."]
    if tolerance is not None:
        lines += [f"- Declare `tolerance=` at most {tolerance:g}: a kernel declaring more is "
                  "refused."]
    lines += ["", "An example of a complete kernel file (for another pattern, `a * b + 1`), "
              "writing into `out` when it is given:", "", "```python", EXAMPLE_KERNEL.strip(),
              "```", ""]
    lines += ["## How it is checked", "",
              "`tg.kernels.load('my_kernels.py')` imports the file and verifies each kernel "
              "before registering it: fresh random inputs (never zeros) of sizes 1, 7, 33 and "
              "1025, broadcast and strided inputs where the constraints allow, NaN, +-inf and "
              "large magnitudes for elementwise patterns. The result must have the node's shape "
              "and dtype, NaN/inf where the reference has them, and a norm-wise relative error "
              "||got - ref|| / ||ref|| against the float64 reference within the kernel's "
              "tolerance. A kernel that fails is not registered (KernelVerificationError).", ""]
    if examples:
        lines += ["Signatures it will be tried on (the kernel's constraints may skip some):", ""]
        lines += [f"- {c.describe()}" for c, _ in examples[:10]]
        if len(examples) > 10:
            lines += [f"- ... and {len(examples) - 10} more"]
    return "\n".join(lines).rstrip() + "\n"


# The calling convention shown in every prompt: a whole file, which tests load and verify.
EXAMPLE_KERNEL = '''
import numpy as np
import tensor_graphs as tg


@tg.kernel(lambda a, b: a * b + 1.0, backend="numpy", name="example_mul_add_one",
           dtypes=("float32", "float64"), writes_out=True)
def example_mul_add_one(a, b, *, out=None):
    """a * b + 1, into the program's buffer when it gives one."""
    result = np.multiply(a, b, out=out)  # out=None: a new array
    result += result.dtype.type(1)
    return result
'''


def _op_count(p: pat.Pat) -> int:
    seen: set[int] = set()
    stack = [p]
    while stack:
        q = stack.pop()
        if isinstance(q, pat.OpPat) and id(q) not in seen:
            seen.add(id(q))
            stack.extend(q.inputs)
    return len(seen)


def _signatures_text(sigs: Sequence[Mapping[str, object]]) -> str:
    """Verification signatures as Python text: (shape, dtype) pairs, a Spec where the values
    are drawn otherwise than from the normal distribution."""
    rows = []
    for sig in sigs:
        parts = []
        for k, v in sig.items():
            if k == "attrs":
                parts.append(f"{k!r}: {dict(v)!r}")
                continue
            spec = as_spec(v) if not isinstance(v, list) else None
            if spec is None:
                parts.append(f"{k!r}: {v!r}")
            elif spec.values == "normal" and spec.leaf == "input" and spec.axes is None:
                parts.append(f"{k!r}: ({tuple(spec.shape)!r}, {spec.dtype!r})")
            else:
                parts.append(f"{k!r}: tg.kernels.signatures.Spec({tuple(spec.shape)!r}, "
                             f"{spec.dtype!r}, {spec.values!r}, {spec.high!r})")
        rows.append("{" + ", ".join(parts) + "}")
    return "[\n    " + ",\n    ".join(rows) + ",\n]"


def _attr_names(p: pat.Pat) -> list[str]:
    if not isinstance(p, pat.OpPat) or p.op not in OPS:
        return []
    return [a for a in OPS[p.op].attr_defaults if a not in p.attrs or callable(p.attrs[a])]


def _pick_example(examples):
    """A readable example: few size-1 axes and a middling size (not the 1025 or the 1-element
    case)."""
    def score(item):
        specs = item[0].specs.values()
        ones = sum(1 for s in specs for d in s.shape if d == 1)
        total = sum(int(np.prod(s.shape)) for s in specs)
        return ones, abs(np.log(max(total, 1) / 300.0))
    return min(examples, key=score)
