"""Ask a program for a kernel: the request on its standard input, a Python file from its output.

``tg kernels generate --command CMD`` hands each region's request to CMD (a local language-model
CLI, a script, anything) and reads a kernel file back. CMD is run without a shell
(``shlex.split``), in a session of its own so that a timeout kills it and whatever it started,
with the request on a pipe (never the user's terminal: a program waiting for input would hang
the loop) and its standard error captured for the report. Whatever comes back is judged here
before any of it runs: a timeout, a non-zero exit, an answer with no Python in it or no
``@tg.kernel`` each become a verdict, never an exception that stops the loop.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass

from tensor_graphs.errors import ArgumentError

MAX_ANSWER = 1 << 22  # bytes of standard output read as an answer; more is not a kernel file
STDERR_TAIL = 2000  # characters of the program's standard error kept for the report

# ```python ... ``` (or ```py / ```python3): the first such block is the answer when there is one
_FENCED = re.compile(r"^[ \t]*```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)^[ \t]*```", re.M | re.S)
_BARE_FENCE = re.compile(r"^[ \t]*```[ \t]*\r?\n(.*?)^[ \t]*```", re.M | re.S)
_KERNEL = re.compile(r"\bkernel\s*\(")  # @tg.kernel(...) or a kernel(...) imported by name


@dataclass
class Answer:
    """What the program said: ``source`` when it is a candidate kernel file, else ``verdict``
    (crashed / timed out / garbage) and ``detail`` say why not."""

    source: str | None
    verdict: str = ""
    detail: str = ""
    stderr: str = ""
    seconds: float = 0.0


def command_argv(command: str) -> list[str]:
    """``command`` split as a shell would split words (no shell runs it), its program found:
    an ArgumentError naming the fix when it is empty, badly quoted or not a program here."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ArgumentError(f"--command {command!r}: cannot split it into words ({exc}); "
                            "quote it as a shell would") from None
    if not argv:
        raise ArgumentError("--command is empty: give the program that answers a request on "
                            "its standard input, e.g. --command 'llm -m mymodel'")
    program = argv[0]
    if os.sep in program or (os.altsep and os.altsep in program):
        if not (os.path.isfile(program) and os.access(program, os.X_OK)):
            raise ArgumentError(f"--command: {program!r} is not an executable file; give the "
                                "path of a program (chmod +x it), or a name on PATH")
        return argv
    found = shutil.which(program)
    if found is None:
        raise ArgumentError(f"--command: no program {program!r} on PATH; install it, or give "
                            "its full path")
    return argv


def ask(argv: list[str], request: str, timeout: float) -> Answer:
    """Run ``argv`` with ``request`` on its standard input for at most ``timeout`` seconds and
    judge its standard output (see the module doc)."""
    start = time.perf_counter()
    try:
        rc, out, err, timed_out = run_captured(argv, request.encode(), timeout)
    except OSError as exc:
        return Answer(None, "crashed", f"could not start it: {exc.strerror or exc}",
                      seconds=time.perf_counter() - start)
    seconds = time.perf_counter() - start
    tail = err.decode("utf-8", "replace")[-STDERR_TAIL:]
    if timed_out:
        return Answer(None, "timed out", f"no answer within {timeout:g} s", tail, seconds)
    if rc != 0:
        how = f"killed by signal {-rc}" if rc < 0 else f"exit status {rc}"
        last = next((line for line in reversed(tail.splitlines()) if line.strip()), "")
        return Answer(None, "crashed", how + (f": {last.strip()[:200]}" if last else ""), tail,
                      seconds)
    if len(out) > MAX_ANSWER:
        return Answer(None, "garbage", f"an answer of {len(out)} bytes (more than "
                      f"{MAX_ANSWER} is not a kernel file)", tail, seconds)
    source, why = extract_source(out.decode("utf-8", "replace"))
    if source is None:
        return Answer(None, "garbage", why, tail, seconds)
    return Answer(source, stderr=tail, seconds=seconds)


def run_captured(argv: list[str], data: bytes | None, timeout: float,
                 env: dict[str, str] | None = None) -> tuple[int, bytes, bytes, bool]:
    """(exit status, stdout, stderr, timed out) of ``argv`` fed ``data`` (None: no input at
    all), in ``env`` (None: ours). It runs in a new session; on timeout the whole session is
    killed, so a grandchild holding the pipes cannot keep the call waiting."""
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE if data is not None else
                            subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, env=env)
    try:
        out, err = proc.communicate(data, timeout=timeout)
        return proc.returncode, out, err, False
    except subprocess.TimeoutExpired:
        _kill_session(proc)
        out, err = proc.communicate()
        return proc.returncode, out, err, True
    except BaseException:  # Ctrl-C: leave nothing of ours running
        _kill_session(proc)
        proc.communicate()
        raise


def _kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # the session we started: its leader's id
    except (ProcessLookupError, PermissionError):
        proc.kill()


def extract_source(text: str) -> tuple[str | None, str]:
    """(the kernel file's source, "") from a program's output — its first ```python block, else
    all of it, else its first bare ``` block — or (None, why it is not one)."""
    if not text.strip():
        return None, "an empty answer"
    tried = []
    fenced = _FENCED.search(text)
    if fenced:
        tried.append(fenced.group(1))
    else:
        tried.append(text)
        bare = _BARE_FENCE.search(text)
        if bare:
            tried.append(bare.group(1))
    why = ""
    for source in tried:
        try:
            compile(source, "<answer>", "exec", dont_inherit=True)
        except (SyntaxError, ValueError) as exc:
            line = getattr(exc, "lineno", None)
            why = (f"not Python ({type(exc).__name__}: {getattr(exc, 'msg', exc)}"
                   + (f", line {line})" if line else ")"))
            continue
        if not _KERNEL.search(source):
            why = "Python, but no @tg.kernel in it"
            continue
        return source, ""
    return None, why


__all__ = ["Answer", "MAX_ANSWER", "ask", "command_argv", "extract_source", "run_captured"]
