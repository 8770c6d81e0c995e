"""``tg db``: inspect, share and prune the measurement database."""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import sys
import time

from tensor_graphs import cli_args
from tensor_graphs.commands import output
from tensor_graphs.errors import ArgumentError

DB_HELP = ("the database: a file or a postgresql:// URL (default: $TG_DB, else "
           "~/.cache/tensor_graphs/measurements.sqlite; ':memory:' for an empty one)")


def _jsonl_or_url(check):
    """An argparse type: a ``postgresql://`` URL as it is, else ``check``'s file rule."""
    def parse(text: str) -> str:
        from tensor_graphs.db.store import is_url

        return text if is_url(text) else check(text)
    return parse


def add_db_commands(sub) -> None:
    """Register ``tg db stats | show | export | import | prune | plot`` on the ``tg`` subparsers."""
    db = sub.add_parser(
        "db", help="inspect, export, import and prune kernel measurements (tg db --help)",
        description="The measurement database holds kernel timings on this hardware (an "
                    "SQLite file, or a PostgreSQL database a team shares: --db or TG_DB "
                    "postgresql://...; one row per kernel x input signature x hardware). The "
                    "planner reads it; "
                    "`tg profile` and compile(profile='missing') write it.")
    dsub = db.add_subparsers(dest="db_command", metavar="SUBCOMMAND")
    db.set_defaults(run=lambda args: (db.print_help(), 0)[1])

    def command(name: str, help: str, description: str, run) -> argparse.ArgumentParser:
        p = dsub.add_parser(name, help=help, description=description)
        p.add_argument("--db", metavar="PATH|URL", help=DB_HELP)
        p.set_defaults(run=run)
        return p

    stats = command("stats", "counts: rows, kernels, hardware, failures, stale rows",
                    "Summarises the database: its file, schema version and revision, how many "
                    "rows, kernels and failures it holds, rows per hardware key, and how many "
                    "rows are stale (their kernel's source changed since they were measured).",
                    _stats)
    output.add_output_option(stats)
    show = command("show", "table of measurements, most recent first",
                   "One line per measurement: when, kernel, input signature, runs, median / "
                   "min / max time, error against the float64 reference, and the device. "
                   "Failed kernels show their error message.", _show)
    show.add_argument("--kernel", help="only this kernel (exact name)")
    output.add_output_option(show)
    show.add_argument("--limit", type=cli_args.count, default=30,
                      help="at most this many rows (default 30; 0 for all)")
    exp = command("export", "write measurements as JSON lines (or into another database)",
                  "Writes every measurement as one JSON object per line, to share with "
                  "another machine or keep as a backup; `tg db import` merges it back. Given "
                  "a postgresql:// URL instead of a file, merges the rows into that database "
                  "(SQLite file to server: --db FILE URL).", _export)
    exp.add_argument("file", metavar="FILE|URL", type=_jsonl_or_url(cli_args.output_file),
                     help="output file, '-' for stdout, or a postgresql:// database")
    imp = command("import", "merge measurements from JSON lines (or another database)",
                  "Adds the measurements of a `tg db export` file, skipping rows already "
                  "present (exact duplicates), so importing twice changes nothing. Given a "
                  "postgresql:// URL instead of a file, merges that database's rows (server "
                  "to SQLite file: --db FILE URL).", _import)
    imp.add_argument("file", metavar="FILE|URL", type=_jsonl_or_url(cli_args.input_file),
                     help="input file, '-' for stdin, or a postgresql:// database")
    prune = command("prune", "delete stale, old or failed measurements",
                    "Deletes the rows selected by the options (at least one is needed). "
                    "Stale rows are still used as rough estimates, so pruning them is "
                    "optional.", _prune)
    prune.add_argument("--stale", action="store_true",
                       help="rows measured with an older source of a kernel registered now")
    prune.add_argument("--older-than", type=cli_args.non_negative_float, metavar="DAYS",
                       help="rows recorded more than DAYS days ago")
    prune.add_argument("--failures", action="store_true",
                       help="rows that record a kernel raising during profiling")
    plot = command("plot", "draw a kernel's measured times and the cost model's curve",
                   "Writes a PNG (matplotlib: pip install \"tensor_graphs[plot]\"): the "
                   "kernel's measured rows as points and the cost model's interpolation over "
                   "a shape feature as a curve, one per class of signatures it fits together, "
                   "with the roofline estimate dashed: why a shape was estimated as it was.",
                   _plot)
    plot.add_argument("kernel", metavar="KERNEL", help="the kernel's name (tg db show lists them)")
    plot.add_argument("-o", "--output", required=True, type=cli_args.output_file,
                      metavar="FILE", help="the PNG file to write")
    plot.add_argument("--x", choices=("work", "flops", "bytes"), default="work",
                      help="the shape feature on the horizontal axis (default work: the "
                           "roofline seconds the model interpolates over)")


