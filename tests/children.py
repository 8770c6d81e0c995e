"""The folders that run in a child pytest of their own: the simulated GPU must be set before
tensor_graphs (and triton) is imported, so they cannot run in the main process.

Why in the background: a child run is single-threaded Python (Triton's interpreter) while its
door test in the main run waits, idle, for it: 6 of the suite's 30 minutes on CI's 2 cores
with one of them unused. So the children start when the main run's collection ends
(``tests/conftest.py``), at a lower priority than the main run (its timed tests keep their
core), and each door test (marked ``@pytest.mark.child(name)``) waits for its own. Not a test
module (pytest collects ``test_*.py`` only)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NICE = 10  # the children's priority below the main run's (CFS: about a tenth of a core)
TIMEOUT = 900  # seconds a door test waits for its child, from when it starts waiting

# name -> (folder, pytest options, whether it gets a compile cache of its own)
CHILDREN = {
    # tests/gpu on the simulated GPU (test_gpu_simulated.py)
    "gpu": ("tests/gpu", ("-W", "ignore::RuntimeWarning"), False),
    # the generated Triton kernels in the interpreter (kernels/test_triton_simulated.py)
    "triton": ("tests/kernels/triton", ("-W", "ignore::RuntimeWarning"), True),
    # every template x config verified in the interpreter (test_templates_child.py)
    "templates": ("tests/kernels/triton_templates", ("-x",), False),
}

# the child's own: lower its priority, then run pytest as ``python -m pytest`` does
_MAIN = "import os, sys, pytest; os.nice(int(sys.argv[1])); sys.exit(pytest.main(sys.argv[2:]))"


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str

    @property
    def tail(self) -> str:
        return (self.stdout + self.stderr)[-6000:]

    def assert_all_passed(self) -> None:
        """Exit 0, and a summary of passes only: a child that skips its tests (a missing
        dependency) would leave the GPU path untested while the door test passed."""
        assert self.returncode == 0, self.tail
        summary = self.stdout.strip().splitlines()[-1]
        assert " passed" in summary and "skipped" not in summary \
            and "failed" not in summary, self.tail


class _Child:
    def __init__(self, name: str, env: dict[str, str]):
        folder, options, own_cache = CHILDREN[name]
        self.dir = Path(tempfile.mkdtemp(prefix=f"tg-child-{name}-"))
        env = dict(env, TG_SIMULATED_CUDA="1", TG_DB=str(self.dir / "measurements.sqlite"),
                   OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
        if own_cache:
            env["TG_CACHE_DIR"] = str(self.dir / "cache")
        env.pop("TRITON_INTERPRET", None)  # the simulated GPU sets it before triton's import
        self.out = open(self.dir / "stdout", "w+")  # noqa: SIM115 - read after the wait
        self.err = open(self.dir / "stderr", "w+")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _MAIN, str(NICE), "-q", "-p", "no:cacheprovider",
             *options, str(ROOT / folder)],
            cwd=ROOT, env=env, stdout=self.out, stderr=self.err, text=True)

    def finish(self) -> Finished:
        try:
            self.proc.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        texts = []
        for f in (self.out, self.err):
            f.seek(0)
            texts.append(f.read())
            f.close()
        return Finished(self.proc.returncode, *texts)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_running: dict[str, _Child] = {}


def start(name: str, env: dict[str, str]) -> None:
    """Start ``name``'s child run unless it runs already (``env``: ``child_env``'s)."""
    if name not in _running:
        _running[name] = _Child(name, env)


def finish(name: str, env: dict[str, str]) -> Finished:
    """Wait for ``name``'s child run (started now if it was not) and return what it did."""
    start(name, env)
    return _running.pop(name).finish()


def stop_all() -> None:
    """Kill the children no door test waited for (the run stopped early: -x, Ctrl-C)."""
    while _running:
        _running.popitem()[1].stop()
