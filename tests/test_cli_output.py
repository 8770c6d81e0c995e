"""Every ``tg`` listing writes its rows as a table, JSON, CSV or markdown (``-o``), with data
alone on stdout and notes on stderr, and ``--quiet`` silences the notes but not the errors.
``tg`` runs as a subprocess with its output piped, as a script would run it."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

import tensor_graphs as tg
from tensor_graphs import kernels
from tensor_graphs.db import Database, Measurement, signature_text

FORMATS = ("table", "json", "csv", "md")


def tg_run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensor_graphs.cli", *argv],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def _measurement(kernel: str, n: int, source_hash: str = "h1", **kw) -> Measurement:
    sig = signature_text([((n, n), "float32"), ((n, n), "float32")], {})
    return Measurement(kernel, source_hash, sig, runs=10, median=1e-5, min=9e-6, max=1.5e-5,
                       error=1e-7, **kw)


def strict_json(text: str):
    """JSON as jq reads it: NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli_output")
    db = folder / "m.sqlite"
    k = kernels.all()[0]
    with Database(db) as d:
        d.record(_measurement(k.name, 4, k.source_hash))
        d.record(_measurement("user_mul", 8, when=time.time() - 86400))
        d.record(Measurement("user_mul", "h", _measurement("user_mul", 16).signature, 0,
                             math.nan, math.nan, math.nan, None,
                             failure="RuntimeError: boom, with a comma | and a bar"))
    x = tg.input("x", ("n", 16))
    tg.save(tg.tanh(x @ tg.weight("w", (16, 8))), folder / "g.json")
    return {"db": str(db), "graph": str(folder / "g.json"), "kernel": k.name}


# listing -> (its arguments, the columns of its rows, how a row shows in the default table:
# a text each row's table line holds, so the table and the rows are checked to agree)
LISTINGS = {
    "kernels list": (["kernels", "list", "--op", "tanh"],
                     ("name", "backend", "device", "pattern", "tolerance"),
                     lambda r: f"{r['name']} "),
    "kernels verify": (["kernels", "verify", "c_tanh", "numpy_tanh", "--seed", "1"],
                       ("kernel", "backend", "result", "max_rel_error", "tolerance", "cases",
                        "failures", "skipped"),
                       lambda r: f"{r['result']:4} {r['kernel']}: "),
    "db show": (["db", "show", "--db", "{db}"],
                ("when", "kernel", "signature", "runs", "median_s", "min_s", "max_s", "error",
                 "hardware", "failure"),
                lambda r: f"{r['kernel']} "),
    "db stats": (["db", "stats", "--db", "{db}"], ("field", "value"),
                 lambda r: "" if r["field"] in ("readonly", "oldest", "newest")
                 else str(r["value"]).split(" ")[-1]),
    "paths": (["paths", "{graph}", "--dim", "n=4", "--db", "{db}", "--limit", "3"],
              ("rank", "cost_s", "kernels"), lambda r: f"{r['rank']:4d}  "),
    "explain": (["explain", "{graph}", "--dim", "n=4", "--db", "{db}"],
                ("step", "kernel", "backend", "device", "computes", "shape", "time_s",
                 "source", "error"),
                lambda r: f"{r['step']}  {r['kernel']} "),
    "env": (["env"], ("name", "value", "source", "meaning"), lambda r: f"{r['name']} "),
}


@pytest.fixture(scope="module")
def outputs(files):
    """(listing, format) -> the finished ``tg`` run, all run at once."""
    jobs = {(name, fmt): [a.format(**files) for a in args] + (["-o", fmt] if fmt != "table"
                                                             else [])
            for name, (args, _, _) in LISTINGS.items() for fmt in FORMATS}
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(jobs, pool.map(lambda argv: tg_run(*argv), jobs.values())))
    return done


@pytest.mark.parametrize("name", LISTINGS)
def test_json_csv_and_md_hold_the_table_rows(name, outputs):
    _, columns, line_of = LISTINGS[name]
    runs = {fmt: outputs[name, fmt] for fmt in FORMATS}
    for fmt, proc in runs.items():
        assert proc.returncode == 0, (fmt, proc.stderr)
    rows = strict_json(runs["json"].stdout)  # the whole of stdout: no note, no progress
    assert rows and all(list(r) == list(columns) for r in rows), rows[:1]
    table = runs["table"].stdout
    where = -1
    for r in rows:  # every row is in the table, in the same order
        found = table.find(line_of(r), where + 1)
        assert found > where, (line_of(r), table)
        where = found if line_of(r) else where
    parsed = list(csv.DictReader(io.StringIO(runs["csv"].stdout)))
    assert [list(r) for r in parsed] == [list(columns)] * len(rows)
    assert parsed == [{k: "" if v is None else str(v) for k, v in r.items()} for r in rows]
    md = runs["md"].stdout.splitlines()
    assert md[0] == "| " + " | ".join(columns) + " |"
    assert md[1] == "|" + "|".join(["---"] * len(columns)) + "|"
    assert len(md) == 2 + len(rows) and all(line.startswith("| ") and line.endswith(" |")
                                            for line in md[2:])
    assert all(len(re.split(r"(?<!\\)\|", line)) == len(columns) + 2 for line in md)


