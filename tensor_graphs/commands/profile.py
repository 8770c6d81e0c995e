"""``tg profile``, ``tg paths`` and ``tg explain``: planning from the command line.

Each takes a graph: a file written by ``tg.save`` or a built-in graph name (``GRAPHS``), with
``--dim NAME=VALUE`` for its symbolic dims (default: batch=1, seq=128 where the graph has them).
"""

from __future__ import annotations

import argparse
import os
import sys

from tensor_graphs import cli_args

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
    print(f"profiling {args.graph} ({', '.join(f'{k}={v}' for k, v in dims.items()) or 'static'})"
          f" on {settings.device.name} into {settings.db.path}", file=sys.stderr)
    report = profile(settings.outputs, settings, dims, budget=args.budget, paths=args.paths,
                     progress=not args.quiet)
    print(report.table())
    return 0


def _paths(args) -> int:
    from tensor_graphs.compiler import prepare

    graph = load_graph(args.graph)
    dims = parse_dims(graph, args.dim)
    settings = _settings(args, graph)
    planner = settings.planner(prepare(settings.outputs, dims), blocks=False)
    print(f"{planner.count()} paths; the {args.limit} cheapest-first:")
    for i, plan in enumerate(planner.paths()):
        if i >= args.limit:
            break
        names = ", ".join(plan.kernels)
        print(f"{i + 1:4d}  {plan.cost * 1e6:10.1f} us  {names[:110]}")
    return 0


def _explain(args) -> int:
    from tensor_graphs.compiler import compile
    from tensor_graphs.errors import ArgumentError

    if args.html == "-":
        raise ArgumentError("--html -: give a file path for the page")
    graph = load_graph(args.graph)
    dims = parse_dims(graph, args.dim)
    prog = compile(graph, device=args.device, tolerance=args.tolerance, db=args.db,
                   bounds=dims)
    print(prog.explain(limit=args.limit, html=args.html))
    if args.html:
        print(f"wrote {args.html}", file=sys.stderr)
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
    p.add_argument("--quiet", action="store_true", help="no progress bars")
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
