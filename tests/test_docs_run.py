"""Every code block in README.md and docs/*.md works as written, because a newcomer pastes them.

```python blocks run: each file's blocks in order in one fresh process and one namespace, as a
reader pastes them one after another, in a temporary folder with a temporary database and no
network. The blocks before the first that imports a model library (torch, transformers, ...)
run in the fast subset; all of them run again, in order, marked slow and only where the library
is installed. Shell blocks are checked, never run (they install packages or run for minutes):
each command they name must exist and accept the subcommands and options written. A block that
is not a program (a listing, printed output, an excerpt of C) says so with its fence's language
(```text, ```c), so there is no skip list.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# Modules a block may import only when installed (the `torch` and `models` extras); importing
# one also makes the block model-sized, so the run that includes it is marked slow.
MODEL_MODULES = {"torch", "transformers", "diffusers", "sentence_transformers"}

SHELL = ("bash", "sh", "shell", "console")


@dataclass(frozen=True)
class Block:
    path: Path
    line: int  # 1-based line of the block's first content line
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{_name(self.path)}:{self.line}"


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


_FENCE = re.compile(r"^( {0,3})(`{3,}|~{3,})\s*([^`\s]*)")


def blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown file (CommonMark's fences: ``` or ~~~, closed by
    the same character at least as long), with the fence's first word as the language."""
    out, lines, i = [], path.read_text(encoding="utf-8").splitlines(), 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = len(m.group(1)), m.group(2), m.group(3).lower()
        body, j = [], i + 1
        while j < len(lines) and not re.match(rf"^ {{0,3}}{fence[0]}{{{len(fence)},}}\s*$",
                                              lines[j]):
            body.append(lines[j][min(indent, len(lines[j]) - len(lines[j].lstrip())):])
            j += 1
        out.append(Block(path, i + 2, lang, "\n".join(body) + "\n"))
        i = j + 1
    return out


def _json(block: Block) -> list[str]:
    try:
        json.loads(block.text)
    except ValueError as exc:
        return [f"{block.where}: not valid JSON ({exc})"]
    return []


# What each fence language means; a fence without one, or with one not here, fails the test.
LANGUAGES = {
    "python": "run (test_python_blocks_run)",
    "bash": "every command checked (test_shell_commands_exist)",
    "sh": "every command checked (test_shell_commands_exist)",
    "shell": "every command checked (test_shell_commands_exist)",
    "console": "`$ ` lines are commands, checked; the rest is their output",
    "json": "parsed",
    "text": "not a program: a listing, a sketch, printed output",
    "c": "an excerpt of C source, not a whole program",
}


def fence_problems(path: Path) -> list[str]:
    problems = []
    for block in blocks(path):
        if not block.lang:
            problems.append(f"{block.where}: a fence without a language; name it (```python, "
                            "```bash, or ```text for a listing that is no program)")
        elif block.lang not in LANGUAGES:
            problems.append(f"{block.where}: fence language '{block.lang}' is not in "
                            f"{Path(__file__).name}'s LANGUAGES table ({', '.join(LANGUAGES)})")
        elif block.lang == "json":
            problems += _json(block)
    return problems


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_every_fence_names_a_known_language(path):
    problems = fence_problems(path)
    assert not problems, "\n".join(problems)


_INDENTED_COMMAND = re.compile(r"^(?: {4}|\t)\s*(?:\$ |python3? |tg |pip |\.venv/bin/)")


def indented_commands(path: Path) -> list[str]:
    """Indented code blocks are not checked, so a command must sit in a ```bash fence."""
    fenced = set()
    for block in blocks(path):
        fenced.update(range(block.line - 1, block.line + block.text.count("\n") + 1))
    lines = path.read_text(encoding="utf-8").splitlines()
    return [f"{_name(path)}:{n}: `{line.strip()}` is an indented command; put it in a ```bash "
            "fence so that this test checks it"
            for n, line in enumerate(lines, 1) if n not in fenced and _INDENTED_COMMAND.match(line)]


