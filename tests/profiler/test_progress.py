"""Progress bars (tensor_graphs.profiler.progress): tqdm on a terminal, nothing on a pipe."""

import io
import os
import subprocess
import sys

from tensor_graphs.profiler.progress import Progress


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
    code = ("from tensor_graphs.profiler.progress import Progress\n"
            "b = Progress(5, 'x')\n"
            "[b.step('n') for _ in range(5)]\n"
            "b.close()\nprint('data')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout == "data\n"
    assert "100%" not in out.stderr and "|" not in out.stderr
