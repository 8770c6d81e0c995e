"""``tg env``: the one table of the ``TG_*`` environment variables is complete (every name the
package reads is in it, and it names none the package no longer reads), and ``tg env`` shows
each with its value and where that value comes from."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from tensor_graphs.commands.env import ENV

PACKAGE = Path(__file__).resolve().parents[1] / "tensor_graphs"
# An environment variable is read by its name as a string literal (os.environ.get("TG_DB"),
# SIMULATED = "TG_SIMULATED_CUDA"); C macros such as TG_SELECT(...) are never a whole literal.
READ = re.compile(r"""["'](TG_[A-Z0-9_]+)["']""")


def names_read() -> dict[str, str]:
    """Each TG_* name in a string literal of the package -> the first file that has it."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.parent.name == "commands" and path.name == "env.py":
            continue  # the table itself
        for name in READ.findall(path.read_text(encoding="utf-8")):
            found.setdefault(name, str(path.relative_to(PACKAGE)))
    return found


def test_every_variable_the_package_reads_is_in_the_table():
    read = names_read()
    assert {"TG_DB", "TG_DEBUG"} <= set(read)  # the search finds what it must
    missing = {name: where for name, where in read.items() if name not in ENV}
    assert not missing, f"add these to ENV in tensor_graphs/commands/env.py: {missing}"
    stale = set(ENV) - set(read)
    assert not stale, f"ENV lists variables nothing reads any more: {sorted(stale)}"
    assert all(default and meaning for default, meaning in ENV.values())


def test_tg_env_shows_values_and_sources(tmp_path):
    db = str(tmp_path / "mine.sqlite")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TG_")}
    proc = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "env", "-o", "json"],
                          capture_output=True, text=True, timeout=120,
                          env={**env, "TG_DB": db})
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    assert set(rows) == set(ENV)
    assert rows["TG_DB"]["value"] == db and rows["TG_DB"]["source"] == "environment"
    assert rows["TG_DEBUG"] == {"name": "TG_DEBUG", "value": ENV["TG_DEBUG"][0],
                                "source": "default", "meaning": ENV["TG_DEBUG"][1]}
    table = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "env"],
                           capture_output=True, text=True, timeout=120, env=env).stdout
    assert all(name in table for name in ENV)
