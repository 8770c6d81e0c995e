"""Progress bars (tensor_graphs.progress): tqdm on a terminal, nothing on a pipe."""

import io
import os
import subprocess
import sys

import pytest

from tensor_graphs.progress import Progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def run(stream, force=False, n=3):
    bar = Progress(n, "profiling", stream=stream, force=force)
    for i in range(n):
        bar.step(f"kernel_{i}")
    bar.close()
    return bar


def test_nothing_on_a_pipe():
    stream = io.StringIO()  # not a terminal
    bar = run(stream)
    assert not bar.enabled and bar.done == 3
    assert stream.getvalue() == ""


def test_bar_on_a_terminal_is_tqdm():
    stream = Terminal()
    bar = run(stream)
    out = stream.getvalue()
    assert bar.enabled
    assert "profiling: 100%|" in out and "3/3" in out  # tqdm's layout
    assert "kernel_2" in out  # the last step's note
    assert out.endswith("\n")  # left on its own line when closed


def test_forced_bar_and_context_manager():
    stream = io.StringIO()
    with Progress(2, "measuring kernels", stream=stream, force=True) as bar:
        bar.step()
        bar.step()
    assert "measuring kernels: 100%|" in stream.getvalue() and "2/2" in stream.getvalue()


def test_default_stream_is_stderr_and_a_pipe_stays_clean():
    """A real pipe: stdout holds the data only, and stderr has no bar either."""
    code = ("from tensor_graphs.progress import Progress\n"
            "b = Progress(5, 'x')\n"
            "[b.step('n') for _ in range(5)]\n"
            "b.close()\nprint('data')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout == "data\n"
    assert "100%" not in out.stderr and "|" not in out.stderr


@pytest.mark.skipif(sys.platform == "win32", reason="needs a pseudo-terminal")
@pytest.mark.parametrize("columns", [100, 0])  # 0: a terminal that reports no width
def test_a_real_terminal_on_stderr_gets_the_bar(columns):
    """stderr a pseudo-terminal: the default stream draws tqdm's bar there, stdout stays data."""
    import fcntl
    import struct
    import termios

    code = ("from tensor_graphs.progress import Progress\n"
            "b = Progress(4, 'profiling')\n"
            "[b.step('k') for _ in range(4)]\n"
            "b.close()\nprint('data')\n")
    leader, follower = os.openpty()
    if columns:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, columns, 0, 0))
    try:
        proc = subprocess.run([sys.executable, "-c", code], stdout=subprocess.PIPE,
                              stderr=follower, text=True, check=True, timeout=120,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
        os.close(follower)
        follower = None
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
        if follower is not None:
            os.close(follower)
    assert proc.stdout == "data\n"
    assert b"profiling: 100%|" in drawn and b"4/4" in drawn


def test_a_delayed_bar_draws_nothing_for_short_work():
    stream = Terminal()
    with Progress(3, "planning", stream=stream, delay=60.0) as bar:
        for _ in range(3):
            bar.step()
    assert bar.enabled and stream.getvalue() == ""


def test_planning_draws_a_bar_over_the_graphs_nodes(monkeypatch):
    """tg.compile's search (a graph's top-level nodes solved, an unrolled recurrence's layers
    taking tens of seconds) draws "planning" on a terminal once PROGRESS_DELAY has passed."""
    import tensor_graphs as tg
    from tensor_graphs.planner import search

    monkeypatch.setattr(search, "PROGRESS_DELAY", 0.0)
    stream = Terminal()
    monkeypatch.setattr(sys, "stderr", stream)
    x = tg.input("x", (4, 8))
    tg.compile(tg.relu(x @ tg.weight("w", (8, 8))) + 1.0, db=":memory:")
    out = stream.getvalue()
    assert "planning: 100%|" in out and "6/6" in out, out
