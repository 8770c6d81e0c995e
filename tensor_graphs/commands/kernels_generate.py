"""``tg kernels generate MODEL_OR_GRAPH --command CMD``: a language-model kernel loop.

The planner fuses regions no hand-written kernel covers into generated C (``kernels/generated``).
A person or a language model may do better on some of them: a kernel that knows the math (an
``exp(log(x))`` is ``x`` where ``x >= 0``), a library call, a better loop. This command plans the
graph with generated kernels on, and for each region the plan computes with one (deduplicated
by kernel name: a layer's region once) asks CMD for a kernel:

1. the request (``tg.kernels.prompt`` with the region's pattern spelled in ``tg.pat``, the
   shapes and dtypes the plan calls it with, the tolerance, the calling convention and an
   example kernel, plus how the answer is used) goes to CMD's standard input
   (``kernel_answer``: no shell, a timeout, its stderr kept);
2. a Python file is taken from its standard output (all of it, or its first ```python block);
3. nothing from it runs in this process before it verifies: a child process imports and
   verifies it (``kernel_trial``: the file's own checks, the region's pattern and signatures,
   the plan's shapes, under the timeout); only then ``tg.kernels.load`` imports it here, and
   the same checks run again before anything times it;
4. it is timed against the generated kernel and against the region compiled without generated
   kernels (the unfused option), interleaved (``profiler.measure_together``) on the plan's
   calls; it is admitted — written atomically into the kernel folder, with a header naming the
   region and the speedup — only if it is correct and faster than the best of the two.

CMD is trusted by the user who names it, as a kernel file they load is: the child process
runs its output as Python (imports are code), with this user's rights. What the numerical
checks guarantee is that no kernel is timed, kept or used before it matches the float64
reference.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tensor_graphs import cli_args
from tensor_graphs.commands import output
from tensor_graphs.commands.kernel_answer import ask, command_argv, run_captured
from tensor_graphs.commands.kernel_trial import (
    Verdict,
    judge,
    leaves_of,
    signatures_json,
)
from tensor_graphs.commands.profile import GRAPHS, graph_source, load_graph, parse_dims
from tensor_graphs.ir.ops.names import MAX, SUM

DEFAULT_TOLERANCE = 1e-5
DEFAULT_TIMEOUT = 300.0
REDUCTIONS = (SUM, MAX)  # named first in a region's summary
STDERR_LINES = 5  # lines of CMD's standard error shown under a crashed or timed-out row

# The verdicts of the table: (verdict, what it means). Only "admitted" writes a file.
VERDICTS: tuple[tuple[str, str], ...] = (
    ("admitted", "verified, and faster than the generated kernel and the unfused ops: kept"),
    ("slower", "verified, but not faster than the best of the others: not kept"),
    ("wrong", "imports, but fails verification against the float64 reference (or declares "
              "a tolerance above --tolerance)"),
    ("does not match", "its pattern (or its constraints) does not cover the region"),
    ("broken", "the file does not import, or registers no kernel"),
    ("garbage", "the answer holds no Python file with a @tg.kernel"),
    ("crashed", "CMD exited non-zero or was killed (or the file killed its trial process)"),
    ("timed out", "CMD, or the trial of its kernel, took longer than --timeout"),
    ("skipped", "no request could be made for the region (its generated kernel was refused, "
                "or its pattern cannot be written as text)"),
)


@dataclass
class Region:
    """One generated kernel of the plan and the calls the plan makes of it."""

    candidate: object  # kernels.generated.Candidate
    calls: dict[str, list] = field(default_factory=dict)  # signature -> [input nodes, count]

    @property
    def name(self) -> str:
        return self.candidate.name


@dataclass
class Row:
    """One line of the table."""

    region: str
    shape: str
    verdict: str
    detail: str = ""
    seconds: dict[str, float] = field(default_factory=dict)  # "this", "generated", "unfused"
    path: str = ""
    stderr: str = ""

    @property
    def speedup(self) -> float | None:
        mine = self.seconds.get("this")
        others = [v for k, v in self.seconds.items() if k != "this" and v == v]
        if not mine or not others:
            return None
        return min(others) / mine


# ---------------------------------------------------------------------------- regions
def plan_regions(outputs, dims: Mapping[str, int], tolerance: float, db) -> list[Region]:
    """The plan's steps computed by a generated kernel, one Region per kernel name, in plan
    order, with every distinct input signature the plan calls it with."""
    from tensor_graphs.compiler import Pipeline, prepare
    from tensor_graphs.kernels import generated

    pipeline = Pipeline(list(outputs), "cpu", tolerance, db, "never", None, generate=True)
    plan = pipeline.planner(prepare(pipeline.outputs, dims)).plan()
    regions: dict[str, Region] = {}
    for step in plan.steps:
        if not isinstance(step.kernel, generated.Candidate) or step.kernel.also:
            continue  # (a kernel storing values besides its root: the request asks for one)
        region = regions.setdefault(step.kernel.name, Region(step.kernel))
        entry = region.calls.setdefault(step.signature,
                                        [tuple(s.node for s in step.inputs), 0])
        entry[1] += 1
    return list(regions.values())


def ops_summary(covers) -> str:
    """"14 ops: 6 exp, 6 log, add, mul": the region's atomic ops, its reductions first (what
    makes it a row region), then the most frequent."""
    counts: dict[str, int] = {}
    for n in covers:
        counts[n.op.name] = counts.get(n.op.name, 0) + 1
    order = sorted(counts.items(), key=lambda kv: (kv[0] not in REDUCTIONS, -kv[1], kv[0]))
    parts = [f"{c} {op}" if c > 1 else op for op, c in order]
    return f"{len(covers)} ops: {', '.join(parts)}"


def _reference(kernel, inputs: Sequence) -> object:
    """The region's graph at one signature of the plan, built from the generated kernel's
    pattern over fresh inputs x0, x1, ... (``verify.build_case``): what the request shows and
    what every option is checked and timed on. A string says why it cannot be built."""
    from tensor_graphs.kernels.signatures import Case, Spec
    from tensor_graphs.kernels.verify import build_case

    specs = {name: Spec(tuple(int(d) for d in n.shape), n.dtype.name)
             for name, n in zip(kernel.inputs, inputs)}
    return build_case(kernel, Case(specs, {}, "this plan"))


# ---------------------------------------------------------------------------- the request
def request(kernel, name: str, builts: Sequence, tolerance: float) -> str | None:
    """The text sent to CMD for one region (None when its pattern cannot be written out)."""
    from tensor_graphs.kernels.loading import pattern_source, prompt

    if pattern_source(kernel.pattern) is None:
        return None
    calls = [{n: (tuple(leaf.shape), leaf.dtype.name) for n, leaf in b.leaves.items()}
             for b in builts]
    text = prompt(kernel.pattern, name=name, calls=calls, tolerance=tolerance,
                  signatures=kernel.signatures)
    return text + ANSWER_FORMAT.format(name=name, tolerance=tolerance)


ANSWER_FORMAT = (
    "\n## Your answer\n\n"
    "Answer with the whole kernel file: a ```python fenced block (the first one is taken), or "
    "the bare file and nothing else. Keep the template's PATTERN and SIGNATURES lines, the "
    "kernel's name `{name}`, and a declared tolerance of at most {tolerance:g}. It is imported "
    "and verified in a separate process first, then timed against the generated C kernel for "
    "this region and against its ops run one by one, and kept only if it is correct and "
    "faster than both: aim for speed on the calls listed above.\n")


# ---------------------------------------------------------------------------- one region
@dataclass(frozen=True)
class Unfused:
    """The region compiled without generated kernels, timed like a kernel (the profiler's
    ``Call`` wants ``name``, ``source_hash``, ``prepare_arguments`` and ``fn``)."""

    name: str
    program: object  # a CompiledGraph
    inputs: tuple[str, ...]  # its feed names, in argument order
    source_hash: str = ""

    def prepare_arguments(self, arrays):
        return list(arrays)

    def fn(self, *arrays):
        return self.program(**dict(zip(self.inputs, arrays)))


def unfused(root, tolerance: float, db) -> Unfused:
    """The region's graph compiled with registered kernels only (``generate=False``)."""
    from tensor_graphs.compiler import compile as tg_compile

    prog = tg_compile(root, device="cpu", tolerance=tolerance, db=db, generate=False)
    steps = len(prog.plan.steps)
    return Unfused(f"unfused ({steps} step{'s' if steps != 1 else ''})", prog,
                   tuple(n.name for n in leaves_of(root)))