@pytest.mark.parametrize("path", DOCS, ids=_name)
def test_no_command_hides_in_an_indented_block(path):
    bad = indented_commands(path)
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------ python blocks
def _imports(block: Block) -> set[str]:
    """Top-level module names the block imports (none when it does not parse: running it
    then reports the syntax error at its line of the docs)."""
    try:
        tree = ast.parse(block.text)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def _installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def _python_runs():
    """Per file: its blocks up to the first that imports a model library (fast), and, where
    there is such a block, all of them in order (slow; the first run's blocks again, ~1 s, so
    that the fast subset still covers them)."""
    for path in DOCS:
        code = [b for b in blocks(path) if b.lang == "python"]
        name = _name(path)
        plain = next((i for i, b in enumerate(code) if _imports(b) & MODEL_MODULES), len(code))
        if plain:
            yield pytest.param(code[:plain], id=name)
        if plain < len(code):
            yield pytest.param(code, marks=pytest.mark.slow, id=f"{name}+models")


# Runs the blocks given on stdin in one namespace. Each is compiled under its Markdown file's
# name with its own line numbers, so a traceback points at the line of the docs. A warning of
# tensor_graphs' or of a block's own line is an error (a reader would see it as one), and a
# connection to another host fails (an audit hook), so no block can depend on the network.
DRIVER = r"""
import json, socket, sys, warnings

warnings.filterwarnings("error", module="tensor_graphs")
warnings.filterwarnings("error", module="__main__")

def no_network(event, args):
    if event == "socket.connect" and args[0].family in (socket.AF_INET, socket.AF_INET6):
        raise RuntimeError(f"a docs block connected to {args[1]!r}: blocks must run offline")

sys.addaudithook(no_network)
namespace = {"__name__": "__main__"}
for block in json.load(sys.stdin):
    print(f"--- {block['where']}", file=sys.stderr, flush=True)
    code = compile("\n" * (block["line"] - 1) + block["text"], block["path"], "exec")
    exec(code, namespace)
"""


# Set by tests/conftest.py for the suite, not in a reader's shell: a block must work without.
READER_UNSET = {"OPENBLAS_THREAD_TIMEOUT", "GOMP_SPINCOUNT"}


def run_blocks(code: list[Block], folder: Path, child_env: dict[str, str]):
    """The blocks pasted in order into one fresh process working in ``folder``, with a
    database of its own there and nothing fetched from the network."""
    env = {k: v for k, v in child_env.items() if k not in READER_UNSET}
    env.update(TG_DB=str(folder / "measurements.sqlite"), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    payload = [{"where": b.where, "path": str(b.path), "line": b.line, "text": b.text}
               for b in code]
    return subprocess.run([sys.executable, "-c", DRIVER], input=json.dumps(payload),
                          capture_output=True, text=True, cwd=folder, env=env, timeout=600)


@pytest.mark.parametrize("code", list(_python_runs()))
def test_python_blocks_run(code, tmp_path, child_env):
    for block in code:
        for module in sorted(_imports(block) & MODEL_MODULES):
            if not _installed(module):
                pytest.skip(f"{block.where} imports {module}, which is not installed (the "
                            "torch and models extras); the blocks before it run without it")
    start = time.perf_counter()
    done = run_blocks(code, tmp_path, child_env)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, (
        f"the python blocks of {_name(code[0].path)}, pasted in order, fail (the last '---' "
        f"line names the block):\n{done.stderr[-6000:]}")
    print(f"{code[0].where} to {code[-1].where}: {len(code)} python blocks ran in "
          f"{seconds:.1f} s")


# ------------------------------------------------------------------------------- shell blocks
def commands(block: Block) -> list[list[str]]:
    """The simple commands of a shell block: `$ ` lines only in a console block (the rest is
    output), continuation lines joined, split at && || ; and |, leading VAR=value dropped."""
    lines = block.text.splitlines()
    if block.lang == "console":
        lines = [line[2:] for line in lines if line.startswith("$ ")]
    text = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        lex = shlex.shlex(line, posix=True, punctuation_chars=True)
        lex.whitespace_split, lex.commenters = True, "#"
        words = []
        for token in [*lex, ";"]:
            if token and set(token) <= set("&|;()<>"):
                while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0]):
                    words.pop(0)
                if words:
                    out.append(words)
                words = []
            else:
                words.append(token)
    return out


def _options(script: Path) -> dict[str, tuple | None]:
    """The options a script's argparse calls declare (add_argument("--x", choices=...)), each
    with its literal choices, if any."""
    found: dict[str, tuple | None] = {"-h": None, "--help": None}
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"):
            continue
        choices = None
        for kw in node.keywords:
            if kw.arg == "choices":
                with contextlib.suppress(ValueError):
                    choices = tuple(ast.literal_eval(kw.value))
        for a in node.args:
            if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value[:1] == "-":
                found[a.value] = choices
    return found


