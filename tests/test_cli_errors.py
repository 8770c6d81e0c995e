"""Every ``tg`` command refuses a bad argument or file with one line on stderr and a non-zero
exit, never a traceback: `tg` runs here as a subprocess, as a user runs it, on real files (a
directory, an empty file, binary garbage, 100,000 nested brackets, a FIFO)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import tensor_graphs as tg
from tensor_graphs.cli import build_parser, main

# (arguments, a text the one line must contain, exit status); {name} is a file of `files`.
# 2 is a bad argument (the parser's, or one only the command can spot), 1 a file or database
# the command refuses. Run as `tg` subprocesses: one case per kind of failure.
CASES = [
    # the cases: a directory, a deeply nested file, a negative batch, a negative budget
    (["profile", "{dir}"], "'{dir}' is a directory", 2),
    (["explain", "{deep}"], "deep.json", 1),
    (["demo", "--batch", "-1"], "argument --batch: expected a whole number of 1 or more", 2),
    (["profile", "block", "--budget", "-5"], "argument --budget: expected a number of 0", 2),
    # a sub-subcommand names itself; a FIFO is refused before anything reads it (and waits)
    (["run", "gpt2", "--layers", "0"], "argument --layers", 2),
    (["explain", "{fifo}"], "is a FIFO (named pipe), not a regular file", 2),
    # refused by the command: a file, a dim, a device, a database, a file of rows
    (["explain", "{garbage}"], "garbage.bin is not a tensor_graphs graph file", 1),
    (["paths", "block", "--dim", "nosuch=4"], "the graph has no dim 'nosuch'", 2),
    (["explain", "block", "--device", "tpu"], "unknown device 'tpu'", 2),
    (["db", "stats", "--db", "{garbage}"], "garbage.bin is not a tensor_graphs measurement", 1),
    (["db", "import", "{deep}"], "line 1 is not a tensor_graphs measurement", 1),
]

# The same checks on every other option, through tg's main in this process (what the parser
# refuses exits before any command runs, so a subprocess would test nothing more).
MORE_CASES = [
    (["demo", "--seq", "0"], "argument --seq", 2),
    (["demo", "--show", "many"], "argument --show", 2),
    (["paths", "block", "--limit", "-1"], "argument --limit", 2),
    (["explain", "block", "--limit", "-2"], "argument --limit", 2),
    (["explain", "block", "--tolerance", "nan"], "argument --tolerance", 2),
    (["profile", "block", "--paths", "-1"], "argument --paths", 2),
    (["profile", "block", "--tolerance", "0"], "argument --tolerance", 2),
    (["explain", "{missing}"], "neither a graph file", 2),
    (["paths", "{empty}"], "empty.json is not a tensor_graphs graph file", 1),
    (["explain", "{graph}"], "--dim n=...", 2),
    (["explain", "block", "--dim", "batch=0"], "argument --dim: expected NAME=VALUE", 2),
    (["explain", "block", "--dim", "seq"], "argument --dim", 2),
    (["explain", "block", "--dim", f"seq={2 ** 64}"], "argument --dim", 2),
    (["frobnicate"], "invalid choice: 'frobnicate'", 2),
    (["run", "gpt3"], "invalid choice: 'gpt3'", 2),
    (["run", "gpt2", "--tokens", "0"], "argument --tokens", 2),
    (["run", "gpt2", "--prompt", "-8"], "argument --prompt", 2),
    (["run", "gpt2", "--repeats", "x"], "argument --repeats", 2),
    (["run", "minilm", "a", "--repeats", "0"], "argument --repeats", 2),
    (["run", "minilm", "a", "--check-tolerance", "-1"], "argument --check-tolerance", 2),
    (["kernels", "list", "--op", "tahn"], "did you mean tan or tanh", 2),
    (["kernels", "list", "--backend", "fortran"], "no backend 'fortran'", 2),
    (["kernels", "verify", "numpy_tanh", "--seed", "-1"], "argument --seed", 2),
    (["kernels", "verify", "no_such_kernel"], "no kernel named or matching", 2),
    (["kernels", "verify", "--file", "{dir}"], "is a directory", 2),
    (["kernels", "verify", "--file", "{missing}"], "no such file", 2),
    (["kernels", "verify", "--backend", "fortran"], "no backend 'fortran'", 2),
    (["kernels", "prompt", "softmax", "--backend", "fortran"], "no backend 'fortran'", 2),
    (["kernels", "prompt", "x" + "+x" * 5000], "nested too deeply", 2),
    # a file where a folder goes: refused by the parser, naming the option (was "FILE: File
    # exists" from making the folder)
    (["kernels", "generate", "block", "--command", "true", "--out", "{garbage}"],
     "argument --out: '{garbage}' exists and is not a folder", 2),
    (["db", "show", "--limit", "-1"], "argument --limit", 2),
    (["db", "prune", "--older-than", "-3"], "argument --older-than", 2),
    (["db", "prune", "--older-than", "nan"], "argument --older-than", 2),
    (["db", "prune"], "say what to prune", 2),
    (["db", "import", "{missing}"], "no such file", 2),
    (["db", "import", "{dir}"], "is a directory", 2),
    (["db", "import", "{garbage}"], "line 1 is not a tensor_graphs measurement", 1),
    (["db", "export", "{dir}"], "is a directory", 2),
    (["db", "export", "{missing}/rows.jsonl"], "no folder", 2),
    # a FIFO (or a device: /dev/full as root) was renamed over by the file, not written into
    (["db", "export", "{fifo}"], "'{fifo}' is a FIFO (named pipe), not a regular file", 2),
    (["explain", "block", "--html", "{fifo}"], "argument --html: '{fifo}' is a FIFO", 2),
    (["db", "stats", "--db", "{dir}"], "is a directory", 1),
    # checked before training, not after (it was a write error naming a temporary file)
    (["quality", "train-char", "--quantize", "int8-weight", "--steps", "1", "--db", ":memory:",
      "--save", "{missing}/w.safetensors"], "argument --save: cannot write", 2),
    (["quality", "train-char", "--quantize", "int8-weight", "--steps", "1", "--db", ":memory:",
      "--save", "{dir}"], "argument --save: '{dir}' is a directory", 2),
    (["quality", "train-char", "--quantize", "int8-weight", "--steps", "1", "--db", ":memory:",
      "--save", "-"], "argument --save: '-' is standard output", 2),
    # --weights loads trained weights: --save had nothing trained to write and was ignored
    (["quality", "train-char", "--quantize", "int8-weight", "--weights", "{graph}", "--save",
      "{dir}/w.safetensors"], "argument --save: not allowed with --weights", 2),
    (["quality", "train-char", "--quantize", "int8-weight", "--save", "{dir}/w.safetensors",
      "--weights", "{graph}"], "nothing is trained here to save", 2),
    # an option the chosen model or scheme never reads: refused, where it was ignored
    (["quality", "--quantize", "int8-weight", "gpt2", "--weights", "{graph}"],
     "argument --weights: applies to train-char only, and would be ignored with gpt2", 2),
    (["quality", "--quantize", "int8-weight", "gpt2", "--steps", "3"],
     "argument --steps: applies to train-char only", 2),
    (["quality", "train-char", "--quantize", "int8-weight", "--layers", "2"],
     "argument --layers: applies to gpt2 only, and would be ignored with train-char", 2),
    (["quality", "--quantize", "int8-weight", "gpt2", "--group", "64"],
     "argument --group: applies to int4-weight and int8-dynamic only, and would be ignored "
     "with int8-weight", 2),
    # weights that are no safetensors file: named, not an internal SafetensorError
    (["quality", "train-char", "--quantize", "int8-weight", "--weights", "{garbage}", "--quiet"],
     "garbage.bin is not a safetensors file", 1),
]
_COMMANDS = {"profile", "paths", "explain", "demo", "run", "gpt2", "minilm", "kernels", "list",
             "verify", "prompt", "generate", "db", "stats", "show", "import", "export", "prune",
             "quality"}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("cli")
    paths = {name: folder / name for name in ("dir", "missing.json", "empty.json", "garbage.bin",
                                              "deep.json", "fifo", "g.json")}
    paths["dir"].mkdir()
    paths["empty.json"].write_bytes(b"")
    paths["garbage.bin"].write_bytes(bytes(range(256)) * 8)
    paths["deep.json"].write_text("[" * 100_000)
    os.mkfifo(paths["fifo"])
    x = tg.input("x", ("n", 16))
    tg.save(tg.tanh(x @ tg.weight("w", (16, 8))), paths["g.json"])
    named = {name.split(".")[0]: str(path) for name, path in paths.items()}
    return named | {"graph": named["g"]}


def tg_command(args: list[str], env: dict[str, str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tensor_graphs.cli", *args], env=env,
                          capture_output=True, text=True, timeout=120, **kwargs)


@pytest.fixture
def env(child_env, tmp_path) -> dict[str, str]:
    return dict(child_env, TG_DB=str(tmp_path / "m.sqlite"), TG_DEBUG="")


def _check(args: list[str], status: int, err: str, says: str, expected: int) -> None:
    """One line on stderr, starting with the (sub)command and naming the problem."""
    assert "Traceback" not in err and "internal error" not in err, err
    assert status == expected, err
    assert len(err.splitlines()) == 1 and len(err) < 400, err
    prog = " ".join(["tg", *(a for a in args[:2] if a in _COMMANDS)])
    assert err.startswith(f"{prog}: error: ") and says in err, err


@pytest.fixture(scope="module")
def runs(files, tmp_path_factory) -> dict[str, subprocess.CompletedProcess]:
    """Every CASES command run as `tg`, several at a time (each spends its ~0.4 s starting
    Python and importing tensor_graphs), keyed by the case's id; conftest's child_env, once."""
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p), TG_DEBUG="",
               TG_DB=str(tmp_path_factory.mktemp("cli-db") / "m.sqlite"))
    with ThreadPoolExecutor(max_workers=min(4, os.cpu_count() or 1)) as pool:
        done = pool.map(lambda args: tg_command([a.format(**files) for a in args], env),
                        [args for args, _, _ in CASES])
        return dict(zip(_IDS, done))


_IDS = [" ".join(c[0]) for c in CASES]


@pytest.mark.parametrize("args, says, status", CASES, ids=_IDS)
def test_bad_input_is_one_line_and_a_non_zero_exit(args, says, status, files, runs):
    done = runs[" ".join(args)]
    _check([a.format(**files) for a in args], done.returncode, done.stderr,
           says.format(**files), status)


@pytest.mark.parametrize("args, says, status", MORE_CASES,
                         ids=[" ".join(c[0])[:60] for c in MORE_CASES])
def test_every_option_refuses_bad_values(args, says, status, files, tmp_path, monkeypatch,
                                         capsys):
    monkeypatch.setenv("TG_DB", str(tmp_path / "m.sqlite"))
    monkeypatch.delenv("TG_DEBUG", raising=False)
    monkeypatch.chdir(tmp_path)  # a relative path a command writes by mistake lands here
    args = [a.format(**files) for a in args]
    try:
        code = main(args)
    except SystemExit as stop:  # the parser's refusal, as argparse exits
        code = stop.code
    _check(args, code, capsys.readouterr().err, says.format(**files), status)


def test_traceback_on_request(files, env):
    """TG_DEBUG=1 (or --traceback) shows the traceback of an error for a bug report."""
    done = tg_command(["explain", "block", "--dim", "nosuch=4"], dict(env, TG_DEBUG="1"))
    assert done.returncode != 0 and "Traceback" in done.stderr
    done = tg_command(["--traceback", "explain", "{graph}".format(**files)], env)
    assert done.returncode != 0 and "Traceback" in done.stderr and "--dim n=..." in done.stderr


def _sigint_default():
    """A child that Ctrl-C reaches: started from a background job (CI's, `cmd &`), pytest may
    itself ignore SIGINT, and a child inherits that (as `nohup tg ... &` should)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_status_130(env):
    """Interrupting a command prints "interrupted", not the traceback of where it was."""
    proc = subprocess.Popen([sys.executable, "-m", "tensor_graphs.cli", "demo", "--batch", "64",
                             "--seq", "512", "--show", "0"],
                            env=dict(env, PYTHONUNBUFFERED="1"), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_default)
    proc.stdout.readline()  # the demo has started: it evaluates for seconds now
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err == "tg demo: error: interrupted\n", err


def test_closed_stdout_is_not_an_error_worth_a_line(env):
    """`tg kernels list --op tanh | head -1`: the reader left before tg's buffered output was
    flushed; nothing is printed about it (not "Exception ignored ... BrokenPipeError")."""
    env = {k: v for k, v in env.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen([sys.executable, "-m", "tensor_graphs.cli", "kernels", "list",
                             "--op", "tanh"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # before tg writes anything
    err = proc.stderr.read()
    assert proc.wait(timeout=60) != 0 and err == "", err


def _commands(parser, path=()):
    """Every (sub)command's parser, with the words that reach it."""
    for action in parser._actions:
        if action.choices and hasattr(action, "_name_parser_map"):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def test_every_command_and_option_says_what_it_does():
    commands = dict(_commands(build_parser()))
    assert {("profile",), ("db", "import"), ("kernels", "verify"), ("run", "gpt2")} <= set(
        commands)
    for words, parser in commands.items():
        assert parser.description and len(parser.description) > 40, words
        for action in parser._actions:
            if not hasattr(action, "_name_parser_map"):  # subcommands: described above
                assert action.help, (words, action.dest)


def test_the_types_refuse_what_no_option_means(tmp_path):
    """The argparse types themselves, for what the table above does not reach."""
    import argparse

    from tensor_graphs import cli_args

    for convert, bad in ((cli_args.positive_int, ["0", "-1", "1.5", "", "1e3"]),
                         (cli_args.count, ["-1", "x"]),
                         (cli_args.positive_float, ["0", "-1e-9", "inf", "nan", "1e999"]),
                         (cli_args.non_negative_float, ["-0.5", "nan", "-inf"]),
                         (cli_args.dim_binding, ["seq", "seq=", "=3", "seq=-1", "1x=3", "s=1.0"]),
                         (cli_args.existing_file, [str(tmp_path), str(tmp_path / "none")]),
                         (cli_args.output_file, [str(tmp_path), str(tmp_path / "no" / "f")]),
                         (cli_args.new_file, ["-", str(tmp_path), str(tmp_path / "no" / "f")])):
        for text in bad:
            with pytest.raises(argparse.ArgumentTypeError):
                convert(text)
    assert cli_args.dim_binding("seq=128") == ("seq", 128)
    assert cli_args.count("0") == 0 and cli_args.non_negative_float("0") == 0.0
    assert cli_args.input_file("-") == "-" and cli_args.output_file("-") == "-"
    assert cli_args.output_file(str(tmp_path / "new.jsonl")) == str(tmp_path / "new.jsonl")
    assert Path(cli_args.existing_file(__file__)) == Path(__file__)


def test_ctrl_c_swallowed_by_a_library_is_still_reported(monkeypatch, capsys):
    """numpy's lazy import of numpy.random lost a KeyboardInterrupt landing inside it, and
    `tg demo` went on to exit 0; main remembers the signal and reports it anyway."""
    from tensor_graphs import cli

    def swallowing_command(args):
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt:
            pass  # what the library did
        return 0

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
    parser = cli.build_parser()
    monkeypatch.setattr(cli, "build_parser", lambda: parser)
    demo = parser._subparsers._group_actions[0].choices["demo"]
    demo.set_defaults(run=swallowing_command)
    try:
        assert cli.main(["demo"]) == 130
        assert capsys.readouterr().err == "tg demo: error: interrupted\n"
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def _db_commands():
    return [words for words, parser in _commands(build_parser())
            if any("--db" in a.option_strings for a in parser._actions)]


@pytest.mark.parametrize("words", _db_commands(), ids=" ".join)
def test_db_in_a_missing_folder_is_refused_as_the_other_paths_are(words, tmp_path, capsys,
                                                                  monkeypatch):
    """--db made every missing folder of its path (a typo became a new tree of folders and an
    empty database), where --html, --save and the other paths refuse a missing folder."""
    monkeypatch.delenv("TG_DEBUG", raising=False)
    missing = tmp_path / "no" / "such"
    args = [*words, "--db", str(missing / "m.sqlite")]
    try:
        code = main(args)
    except SystemExit as stop:  # refused by the parser, before the command runs
        code = stop.code
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"tg {' '.join(words)}: error: argument --db: "), err
    assert f"no folder '{missing}'" in err and "mkdir -p" in err, err
    assert not (tmp_path / "no").exists()


def test_db_takes_what_the_database_opens(tmp_path, monkeypatch):
    """An existing folder, ':memory:', a PostgreSQL URL, '~', and the default cache file
    (whose folder tg makes private when it opens it, as the Python API does) pass as given."""
    import argparse

    from tensor_graphs import cli_args

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HOME", str(tmp_path))
    default = str(tmp_path / "cache" / "tensor_graphs" / "measurements.sqlite")
    for text in (str(tmp_path / "m.sqlite"), ":memory:", "postgresql://db.example/tg",
                 "~/m.sqlite", default, "m.sqlite"):
        assert cli_args.database(text) == text
    with pytest.raises(argparse.ArgumentTypeError, match="no folder"):
        cli_args.database("~/none/m.sqlite")


def test_the_one_line_keeps_the_notes_that_name_the_failing_node(tmp_path, capsys,
                                                                 monkeypatch):
    """An importer notes which node failed ("while importing Reshape node ..."); the line
    printed only the message, which names an op of ours, not the user's node."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq", 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    shape = helper.make_tensor("shape", TensorProto.INT64, [2], [2, 14])
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Reshape", ["r", "shape"], ["y"], name="/mha/Reshape_4")]
    path = tmp_path / "baked.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", [x], [y], [shape]),
                                opset_imports=[helper.make_opsetid("", 17)]), path)
    monkeypatch.setenv("TG_DB", str(tmp_path / "m.sqlite"))
    monkeypatch.delenv("TG_DEBUG", raising=False)
    assert main(["explain", str(path)]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1, err
    assert "cannot reshape" in err and "Reshape node '/mha/Reshape_4'" in err, err


def test_train_char_checks_the_window_fits_before_training(tmp_path, capsys, monkeypatch):
    """--seq 32 with a 16 + 32 token window was refused after the whole training (minutes
    at the default 600 steps)."""
    from tensor_graphs.jobs import train_char

    monkeypatch.setattr(train_char, "trained_weights",
                        lambda *a, **k: pytest.fail("trained before the check"))
    monkeypatch.setenv("TG_DB", str(tmp_path / "m.sqlite"))
    code = main(["quality", "train-char", "--quantize", "int8-weight", "--seq", "32",
                 "--prompt", "16", "--tokens", "32"])
    assert code == 2
    assert "must fit the model's 32 positions" in capsys.readouterr().err
