"""Plan lock files are checked before they pick the code that runs: the file's trust and
schema, the kernels' source hashes, and each replayed decision against the tolerance."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, PlanFileError, UntrustedPathError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.c import build
from tensor_graphs.planner import cache, lockfile

needs_c = pytest.mark.skipif(not build.available(), reason="no usable C compiler")


def graph():
    return tg.tanh(tg.input("x", (4, 16)))


def saved(tmp_path) -> tuple[str, dict]:
    """A lock file for tanh(x) on the C backend (c_tanh, error 1e-6), and its JSON."""
    cache.clear()
    prog = tg.compile(graph(), db=":memory:", backends=("c",))
    assert "c_tanh" in prog.plan.kernels
    path = tmp_path / "plan.json"
    prog.save_plan(path)
    return str(path), json.loads(path.read_text())


def write(path, data) -> str:
    with open(path, "w") as f:
        json.dump(data, f) if not isinstance(data, str) else f.write(data)
    return str(path)


def replay(path, **kw):
    cache.clear()
    return tg.compile(graph(), db=":memory:", backends=("c",), plan=path, **kw)


@needs_c
def test_a_saved_plan_replays(tmp_path):
    path, _ = saved(tmp_path)
    prog = replay(path)
    assert prog.stats["replayed"] == 1 and prog.plan.kernels == ["c_tanh"]
    x = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    assert np.allclose(prog(x=x), np.tanh(x), atol=1e-6)


@needs_c
def test_a_decision_above_the_tolerance_is_refused(tmp_path):
    # the case: a hand-edited file made tolerance=1e-5 run c_tanh_fast (error 1e-3)
    path, data = saved(tmp_path)
    fast = registry.get("c_tanh_fast")
    assert fast.tolerance > 1e-5
    data["decisions"] = [d.replace("kernel:c_tanh", "kernel:c_tanh_fast")
                         for d in data["decisions"]]
    data["kernels"] = {"c_tanh_fast": fast.source_hash}
    write(path, data)
    with pytest.raises(PlanFileError, match=r"c_tanh_fast.*error 1\.0e-03 is above the "
                       r"tolerance 1e-05.*refused, not re-planned") as info:
        replay(path, tolerance=1e-5)
    # one "plan file X" prefix: replay says what does not fit, compile names the file once
    assert str(info.value).startswith(f"plan file {path} cannot be replayed as saved: it "
                                      "chooses 'kernel:c_tanh_fast' for tanh")
    assert "the plan file" not in str(info.value)
    assert replay(path, tolerance=1e-3).plan.kernels == ["c_tanh_fast"]  # where it fits


@needs_c
def test_a_decision_naming_a_kernel_the_table_does_not_list_is_refused(tmp_path):
    path, data = saved(tmp_path)
    data["decisions"] = [d.replace("kernel:c_tanh", "kernel:c_exp") for d in data["decisions"]]
    write(path, data)
    with pytest.raises(PlanFileError, match=r"uses kernel 'c_exp', which the file's "
                       r"\"kernels\" table does not list"):
        replay(path)


@needs_c
def test_an_edited_kernel_is_refused(tmp_path):
    path, data = saved(tmp_path)
    real = data["kernels"]["c_tanh"]
    data["kernels"]["c_tanh"] = "0123456789abcdef"
    write(path, data)
    with pytest.raises(PlanFileError, match=f"c_tanh \\(saved 0123456789abcdef, now {real}\\)"
                       ".*refused, not re-planned"):
        replay(path)


@needs_c
@pytest.mark.parametrize("edit, key", [
    (lambda d: d.pop("decisions"), "decisions"),
    (lambda d: d.pop("kernels"), "kernels"),
    (lambda d: d.pop("device"), "device"),
    (lambda d: d.pop("tolerance"), "tolerance"),
    (lambda d: d.pop("version"), "version"),
    (lambda d: d.update(version=2), "version"),
    (lambda d: d.update(format="tensor_graphs.graph"), "format"),
    (lambda d: d.update(tolerance="1e-5"), "tolerance"),
    (lambda d: d.update(tolerance=None), "tolerance"),
    (lambda d: d.update(tolerance=float("nan")), "tolerance"),
    (lambda d: d.update(tolerance=-1.0), "tolerance"),
    (lambda d: d.update(tolerance=True), "tolerance"),
    (lambda d: d.update(kernels=["c_tanh"]), "kernels"),
    (lambda d: d.update(kernels={"c_tanh": 5}), "kernels"),
    (lambda d: d.update(decisions="local"), "decisions"),
    (lambda d: d.update(decisions=[1, 2]), "decisions"),
    (lambda d: d.update(device=["cpu"]), "device"),
    (lambda d: d.update(predicted_seconds="fast"), "predicted_seconds"),
])
def test_schema_errors_name_the_key(tmp_path, edit, key):
    path, data = saved(tmp_path)
    edit(data)
    write(path, data)
    with pytest.raises(PlanFileError, match=f"plan file .*plan.json is not a valid "
                       f"tensor_graphs plan: '{key}' must be"):
        replay(path)


@pytest.mark.parametrize("text, says", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ('{"format": "tensor_graphs.plan", "tolerance": 1' + "0" * 5000 + "}",
     "thousands of digits"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    ("{", "not valid JSON"),
    ("[]", "its JSON is a list"),
    ("null", "its JSON is a NoneType"),
])
def test_unreadable_files_are_plan_file_errors(tmp_path, text, says):
    path = tmp_path / "plan.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(PlanFileError, match=says) as info:
        replay(str(path))
    assert str(path) in str(info.value)


def test_a_plan_file_that_is_not_a_file(tmp_path):
    with pytest.raises(PlanFileError, match="missing.json: no such plan file"):
        replay(str(tmp_path / "missing.json"))
    with pytest.raises(PlanFileError, match="is a directory, not a regular file"):
        replay(str(tmp_path))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it would wait for a writer forever
    with pytest.raises(PlanFileError, match="is a FIFO .*, not a regular file"):
        replay(str(fifo))
    with pytest.raises(ArgumentError, match="expected the path of a plan file"):
        replay(123)


def test_an_oversized_plan_file_is_refused(tmp_path):
    path = tmp_path / "plan.json"
    path.write_bytes(b" " * (lockfile.MAX_BYTES + 1))
    with pytest.raises(PlanFileError, match="larger than 16 MiB"):
        replay(str(path))


@needs_c
def test_device_and_tolerance_mismatches(tmp_path):
    path, data = saved(tmp_path)
    with pytest.raises(PlanFileError, match="planned at tolerance 1e-05, looser than the "
                       "1e-06 asked for"):
        replay(path, tolerance=1e-6)
    data["device"] = "cuda"
    write(path, data)
    with pytest.raises(PlanFileError, match="was planned for cuda, not cpu"):
        replay(path)


@needs_c
def test_a_plan_file_others_could_write_is_refused(tmp_path):
    path, _ = saved(tmp_path)
    os.chmod(path, 0o666)
    with pytest.raises(UntrustedPathError, match="refusing to load plan file .* writable by "
                       "group and others"):
        replay(path)
    os.chmod(path, 0o644)
    os.chmod(tmp_path, 0o777)  # not sticky: another user could replace the file
    try:
        with pytest.raises(UntrustedPathError, match="its folder .* writable"):
            replay(path)
    finally:
        os.chmod(tmp_path, 0o700)
    if os.getuid() == 0:  # only root can give a file away
        os.chown(path, 12345, 12345)
        with pytest.raises(UntrustedPathError, match="owned by uid 12345"):
            replay(path)


def test_kernel_names_of_labels():
    assert lockfile.kernel_names("kernel:c_tanh") == ["c_tanh"]
    assert lockfile.kernel_names("copy:copy_cpu_to_cuda") == ["copy_cpu_to_cuda"]
    assert lockfile.kernel_names("local") == [] and lockfile.kernel_names("rewrite:x:0") == []
    assert lockfile.kernel_names("block:local|kernel:a|leaf|kernel:b") == ["a", "b"]
