"""Errors and reports that said something other than what happened: an ONNX tensor's external
data range (a huge offset read as "bytes 1000000000000..8192", a negative length as
"truncated?"), a lock file with its decisions emptied (reported as unregistered kernels), the
JSON of ``tg explain`` (a generated step's "computes" was one op of it, where the table lists
them all), and an out-of-memory error 1 byte short ("needs 1.8 MB but 1.8 MB are
available")."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.commands.profile import explain_rows
from tensor_graphs.errors import PlanFileError
from tensor_graphs.memory import check_fits, format_bytes
from tensor_graphs.memory.plan import format_apart
from tensor_graphs.planner import cache

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


# ---------------------------------------------------------------------------- ONNX external data
def _external_model(folder, offset, length):
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    init = numpy_helper.from_array(w, "w")
    init.ClearField("raw_data")
    init.data_location = TensorProto.EXTERNAL
    for k, v in {"location": "w.bin", "offset": str(offset), "length": str(length)}.items():
        init.external_data.add(key=k, value=v)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
                              [init])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    (folder / "w.bin").write_bytes(w.tobytes())  # 48 bytes
    path = folder / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


@pytest.mark.parametrize("offset, length, words", [
    (10 ** 12, 48, "reads bytes 1000000000000..1000000000048 (48 bytes) of 'w.bin', past its "
                   "end (48 bytes): the file is truncated, or the model's offsets are not "
                   "this file's"),
    (8, 48, "reads bytes 8..56 (48 bytes) of 'w.bin', past its end (48 bytes)"),
    (0, -8, "tensor 'w' has a negative external data length (-8) for 'w.bin': the model's "
            "entry for it is corrupt"),
    (-4, 48, "negative external data offset (-4)"),
])
def test_external_data_ranges_are_told_as_they_are(tmp_path, offset, length, words):
    path = _external_model(tmp_path, offset, length)
    with pytest.raises(tg.SerializationError) as info:
        tg.from_onnx(path)
    message = str(info.value)
    assert words in message, message
    if length < 0 or offset < 0:
        assert "truncated" not in message


def test_external_data_in_range_still_loads(tmp_path):
    path = _external_model(tmp_path, 0, 48)
    x = np.ones((2, 4), np.float32)
    out = tg.from_onnx(path)(x)[0]
    np.testing.assert_allclose(out, x @ np.arange(12, dtype=np.float32).reshape(4, 3))


# ---------------------------------------------------------------------------- lock files
def _fused_graph():
    x = tg.input("x", ("b", 64))
    y = tg.layer_norm(x @ tg.weight("w", (64, 32)) + tg.weight("bias", (32,)))
    return tg.gelu(y) * 2 + 1


@pytest.fixture(scope="module")
def fused_program():
    cache.clear()
    return tg.compile(_fused_graph(), bounds={"b": 8}, db=":memory:")


def test_a_lock_file_with_its_decisions_emptied_says_so(tmp_path, fused_program):
    path = tmp_path / "plan.json"
    fused_program.save_plan(path)
    data = json.loads(path.read_text())
    assert data["kernels"]
    data["decisions"] = []
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFileError) as info:
        tg.compile(_fused_graph(), bounds={"b": 8}, db=":memory:", plan=path)
    message = str(info.value)
    assert 'has an empty "decisions" list, yet its "kernels" table lists' in message, message
    assert "not registered" not in message


def test_a_generated_kernel_no_decision_names_is_no_registration_problem(tmp_path,
                                                                         fused_program):
    path = tmp_path / "plan.json"
    fused_program.save_plan(path)
    data = json.loads(path.read_text())
    generated = [d for d in data["decisions"] if d.startswith("generated:")]
    if not generated:
        pytest.skip("the plan chose no generated kernel")
    data["decisions"] = [d for d in data["decisions"] if d not in generated]
    path.write_text(json.dumps(data))
    with pytest.raises(PlanFileError, match="that no decision uses .* edited by hand"):
        tg.compile(_fused_graph(), bounds={"b": 8}, db=":memory:", plan=path)


# ---------------------------------------------------------------------------- explain -o json
def _table_computes(text: str) -> list[str]:
    """The "computes" column of explain's table, cut by the header's column starts."""
    lines = text.splitlines()
    start = lines[0].index("computes")
    end = lines[0].index("shape")
    rows = lines[2:lines.index("")]  # the totals follow a blank line
    assert all(re.match(r"\d+ ", line) for line in rows), rows
    return [line[start:end].rstrip() for line in rows]


def test_explain_rows_carry_what_the_table_computes_column_shows(fused_program):
    plan = fused_program.plan
    rows = explain_rows(plan)
    assert [r["computes"] for r in rows] == _table_computes(plan.explain())
    fused = [r["computes"] for r, s in zip(rows, plan.steps) if len(s.nodes) > 1]
    assert fused and all(c.startswith("generated: ") or "fused)" in c for c in fused), fused


def test_tg_explain_json_matches_the_table(tmp_path, fused_program):
    graph = tmp_path / "g.json"
    tg.save(_fused_graph(), graph)

    def run(*extra):
        proc = subprocess.run([sys.executable, "-m", "tensor_graphs.cli", "explain", str(graph),
                               "--dim", "b=8", "--db", str(tmp_path / "m.sqlite"), *extra],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    rows = json.loads(run("-o", "json"))
    assert [r["computes"] for r in rows] == _table_computes(run())
    assert any(r["computes"].startswith("generated: ") or "fused)" in r["computes"]
               for r in rows)


# ---------------------------------------------------------------------------- out of memory
def test_format_apart_shows_bytes_where_the_rounded_figures_agree():
    assert format_apart(1_769_600, 1_769_599) == ("1,769,600 B", "1,769,599 B")
    assert format_apart(2_000_000, 1_000_000) == (format_bytes(2_000_000), "1.0 MB")
    assert format_apart(999, 998) == ("999 B", "998 B")
    assert format_apart(5000, 5000) == ("5.0 kB", "5.0 kB")


def test_out_of_memory_by_one_byte_reads_as_such():
    """A real plan's memory against a device 1 byte short of it (``check_fits``, which
    tg.compile calls; a stand-in device, since other programs alive in the process hold
    bytes of the real one)."""
    x = tg.input("x", (256, 256))
    prog = tg.compile(tg.relu(x @ tg.weight("w", (256, 512))), db=":memory:")
    need = prog.memory_plan.total("cpu")
    assert format_bytes(need) == format_bytes(need - 1)  # the case: rounded, they agree
    device = SimpleNamespace(name="cpu", kind="cpu", capacity=need - 1, allocated=0)
    with pytest.raises(tg.OutOfMemory) as info:
        check_fits(prog.memory_plan, {"cpu": device})
    message = str(info.value)
    assert f"needs {need:,} B (arena " in message, message
    assert f"but {need - 1:,} B are available (capacity {need - 1:,} B)" in message, message


def test_out_of_memory_far_apart_keeps_the_short_figures():
    plan = SimpleNamespace(devices=["cpu"], total=lambda kind: 3_000_000,
                           arena={"cpu": 2_000_000}, weights={"cpu": 1_000_000}, prepared={},
                           state={}, results={}, largest=lambda n, kind: [])
    device = SimpleNamespace(name="cpu", kind="cpu", capacity=1_000_000, allocated=0)
    with pytest.raises(tg.OutOfMemory, match=r"needs 3\.0 MB \(arena 2\.0 MB \+ weights "
                                             r"1\.0 MB\) but 1\.0 MB are available "
                                             r"\(capacity 1\.0 MB\)"):
        check_fits(plan, {"cpu": device})
