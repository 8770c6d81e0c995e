"""Render docs/kernels.md, the kernel coverage report, from the kernel registry.

    python -m tensor_graphs.tools.kerneldocs            # (re)write docs/kernels.md
    python -m tensor_graphs.tools.kerneldocs --check    # exit 1 when docs/kernels.md is stale
    python -m tensor_graphs.tools.kerneldocs --print    # print the rendered page

The page is a pure function of the kernels the package registers at import on a machine
without a GPU: kernels of user files, tests and the generated-C code generator (registered on
demand) are left out, and so are kernels that read or write GPU memory (registered only where
a GPU is usable; they mirror the torch CPU kernels, and the copies to and from a GPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import tensor_graphs  # noqa: F401  (registers every op and kernel)
from tensor_graphs.ir.ops import OPS
from tensor_graphs.ir.ops.atomic import ATOMIC_OPS
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.copy import placement
from tensor_graphs.kernels.registry import Kernel, describe
from tensor_graphs.rewrite import pattern as pat
from tensor_graphs.tools import docgen

DOCS_PATH = Path(__file__).resolve().parents[2] / "docs" / "kernels.md"
COMMAND = "python -m tensor_graphs.tools.kerneldocs"
BACKENDS = ("numpy", "c", "torch", "copy")

INTRO = f"""\
# Kernels

<!-- Generated from the kernel registry by `{COMMAND}`; do not edit by hand. -->

A kernel implements a *pattern* — one op, atomic or composite, or a fused subgraph — on a
backend, with constraints (dtypes, ranks, contiguity, shape predicates) and a declared
*tolerance*: the largest norm-wise relative error ‖got − ref‖ / ‖ref‖ against the float64
reference it may show on float32/float64 outputs (float16/bfloat16 outputs are allowed their
own rounding, see `tensor_graphs/kernels/verify.py`). Every kernel below is verified by the
test suite (`tests/kernels/test_verify_all.py`) and by `tg kernels verify`.

- `numpy_<op>`: the numpy backend, always available; every atomic op and the common
  composites, at the op's own dtype semantics.
- `numpy_exact_<op>`: every op, computed by the reference interpreter in float64 and rounded
  once (tolerance 1e-7): any tolerance >= 1e-7 on float32 outputs always has a path.
- `c_*`: C kernels (compiled on first use, BLAS from `scipy-openblas32`); `torch_*`: torch on
  the CPU (`torch_cuda_*` mirror them on a GPU and are registered only there);
  `copy_*`: moves between devices (`copy_to`).
- An op with optional tensors has one kernel per combination given (`_no_bias` ...): a
  pattern fixes which inputs are present. A variadic pattern (`pat.many`) covers any number
  of inputs: the `concat` kernels (`concat(*xs)`) take a concat of 1, 2, 9 or more tensors.
- *writes `out=`*: kernels declared `writes_out` also write their result into a buffer the
  runtime gives them (`k.fn(*args, out=buf)` fills `buf` and returns it; see
  `tensor_graphs/kernels/registry.py`): results can live at offsets of a planned arena.

Regenerate with `{COMMAND}` after adding kernels; `tests/kernels/test_docs_kernels.py` fails
when this page is stale. `tg kernels list` shows the same registry as a table.

## Verification

`tg.kernels.verify(k)` (and `tg kernels verify`, `tg.kernels.load`, every generated kernel
before it is timed) calls the kernel on fresh random inputs and compares it with the float64
reference: unit-scale values at sizes 1, 7, 33 and 1025, every dtype it takes, strided,
broadcast (stride-0) and column-major inputs, and NaN, +-inf and -0.0 for elementwise
patterns. Then come adversarial cases, chosen from the atomic ops the pattern decomposes to
(`tensor_graphs/kernels/adversarial.py`), so a new op or a fused region gets them unasked:

- an exp of a max-shifted value (softmax, log_softmax, logsumexp, attention, cross_entropy):
  rows shifted by +-1.2..2 log(FLT_MAX) or spread by half that, and -inf masked positions
  (scattered, left or right padding, one finite value per row). Catches a softmax without
  the max subtracted (inf / inf), log(softmax) (log 0 = -inf), an online softmax that
  rescales by exp(-inf - -inf).
