"""Record, look up, calibrate, prune, export and import: the store's contract, each test on
an in-memory SQLite database and on a fresh PostgreSQL database (``new_db``, conftest.py)."""

from __future__ import annotations

import io
import json
import math
import time

import pytest

from tensor_graphs.db import Database, Hardware, Measurement, current, open_db, signature_text
from tensor_graphs.errors import DatabaseError, TensorGraphsError


def test_record_lookup_round_trip(new_db, mk):
    db = new_db()
    m = mk()
    before = time.time()
    stored = db.record(m)
    assert stored.hardware == current() and before <= stored.when <= time.time()
    got = db.lookup(m.kernel, m.signature)
    assert got == stored and got.ok
    assert (got.runs, got.median, got.min, got.max, got.error) == \
        (10, 1e-5, 1e-5 * 0.9, 1e-5 * 1.5, 1e-7)
    assert db.lookup(m.kernel, mk(n=8).signature) is None
    assert db.lookup("numpy_mul", m.signature) is None


def test_lookup_matches_device_and_libs_and_prefers_this_machine(new_db, mk, elsewhere):
    db = new_db()
    hw = current()
    db.record(mk(median=1.0, hardware=hw, when=100.0))
    db.record(mk(median=2.0, hardware=elsewhere, when=200.0))  # newer, other machine
    assert db.lookup("numpy_add", mk().signature).median == 1.0
    db.record(mk(median=3.0, hardware=hw, when=50.0))  # older, this machine
    assert db.lookup("numpy_add", mk().signature).median == 1.0
    other_libs = Hardware(hw.machine, hw.device, hw.libs + "|numpy 0.0")
    db.record(mk(median=4.0, hardware=other_libs, when=300.0))
    other_device = Hardware(hw.machine, "cpu|other|avx|1 core", hw.libs)
    db.record(mk(median=5.0, hardware=other_device, when=300.0))
    assert db.lookup("numpy_add", mk().signature).median == 1.0
    assert db.lookup("numpy_add", mk().signature, other_libs).median == 4.0
    assert db.lookup("numpy_add", mk().signature, other_device).median == 5.0
    # only another machine has it: still used (same device and libs)
    db.record(mk(n=8, median=6.0, hardware=elsewhere))
    assert db.lookup("numpy_add", mk(n=8).signature).median == 6.0


def test_lookup_returns_any_source_hash_and_prefers_the_given_one(new_db, mk):
    db = new_db()
    db.record(mk(source_hash="new", median=1.0, when=100.0))
    db.record(mk(source_hash="old", median=2.0, when=200.0))
    assert db.lookup("numpy_add", mk().signature).source_hash == "old"  # most recent
    assert db.lookup("numpy_add", mk().signature, source_hash="new").median == 1.0
    assert db.lookup("numpy_add", mk().signature, source_hash="gone").source_hash == "old"


def test_failures_are_recorded_with_nan_timings(new_db, mk):
    db = new_db()
    db.record(mk(n=2))
    sig = mk(n=4).signature
    db.record(Measurement("numpy_add", "h1", sig, 0, math.nan, math.nan, math.nan, None,
                          failure="ValueError: boom"))
    got = db.lookup("numpy_add", sig)
    assert not got.ok and got.failure == "ValueError: boom"
    assert math.isnan(got.median) and math.isnan(got.min) and math.isnan(got.max)
    assert [m.signature for m in db.rows_for("numpy_add")] == [mk(n=2).signature]
    assert db.stats()["failures"] == 1


def test_rows_for_is_every_successful_row_on_this_device_and_libs(new_db, mk, elsewhere):
    db = new_db()
    hw = current()
    for n in (64, 128, 256):
        db.record(mk(n=n, median=n * 1e-6))
    db.record(mk(n=512, hardware=elsewhere, source_hash="h0"))
    db.record(mk(n=32, hardware=Hardware(hw.machine, "cpu|other", hw.libs)))
    db.record(mk(kernel="numpy_mul", n=16))
    rows = db.rows_for("numpy_add")
    assert sorted(json.loads(m.signature)["inputs"][0][0][0] for m in rows) == [64, 128, 256, 512]
    assert db.rows_for("nothing") == []


def test_rows_named_is_every_kernel_of_a_prefix_in_code_point_order(new_db, mk):
    db = new_db()
    names = ["gen_a1", "gen_B2", "gen_", "gen", "gem_x", "gen\u00e9", "genZ", "other"]
    for i, name in enumerate(names):
        db.record(mk(kernel=name, n=i + 1))
    assert sorted({m.kernel for m in db.rows_named("gen_")}) == ["gen_", "gen_B2", "gen_a1"]
    assert {m.kernel for m in db.rows_named("gen")} == set(names) - {"gem_x", "other"}
    assert db.rows_named("nothing") == []


def test_record_many_is_one_transaction_and_rejects_non_measurements(new_db, mk):
    db = new_db()
    assert db.record_many([mk(n=n) for n in range(1, 6)]) == 5
    assert db.revision == 1 and len(db.rows()) == 5
    with pytest.raises(DatabaseError):
        db.record_many([mk(n=9), "not a measurement"])
    assert len(db.rows()) == 5 and db.record_many([]) == 0


