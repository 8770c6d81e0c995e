"""``tg profile``, ``tg paths`` and ``tg explain``: planning from the command line.

Each takes a graph: a file written by ``tg.save``, an ONNX model file (imported as
``tg.from_onnx`` imports it, its symbolic dims named by the model) or a built-in graph name
(``GRAPHS``), with ``--dim NAME=VALUE`` for its symbolic dims (default: batch=1, seq=128 where
the graph has them).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

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


def load_graph(source: str, dims=()):
    """A graph from a ``tg.save`` file, an ONNX model file or a built-in name. ``dims``: the
    ``--dim`` pairs, which an ONNX model's import needs as well as the planner (see
    ``_load_onnx``)."""
    from tensor_graphs.errors import ArgumentError

    if source in GRAPHS:
        return GRAPHS[source][1]()
    if os.path.exists(source):
        from tensor_graphs.ir.serialize import load

        if is_onnx(source):
            return _load_onnx(source, dims)
        try:
            return load(source)
        except Exception:
            if _looks_like_onnx(source):  # an ONNX model named otherwise: read as one
                try:
                    return _load_onnx(source, dims)
                except Exception:  # noqa: BLE001 - not ONNX either: the graph file's error
                    pass
            raise
    raise ArgumentError(_not_a_graph(source))


def is_onnx(path: str) -> bool:
    """An ONNX model file, by its name (``*.onnx``)."""
    return os.path.splitext(path)[1].lower() == ".onnx"


def _looks_like_onnx(path: str) -> bool:
    """A protobuf whose first field is ModelProto's ir_version (tag byte 0x08, what
    ``onnx.save`` writes first) rather than a tg.save file's JSON text."""
    try:
        with open(path, "rb") as f:
            return f.read(1) == b"\x08"
    except OSError:
        return False


def _load_onnx(path: str, dims=()) -> list:
    """The graph of an ONNX model as ``tg.from_onnx`` imports it (outputs in the model's
    order; initializers become weights, left unbound: planning needs their shapes only).
    The dims planned for (``--dim`` over DEFAULT_DIMS) are its ``dynamic_dims``: an RNN, GRU
    or LSTM over a dynamic sequence is unrolled to its length at import, and without them
    every such model was refused, naming a from_onnx argument the command does not take."""
    from tensor_graphs.frontend.onnx_import import import_onnx, load_model

    label = f"'{path}'"
    planned = {k: v for k, v in {**DEFAULT_DIMS, **dict(dims or ())}.items() if v >= 1}
    outputs, _, _, _ = import_onnx(load_model(path), planned, label=label)
    return list(outputs)


def _not_a_graph(source: str) -> str:
    return (f"{source!r} is neither a graph file (tg.save or .onnx) nor a built-in graph "
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

    graph = load_graph(args.graph, args.dim)
    dims = parse_dims(graph, args.dim)
    if args.ray is not None:
        return _profile_on_ray(args, graph, dims)
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
             "measured_s": p.measured, "spread": p.spread, "failure": p.failure,
             "kernels": ", ".join(dict.fromkeys(p.plan.kernels))} for p in report.paths]
    output.info(report.table().split("\n")[0])  # how many calls were measured
    output.emit(rows, args.output_format, PROFILE_COLUMNS, shown=_shown_seconds)
    if report.verdict():
        output.info(report.verdict())
    return 0


@dataclass(frozen=True)
class GraphPlanner:
    """Plans a graph on a Ray node (pickled there by ``tg profile --ray``): the nodes may not
    have the driver's files, so a graph file travels as its text; a built-in graph by name."""

    graph: str  # a built-in graph's name, or the file's path (for messages)
    text: str | None  # the graph file's JSON; None for a built-in graph
    dims: tuple[tuple[str, int], ...]
    device: str
    tolerance: float
    backends: tuple[str, ...] | None = None

    def __call__(self, db):
        import json

        from tensor_graphs.compiler import Pipeline, prepare
        from tensor_graphs.ir.graph import _as_list
        from tensor_graphs.ir.serialize import from_json

        graph = load_graph(self.graph) if self.text is None else \
            from_json(json.loads(self.text), source=self.graph)
        settings = Pipeline(_as_list(graph), self.device, self.tolerance, db, "never",
                            self.backends)
        return settings.planner(prepare(settings.outputs, dict(self.dims)), blocks=False)


