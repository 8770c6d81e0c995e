"""Try a kernel file from a generator in a process of its own, before ``tg`` imports it.

    python -m tensor_graphs.commands.kernel_trial WORKDIR

Importing a kernel file runs it, and verifying a kernel calls it; a generated file may hang,
crash the interpreter (a bad ctypes call), call ``sys.exit`` or print to standard output. So
``tg kernels generate`` first runs this module in a child process, under its timeout, on a
private WORKDIR it wrote: ``kernel.py`` (the answer), ``region.json`` (``tg.save`` of the
region's reference graphs, one per signature the plan calls it with, inputs ``x0, x1, ...``)
and ``trial.json`` (``{"tolerance": T, "signatures": [...], "name": N}``: the region's
verification signatures and the kernel name asked for). The verdict goes to
``WORKDIR/verdict.json`` (the kernel may write to stdout). Only a kernel that passes here is
imported by ``tg`` itself, where the same checks (``tg.kernels.load``'s verification
included) run again before anything times it: what decides is what ran in tg's own process.

The checks (``judge``), in order: the file imports and ``tg.kernels.load`` verifies every
kernel it defines on its own declared signatures; one of them matches the region's graph at
every signature of the plan (pattern and constraints: ``pick``); it declares no more than the
tolerance; it has the name asked for (kept files are loaded side by side); it verifies on the
region's own signatures too (a file cannot narrow verification to a few easy shapes); and on
the plan's signatures its result is within the tolerance of the float64 reference.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tensor_graphs.errors import KernelVerificationError, TensorGraphsError
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.ir.graph import nodes
from tensor_graphs.ir.node import Node
from tensor_graphs.ir.ops.names import CONSTANT
from tensor_graphs.kernels.registry import Kernel, describe
from tensor_graphs.kernels.signatures import Spec, as_spec

OK = "ok"


@dataclass
class Verdict:
    """``verdict`` is OK or a table verdict (broken / wrong / does not match)."""

    verdict: str
    detail: str = ""
    kernel: str = ""
    error: float | None = None

    @property
    def ok(self) -> bool:
        return self.verdict == OK


def leaves_of(root: Node) -> list[Node]:
    """The region graph's inputs in argument order (x0, x1, ...)."""
    found = [n for n in nodes(root) if n.op.is_leaf and n.name is not None
             and n.op.name != CONSTANT]
    return sorted(found, key=lambda n: int(n.name[1:]) if n.name[1:].isdigit() else 1 << 30)


def pick(kernels: Sequence[Kernel], roots: Sequence[Node], tolerance: float
         ) -> tuple[Kernel | None, Verdict]:
    """The first of ``kernels`` that matches every root (pattern and constraints) and declares
    no more than ``tolerance``; else (None, why not)."""
    if not kernels:
        return None, Verdict("broken", "the file registers no kernel")
    why = []
    for k in kernels:
        refused = next((r for r in roots if k.match(r) is None), None)
        if refused is None:
            if k.tolerance > tolerance:
                return None, Verdict("wrong", f"{k.name} declares tolerance {k.tolerance:g}, "
                                     f"above the {tolerance:g} asked for", k.name)
            return k, Verdict(OK, kernel=k.name)
        shapes = ", ".join(f"{n.name} {tuple(n.shape)} {n.dtype.name}"
                           for n in leaves_of(refused))
        why.append(f"{k.name}'s pattern {_short(describe(k.pattern))} does not match the region "
                   f"at {shapes}")
    return None, Verdict("does not match", "; ".join(why))


def _short(text: str, limit: int = 80) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def on_region_signatures(k: Kernel, root: Node, signatures: Sequence[dict]) -> Kernel:
    """``k`` with the region's verification signatures, renamed to its own input names (the
    match says which region input each of its variables is)."""
    m = k.match(root)
    rename = {}
    for var in k.inputs:
        bound = m.bindings[var]
        if isinstance(bound, tuple):  # a variadic input: not what a region kernel takes
            return k
        rename[bound.name] = var
    sigs = [{rename[name]: spec for name, spec in sig.items() if name in rename}
            for sig in signatures]
    if any(len(s) != len(k.inputs) for s in sigs):
        return k
    return dataclasses.replace(k, signatures=sigs)