def test_calibration(new_db, mk, elsewhere):
    db = new_db()
    assert db.calibration() is None
    db.set_calibration(None, {"flops": 1e11, "bytes": 2e10})
    assert db.calibration() == {"flops": 1e11, "bytes": 2e10}
    assert db.calibration(elsewhere) == {"flops": 1e11, "bytes": 2e10}  # device + libs key
    db.set_calibration(current(), {"flops": 3e11})
    assert db.calibration(current()) == {"flops": 3e11}
    other = Hardware("m", "cuda|H100", "torch 2")
    assert db.calibration(other) is None
    assert db.stats()["calibrations"] == 1


def test_revision_increments_on_every_write(new_db, mk):
    db = new_db()
    assert db.revision == 0
    db.record(mk())
    assert db.revision == 1
    db.record_many([mk(n=2), mk(n=3)])
    assert db.revision == 2
    db.set_calibration(None, {"flops": 1.0})
    assert db.revision == 3
    assert db.prune(failures=True) == 0 and db.revision == 3  # nothing deleted
    assert db.prune(stale_hashes={"numpy_add": "h2"}) == 3 and db.revision == 4


def test_stats_and_rows(new_db, mk, elsewhere):
    db = new_db()
    db.record(mk(n=1, when=10.0))
    db.record(mk(n=2, when=30.0, source_hash="h0"))
    db.record(mk(kernel="numpy_mul", n=2, when=20.0, hardware=elsewhere))
    s = db.stats({"numpy_add": "h1", "numpy_mul": "h1"})
    assert (s["rows"], s["kernels"], s["failures"], s["stale"]) == (3, 2, 0, 1)
    assert (s["oldest"], s["newest"]) == (10.0, 30.0)
    assert sorted(h["rows"] for h in s["hardware"]) == [1, 2]
    assert {h["key"] for h in s["hardware"]} == {current().key, elsewhere.key}
    assert "stale" not in db.stats()
    assert [m.when for m in db.rows()] == [30.0, 20.0, 10.0]
    assert [m.when for m in db.rows(kernel="numpy_add", limit=1)] == [30.0]


def test_prune(new_db, mk):
    db = new_db()
    now = time.time()
    db.record(mk(n=1, source_hash="old", when=now - 10 * 86400))
    db.record(mk(n=2, source_hash="old"))
    db.record(mk(n=3, source_hash="new"))
    db.record(mk(kernel="gone_kernel", source_hash="x"))  # no current kernel: not stale
    db.record(Measurement("numpy_add", "new", mk(n=4).signature, 0, math.nan, math.nan,
                          math.nan, None, failure="boom"))
    assert db.prune() == 0
    assert db.prune(older_than=5 * 86400) == 1
    assert db.prune(stale_hashes={"numpy_add": "new"}) == 1
    assert db.prune(failures=True) == 1
    assert sorted((m.kernel, m.source_hash) for m in db.rows()) == [
        ("gone_kernel", "x"), ("numpy_add", "new")]


def test_export_import_round_trip_and_merge(new_db, mk, elsewhere, tmp_path):
    a = new_db()
    a.record(mk(n=1))
    a.record(mk(n=2, hardware=elsewhere))
    a.record(Measurement("numpy_add", "h1", mk(n=3).signature, 0, math.nan, math.nan,
                         math.nan, None, failure="boom"))
    path = tmp_path / "a.jsonl"
    assert a.export_jsonl(path) == 3
    for line in path.read_text().splitlines():  # strict JSON: NaN written as null
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    b = new_db()
    b.record(mk(n=4))
    assert b.import_jsonl(path) == 3
    assert b.revision == 2
    assert b.import_jsonl(path) == 0 and b.revision == 2  # duplicates skipped, no new revision
    assert len(b.rows()) == 4

    def key(m):
        return (m.kernel, m.signature, m.hardware, m.when, m.failure, m.median)

    assert {key(m) for m in a.rows()} < {key(m) for m in b.rows()}
    failed = b.lookup("numpy_add", mk(n=3).signature)
    assert failed.failure == "boom" and math.isnan(failed.median)
    buf = io.StringIO()  # file objects work too, and merging back adds only b's own row
    b.export_jsonl(buf)
    buf.seek(0)
    assert a.import_jsonl(buf) == 1 and len(a.rows()) == 4


def test_import_rejects_bad_lines(new_db, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"kernel": "k"}\n')
    db = new_db()
    with pytest.raises(DatabaseError, match="line 1"):
        db.import_jsonl(path)
    assert db.rows() == [] and db.revision == 0


GOOD_LINE = ('{"kernel": "k", "source_hash": "h", "signature": "s", "runs": 1, "median": 1, '
             '"min": 1, "max": 1, "when": 1, "machine": "m", "device": "d", "libs": "l"}\n')