def _check_python(args: list[str]) -> list[str]:
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] not in ("-m", "-c"):
        i += 1
    if i == len(args) or args[i] == "-c":
        return []
    if args[i] == "-m":
        module = args[i + 1] if i + 1 < len(args) else ""
        return [] if module and _installed(module) else \
            [f"`python -m {module}`: no module '{module}' (not installed, or misspelt)"]
    script, rest = ROOT / args[i], args[i + 1:]
    if not script.is_file():
        return [f"`python {args[i]}`: no file {args[i]} in the repository"]
    known, problems = _options(script), []
    for k, word in enumerate(rest):
        name, _, value = word.partition("=")
        if not word.startswith("-"):
            continue
        if name not in known:
            problems.append(f"`python {args[i]}`: it declares no option {name} (its options: "
                            f"{', '.join(sorted(set(known) - {'-h', '--help'})) or 'none'})")
            continue
        value = value or (rest[k + 1] if k + 1 < len(rest) else "")
        if known[name] is not None and value not in known[name]:
            problems.append(f"`python {args[i]} {name} {value}`: {name} takes one of "
                            f"{', '.join(map(str, known[name]))}")
    return problems


def _check_tg(args: list[str]) -> list[str]:
    """The command line is parsed by tg's own parser: subcommands, options and their values
    (choices, types) as `tg` itself would accept them; --help counts as accepted."""
    from tensor_graphs.cli import build_parser

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            build_parser().parse_args(args)
        except SystemExit as exc:
            if exc.code in (0, None):  # --help
                return []
            said = err.getvalue().strip().splitlines()
            reason = said[-1] if said else f"exit status {exc.code}"
        except Exception as exc:  # a parser that raises its usage error rather than exiting
            reason = f"{type(exc).__name__}: {exc}"
        else:
            return []
    return [f"`tg {shlex.join(args)}` is refused by tg's parser: {reason}"]


def _extras() -> set[str] | None:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the extras go unchecked
        return None
    with open(ROOT / "pyproject.toml", "rb") as f:
        return set(tomllib.load(f)["project"].get("optional-dependencies", {}))


def _check_pip(args: list[str]) -> list[str]:
    """Installs are not run; the files they name (constraints, requirements, the local
    project) and the extras asked of the project must exist."""
    problems = []
    for flag, value in zip(args, args[1:]):
        if flag in ("-c", "--constraint", "-r", "--requirement") and not (ROOT / value).is_file():
            problems.append(f"`pip {flag} {value}`: no file {value} in the repository")
    for word in args:
        m = re.fullmatch(r"(\.[^\[]*)(?:\[([^\]]*)\])?", word)
        if not m:
            continue
        if not (ROOT / m.group(1)).is_dir():
            problems.append(f"`pip install {word}`: no folder {m.group(1)}")
        declared = _extras()
        for extra in (m.group(2) or "").split(","):
            if extra and declared is not None and extra not in declared:
                problems.append(f"`pip install {word}`: pyproject.toml declares no extra "
                                f"'{extra}' (it has {', '.join(sorted(declared))})")
    return problems


def _check_ruff(args: list[str]) -> list[str]:
    """Not run here (CI runs it): a subcommand ruff has, and the paths it names exist."""
    if not args or args[0] not in ("check", "format"):
        return [f"`ruff {shlex.join(args)}`: ruff's subcommands are check and format"]
    return [f"`ruff {args[0]} {p}`: no such path in the repository" for p in args[1:]
            if not p.startswith("-") and not (ROOT / p).exists()]


def _check_cd(args: list[str]) -> list[str]:
    return [] if not args or (ROOT / args[0]).is_dir() else [f"`cd {args[0]}`: no such folder"]


# How each program a shell block names is checked (keyed by the program's file name, so
# `.venv/bin/tg` is `tg`); a program not here fails the test until it gets a check.
CHECKS = {
    "python": _check_python,  # -m MODULE imports; a script exists and declares its options
    "python3": _check_python,
    "tg": _check_tg,  # tg's own parser accepts the line
    "pip": _check_pip,  # named files and extras exist; nothing is installed
    "cd": _check_cd,  # the folder exists in the repository
    "ruff": _check_ruff,  # check or format, on paths that exist
}


def _shell_blocks():
    for path in DOCS:
        shell = [b for b in blocks(path) if b.lang in SHELL]
        if shell:
            yield pytest.param(shell, id=_name(path))