def _open(args: argparse.Namespace, *, existing: bool = True):
    """The database ``--db`` names (else TG_DB's, else the default file). ``existing``: a
    file named with ``--db`` must be there, for the commands that read rows; opening a
    misspelt path made an empty database and ``tg db export`` wrote 0 rows, exit 0. The
    path is looked for as the database opens it, ``~`` expanded (``--db=~/m.sqlite``, where
    the shell leaves it, was refused as missing)."""
    from tensor_graphs.db.store import is_url, open_db
    from tensor_graphs.errors import DatabaseError

    if existing and args.db and args.db != ":memory:" and not is_url(args.db) \
            and not os.path.exists(os.path.expanduser(args.db)):
        raise DatabaseError(f"--db {args.db}: no such measurement database; check the path "
                            "(`tg profile` and compile(profile='missing') create one, "
                            "`tg db import` fills a new one)")
    return open_db(args.db)


def _current_hashes() -> dict[str, str]:
    from tensor_graphs import kernels

    return {k.name: k.source_hash for k in kernels.all()}


def fmt_seconds(t: float | None) -> str:
    """A duration for people: 12.3us, 4.56ms, 1.20s ('-' for none)."""
    if t is None or math.isnan(t):
        return "-"
    t = float(f"{t:.3g}")  # the unit chosen after rounding: 999.6us printed 1e+03us
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(t) >= scale:
            return f"{t / scale:.3g}{unit}"
    return f"{t * 1e9:.3g}ns"


def short_signature(text: str) -> str:
    """``float32[64x64], float32[64] axis=-1`` for a signature_text (else the text itself)."""
    try:
        sig = json.loads(text)
        ins = [f"{dtype}[{'x'.join(map(str, shape))}]" for shape, dtype in sig["inputs"]]
        attrs = [f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sig["attrs"].items()]
    except (ValueError, KeyError, TypeError, AttributeError):
        return text
    return " ".join([", ".join(ins), *attrs]).strip()


def _stats(args: argparse.Namespace) -> int:
    db = _open(args)
    s = db.stats(_current_hashes())
    if args.output_format != "table":  # one field per row; a row per hardware key after
        fields = [("database", str(s["path"])), ("readonly", db.readonly_reason or None),
                  *((k, s[k]) for k in ("schema", "revision", "rows", "kernels", "failures",
                                        "stale", "oldest", "newest", "calibrations"))]
        fields += [(f"hardware {h['key']}", h["rows"]) for h in s["hardware"]]
        output.emit([{"field": k, "value": v} for k, v in fields], args.output_format,
                    ("field", "value"))
        return 0
    note = f"  (read-only: {db.readonly_reason})" if db.readonly else ""
    print(f"database   {s['path']}{note}")
    print(f"schema     v{s['schema']}, revision {s['revision']}")
    print(f"rows       {s['rows']} ({s['kernels']} kernels, {s['failures']} failures, "
          f"{s['stale']} stale)")
    if s["rows"]:
        print(f"recorded   {_date(s['oldest'])} .. {_date(s['newest'])}")
    print(f"calibrated {s['calibrations']} device(s)")
    if s["hardware"]:
        print()
        output.emit([{"hardware": h["key"], **h} for h in s["hardware"]], "table",
                    ("hardware", "rows", "device", "libs"))
    return 0


