"""What persists between runs (the C library cache, graph and plan files, the plan cache's view
of a database) survives what happens to files: a cached library cut short, a full disk, a file
kept behind a symbolic link, a checkpoint given as a graph, two databases of one name."""

from __future__ import annotations

import errno
import os
import uuid

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.db.hardware import current
from tensor_graphs.db.store import Database, open_db
from tensor_graphs.errors import CCompileError
from tensor_graphs.files import open_regular
from tensor_graphs.ir import serialize
from tensor_graphs.ir.evaluate import evaluate
from tensor_graphs.kernels.c import build, codegen
from tensor_graphs.kernels.c import lib as c_lib
from tensor_graphs.numerics import relative_error
from tensor_graphs.planner import cache
from tests.planner import rows

needs_cc = pytest.mark.skipif(build.compiler() is None, reason="no C compiler")


def _answer_source() -> str:
    return f"int tg_answer(void) {{ return 42; }} /* {uuid.uuid4()} */\n"


@needs_cc
@pytest.mark.parametrize("content", [b"", b"\x7fELF\x02\x01\x01 cut short", b"garbage" * 100])
def test_a_cached_library_that_does_not_load_is_compiled_again(tmp_path, monkeypatch, content):
    # a crash before the compiled file reached the disk leaves it empty or cut short; loading
    # it failed on every run after, so the C backend stayed unavailable until it was deleted
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    src = _answer_source()
    path = build.library_path("answer", src)
    path.write_bytes(content)
    os.chmod(path, 0o755)
    with pytest.warns(UserWarning, match="does not load.*compiling it again"):
        lib = build.load_library("answer", src)
    assert lib.tg_answer() == 42
    assert build.load_library("answer", src) is lib


def _linked(tmp_path, name: str):
    """A path that is a symbolic link to a file in another folder, and that file."""
    shared, work = tmp_path / "shared", tmp_path / "work"
    shared.mkdir(mode=0o700)
    work.mkdir(mode=0o700)
    target = shared / name
    target.write_text("the old version\n")
    link = work / name
    link.symlink_to(os.path.join("..", "shared", name))
    return link, target


def test_saving_a_graph_through_a_link_writes_the_file_it_points_to(tmp_path):
    # the link was replaced by a new file and the file it led to kept its old graph
    link, target = _linked(tmp_path, "graph.json")
    y = tg.exp(tg.input("x", (2, 3)))
    tg.save(y, link)
    assert link.is_symlink(), "the user's link was replaced"
    assert tg.load(target) is y


def test_saving_a_plan_through_a_link_writes_the_file_it_points_to(tmp_path):
    link, target = _linked(tmp_path, "plan.json")
    y = tg.exp(tg.input("x", (2, 3)))
    cache.clear()
    prog = tg.compile(y, db=":memory:", backends=("numpy",))
    prog.save_plan(link)
    assert link.is_symlink(), "the user's link was replaced"
    again = tg.compile(y, db=":memory:", backends=("numpy",), plan=target)
    assert again.stats["replayed"] == 1



class _Counted:
    """A file that counts the bytes read from it."""

    def __init__(self, f):
        self.f, self.read_bytes = f, 0

    def read(self, *n):
        data = self.f.read(*n)
        self.read_bytes += len(data)
        return data

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.f.close()