def check_calls(k: Kernel, roots: Sequence[Node], tolerance: float, seed: int = 0
                ) -> tuple[float, str | None]:
    """(largest error, problem) of ``k`` on the plan's own signatures against the float64
    reference (NaN/inf where the reference has them, see ``verify.compare``)."""
    from tensor_graphs.kernels.verify import compare, draw

    rng = np.random.default_rng(seed)
    worst = 0.0
    for root in roots:
        leaves = leaves_of(root)
        values = {n: draw(Spec(tuple(n.shape), n.dtype.name), rng) for n in leaves}
        feeds = {n.name: v for n, v in values.items()}
        m = k.match(root)
        args = [values[n] for n in k.arguments(m)]
        attrs = {a: root.attrs[a] for a in k.attrs if a in root.attrs}
        with np.errstate(all="ignore"):
            ref = evaluate(root, feeds, dtype="float64")
            alt = evaluate(root, feeds)
            got = np.asarray(k(*args, **attrs))
        if got.shape != ref.shape or got.dtype != alt.dtype:
            return np.inf, (f"returned {got.shape} {got.dtype} for {tuple(root.shape)} "
                            f"{alt.dtype}")
        err, problem = compare(got, ref, alt)
        if problem:
            return np.inf, problem
        if not err <= tolerance:
            shapes = ", ".join(f"{n.name} {tuple(n.shape)}" for n in leaves)
            return err, f"relative error {err:.3g} > tolerance {tolerance:g} at {shapes}"
        worst = max(worst, err)
    return worst, None


def judge(path: Path, roots: Sequence[Node], tolerance: float,
          signatures: Sequence[dict], name: str = "") -> tuple[list[Kernel], Kernel | None,
                                                               Verdict]:
    """Every check of the module doc on the kernel file at ``path`` (``name``: the kernel
    name the request asked for; kept files are loaded side by side, so it must be that):
    (the kernels ``tg.kernels.load`` registered, the one that passed or None, the verdict).
    The caller unregisters what it does not keep."""
    from tensor_graphs.kernels.loading import load
    from tensor_graphs.kernels.verify import verify

    try:
        loaded = load(path)
    except KernelVerificationError as exc:
        return list(getattr(exc, "admitted", [])), None, Verdict("wrong", _first_line(exc))
    except TensorGraphsError as exc:
        return [], None, Verdict("broken", _first_line(exc))
    k, verdict = pick(loaded, roots, tolerance)
    if k is None:
        return loaded, None, verdict
    if name and k.name != name:
        return loaded, None, Verdict("broken", f"its kernel is named {k.name!r}, not {name!r} "
                                     "as asked", k.name)
    strict = on_region_signatures(k, roots[0], signatures)
    if strict is not k:
        report = verify(strict)
        if not report.ok:
            return loaded, None, Verdict("wrong", "; ".join(report.failures[:2])
                                         or report.summary(), k.name)
    error, problem = check_calls(k, roots, tolerance)
    if problem:
        return loaded, None, Verdict("wrong", problem, k.name, error)
    return loaded, k, Verdict(OK, kernel=k.name, error=error)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def signatures_json(signatures: Sequence[dict]) -> list[dict]:
    """Verification signatures as JSON (each entry a Spec's fields)."""
    out = []
    for sig in signatures:
        row = {}
        for name, v in sig.items():
            if name == "attrs":
                continue
            spec = as_spec(v)
            row[name] = [list(spec.shape), spec.dtype, spec.values, spec.high]
        out.append(row)
    return out


def signatures_from_json(rows: list[dict]) -> list[dict]:
    return [{name: Spec(tuple(v[0]), v[1], v[2], v[3]) for name, v in row.items()}
            for row in rows]


def main(argv: list[str] | None = None) -> int:
    """Judge WORKDIR's kernel file and write ``verdict.json`` (see the module doc)."""
    from tensor_graphs.ir.serialize import load as load_graph

    work = Path((argv if argv is not None else sys.argv[1:])[0])
    spec = json.loads((work / "trial.json").read_text())
    graphs = load_graph(work / "region.json")
    roots = list(graphs) if isinstance(graphs, (list, tuple)) else [graphs]
    try:
        _, _, verdict = judge(work / "kernel.py", roots, float(spec["tolerance"]),
                              signatures_from_json(spec["signatures"]), spec.get("name", ""))
    except Exception as exc:  # noqa: BLE001 - the kernel's own failure is a verdict
        verdict = Verdict("wrong", f"{type(exc).__name__}: {exc}"[:300])
    (work / "verdict.json").write_text(json.dumps(dataclasses.asdict(verdict)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
