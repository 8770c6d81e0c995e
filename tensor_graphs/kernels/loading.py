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
import sys
from pathlib import Path

import numpy as np

from tensor_graphs.errors import ArgumentError, TensorGraphsError
from tensor_graphs.files import check_trusted_file, read_regular
from tensor_graphs.ir import api as tg  # the builders: what a pattern's text may call
from tensor_graphs.ir.graph import decompose, format_graph, nodes
from tensor_graphs.ir.ops import OPS
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.registry import Kernel, describe, pattern_vars
from tensor_graphs.kernels.signatures import VARIADIC_ARITIES
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


# ---------------------------------------------------------------------------- prompt
def prompt(pattern, name: str | None = None, backend: str = "numpy") -> str:
    """A request to write a kernel for ``pattern`` (see ``parse_pattern``): the reference graph
    for an example signature, its atomic decomposition with the ops' meanings, the function
    signature expected, the rules and how ``tg.kernels.load`` will check it."""
    built, names, spelled = parse_pattern(pattern)
    root_op = OPS.get(built.op) if isinstance(built, pat.OpPat) else None
    label = root_op.name if root_op is not None and not any(
        isinstance(i, pat.OpPat) for i in built.inputs) else "fused"
    fname = name or f"my_{label}"
    attr_names = _attr_names(built)
    star = registry._variadic_name(built)  # the function takes it as *name
    params = [f"*{n}" if n == star else n for n in names]
    probe = Kernel(name=fname, pattern=built, backend=backend, device="cpu",
                   fn=lambda *a, **k: None, inputs=names, attrs=tuple(attr_names))
    examples: list[tuple] = []
    for case in kernel_cases(probe):
        b = build_case(probe, case)
        if isinstance(b, Built):
            examples.append((case, b))
    lines = [f"# Write a tensor_graphs kernel for `{describe(built)}`", ""]
    lines += [
        "A kernel is a Python function registered with `@tg.kernel`. It must compute exactly "
        "what the reference graph below computes (the numpy reference interpreter, evaluated "
        "in float64, is the judge), for every input signature its constraints accept.", ""]
    if not examples:
        lines += ["(No example signature could be built for this pattern; give the kernel "
                  "`signatures=[{input: shape, ...}]` so it can be verified.)", ""]
    else:
        case, b = _pick_example(examples)
        lines += [f"## Reference graph (example signature: {case.describe()})", "", "```",
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
    lines += ["## The kernel expected", "", "```python", "import numpy as np",
              "import tensor_graphs as tg", "",
              f"@tg.kernel({spelled}, backend={backend!r}, name={fname!r})",
              f"def {fname}({', '.join(params + attr_names)}):",
              f'    """{describe(built)}."""',
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
        shown = ", ".join(f"`{a}`" for a in attr_names)
        lines += [f"- After them, the root node's attributes it needs, by name: {shown} "
                  "(leave out the ones it does not read)."]
    if examples:
        root = _pick_example(examples)[1].root
        lines += [f"- Return a new numpy array of the output's shape and dtype "
                  f"(here {tuple(root.shape)} {root.dtype.name}); "
                  "never modify an input, never return an input or a view of one (unless you "
                  "declare `view=True`)."]
    lines += [
        "- Keep each op's dtype semantics: float16/bfloat16 may compute in float32 and round "
        "once; int arithmetic wraps. NaN and +-inf must propagate exactly as in the reference "
        "(no fast-math).",
        "- Optional arguments of @tg.kernel: `dtypes=(...)`, `ranks=(...)`, "
        "`contiguous=True`, `where=lambda shapes, dtypes, attrs: True or 'reason'` to narrow "
        "the inputs it takes; `tolerance=` the largest error it may show (default 1e-6); "
        "`signatures=[{input: shape or (shape, dtype), 'attrs': {...}}]` to say which inputs "
        "to verify it on (needed when the pattern's shapes cannot be guessed).", ""]
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