def _unfused_or_none(root, tolerance: float, db) -> Unfused | None:
    try:
        return unfused(root, tolerance, db)
    except Exception:  # noqa: BLE001 - no plan without generated kernels: compared without it
        return None


def run_region(region: Region, argv: list[str], *, out: Path, tolerance: float, db,
               timeout: float, source: str = "") -> Row:
    """Ask, try, load, time and maybe admit one region's kernel; every failure is a Row."""
    from tensor_graphs.errors import TensorGraphsError
    from tensor_graphs.kernels import generated
    from tensor_graphs.kernels.verify import Built

    cand = region.candidate
    summary = ops_summary(cand.covers)
    shape = f"{tuple(cand.root.shape)} {cand.root.dtype.name}"
    if len(region.calls) > 1:
        shape += f" (+{len(region.calls) - 1})"
    try:
        gen = generated.realize(cand)
    except TensorGraphsError as exc:
        return Row(summary, shape, "skipped", "its generated kernel was refused: "
                   + str(exc).splitlines()[0])
    builts = []
    for inputs, _count in region.calls.values():
        b = _reference(gen, inputs)
        if not isinstance(b, Built):
            return Row(summary, shape, "skipped", f"cannot build its graph: {b}")
        builts.append(b)
    name = "lm_" + gen.name.removeprefix("c_")
    text = request(gen, name, builts, tolerance)
    if text is None:
        return Row(summary, shape, "skipped", "its pattern cannot be written as text")
    answer = ask(argv, text, timeout)
    if answer.source is None:
        return Row(summary, shape, answer.verdict, answer.detail, stderr=answer.stderr)
    work = Path(tempfile.mkdtemp(prefix="tg-generate-"))  # 0700, ours
    try:
        roots = [b.root for b in builts]
        verdict = _trial(work, answer.source, roots, tolerance, gen.signatures, name,
                         timeout)
        if not verdict.ok:
            return Row(summary, shape, verdict.verdict, verdict.detail, stderr=answer.stderr)
        # compiled before the new kernel is registered, which its plan would otherwise use
        plain = [_unfused_or_none(b.root, tolerance, db) for b in builts]
        row = _load_and_time(work / "kernel.py", region, gen, builts, plain, tolerance,
                             gen.signatures or [], name, db)
        row.region, row.shape, row.stderr = summary, shape, answer.stderr
        if row.verdict == "admitted":
            row.path = str(admit(out, answer.source, row, gen, builts, source))
        return row
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _trial(work: Path, source: str, roots, tolerance: float, signatures, name: str,
           timeout: float) -> Verdict:
    """Run ``kernel_trial`` on the answer in a child process (see its doc)."""
    from tensor_graphs.files import private_dir
    from tensor_graphs.ir.serialize import save

    private_dir(work)
    (work / "kernel.py").write_text(source, encoding="utf-8")
    save(list(roots), work / "region.json")
    (work / "trial.json").write_text(json.dumps(
        {"tolerance": tolerance, "signatures": signatures_json(signatures or []),
         "name": name}))
    env = dict(os.environ)
    here = str(Path(__file__).resolve().parents[2])  # this checkout first on the child's path
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-m", "tensor_graphs.commands.kernel_trial", str(work)]
    try:
        rc, _out, err, timed_out = run_captured(argv, None, timeout, env=env)
    except OSError as exc:
        return Verdict("crashed", f"the trial process could not start: {exc}")
    if timed_out:
        return Verdict("timed out", f"importing and verifying it took more than {timeout:g} s")
    found = work / "verdict.json"
    if rc != 0 or not found.exists():
        how = f"signal {-rc}" if rc < 0 else f"exit status {rc}"
        last = next((line for line in reversed(err.decode("utf-8", "replace").splitlines())
                     if line.strip()), "")
        return Verdict("crashed", f"the file ended its trial process ({how})"
                       + (f": {last.strip()[:200]}" if last else ""))
    data = json.loads(found.read_text())
    return Verdict(data["verdict"], data.get("detail", ""), data.get("kernel", ""),
                   data.get("error"))