def calibrate_node(db, planner) -> bool:
    """Calibrate this node's devices the database has no rates for (as ``tg profile`` does
    before measuring); True when it did, so the planner is made again."""
    from tensor_graphs.commands.calibrate import calibrate, calibrate_gpu
    from tensor_graphs.devices import cuda_available

    kinds = [kind for kind in planner.kinds
             if db.calibration(planner.cost.hardware[kind]) is None
             and (kind == "cpu" or cuda_available())]
    for kind in kinds:
        (calibrate if kind == "cpu" else calibrate_gpu)(db, planner.cost.hardware[kind])
    return bool(kinds)


def _profile_on_ray(args, graph, dims) -> int:
    from tensor_graphs.db.store import default_target, is_url, open_db
    from tensor_graphs.errors import ArgumentError
    from tensor_graphs.profiler.ray_profile import KINDS, profile_on_ray

    if args.budget is not None:
        raise ArgumentError("--budget does not apply with --ray: each machine measures all it "
                            "lacks (stop the run with Ctrl-C; what was recorded stays)")
    target = str(args.db if args.db is not None else default_target())
    text = None if args.graph in GRAPHS else graph_text(args.graph, graph)
    source = GraphPlanner(args.graph, text, tuple(sorted(dims.items())), args.device,
                          args.tolerance)
    # the device kinds a plan for --device uses (the device need not be on this machine)
    kind = args.device.split(":")[0]
    if kind not in KINDS:
        raise ArgumentError(f"--device {args.device!r}: the device kinds are {', '.join(KINDS)}")
    kinds = tuple(dict.fromkeys((kind, "cpu")))
    bound = ", ".join(f"{k}={v}" for k, v in dims.items()) or "static"
    output.info(f"profiling {args.graph} ({bound}) for {'/'.join(kinds)} on the Ray cluster at "
                f"{args.ray} into {open_db(target).path}"
                + ("" if is_url(target) else " (a file: every node must see this path)"))
    report = profile_on_ray(args.ray, target, source, kinds, prepare=calibrate_node,
                            progress=not output.quiet())
    if args.output_format == "table":
        print(report.table())
    else:
        output.emit(report.rows(), args.output_format, RAY_COLUMNS)
    return 0 if all(not r.left and not r.errors for r in report.keys.values()) else 1


def graph_text(source: str, graph) -> str:
    """The JSON of the graph file ``source`` (as ``tg.save`` writes it), for a node that may
    not have the file: the file's own text, or an ONNX model's imported ``graph`` saved."""
    if is_onnx(source) or _looks_like_onnx(source):
        import tempfile

        from tensor_graphs.ir.serialize import save

        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "graph.json")
            save(graph, path)
            with open(path, encoding="utf-8") as f:
                return f.read()
    with open(source, encoding="utf-8") as f:
        return f.read()


RAY_COLUMNS = ("hardware", "device", "nodes", "calls", "measured", "failures", "by_others",
               "left", "died", "errors")


def _ray_node(args) -> int:
    import json
    import shlex
    import subprocess
    import sys

    from tensor_graphs.errors import ArgumentError
    from tensor_graphs.profiler.ray_profile import node_resources

    if (args.address is None) == (not args.head):
        raise ArgumentError("tg ray-node: give the head's ADDRESS to join a cluster, or --head "
                            "to start one (not both)")
    command = [sys.executable, "-c", "from ray.scripts.scripts import main; main()", "start",
               *(["--head", "--port", str(args.port)] if args.head
                 else ["--address", args.address]),
               "--resources", json.dumps(node_resources(), sort_keys=True)]
    if args.dry_run:
        print(shlex.join(command))
        return 0
    from tensor_graphs.profiler.ray_profile import import_ray

    import_ray()  # a ClusterError naming the extra before a bare ModuleNotFoundError
    return subprocess.run(command, check=False).returncode


PROFILE_COLUMNS = ("path", "steps", "predicted_s", "measured_s", "spread", "failure",
                   "kernels")  # spread: half the samples' interquartile range / their median


def _shown_seconds(row: output.Row) -> output.Row:
    """A row as people read it: every ``*_s`` value (seconds) as "12.3us"."""
    from tensor_graphs.commands.db import fmt_seconds

    return {k: fmt_seconds(v) if k.endswith("_s") else ("-" if v is None else v)
            for k, v in row.items()}


