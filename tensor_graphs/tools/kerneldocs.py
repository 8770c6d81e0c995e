"""Render docs/kernels.md, the kernel coverage report, from the kernel registry.

    python -m tensor_graphs.tools.kerneldocs            # (re)write docs/kernels.md
    python -m tensor_graphs.tools.kerneldocs --check    # exit 1 when docs/kernels.md is stale
    python -m tensor_graphs.tools.kerneldocs --print    # print the rendered page

The tables are a pure function of the kernels the package registers at import on a machine
without a GPU: kernels of user files, tests and the generated-C code generator (registered on
demand) are left out, and so are kernels that read or write GPU memory (registered only where
a GPU is usable). Those get a section of their own, read from the code that would register
them (the templates' config tuples, the generated kernels' launch configs, the torch and copy
modules' sources), never from the registry: the page is the same on any machine, GPU,
simulated GPU or none, and rendering it imports neither torch nor triton.
"""

from __future__ import annotations

import ast
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
  the CPU (`torch_cuda_*` mirror them on a GPU, registered only there: *GPU kernels*);
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
    lines += ["", gpu_section()]
    return "\n".join(lines).rstrip() + "\n"


# ---------------------------------------------------------------------------- GPU kernels
# Registered only where a GPU is usable, so read from the code that would register them: the
# templates' and launches' config tuples, and the torch and copy modules' decorators (their
# sources, parsed: registering them needs a GPU). Nothing here imports torch or triton
# (``test_docs_kernels`` checks); ``register()`` of each template names its kernels as below.
def _table(header: tuple[str, ...], rows: list[tuple]) -> list[str]:
    return (["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
            + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def _codes(names) -> str:
    return ", ".join(f"`{n}`" for n in names)


def _calls(node, name: str) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == name)


def _constant(node, what: str):
    if not isinstance(node, ast.Constant):
        raise ValueError(f"kerneldocs reads {what} from the source and needs a literal there, "
                         f"got `{ast.unparse(node)}`")
    return node.value


def _decorated(path: Path, decorator: str) -> list[tuple[str, ast.Call]]:
    """(function name, decorator call) of each ``@decorator(...)`` in a module's source."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [(node.name, d) for node in ast.walk(tree) if isinstance(node, ast.FunctionDef)
            for d in node.decorator_list if _calls(d, decorator)]


def torch_cuda_kernels() -> tuple[list[str], list[tuple[str, dict[str, str]]]]:
    """(the torch CUDA kernel names a GPU registers, and each ``torch_kernel`` label with the
    CUDA keywords it was given), from the sources of ``kernels/torch/``: ``torch_kernel``
    registers ``torch_cuda_<label>`` beside ``torch_<label>`` unless told ``cuda=False``, and
    ``kernel(..., name="torch_cuda_...")`` registers a CUDA kernel outright."""
    from tensor_graphs.kernels import torch as package  # imports no torch

    names, labels = [], []
    for path in sorted(Path(package.__file__).parent.glob("*.py")):
        for fn, call in _decorated(path, "torch_kernel"):
            keywords = {k.arg: k.value for k in call.keywords}
            label = (call.args[1] if len(call.args) > 1 else keywords.get("label"))
            label = fn if label is None else _constant(label, "a torch kernel's label")
            cuda = {k[5:] or "function": ast.unparse(v) for k, v in keywords.items()
                    if k.startswith("cuda")}
            labels.append((label, cuda))
            if cuda.get("function") != "False":
                names.append(f"torch_cuda_{label}")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = next((k.value for k in getattr(node, "keywords", ())
                         if _calls(node, "kernel") and k.arg == "name"), None)
            if isinstance(name, ast.Constant) and str(name.value).startswith("torch_cuda_"):
                names.append(name.value)
    return sorted(set(names)), labels


def gpu_copies() -> list[tuple[str, str, str, bool]]:
    """(name, source kind, target kind, moves nothing) of each copy kernel to, from or within
    a GPU, from ``kernels/copy.py``'s ``@copy_kernel`` decorators."""
    from tensor_graphs.kernels import copy

    out = []
    for _, call in _decorated(Path(copy.__file__), "copy_kernel"):
        name, source, target = (_constant(a, "a copy kernel's route") for a in call.args[:3])
        same = any(k.arg == "same_memory" and _constant(k.value, "same_memory")
                   for k in call.keywords)
        if "cuda" in (source, target):
            out.append((name, source, target, bool(same)))
    return out


def _generated_prefixes() -> dict[str, str]:
    """kind -> the kernel name prefix ``generate._candidate`` hashes a config under."""
    from tensor_graphs.kernels.triton import generate

    tree = ast.parse(Path(generate.__file__).read_text(encoding="utf-8"))
    return {_constant(n.args[0], "a candidate kind"): _constant(n.args[1], "a kernel prefix")
            for n in ast.walk(tree) if _calls(n, "_candidate") and len(n.args) > 1
            and isinstance(n.args[0], ast.Constant)}


def matmul_kernels() -> list[tuple[object, object, str]]:
    """(epilogue, config, name) of every GEMM template kernel, as ``matmul.register`` names them."""
    from tensor_graphs.kernels.triton.templates import matmul

    return [(e, c, f"triton_{e.label}_{c.label}") for e in matmul.EPILOGUES
            for c in matmul.configs(e)]


def attention_kernels() -> list[tuple[str, object, str]]:
    """(kind, config, name) of every attention template kernel, as ``attention.register``
    names them (no mask, then ``_mask``)."""
    from tensor_graphs.kernels.triton.templates import attention as at

    return [(kind, c, f"triton_{kind}_attention{suffix}_{c.label}")
            for kind, configs in (("flash", at.FLASH_CONFIGS), ("decode", at.DECODE_CONFIGS))
            for c in configs for suffix in ("", "_mask")]


def rope_kernels() -> list[tuple[object, str]]:
    from tensor_graphs.kernels.triton.templates import rope

    return [(c, f"triton_rotary_embedding_{c.label}") for c in rope.CONFIGS]


def gather_kernels() -> list[tuple[object, str]]:
    from tensor_graphs.kernels.triton.templates import gather

    return [(c, f"triton_embedding_{c.label}") for c in gather.CONFIGS]


def argmax_kernels() -> list[tuple[object, str]]:
    from tensor_graphs.kernels.triton.templates import argmax

    return [(c, f"triton_argmax_{c.label}") for c in argmax.CONFIGS]


def _epilogue(e) -> str:
    """What a GEMM epilogue computes (the pattern's variables)."""
    a = "x" if e.linear else "a"
    a = f"{e.norm}_norm({a}, eps={e.eps:g})" if e.norm else a
    y = (f"{a} @ weight.T" if e.linear else f"{a} @ b") + (" + bias" if e.bias else "")
    return (f"{e.act}({y})" if e.act else y) + (" + res" if e.residual else "")


def gpu_section() -> str:
    from tensor_graphs.devices import SIMULATED, SIMULATED_CAPACITY
    from tensor_graphs.kernels import triton as tr
    from tensor_graphs.kernels.triton import generate
    from tensor_graphs.kernels.triton.templates import argmax, gather, matmul, rope
    from tensor_graphs.kernels.triton.templates import attention as at

    run = [d for d in tr.FLOAT_DTYPES if d not in tr.WRONG_IN_INTERPRETER]
    lines = ["## GPU kernels", "",
             "Registered only where a GPU, real or simulated, is usable (the generated ones: "
             "offered), so the tables above leave them out. This section is read from the code "
             "that registers them: the same on any machine.", "",
             '**The device.** `tg.compile(graph, device="cuda")` (or `"cuda:N"`, or a '
             '`tg.Device("cuda:0")`, whose capacity bounds the program) runs each step where '
             "the planner finds it fastest, host or GPU. A program keeps one arena per device; "
             "weights and kept states (a KV cache) live on the GPU, moved there once per "
             "binding. Values cross devices only through `copy_to` steps, which the planner "
             "costs from measurements "
             "like any kernel:", ""]
    lines += _table(("copy kernel", "from", "to", "cost"),
                    [(f"`{n}`", s, t, "0: moves nothing" if same else "measured")
                     for n, s, t, same in gpu_copies()])
    lines += ["", f"**The simulated GPU.** With `{SIMULATED}=1` (a "
              f"{SIMULATED_CAPACITY >> 30} GiB GPU; or its capacity in bytes) set before "
              "tensor_graphs is imported, `cuda:0` is a device in host memory: its tensors are "
              "torch CPU tensors, the torch CUDA kernels run as CPU ops and the Triton kernels "
              f"in Triton's interpreter (`{tr.INTERPRET}=1`). CI runs the GPU's code paths "
              "this way; its timings are CPU times, filed under a hardware key of their own. The "
              f"interpreter computes {_codes(sorted(tr.WRONG_IN_INTERPRETER))} wrong, so no "
              "Triton kernel takes it there.", ""]

    prefixes = _generated_prefixes()
    rows = []
    for option, fn in generate.generator_rows():
        cfg = fn.keywords["config"]
        kind = option[len("triton_"):-len(cfg.label) - 1]
        rows.append((kind.replace("_", " "), f"`{prefixes[kind]}_<hash>`", f"`{option}`",
                     cfg.block, cfg.warps, cfg.persist or "—"))
    lines += ["### Generated Triton kernels", "",
              "The regions the generator fuses on the host (elementwise chains; rows of "
              "reductions with their prologue and epilogue) are rendered as Triton for the GPU "
              "(`kernels/triton/`): `render.py` a pointwise region, `rows.py` a row region "
              "(whole rows in one block up to the config's limit, longer rows looped), "
              f"`splitrows.py` static rows of at least {generate.SPLIT_MIN_WIDTH} elements "
              "across several programs, then a combine. Each launch config is its own planner "
              "option and kernel, named by a hash of source and config, so the profiler times "
              "each and the planner picks by cost. Each is checked against the float64 "
              "reference before it is timed or run (`check.py`, then "
              "`tg.kernels.verify(strict=True)`). CI runs them on the simulated GPU. "
              "`tg kernels compile --arch sm_90` compiles a gallery of regions under every "
              "config, and every template x config, for an H100 without one, shared memory "
              "checked.", ""]
    lines += _table(("region", "kernel", "planner option", "BLOCK", "warps",
                     "rows whole up to"), rows)

    lines += ["", "### Triton templates", "",
              "Hand-written kernels (`kernels/triton/templates/`) on the patterns models spend "
              "their time in, beside the torch CUDA kernels on the same patterns. Each "
              '(template, config) is its own kernel (backend "triton", device "cuda", writes '
              "`out=`), so the profiler times every config. CI verifies each in the interpreter "
              f"in {_codes(run)}. A template's jit module is imported on its first call.", "",
              "**GEMM** (`matmul_jit.py`): the epilogue runs on the fp32 accumulator and the "
              "result is rounded once; `linear` reads torch's (out, in) weight through swapped "
              "strides, never a transposed copy. Kernels `triton_<epilogue>_<config>`:", ""]
    names: dict[str, list[str]] = {}
    for e, _, name in matmul_kernels():
        names.setdefault(e.label, []).append(f"`{name}`")
    lines += _table(("epilogue", "computes", "kernels"),
                    [(f"`{e.label}`", f"`{_epilogue(e)}`", "<br>".join(names[e.label]))
                     for e in matmul.EPILOGUES])
    lines += ["", '"ieee" multiplies fp32 in full fp32; "tf32" on the tensor cores (10-bit '
              "mantissas), fp32 operands only. The fp32 share is the config's assumed share of "
              "the GPU's fp32 peak, for plans made before anything is measured.", ""]
    # Config.dtypes asks the running triton (bfloat16 is left out in the interpreter): the
    # page gives the GPU's
    lines += _table(("config", "BLOCK_M x N x K", "warps", "stages", "precision", "operands",
                     "tolerance", "fp32 share"),
                    [(f"`{c.label}`", f"{c.block_m} x {c.block_n} x {c.block_k}", c.warps,
                      c.stages, c.precision,
                      ", ".join(("float32",) if c.precision == "tf32" else tr.FLOAT_DTYPES),
                      f"{c.tolerance:g}", f"{c.fp32_share:g}") for c in matmul.CONFIGS])
    lines += ["", f"The `gemv_` configs take at most {matmul.GEMV_ROWS} rows (a decode step): "
              "`tl.dot`'s 16-row tile would do 16 rows' arithmetic on one, in as few programs "
              "as the columns give. A program sums one row's products over a split of K with "
              "fp32 FMAs; the splits aim at "
              f"{matmul.PROGRAMS} programs in all, and the last split of a column block to "
              "finish adds the parts and applies the epilogue (an arrival counter per block; "
              "a second kernel, `gemv_combine`, where a CUDA graph's capture finds no "
              "counters; one split: the epilogue in the first). The `ln_` epilogues (GEMV "
              "configs only) take LayerNorm's input, and the `rms*_` ones RMSNorm's: each "
              "program computes its row's statistics and normalizes its split as it loads it, "
              "so a pre-norm block's norm is no kernel of its own (the norm's eps is fixed in "
              f"the pattern: {matmul.LN_EPS:g} for LayerNorm, "
              f"{' and '.join(f'{e:g}' for e in matmul.RMS_EPS)} for RMSNorm, a kernel each). "
              "On a Hopper the GEMVs launch with programmatic dependent launch: a "
              "program loads its first weights, then waits for the kernel before it. Every "
              "operand dtype, "
              f"tolerance {matmul.REDUCTION:g}.", ""]
    lines += _table(("config", "columns a program", "K a step", "splits up to", "warps",
                     "stages"),
                    [(f"`{c.label}`", c.block_n, c.block_k, c.max_splits, c.warps, c.stages)
                     for c in matmul.GEMV_CONFIGS])
    lines += ["", "Each template declares the grid a call launches and the share of its "
              "arithmetic that is real (`Occupancy`): until measured, its estimate is at the "
              "share of the GPU's SMs the grid keeps busy (`db/cost.py`)."]
    lines += ["", "**Attention** (`attention_jit.py`): `scaled_dot_product_attention` without a "
              "mask and with one (`_mask`: bool or float), causal or not, grouped-query heads, "
              f"head dims up to {at.MAX_HEAD_DIM}; online softmax in fp32, fp32 products in "
              f'"{at.PRECISION}", tolerance {at.REDUCTION:g}. Flash attention runs a program '
              "per block of query rows; decode attention takes one query row, splits the keys "
              f"across programs (aiming at {at.PROGRAMS} in all), and the last split of a kv "
              "head to finish combines the splits (an arrival counter per kv head; a second "
              "kernel, `decode_combine`, where a CUDA graph's capture finds no counters).", ""]
    att: dict[tuple, list[str]] = {}
    for kind, c, name in attention_kernels():
        att.setdefault((kind, c), []).append(f"`{name}`")
    lines += _table(("kernels", "query rows a program", "keys a block", "splits up to", "warps",
                     "stages"),
                    [("<br>".join(ns), c.block_m if kind == "flash" else 1, c.block_n,
                      "—" if kind == "flash" else c.max_splits, c.warps, c.stages)
                     for (kind, c), ns in att.items()])
    lines += ["", "**RoPE** (`rope_jit.py`: `rotary_embedding`, rotate_half layout, cos and sin "
              "broadcast) and **embedding** (`gather_jit.py`: rows of a table by integer ids; an "
              "out-of-range id gives a NaN row, where the reference raises):", ""]
    lines += _table(("kernel", "rows a program", "columns a block", "warps", "tolerance"),
                    [(f"`{n}`", c.block_r, "all", c.warps, f"{rope.ELEMENTWISE:g}")
                     for c, n in rope_kernels()]
                    + [(f"`{n}`", c.block_r, c.block_d, c.warps, f"{gather.EXACT:g}")
                       for c, n in gather_kernels()])
    lines += ["", "**Argmax** (`argmax_jit.py`: `argmax` over the last axis, any float dtype; "
              "the first maximum, a NaN counting as the maximum): a row is split into chunks "
              f"over programs (aiming at {argmax.PROGRAMS} in all), and the last chunk of a row "
              "to finish picks the index (a second kernel, `argmax_combine`, where a capture "
              "finds no counters). A decode step's token over a vocabulary's logits: torch's "
              "CUDA argmax reduces a row in one block.", ""]
    lines += _table(("kernel", "values a step", "splits up to", "warps", "tolerance"),
                    [(f"`{n}`", c.block, c.max_splits, c.warps, f"{argmax.EXACT:g}")
                     for c, n in argmax_kernels()])

    cuda, labels = torch_cuda_kernels()
    without = [f"`torch_{lb}`" for lb, kw in labels if kw.get("function") == "False"]
    own = [f"`torch_cuda_{lb}` (`{kw['function']}`)" for lb, kw in labels
           if kw.get("function") not in (None, "False")]
    other = [f"`torch_cuda_{lb}` (" + ", ".join(f"`cuda_{k}={v}`" for k, v in sorted(kw.items())
                                               if k != "function") + ")"
             for lb, kw in labels if set(kw) - {"function"}]
    lines += ["", "### torch CUDA kernels", "",
              "`torch_kernel` (`kernels/torch/base.py`) registers each torch function twice: "
              "`torch_<label>` on the CPU (the torch column above) and, where a GPU is usable, "
              '`torch_cuda_<label>` on "cuda", CUDA tensors in and out, so a chain of them '
              "stays on the GPU. No CUDA twin (`cuda=False`): "
              f"{', '.join(without) or 'none'}. A function of its own on CUDA: "
              f"{', '.join(own) or 'none'}. Declared otherwise on CUDA: "
              f"{', '.join(other) or 'nothing'}. `torch_cuda_state_update` "
              "(`kernels/torch/state.py`) appends to a kept state's GPU buffer in place.", "",
              f"{len(cuda)} kernels: {_codes(cuda)}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    return docgen.main(render, DOCS_PATH, COMMAND, __doc__.split("\n\n")[0], argv)


if __name__ == "__main__":
    sys.exit(main())