def _load_and_time(path: Path, region: Region, gen, builts, plain, tolerance: float,
                   signatures, name: str, db) -> Row:
    """Load the tried file here and check it again as its trial did (``kernel_trial.judge``:
    ``tg.kernels.load`` verifies before registering), then time it, the generated kernel and
    the unfused ops on each call of the plan. Its kernels are unregistered afterwards."""
    from tensor_graphs.kernels import registry

    loaded, k, verdict = judge(path, [b.root for b in builts], tolerance, signatures, name)
    try:
        if k is None:
            return Row("", "", verdict.verdict, verdict.detail)
        return _time(k, region, gen, builts, plain, tolerance, db)
    finally:
        for each in loaded:
            if registry._KERNELS.get(each.name) is each:  # noqa: SLF001
                registry.unregister(each.name)


def _time(k, region: Region, gen, builts, plain, tolerance: float, db) -> Row:
    import numpy as np

    from tensor_graphs.profiler.measure import Call, measure_together

    totals = {"this": 0.0, "generated": 0.0, "unfused": 0.0}
    worst = 0.0
    labels = {}
    measured = []  # (the new kernel's row where its signature is the plan's, the generated's)
    for (signature, (_inputs, count)), b, ops in zip(region.calls.items(), builts, plain):
        root = b.root
        m = k.match(root)
        mine = Call(k, root, tuple(k.arguments(m)),
                    {a: root.attrs[a] for a in k.attrs if a in root.attrs}, signature)
        theirs = Call(gen, root, tuple(b.bound),
                      {a: root.attrs[a] for a in gen.attrs if a in root.attrs}, signature)
        options = [mine, theirs]
        if ops is not None:
            options.append(Call(ops, root, tuple(leaves_of(root)), {}, signature))
            labels["unfused"] = ops.name
        with np.errstate(all="ignore"):  # random inputs: log of a negative is NaN, quietly
            rows = measure_together(options)
        if ops is None:
            totals["unfused"] = float("nan")
        if rows[0].failure is not None:
            return Row("", "", "wrong", f"failed when timed: {rows[0].failure}")
        error = rows[0].error if rows[0].error is not None else float("nan")
        if not error <= tolerance:
            return Row("", "", "wrong", f"relative error {error:.3g} > tolerance "
                       f"{tolerance:g} when timed on the plan's shapes")
        worst = max(worst, error)
        for key, row in zip(("this", "generated", "unfused"), rows):
            totals[key] += count * row.median if row.failure is None else float("nan")
        measured.append((rows[0] if tuple(mine.arguments) == tuple(theirs.arguments)
                         else None, rows[1]))
    result = Row("", "", "slower", seconds=totals)
    result.detail = f"max relative error {worst:.2g}; {labels.get('unfused', 'unfused')}"
    speed = result.speedup
    if speed is not None and speed > 1.0:
        result.verdict = "admitted"
    _record(db, [r for mine_row, gen_row in measured
                 for r in (gen_row, mine_row if result.verdict == "admitted" else None)])
    return result