def _paths(args) -> int:
    from tensor_graphs.commands.walk import RANKED_PATHS, cheapest_paths
    from tensor_graphs.compiler import prepare

    graph = load_graph(args.graph, args.dim)
    dims = parse_dims(graph, args.dim)
    settings = _settings(args, graph)
    planner = settings.planner(prepare(settings.outputs, dims), blocks=False)
    total = planner.count()
    plans, everyone = cheapest_paths(planner, args.limit)
    shown = min(args.limit, total)
    output.note(f"{total} paths; the {shown} cheapest-first"
                + ("" if everyone or not shown else
                   f" of the first {max(args.limit, RANKED_PATHS)} enumerated (each "
                   f"decision's cheapest option first; the others are not ranked)") + ":",
                args.output_format)
    rows = [{"rank": i + 1, "cost_s": plan.cost, "kernels": ", ".join(plan.kernels)}
            for i, plan in enumerate(plans)]
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
    """The plan's steps as rows for ``-o``: what ``explain``'s table shows, raw values
    ("computes" as the table words it: a generated kernel's ops, what is fused...)."""
    from tensor_graphs.ir.shapes import format_shape
    from tensor_graphs.planner.plan import check_limit, step_computes

    limit = check_limit(limit, "explain_rows")
    return [{"step": i, "kernel": s.kernel.name, "backend": s.kernel.backend,
             "device": s.device, "computes": step_computes(s),
             "shape": format_shape(s.node.shape), "time_s": s.cost, "source": s.source,
             "error": s.error}
            for i, s in enumerate(plan.steps) if limit is None or i < limit]


def _explain(args) -> int:
    from tensor_graphs.compiler import compile
    from tensor_graphs.errors import ArgumentError

    if args.html == "-":
        raise ArgumentError("--html -: give a file path for the page")
    graph = load_graph(args.graph, args.dim)
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
                   help=f"a graph file written by tg.save, an ONNX model file (.onnx; its "
                        f"symbolic dims by the model's names, bound with --dim), or one of: "
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
                    "end to end and prints predicted vs measured times: every path warmed "
                    "first, then timed in turns, the median of 9 samples of 5 ms or more; a "
                    "path counts as faster than the default plan only beyond the samples' "
                    "spread, and one with the default plan's kernels is the default plan.")
    _common(p, 1e-5)
    p.add_argument("--budget", type=cli_args.non_negative_float, default=None, metavar="SECONDS",
                   help="stop measuring after this many seconds (default: no limit)")
    p.add_argument("--paths", type=cli_args.count, default=3, metavar="N",
                   help="how many of the cheapest paths to run end to end (default 3)")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="measure on the machines of the Ray cluster at ADDRESS (HOST:PORT of "
                        "its head, or auto) instead of here, each on its own hardware: the "
                        "driver collects what the database lacks per hardware key (each "
                        "machine lists it for itself), and measuring actors, placed only on "
                        "nodes that advertise that hardware (start them with `tg ray-node "
                        "ADDRESS`), split it through the database's claims and record into "
                        "it; a killed worker's claims are taken over when their lease runs "
                        "out. --db must be a database every node reaches (a postgresql:// "
                        "URL; a file only for nodes on one machine). Prints what each "
                        "hardware key got; --budget and --paths do not apply (run tg profile "
                        "without --ray on a machine to compare its paths). Needs the ray "
                        "extra: pip install tensor_graphs[ray]")
    p.set_defaults(run=_profile)

    p = sub.add_parser(
        "ray-node", help="start a Ray node that offers this machine to tg profile --ray",
        description="Runs `ray start` with this machine's hardware advertised as Ray "
                    "resources (tg_hw_<kind>_<key>: one unit for its CPU and one for a usable "
                    "GPU), so tg profile --ray gives it only the work its hardware can "
                    "measure, one measuring actor per kind at a time. Needs the ray extra.")
    p.add_argument("address", nargs="?", default=None,
                   help="HOST:PORT of the cluster's head node to join")
    p.add_argument("--head", action="store_true",
                   help="start a new cluster's head node here instead of joining one")
    p.add_argument("--port", type=cli_args.positive_int, default=6379,
                   help="the head's port (with --head; default 6379)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the ray start command instead of running it")
    p.set_defaults(run=_ray_node)

    p = sub.add_parser("paths", help="count a graph's paths and list the cheapest",
                       description="Counts every valid path (kernel choices, decompositions, "
                                   "rewrites, copies) without enumerating them, then lists "
                                   "the cheapest by predicted total, cheapest first: of all "
                                   "paths where there are at most 2000, else of the first "
                                   "2000 enumerated (each decision's cheapest option first).")
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