def test_a_large_file_that_is_no_graph_is_refused_before_it_is_read(tmp_path, monkeypatch):
    # a checkpoint given to tg.load (or `tg explain`) by mistake was read whole, then refused
    # as "not valid JSON": a 3 GiB one took 6 GiB of memory and 17 s
    path = tmp_path / "model.safetensors"
    with open(path, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{\"__metadata__\": {}}")
        f.truncate(64 << 20)
    opened: list[_Counted] = []
    monkeypatch.setattr(serialize, "open_regular",
                        lambda *a, **k: opened.append(_Counted(open_regular(*a, **k)))
                        or opened[-1])
    with pytest.raises(tg.SerializationError, match=r"model\.safetensors is not a tensor_graphs "
                       r"graph file: it begins with b'\\x08"):
        tg.load(path)
    assert opened[0].read_bytes <= serialize.HEAD


def _disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


@needs_cc
def test_a_full_cache_disk_is_a_compile_error_naming_the_folder(tmp_path, monkeypatch):
    # a bare "OSError: [Errno 28] No space left on device" escaped load_library
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    folder = build.cache_dir()
    monkeypatch.setattr(build.tempfile, "mkstemp", _disk_full)
    with pytest.raises(CCompileError, match=f"cannot build C library 'answer' in {folder}: "
                       "No space left on device; free space there, or point TG_CACHE_DIR"):
        build.load_library("answer", _answer_source())


@needs_cc
def test_a_full_cache_disk_plans_without_the_kernels_it_cannot_build(tmp_path, monkeypatch):
    # the generated kernel the plan chose could not be built, and the OSError ended tg.compile
    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    build.cache_dir()
    monkeypatch.setattr(build.tempfile, "mkstemp", _disk_full)
    # what this process learnt of its C backend, found afresh here and forgotten after
    monkeypatch.setattr(build, "_facts", {})
    monkeypatch.setattr(c_lib, "_failed", {})
    monkeypatch.setattr(codegen, "_vector_found", None)
    scale = 1.0 + uuid.uuid4().int % 1000 / 1e4  # a region no earlier test built
    x = tg.input("x", (4, 16))
    y = tg.tanh(x * scale + 0.5) * 2.0
    cache.clear()
    prog = tg.compile(y, db=":memory:")
    feed = np.linspace(-3, 3, 64, dtype=np.float32).reshape(4, 16)
    want = evaluate([y], {"x": feed}, dtype="float64")[0]
    assert relative_error(prog(x=feed), want) < 1e-5


def _rows(folder, fast: str, y) -> Database:
    """The database ``m.sqlite`` in ``folder``, opened by that relative name from inside it,
    whose rows make ``fast`` the cheapest kernel for ``y``."""
    os.chdir(folder)
    db = open_db("m.sqlite")
    rows.record(db, [y], {fast: 1e-6}, target="cpu", backends=("numpy", "c"),
                kinds={"cpu": current("cpu")})
    return db


@needs_cc
def test_two_databases_of_one_relative_name_share_no_plan(tmp_path, monkeypatch):
    # the plan cache keyed a database by the path it was opened with: "m.sqlite" in another
    # folder, at the same revision, replayed the plan the first one's rows had decided
    y = tg.tanh(tg.input("x", (4, 16)))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path)
    a = _rows(tmp_path / "a", "numpy_tanh", y)
    b = _rows(tmp_path / "b", "c_tanh", y)
    assert a.revision == b.revision and a.path == b.path
    cache.clear()
    assert tg.compile(y, db=a, backends=("numpy", "c")).plan.kernels == ["numpy_tanh"]
    assert tg.compile(y, db=b, backends=("numpy", "c")).plan.kernels == ["c_tanh"]


def test_a_verification_outcome_that_cannot_be_filed_is_still_returned(tmp_path, monkeypatch):
    """Filing a kernel's verification outcome for other profilers met a full disk or a
    folder made read-only with a bare OSError out of the profile, and left its temporary
    file behind; the outcome is this process's either way (here the file's place is taken
    by a folder, so the rename fails as on a full disk)."""
    from tensor_graphs.profiler import shared_verify

    monkeypatch.setenv("TG_CACHE_DIR", str(tmp_path))
    folder = shared_verify._folder()
    (folder / "k.json").mkdir()
    assert shared_verify._filed("k", lambda: {"reason": None}) == {"reason": None}
    assert not list(folder.glob(".k.*.tmp"))


def test_a_generated_triton_module_of_other_bytes_is_read_as_none(tmp_path):
    """A cached module file that is no UTF-8 (damaged, or written by another tool) raised
    UnicodeDecodeError where it is to be written again."""
    pytest.importorskip("torch")
    from tensor_graphs.kernels.triton import build

    path = tmp_path / "tg_triton_x.py"
    path.write_bytes(b"\xff\xfe not utf-8 \x80")
    assert build._text(path) is None
    path.write_text("x = 1\n", encoding="utf-8")
    assert build._text(path) == "x = 1\n"