def _date(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))


def _show(args: argparse.Namespace) -> int:
    db = _open(args)
    rows = db.rows(kernel=args.kernel, limit=args.limit or None)
    table = [{"when": m.when, "kernel": m.kernel, "signature": m.signature, "runs": m.runs,
              "median_s": m.median if m.ok else None, "min_s": m.min, "max_s": m.max,
              "error": m.error, "hardware": m.hardware.key, "failure": m.failure}
             for m in rows]
    if table:
        output.emit(table, args.output_format, SHOW_COLUMNS, shown=_shown_row)
    elif args.output_format != "table":  # an empty listing is still one that parses
        output.emit([], args.output_format, SHOW_COLUMNS)
    total = db.stats()["rows"] if not args.kernel else len(db.rows(kernel=args.kernel))
    output.note(f"\n{len(rows)} of {total} rows" + (f" of kernel {args.kernel}" if args.kernel
                                                    else ""), args.output_format)
    return 0


SHOW_COLUMNS = ("when", "kernel", "signature", "runs", "median_s", "min_s", "max_s", "error",
                "hardware", "failure")


def _shown_row(r: output.Row) -> output.Row:
    """A ``tg db show`` row as people read it: dates, short signatures, 12.3us, FAILED."""
    failure = r["failure"].splitlines()[0][:80] if r["failure"] else ""
    return {"when": _date(r["when"]), "kernel": r["kernel"],
            "signature": short_signature(r["signature"]), "runs": r["runs"],
            "median_s": "FAILED" if r["median_s"] is None else fmt_seconds(r["median_s"]),
            "min_s": fmt_seconds(r["min_s"]), "max_s": fmt_seconds(r["max_s"]),
            "error": "-" if r["error"] is None else f"{r['error']:.2g}",
            "hardware": r["hardware"], "failure": failure}


def _export(args: argparse.Namespace) -> int:
    from tensor_graphs.db.store import is_url, open_db

    db = _open(args)
    if is_url(args.file):
        target = open_db(args.file)
        n = _copy(db, target)
        print(f"exported {n} new rows to {target.path}")
        return 0
    n = db.export_jsonl(sys.stdout if args.file == "-" else args.file)
    if args.file != "-":
        print(f"exported {n} rows to {args.file}")
    return 0


def _import(args: argparse.Namespace) -> int:
    from tensor_graphs.db.store import is_url, open_db

    db = _open(args, existing=False)  # (importing into a new database makes it)
    if is_url(args.file):
        n = _copy(open_db(args.file), db)
    else:
        n = db.import_jsonl(sys.stdin if args.file == "-" else args.file)
    print(f"imported {n} new rows into {db.path}")
    return 0


def _copy(source, target) -> int:
    """Merge ``source``'s rows into ``target`` through the JSON lines both stores read and
    write, so a copy is checked exactly as an imported file is; returns how many were new."""
    buffer = io.StringIO()
    source.export_jsonl(buffer)
    buffer.seek(0)
    return target.import_jsonl(buffer)


def _plot(args: argparse.Namespace) -> int:
    from tensor_graphs.commands.db_plot import plot_kernel

    if args.output == "-":
        raise ArgumentError("-o -: give a file path for the PNG")
    drawn = plot_kernel(_open(args), args.kernel, args.output, args.x)
    print(f"wrote {args.output}: {drawn['points']} measured points, "
          f"{drawn['classes']} curve(s)")
    return 0


def _prune(args: argparse.Namespace) -> int:
    if not (args.stale or args.older_than is not None or args.failures):
        raise ArgumentError("say what to prune: --stale, --older-than DAYS and/or --failures")
    db = _open(args)
    n = db.prune(stale_hashes=_current_hashes() if args.stale else None,
                 older_than=None if args.older_than is None else args.older_than * 86400,
                 failures=args.failures)
    print(f"pruned {n} rows from {db.path}")
    return 0