- that exp reached through a matmul (attention's q and k): values times sqrt(log(FLT_MAX)).
- a sum of squares of x - mean(x) (layer_norm, var, group_norm): rows at +-1e3..1e4 whose
  spread is 1e3..1e4 times smaller (float32). Catches the one-pass variance E[x^2] - E[x]^2.
- a division by sqrt(a row statistic) (layer_norm, rms_norm, group_norm): rows scaled by
  1e-5..100 and constant rows. Catches a forgotten eps, the wrong axis.
- a sum or max reduction: one NaN, +inf or -inf in three rows of four (nanmax, fmax).
- a float16/bfloat16 sum: pairs of +-8192..16384 that cancel (a float16 accumulator).
- every pattern: rows of length 1, every size moved to the next prime, a single element
  (squeeze, odd tails, sizes a kernel's `signatures=` missed).

The declared tolerance bounds the norm-wise error on every case, except that a case of rows
far from zero allows 16 * 2**-24 * 1e4 = 1e-2 (float32): the error of a correct two-pass or
Welford algorithm there, which a one-pass variance exceeds by orders of magnitude (or NaN).
`tests/kernels/test_verify_gallery.py` holds plausible wrong kernels (each refused) and right
ones (each admitted).
"""


def documented() -> list[Kernel]:
    """The kernels this page lists (see the module docstring)."""
    generated: set[int] = set()
    try:
        from tensor_graphs.kernels.c import codegen

        generated = {id(k) for k in codegen.cached_kernels()}
    except ImportError:  # pragma: no cover - codegen is part of the package
        pass
    out = []
    for k in registry.all():
        module = getattr(k.fn, "__module__", "") or ""
        if (id(k) in generated or set(placement(k)) != {"cpu"}
                or not module.startswith("tensor_graphs.")):
            continue
        out.append(k)
    return out


def _plain(k: Kernel) -> bool:
    """The pattern is the op over distinct variables with no attribute constraints."""
    p = k.pattern
    return (isinstance(p, pat.OpPat) and not p.attrs and p.op in OPS
            and all(isinstance(i, (pat.Var, pat.Many)) for i in p.inputs)
            and len(p.inputs) == len(OPS[p.op].params))


def _single(k: Kernel) -> bool:
    p = k.pattern
    return isinstance(p, pat.OpPat) and not any(isinstance(i, pat.OpPat) for i in p.inputs)


def _cell_entry(k: Kernel) -> str:
    """``name`` tolerance, and what narrows the pattern: the inputs given (an op with optional
    tensors), pinned attributes, scalar or repeated operands."""
    text = f"`{k.name}` {k.tolerance:g}"
    if _plain(k):
        return text
    p = k.pattern
    parts = []
    if "args" in p.attrs or len(p.inputs) != len(OPS[p.op].params) or \
            not all(isinstance(i, (pat.Var, pat.Many)) for i in p.inputs):
        parts.append(", ".join(describe(i) for i in p.inputs))
    parts += [f"{a}={v!r}" if not callable(v) else f"{a}: a predicate"
              for a, v in p.attrs.items() if a != "args"]
    return f"{text} ({_escape('; '.join(parts))})"


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    kernels = documented()
    backends = [b for b in BACKENDS if any(k.backend == b for k in kernels)]
    backends += sorted({k.backend for k in kernels} - set(backends))
    by_op: dict[str, list[Kernel]] = {}
    fused = []
    for k in kernels:
        if _single(k) and k.op in OPS:
            by_op.setdefault(k.op, []).append(k)
        else:
            fused.append(k)
    lines = [INTRO, "## Summary", "", "| backend | kernels | ops covered | writes `out=` |",
             "|---|---|---|---|"]
    for b in backends:
        ks = [k for k in kernels if k.backend == b]
        ops = {k.op for k in ks if _single(k)}
        lines.append(f"| {b} | {len(ks)} | {len(ops)} | {sum(k.writes_out for k in ks)} |")
    composites = sorted(n for n, op in OPS.items() if op.kind == "composite"
                        and op.decompose.__module__.startswith("tensor_graphs."))
    atomic = [n for n in ATOMIC_OPS if n in OPS]
    uncovered = [n for n in atomic + composites
                 if not any(k.backend != "numpy" or not k.name.startswith("numpy_exact")
                            for k in by_op.get(n, []))]
    lines += ["", f"{len(kernels)} kernels; {len(atomic)} atomic and {len(composites)} "
              f"composite ops. Ops with only the exact kernel (and their decomposition): "
              + (", ".join(f"`{n}`" for n in uncovered) or "none") + ".", ""]
    header = "| op | kind | " + " | ".join(backends) + " |"
    rule = "|---|---|" + "---|" * len(backends)
    for title, names in (("Atomic ops", atomic), ("Composite ops", composites)):
        lines += [f"## {title}", "", header, rule]
        for name in names:
            ks = by_op.get(name, [])
            cells = ["<br>".join(_cell_entry(k) for k in ks if k.backend == b) or "—"
                     for b in backends]
            lines.append(f"| `{name}` | {OPS[name].kind} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Fused kernels", "",
              "Kernels whose pattern covers several ops (one kernel, one pass over memory).", ""]
    if fused:
        lines += ["| pattern | backend | kernel | tolerance |", "|---|---|---|---|"]
        for k in sorted(fused, key=lambda k: (describe(k.pattern), k.backend, k.name)):
            lines.append(f"| `{_escape(describe(k.pattern))}` | {k.backend} | `{k.name}` | "
                         f"{k.tolerance:g} |")
    else:
        lines.append("None registered.")
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    return docgen.main(render, DOCS_PATH, COMMAND, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
