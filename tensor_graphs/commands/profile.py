"""``tg profile``, ``tg paths`` and ``tg explain``: planning from the command line.

Each takes a graph: a file written by ``tg.save`` or a built-in graph name (``GRAPHS``), with
``--dim NAME=VALUE`` for its symbolic dims (default: batch=1, seq=128 where the graph has them).
"""

from __future__ import annotations

import argparse
import os

from tensor_graphs import cli_args
from tensor_graphs.commands import output

GRAPHS = {  # name -> (description, builder)
    "block": ("one pre-norm transformer block, d_model 64, 4 heads",
              lambda: __import__("tensor_graphs.demo").demo.transformer_block()),
    "gpt2-2": ("GPT-2-style model, 2 layers, d_model 768, vocab 50257",
               lambda: __import__("tensor_graphs.demo").demo.gpt2_style(2)),
    "gpt2": ("GPT-2-style model, 12 layers, d_model 768, vocab 50257 (124M parameters)",
             lambda: __import__("tensor_graphs.demo").demo.gpt2_style(12)),
}
DEFAULT_DIMS = {"batch": 1, "seq": 128}


def load_graph(source: str):
    """A graph from a ``tg.save`` file or a built-in name."""
    from tensor_graphs.errors import ArgumentError

    if source in GRAPHS:
        return GRAPHS[source][1]()
    if os.path.exists(source):
        from tensor_graphs.ir.serialize import load

        return load(source)
    raise ArgumentError(_not_a_graph(source))


def _not_a_graph(source: str) -> str:
    return (f"{source!r} is neither a graph file (tg.save) nor a built-in graph "
            f"({', '.join(GRAPHS)})")


def graph_source(text: str) -> str:
    """An argparse type: a built-in graph's name or an existing regular file."""
    if text in GRAPHS:
        return text
    if not os.path.lexists(text):
        raise argparse.ArgumentTypeError(_not_a_graph(text))
    return cli_args.existing_file(text)


def parse_dims(graph, pairs: list[tuple[str, int]]) -> dict[str, int]:
    """The dims to plan for: ``pairs`` (from ``--dim``, see ``dim_binding``) over DEFAULT_DIMS;
    a dim the graph does not have, or one of its dims left unbound, is an ArgumentError."""
    from tensor_graphs.errors import ArgumentError
    from tensor_graphs.planner.prepare import symbols

    names = {str(s) for s in symbols(list(graph) if isinstance(graph, list) else [graph])}
    dims = {k: v for k, v in DEFAULT_DIMS.items() if k in names}
    for name, value in pairs or []:
        if name not in names:
            raise ArgumentError(f"--dim {name}={value}: the graph has no dim {name!r}; its "
                                f"dims are {sorted(names) or 'none (it is static)'}")
        dims[name] = value
    missing = sorted(names - set(dims))
    if missing:
        raise ArgumentError(f"the graph has symbolic dims {missing}: give --dim "
                            + " ".join(f"{m}=..." for m in missing))
    return dims


def _settings(args, graph):
    from tensor_graphs.compiler import Pipeline
    from tensor_graphs.ir.graph import _as_list

    return Pipeline(_as_list(graph), args.device, args.tolerance, args.db, "never", None)


def _profile(args) -> int:
    from tensor_graphs.commands.walk import profile

    graph = load_graph(args.graph)
    dims = parse_dims(graph, args.dim)
    settings = _settings(args, graph)
    bound = ", ".join(f"{k}={v}" for k, v in dims.items()) or "static"
    output.info(f"profiling {args.graph} ({bound}) on {settings.device.name} into "
                f"{settings.db.path}")
    report = profile(settings.outputs, settings, dims, budget=args.budget, paths=args.paths,
                     progress=not output.quiet())
    if args.output_format == "table":
        print(report.table())
        return 0
    rows = [{"path": p.label, "steps": len(p.plan), "predicted_s": p.predicted,
             "measured_s": p.measured, "failure": p.failure,
             "kernels": ", ".join(dict.fromkeys(p.plan.kernels))} for p in report.paths]
    output.info(report.table().split("\n")[0])  # how many calls were measured
    output.emit(rows, args.output_format, PROFILE_COLUMNS, shown=_shown_seconds)
    return 0


PROFILE_COLUMNS = ("path", "steps", "predicted_s", "measured_s", "failure", "kernels")


def _shown_seconds(row: output.Row) -> output.Row:
    """A row as people read it: every ``*_s`` value (seconds) as "12.3us"."""
    from tensor_graphs.commands.db import fmt_seconds

    return {k: fmt_seconds(v) if k.endswith("_s") else ("-" if v is None else v)
            for k, v in row.items()}


