"""Every test process gets its own measurement database file, never the user's cache."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

# as tensor_graphs.threads sets them, before any test module loads numpy or torch
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
os.environ.setdefault("GOMP_SPINCOUNT", "10000")

os.environ.setdefault("TG_DB", os.path.join(tempfile.mkdtemp(prefix="tg-tests-"),
                                            "measurements.sqlite"))

# Hypothesis profiles. "ci" (the default; .ci/run names it) draws the same examples on every
# run, seeded from each test's name, and keeps no example database: a failure reproduces on any
# machine and a pass means the same each time. HYPOTHESIS_PROFILE=explore draws fresh examples
# on each run, to hunt for new failures. Tests set their own max_examples.
settings.register_profile("ci", derandomize=True, deadline=None, database=None)
settings.register_profile("explore", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment of a child Python process: this checkout first on its path, and the
    PYTHONPATH the suite runs with kept after it (packages installed beside the checkout)."""
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


@pytest.fixture
def simulate_gpu(monkeypatch):
    """``simulate(value)`` sets ``TG_SIMULATED_CUDA`` (None: unset) and has tensor_graphs read
    it again (``devices`` reads it once per process); the process's own reading and memoized
    torch devices come back after the test."""
    from tensor_graphs import devices

    monkeypatch.setattr(devices, "_simulated", devices._simulated)
    monkeypatch.setattr(devices, "_torch_devices", dict(devices._torch_devices))

    def simulate(value: str | None) -> None:
        if value is None:
            monkeypatch.delenv("TG_SIMULATED_CUDA", raising=False)
        else:
            monkeypatch.setenv("TG_SIMULATED_CUDA", value)
        devices.reread_environment()

    return simulate


@pytest.fixture
def hub_offline(monkeypatch):
    """The Hugging Face hub offline for one test (weights come from packages' directories,
    never the network): the variable, and huggingface_hub's copy of it read at import."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    constants = pytest.importorskip("huggingface_hub.constants")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