def _record(db, rows) -> None:
    """Keep the generated kernel's rows (their signature is the plan's) and an admitted
    kernel's when it takes its inputs in the same order (the row's signature is then its
    own): a later plan that loads the kept file starts measured."""
    from tensor_graphs.errors import DatabaseError

    try:
        db.record_in_memory()
        for row in rows:
            if row is not None and row.failure is None:
                db.record(row)
    except DatabaseError:
        pass


def admit(out: Path, source: str, row: Row, gen, builts, graph: str) -> Path:
    """Write the admitted kernel file into ``out`` (atomically), under a header naming the
    region, the calls and what it was measured against."""
    from tensor_graphs.db.cost import format_seconds
    from tensor_graphs.files import atomic_write, private_dir

    folder = private_dir(out)
    path = folder / f"lm_{gen.name.removeprefix('c_')}.py"
    calls = "; ".join(", ".join(f"{n} {tuple(leaf.shape)} {leaf.dtype.name}"
                                for n, leaf in b.leaves.items()) for b in builts)
    s = row.seconds
    header = [
        f"# Admitted by `tg kernels generate` on {time.strftime('%Y-%m-%d %H:%M')}"
        + (f" for {graph}" if graph else "") + ".",
        f"# Region: {row.region} (generated kernel {gen.name}).",
        f"# Called with: {calls}.",
        f"# Measured per run of the plan: {format_seconds(s['this'])}, against generated C "
        f"{format_seconds(s['generated'])} and "
        + (f"{format_seconds(s['unfused'])} unfused" if s["unfused"] == s["unfused"]
           else "no unfused plan") + f": {row.speedup:.2f}x faster than the best.",
        f"# Verified against the float64 reference ({row.detail.split(';')[0]}).",
        f'# Load it with tg.kernels.load("{path}").',
        "",
    ]
    # tg.kernels.load refuses a kernel file others could have written
    with atomic_write(path, what="kernel file", only_owner_writes=True) as f:
        f.write("\n".join(header) + source.rstrip("\n") + "\n")
    return path


