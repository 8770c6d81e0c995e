"""How every ``tg`` listing writes its rows, and where its chatter goes.

A listing hands over its rows as dicts (raw values: numbers as numbers, seconds as seconds) and
``-o``/``--output-format`` picks the writer, so a script gets JSON or CSV from any listing by the
same flag and a person gets the aligned table. Data goes to stdout; notes (counts, "wrote ...")
go to stderr whenever stdout carries machine-readable data, so ``tg db show -o json | jq`` reads
nothing but JSON. ``--quiet`` (``set_quiet``) silences the notes; errors are never silenced."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TextIO

Row = Mapping[str, Any]

_state: dict[str, Any] = {"quiet": False, "errors": None}


def _table(rows: Sequence[Row], columns: Sequence[str], out: TextIO) -> None:
    cells = [[str(r.get(c, "")) for c in columns] for r in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    for i, line in enumerate([list(columns), *cells]):
        out.write("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() + "\n")
        if i == 0:
            out.write("  ".join("-" * w for w in widths) + "\n")


def _raw(value: Any) -> Any:
    """A value for a machine: NaN and infinities (a failed measurement's times) become None,
    since strict JSON readers (jq, JavaScript) refuse Python's NaN."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _json(rows: Sequence[Row], columns: Sequence[str], out: TextIO) -> None:
    out.write(json.dumps([{c: _raw(r.get(c)) for c in columns} for r in rows], indent=1,
                         allow_nan=False) + "\n")


def _csv(rows: Sequence[Row], columns: Sequence[str], out: TextIO) -> None:
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([["" if _raw(r.get(c)) is None else r.get(c) for c in columns]
                      for r in rows])


def _md_cell(value: Any) -> str:
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _md(rows: Sequence[Row], columns: Sequence[str], out: TextIO) -> None:
    out.write("| " + " | ".join(map(_md_cell, columns)) + " |\n")
    out.write("|" + "|".join("---" for _ in columns) + "|\n")
    for r in rows:
        out.write("| " + " | ".join(_md_cell(r.get(c, "")) for c in columns) + " |\n")


# -o value -> (writer of the rows, whether it shows the rows as people read them)
FORMATS: dict[str, tuple[Callable[[Sequence[Row], Sequence[str], TextIO], None], bool]] = {
    "table": (_table, True),  # the default: aligned columns, values as `shown` renders them
    "json": (_json, False),  # a JSON array of objects, one per row, raw values
    "csv": (_csv, False),  # a header row, then one row per line, raw values (csv module)
    "md": (_md, True),  # a markdown (GitHub) table of the values as people read them
}


def add_output_option(parser: argparse.ArgumentParser) -> None:
    """Give a listing command ``-o/--output-format``."""
    parser.add_argument("-o", "--output-format", dest="output_format", default="table",
                        choices=tuple(FORMATS), metavar="FORMAT",
                        help="how to write the rows on stdout: table (default, for people), "
                             "json, csv or md (notes go to stderr then)")


def emit(rows: Sequence[Row], fmt: str, columns: Sequence[str],
         shown: Callable[[Row], Row] | None = None, out: TextIO | None = None) -> None:
    """Write ``rows`` (their ``columns``, in that order) on ``out`` (stdout) in ``fmt``;
    ``shown`` maps a raw row to the strings people read (seconds as "12.3us") for the table and
    markdown formats."""
    writer, for_people = FORMATS[fmt]
    if for_people and shown is not None:
        rows = [shown(r) for r in rows]
    writer(rows, columns, out or sys.stdout)


def note(text: str, fmt: str = "table") -> None:
    """A line about the data, not the data: on stdout under a table (where it always was), on
    stderr when stdout carries machine-readable rows; nothing with ``--quiet``."""
    if fmt == "table":
        print(text)
    else:
        info(text.strip("\n"))


def info(text: str) -> None:
    """Progress and notes for a person: stderr, unless ``--quiet``."""
    if not _state["quiet"]:
        print(text, file=sys.stderr, flush=True)


def error(text: str) -> None:
    """An error line: always printed, on the stderr ``tg`` started with even under ``--quiet``
    (which points ``sys.stderr`` at nothing while the command runs)."""
    print(text, file=_state["errors"] or sys.stderr, flush=True)


def set_quiet(quiet: bool, errors: TextIO | None = None) -> None:
    """``tg --quiet``: no progress and no notes on stderr; ``errors`` is where error lines
    still go."""
    _state["quiet"], _state["errors"] = quiet, errors


def quiet() -> bool:
    return _state["quiet"]