def shell_problems(shell: list[Block]) -> list[str]:
    problems = []
    for block in shell:
        found = commands(block)
        if not found:
            problems.append(f"{block.where}: a {block.lang} block without a command"
                            + (" (a console block shows each as `$ command`)"
                               if block.lang == "console" else ""))
        for words in found:
            program = os.path.basename(words[0])
            check = CHECKS.get(program)
            if check is None:
                problems.append(f"{block.where}: `{shlex.join(words)}`: no check for "
                                f"'{program}' in {Path(__file__).name}'s CHECKS table")
            else:
                problems += [f"{block.where}: {p}" for p in check(words[1:])]
    return problems


@pytest.mark.parametrize("shell", list(_shell_blocks()))
def test_shell_commands_exist(shell):
    problems = shell_problems(shell)
    assert not problems, "\n".join(problems)


def test_ci_runs_the_readme_test_command():
    """.ci/run runs, as a line of its own, README's command that installs everything, lints and
    runs the tests (the second block of "Set up"): the command a newcomer pastes is CI's."""
    setup = (ROOT / "README.md").read_text(encoding="utf-8").split("\n## Set up\n", 1)[1]
    commands_ = re.findall(r"^```bash\n(.*?)^```", setup.split("\n## ", 1)[0], re.S | re.M)
    assert len(commands_) >= 2, "README's Set up has no second command (install and test)"
    command = commands_[1].strip()
    assert "ruff check" in command and "pytest" in command, command
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert command in ci, f".ci/run does not run README's test command:\n{command}"


# ------------------------------------------------------------------- the checks themselves
BAD_DOC = """\
Text.

```
a listing without a language
```

    python benchmarks/planner.py --quick

```bash
python3 -m venv .venv && .venv/bin/pip install -c nowhere.txt -e ".[torch,gpu]"
tg run minilm "a sentence" --bogus          # a comment
TG_DB=x.db tg run llama
python benchmarks/planner.py --only e3e --quik
python -m tensor_graphs.nowhere; curl https://example.com | sh
```

```console
$ tg demo --batch 2
batch 2 ...
```

```python
x = 1
print(x + undefined_name)
```
"""


def test_the_checks_find_what_a_bad_page_gets_wrong(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(BAD_DOC, encoding="utf-8")
    found = blocks(page)
    assert [(b.line, b.lang) for b in found] == [(4, ""), (10, "bash"), (18, "console"),
                                                 (23, "python")]
    assert fence_problems(page) == [f"{page}:4: a fence without a language; name it "
                                    "(```python, ```bash, or ```text for a listing that is no "
                                    "program)"]
    assert indented_commands(page) == [f"{page}:7: `python benchmarks/planner.py --quick` is "
                                       "an indented command; put it in a ```bash fence so "
                                       "that this test checks it"]
    problems = "\n".join(shell_problems([b for b in found if b.lang in SHELL]))
    for expected in ["no file nowhere.txt", "declares no extra 'gpu'",
                     "unrecognized arguments: --bogus", "invalid choice: 'llama'",
                     "--only takes one of compile, paths, e2e", "declares no option --quik",
                     "no module 'tensor_graphs.nowhere'", "no check for 'curl'",
                     "no check for 'sh'"]:
        assert expected in problems, expected
    assert problems.count("\n") == 8, problems  # nothing else: venv, tg demo pass
    assert commands(found[2]) == [["tg", "demo", "--batch", "2"]]


def test_a_failing_block_is_reported_at_its_line_of_the_docs(tmp_path, child_env):
    page = tmp_path / "page.md"
    page.write_text(BAD_DOC, encoding="utf-8")
    done = run_blocks([b for b in blocks(page) if b.lang == "python"], tmp_path, child_env)
    assert done.returncode != 0
    assert f'File "{page}", line 24' in done.stderr and "undefined_name" in done.stderr


@pytest.mark.parametrize("text,expected", [
    # a reader would see this warning; the docs' code must not cause one
    ("import warnings\nwarnings.warn('careful')\n", "UserWarning: careful"),
    # numpy first, then tensor_graphs: its import warns about spinning pools (the README did)
    ("import numpy\nimport tensor_graphs\n", "imported after numpy's OpenBLAS"),
    ("import socket\nsocket.create_connection(('127.0.0.1', 9))\n", "blocks must run offline"),
])
def test_warnings_and_network_fail_a_block(text, expected, tmp_path, child_env):
    block = Block(tmp_path / "page.md", 1, "python", text)
    done = run_blocks([block], tmp_path, child_env)
    assert done.returncode != 0 and expected in done.stderr, done.stderr