# ---------------------------------------------------------------------------- the loop
def generate(outputs, dims: Mapping[str, int], command: str, *, out: Path, tolerance: float,
             db, timeout: float, source: str = "", progress: bool = True) -> list[Row]:
    """The loop of the module doc over every region of the plan; a Row per region."""
    from tensor_graphs.db.store import open_db
    from tensor_graphs.files import private_dir
    from tensor_graphs.progress import Progress

    argv = command_argv(command)
    private_dir(out)  # refused now, not after the first answer, if another user can write it
    db = open_db(db)
    regions = plan_regions(outputs, dims, tolerance, db)
    bar = Progress(len(regions), "generating kernels") if progress else None
    rows = []
    for region in regions:
        rows.append(run_region(region, argv, out=out, tolerance=tolerance, db=db,
                               timeout=timeout, source=source))
        if bar is not None:
            bar.step(rows[-1].verdict)
    if bar is not None:
        bar.close()
    return rows


def table(rows: Sequence[Row]) -> str:
    """The regions, verdicts, times and speedups; then each row's detail, numbered."""
    from tensor_graphs.db.cost import format_seconds

    def secs(row: Row, key: str) -> str:
        v = row.seconds.get(key)
        return "-" if v is None or v != v else format_seconds(v)

    head = ("#", "region", "shape", "verdict", "this", "generated", "unfused", "speedup")
    body = [(str(i), _cut(r.region, 60), r.shape, r.verdict, secs(r, "this"),
             secs(r, "generated"), secs(r, "unfused"),
             "-" if r.speedup is None else f"{r.speedup:.2f}x")
            for i, r in enumerate(rows, 1)]
    widths = [max(len(x[i]) for x in [head, *body]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip()
             for line in [head, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if not rows:
        lines.append("(the plan computes no region with a generated kernel: nothing to ask)")
    notes = []
    for i, r in enumerate(rows, 1):
        text = r.path if r.verdict == "admitted" else r.detail
        if text:
            notes.append(f"{i}. {r.verdict}: {text}")
        if r.stderr.strip() and r.verdict in ("crashed", "timed out"):
            notes += [f"   | {line}" for line in r.stderr.strip().splitlines()[-STDERR_LINES:]]
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    summary = f"{len(rows)} region{'s' if len(rows) != 1 else ''}" + (
        ": " + ", ".join(f"{v} {k}" for k, v in counts.items()) if counts else "")
    return "\n".join(lines + ([""] + notes if notes else []) + ["", summary]) + "\n"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def default_folder() -> Path:
    """``$XDG_DATA_HOME/tensor_graphs/kernels`` (``~/.local/share/...``): kept kernels are
    data, not cache (the measurement database is in the cache folder; losing it costs
    re-measuring, losing these costs asking again)."""
    data = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local",
                                                            "share")
    return Path(data) / "tensor_graphs" / "kernels"


# ---------------------------------------------------------------------------- the command
def _run(args: argparse.Namespace) -> int:
    graph = load_graph(args.graph, args.dim)
    dims = parse_dims(graph, args.dim)
    out = Path(args.out) if args.out else default_folder()
    command_argv(args.command)  # a missing program is a one-line error before planning
    outputs = list(graph) if isinstance(graph, (list, tuple)) else [graph]
    output.info(f"asking {args.command!r} for kernels for the generated regions of "
                f"{args.graph} ({', '.join(f'{k}={v}' for k, v in dims.items()) or 'static'}); "
                f"admitted ones go to {out}")
    rows = generate(outputs, dims, args.command, out=out, tolerance=args.tolerance, db=args.db,
                    timeout=args.timeout, source=args.graph, progress=not output.quiet())
    if args.output_format == "table":
        print(table(rows), end="")
    else:
        output.emit([{"region": r.region, "shape": r.shape, "verdict": r.verdict,
                      **{f"{k}_s": r.seconds.get(k) for k in ("this", "generated", "unfused")},
                      "speedup": r.speedup, "path": r.path, "detail": r.detail} for r in rows],
                    args.output_format, GENERATE_COLUMNS)
    return 0


GENERATE_COLUMNS = ("region", "shape", "verdict", "this_s", "generated_s", "unfused_s",
                    "speedup", "path", "detail")


DESCRIPTION = (
    "Plans MODEL_OR_GRAPH with generated kernels on. For each region the plan computes with a "
    "generated kernel (no hand-written kernel covers it; each kernel once) it sends a request "
    "to CMD's standard input: the region's reference graph and pattern, the shapes and dtypes "
    "the plan calls it with, the tolerance, the calling convention and an example kernel (what "
    "tg kernels prompt writes). It reads a Python file of @tg.kernel from CMD's standard "
    "output (all of it, or its first ```python block).",
    "Nothing from the answer runs in tg before it verifies: a separate process imports it and "
    "checks it against the float64 reference (on its own signatures, the region's and the "
    "plan's shapes) under --timeout; then tg.kernels.load verifies it again before it is timed "
    "against the generated kernel and against the region's ops run unfused, interleaved. It "
    "is kept in --out only if it is correct and faster than both; the timings of the generated "
    "and kept kernels are recorded in the database.",
    "CMD is run without a shell, and trusted as your own code is: its answer runs as Python "
    "with your rights. The table lists each region, its verdict, its time per run of the plan "
    "(this kernel, the generated one, unfused) and the speedup over the best other; the exit "
    "status is 0 when the loop ran, even if nothing was admitted.",
)


def add_generate_command(ksub) -> None:
    """Register ``tg kernels generate`` under ``tg kernels``."""
    width = max(len(v) for v, _ in VERDICTS)
    verdicts = "\n".join(textwrap.fill(meaning, 78, initial_indent=f"  {v.ljust(width)}  ",
                                       subsequent_indent=" " * (width + 4))
                         for v, meaning in VERDICTS)
    p = ksub.add_parser(
        "generate", help="ask a program (a language model) for faster kernels for a plan's "
                         "generated regions",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="\n\n".join(textwrap.fill(t, 78) for t in DESCRIPTION)
        + "\n\nverdicts:\n" + verdicts,
        epilog="example: tg kernels generate gpt2-2 --command 'llm -m my-model' (any program "
               "that reads a request on stdin and prints a kernel file). Load a kept kernel "
               "with tg.kernels.load(PATH) or check it with tg kernels verify --file PATH.")
    p.add_argument("graph", metavar="MODEL_OR_GRAPH", type=graph_source,
                   help="a graph file written by tg.save, or one of: "
                        + ", ".join(f"{k} ({v[0]})" for k, v in GRAPHS.items()))
    p.add_argument("--command", required=True, metavar="CMD",
                   help="the program to ask, with its arguments (split as a shell would, run "
                        "without one): it reads the request on stdin and prints a kernel file")
    p.add_argument("--out", metavar="DIR", default=None, type=cli_args.folder,
                   help="folder for admitted kernels, created private (0700) (default "
                        "$XDG_DATA_HOME/tensor_graphs/kernels, i.e. "
                        "~/.local/share/tensor_graphs/kernels)")
    p.add_argument("--tolerance", type=cli_args.positive_float, default=DEFAULT_TOLERANCE,
                   help="largest norm-wise relative error a kernel may declare or show, and "
                        f"the plan's tolerance (default {DEFAULT_TOLERANCE:g})")
    p.add_argument("--db", default=None,
                   help="measurement database the plan is made from (default $TG_DB or the "
                        "user cache file); the timings of the generated and admitted kernels "
                        "are recorded there")
    p.add_argument("--timeout", type=cli_args.positive_float, default=DEFAULT_TIMEOUT,
                   metavar="S", help="seconds CMD may take per region, and the trial of its "
                                     f"answer (default {DEFAULT_TIMEOUT:g})")
    p.add_argument("--dim", action="append", type=cli_args.dim_binding, metavar="NAME=VALUE",
                   help="a value for a symbolic dim (repeatable; default batch=1, seq=128)")
    output.add_output_option(p)
    p.set_defaults(run=_run)


__all__ = ["VERDICTS", "Region", "Row", "Unfused", "add_generate_command", "admit",
           "default_folder", "generate", "ops_summary", "plan_regions", "request",
           "run_region", "table", "unfused"]