@pytest.mark.parametrize("content, line, why", [
    (bytes(range(256)) * 8, 1, "not valid JSON"),  # binary garbage (its line 1 is ASCII)
    ((GOOD_LINE * 2).encode() + b"\xff\xfe\n", 3, "not UTF-8"),  # the exact line
    (b"[" * 100_000 + b"]" * 100_000, 1, "nested too deeply"),  # deeper than json recurses
    (GOOD_LINE.replace('"when": 1', '"when": 1' + "0" * 400).encode(), 1, "OverflowError"),
    (GOOD_LINE.replace('"runs": 1', '"runs": 1, "failure": {"a": 1}').encode(), 1, "failure"),
    (b'"just a string"\n', 1, "AttributeError"),
    # values no row holds: a time `tg db show` and `tg db stats` could not date (stored, it
    # failed both ever after), runs too large for SQLite's INTEGER (an internal error), or
    # not a whole number (taken as 1 and 5)
    (GOOD_LINE.replace('"when": 1', '"when": 1e300').encode(), 1, "when is 1e+300"),
    (GOOD_LINE.replace('"runs": 1', '"runs": 1' + "0" * 30).encode(), 1, "runs is 1000"),
    (GOOD_LINE.replace('"runs": 1', '"runs": true').encode(), 1, "runs is True"),
    (GOOD_LINE.replace('"runs": 1', '"runs": 5.7').encode(), 1, "runs is 5.7"),
])
def test_import_refuses_files_that_are_not_measurements(new_db, tmp_path, content, line, why):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    db = new_db()
    with pytest.raises(DatabaseError) as info:
        db.import_jsonl(path)
    msg = str(info.value)
    assert f"{path}, line {line} is not a tensor_graphs measurement" in msg and why in msg
    assert "tg db export" in msg
    assert db.rows() == [] and db.revision == 0  # nothing half-imported
    with pytest.raises(DatabaseError, match="not UTF-8"):  # a text stream says the same
        db.import_jsonl(io.TextIOWrapper(io.BytesIO(bytes(range(128, 256))), "utf-8"))


@pytest.mark.parametrize("method", ["import_jsonl", "export_jsonl"])
def test_import_and_export_name_a_path_they_cannot_use(tmp_path, method):
    with pytest.raises(DatabaseError) as info:
        getattr(Database(":memory:"), method)(tmp_path)  # a directory
    assert str(tmp_path) in str(info.value) and "directory" in str(info.value)


def test_export_to_a_fifo_is_refused_at_once_and_leaves_it(tmp_path):
    """Export read the target's first bytes (is it a database?) with open(), which waits for
    a writer on a FIFO: it hung; then the rows were renamed over the FIFO."""
    import os
    import stat
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    said: list[BaseException] = []

    def export() -> None:
        try:
            Database(":memory:").export_jsonl(fifo)
        except BaseException as exc:  # noqa: BLE001 - checked below
            said.append(exc)

    worker = threading.Thread(target=export, daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():  # stuck in open(): a writer end releases it
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        worker.join(10)
        pytest.fail("export_jsonl waited on the FIFO")
    assert len(said) == 1 and isinstance(said[0], DatabaseError), said
    assert f"{fifo}: it is a FIFO" in str(said[0])
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_signature_text_is_canonical():
    a = signature_text([((2, 3), "float32")], {"b": (1, 2), "a": 0.1, "eps": 1e-5})
    b = signature_text([[(2, 3), "float32"]], {"eps": 1e-5, "a": 0.1, "b": [1, 2]})
    assert a == b == '{"attrs":{"a":0.1,"b":[1,2],"eps":1e-05},"inputs":[[[2,3],"float32"]]}'
    assert signature_text([], {"x": -0.0}) != signature_text([], {"x": 0.0})
    assert signature_text([], {"x": True}) != signature_text([], {"x": 1})
    assert json.loads(signature_text([], {"x": 0.1 + 0.2}))["attrs"]["x"] == 0.1 + 0.2
    import numpy as np

    import tensor_graphs as tg
    assert signature_text([((np.int64(4),), tg.input("q", (4,)).dtype)], {"k": np.int32(3)}) \
        == signature_text([((4,), "float32")], {"k": 3})


def test_closed_database_raises(new_db, mk):
    with new_db() as db:
        db.record(mk())
    assert db.closed
    with pytest.raises(DatabaseError, match="closed"):
        db.rows()
    assert issubclass(DatabaseError, TensorGraphsError)


def test_open_db(tmp_path, monkeypatch):
    mem = Database(":memory:")
    assert open_db(mem) is mem
    assert open_db(":memory:") is not open_db(":memory:")
    path = tmp_path / "x.sqlite"
    assert open_db(path) is open_db(str(path))
    env = tmp_path / "env" / "tg.sqlite"
    monkeypatch.setenv("TG_DB", str(env))
    db = open_db()
    assert db.path == str(env) and env.exists() and not db.readonly
    monkeypatch.delenv("TG_DB")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    db = open_db(None)
    assert db.path == str(tmp_path / "cache" / "tensor_graphs" / "measurements.sqlite")
    assert (tmp_path / "cache" / "tensor_graphs" / "measurements.sqlite").exists()
    db.close()
    assert open_db(None) is not db and not open_db(None).closed