def test_notes_go_to_stderr_beside_machine_rows(outputs):
    """The counts under a table stay on stdout for people; beside JSON they move to stderr."""
    assert "kernels (of" in outputs["kernels list", "table"].stdout
    assert "3 of 3 rows" in outputs["db show", "table"].stdout
    for fmt in ("json", "csv", "md"):
        proc = outputs["kernels list", fmt]
        assert "kernels (of" in proc.stderr and "kernels (of" not in proc.stdout
        proc = outputs["paths", fmt]
        assert "cheapest-first" in proc.stderr and "cheapest-first" not in proc.stdout
        assert "3 of 3 rows" in outputs["db show", fmt].stderr
        proc = outputs["kernels verify", fmt]
        assert "[2/2] ok   numpy_tanh" in proc.stderr and "2 passed" in proc.stderr


def test_db_show_json_keeps_raw_values(outputs, files):
    rows = strict_json(outputs["db show", "json"].stdout)
    failed = [r for r in rows if r["failure"]]
    assert len(rows) == 3 and len(failed) == 1
    assert failed[0]["median_s"] is failed[0]["min_s"] is None  # not NaN, which jq refuses
    ok = [r for r in rows if r["kernel"] == files["kernel"]][0]
    assert ok["median_s"] == pytest.approx(1e-5) and isinstance(ok["when"], float)
    assert "10us" in outputs["db show", "table"].stdout  # people still read seconds so


def test_profile_json_piped_carries_no_progress(files, tmp_path):
    db = str(tmp_path / "p.sqlite")
    proc = tg_run("profile", files["graph"], "--dim", "n=4", "--db", db, "--paths", "1",
                  "-o", "json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["path"] for r in rows] and all(r["predicted_s"] > 0 for r in rows)
    assert "profiling" in proc.stderr and "measured" in proc.stderr
    assert "\r" not in proc.stderr + proc.stdout  # no progress bar: stderr is not a terminal


def test_quiet_silences_notes_not_errors(files, tmp_path):
    loud = tg_run("kernels", "list", "--op", "tanh", "-o", "json")
    assert "kernels (of" in loud.stderr
    for argv in (["--quiet", "kernels", "list"], ["kernels", "list", "--quiet"]):
        quiet = tg_run(*argv, "--op", "tanh", "-o", "json")
        assert quiet.returncode == 0 and quiet.stderr == "" and \
            json.loads(quiet.stdout) == json.loads(loud.stdout)
    quiet = tg_run("--quiet", "explain", files["graph"], "--dim", "n=4", "--db", files["db"],
                   "--html", str(tmp_path / "p.html"), "-o", "csv")
    assert quiet.returncode == 0 and quiet.stderr == "" and (tmp_path / "p.html").exists()
    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(b"\x00garbage" * 100)
    failed = tg_run("--quiet", "db", "stats", "--db", str(garbage))
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.startswith("tg db stats: error: ") and failed.stderr.count("\n") == 1


CRASH = "import sys\nsys.stdin.read()\nprint('model overloaded', file=sys.stderr)\nsys.exit(1)\n"


def test_kernels_generate_rows(tmp_path):
    """`tg kernels generate -o`: one row per region asked about (here a command that crashes,
    so nothing is timed or kept)."""
    x = tg.input("x", (8, 16), "float32")
    y = x
    for _ in range(3):
        y = tg.exp(tg.log(y))
    tg.save(y * 0.5 + 1.0, tmp_path / "chain.json")
    (tmp_path / "crash.py").write_text(CRASH)
    argv = ["kernels", "generate", str(tmp_path / "chain.json"), "--command",
            f"{sys.executable} {tmp_path / 'crash.py'}", "--out", str(tmp_path / "kept"),
            "--db", str(tmp_path / "m.sqlite"), "--timeout", "60"]
    runs = {fmt: tg_run(*argv, "-o", fmt) for fmt in ("json", "csv")}
    assert all(p.returncode == 0 for p in runs.values()), runs["json"].stderr
    rows = strict_json(runs["json"].stdout)
    assert [r["verdict"] for r in rows] == ["crashed"] and "overloaded" in rows[0]["detail"]
    assert list(rows[0]) == ["region", "shape", "verdict", "this_s", "generated_s",
                             "unfused_s", "speedup", "path", "detail"]
    parsed = list(csv.DictReader(io.StringIO(runs["csv"].stdout)))
    assert parsed == [{k: "" if v is None else str(v) for k, v in r.items()} for r in rows]
    assert "asking" in runs["json"].stderr


def test_an_unknown_format_is_a_usage_error():
    proc = tg_run("env", "-o", "yaml")
    assert proc.returncode == 2 and "argument -o/--output-format" in proc.stderr