def _paths(args) -> int:
    from tensor_graphs.compiler import prepare

    graph = load_graph(args.graph)
    dims = parse_dims(graph, args.dim)
    settings = _settings(args, graph)
    planner = settings.planner(prepare(settings.outputs, dims), blocks=False)
    output.note(f"{planner.count()} paths; the {args.limit} cheapest-first:", args.output_format)
    rows = []
    for i, plan in enumerate(planner.paths()):
        if i >= args.limit:
            break
        rows.append({"rank": i + 1, "cost_s": plan.cost, "kernels": ", ".join(plan.kernels)})
    if args.output_format == "table":  # one line per path, as it always was
        for r in rows:
            print(f"{r['rank']:4d}  {r['cost_s'] * 1e6:10.1f} us  {r['kernels'][:110]}")
    else:
        output.emit(rows, args.output_format, ("rank", "cost_s", "kernels"),
                    shown=_shown_seconds)
    return 0


EXPLAIN_COLUMNS = ("step", "kernel", "backend", "device", "computes", "shape", "time_s",
                   "source", "error")


def explain_rows(plan, limit: int | None = None) -> list[dict]:
    """The plan's steps as rows for ``-o``: what ``explain``'s table shows, raw values."""
    from tensor_graphs.ir.shapes import format_shape

    return [{"step": i, "kernel": s.kernel.name, "backend": s.kernel.backend,
             "device": s.device, "computes": f"copy to {s.device}" if s.is_copy else s.computes,
             "shape": format_shape(s.node.shape), "time_s": s.cost, "source": s.source,
             "error": s.error}
            for i, s in enumerate(plan.steps) if limit is None or i < limit]


def _explain(args) -> int:
    from tensor_graphs.compiler import compile
    from tensor_graphs.errors import ArgumentError

    if args.html == "-":
        raise ArgumentError("--html -: give a file path for the page")
    graph = load_graph(args.graph)
    dims = parse_dims(graph, args.dim)
    prog = compile(graph, device=args.device, tolerance=args.tolerance, db=args.db,
                   bounds=dims)
    text = prog.explain(limit=args.limit, html=args.html)
    if args.output_format == "table":
        print(text)
    else:
        output.emit(explain_rows(prog.plan, args.limit), args.output_format, EXPLAIN_COLUMNS,
                    shown=_shown_seconds)
    if args.html:
        output.info(f"wrote {args.html}")
    return 0


def _common(p: argparse.ArgumentParser, tolerance: float) -> None:
    p.add_argument("graph", type=graph_source,
                   help=f"a graph file written by tg.save, or one of: "
                        f"{', '.join(f'{k} ({v[0]})' for k, v in GRAPHS.items())}")
    p.add_argument("--dim", action="append", type=cli_args.dim_binding, metavar="NAME=VALUE",
                   help="a value for a symbolic dim (repeatable; default batch=1, seq=128)")
    p.add_argument("--device", default="cpu", help="device to plan for (default cpu)")
    p.add_argument("--tolerance", type=cli_args.positive_float, default=tolerance,
                   help=f"largest norm-wise relative error per step (default {tolerance:g})")
    p.add_argument("--db", default=None,
                   help="measurement database (default $TG_DB or the user cache file)")
    output.add_output_option(p)


def add_plan_commands(sub) -> None:
    p = sub.add_parser(
        "profile", help="measure a graph's kernels into the database, then compare paths",
        description="Plans the graph from the database (the default plan), measures every "
                    "kernel x signature the planner considers that has no row yet (each "
                    "checked against the float64 reference first; failures are recorded and "
                    "skipped; an interrupted run resumes), re-plans, runs the cheapest paths "
                    "end to end and prints predicted vs measured times.")
    _common(p, 1e-5)
    p.add_argument("--budget", type=cli_args.non_negative_float, default=None, metavar="SECONDS",
                   help="stop measuring after this many seconds (default: no limit)")
    p.add_argument("--paths", type=cli_args.count, default=3, metavar="N",
                   help="how many of the cheapest paths to run end to end (default 3)")
    p.set_defaults(run=_profile)

    p = sub.add_parser("paths", help="count a graph's paths and list the cheapest",
                       description="Counts every valid path (kernel choices, decompositions, "
                                   "rewrites, copies) without enumerating them, then lists "
                                   "the first ones cheapest-first with predicted times.")
    _common(p, 1.0)
    p.add_argument("--limit", type=cli_args.count, default=10, help="paths to list (default 10)")
    p.set_defaults(run=_paths)

    p = sub.add_parser("explain", help="plan a graph and print the plan",
                       description="Plans the graph from the database without running "
                                   "anything and prints each step (kernel, backend, what it "
                                   "computes, predicted time and its source), then totals.")
    _common(p, 1e-5)
    p.add_argument("--limit", type=cli_args.count, default=None, help="steps to show (default all)")
    p.add_argument("--html", type=cli_args.output_file, default=None, metavar="FILE",
                   help="also write the plan as one self-contained HTML page: the graph "
                        "colored by backend and sized by predicted time, a sortable step "
                        "table, the cost per layer")
    p.set_defaults(run=_explain)
