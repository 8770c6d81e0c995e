"""What tensor_graphs writes is readable as a file written with open() would be: a new file
gets 0666 less the umask, a replaced one keeps its mode, still written whole or not at all
(``files.atomic_write``, ``write_safetensors``). mkstemp's 0600 made every shared checkpoint,
plan or HTML report unreadable to others, and turned a 0644 file 0600 when it was saved over.

A path that cannot be written (a directory, a missing folder, no permission) is one
SerializationError naming the file and the fix, never a raw IsADirectoryError."""

from __future__ import annotations

import os
import stat

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import PlanFileError, SerializationError
from tensor_graphs.files import atomic_write, replacement_mode
from tensor_graphs.runtime.weights import write_safetensors


@pytest.fixture
def umask():
    """``umask(value)`` sets the process's umask for the test; the old one comes back after."""
    old = os.umask(0o022)
    os.umask(old)
    yield os.umask
    os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _graph():
    x = tg.input("x", (2,))
    return x * 2.0


def _program():
    return tg.compile(_graph())


WRITERS = {
    "atomic_write": lambda p: _atomic(p),
    "tg.save": lambda p: tg.save(_graph(), p),
    "save_plan": lambda p: _program().save_plan(p),
    "explain(html=)": lambda p: _program().explain(html=p),
    "trace": lambda p: _program().trace(p, {"x": np.ones(2, np.float32)}, runs=1),
    "write_safetensors": lambda p: write_safetensors(p, {"a": np.zeros(3, np.float32)}),
}


def _atomic(path) -> None:
    with atomic_write(path) as f:
        f.write("{}")


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_mode_open_would_give(tmp_path, umask, writer, mask, expected):
    if writer == "save_plan":  # a plan file is loaded only if no one else could write it
        expected &= ~0o022
    umask(mask)
    path = tmp_path / "out"
    WRITERS[writer](path)
    assert mode(path) == expected, oct(mode(path))
    assert os.listdir(tmp_path) == ["out"]  # no temporary file left


@pytest.mark.parametrize("writer", WRITERS)
@pytest.mark.parametrize("before", [0o644, 0o640, 0o600])
def test_a_replaced_file_keeps_its_mode(tmp_path, umask, writer, before):
    umask(0o077)  # would give 0600: the file's own mode wins
    path = tmp_path / "out"
    path.write_text("old")
    os.chmod(path, before)
    WRITERS[writer](path)
    assert path.read_bytes() != b"old"
    assert mode(path) == before, oct(mode(path))


def test_trainer_save_keeps_a_shared_checkpoint_readable(tmp_path, umask):
    umask(0o022)
    x = tg.input("x", (4, 3))
    w = tg.weight("w", (3, 2))
    trainer = tg.Trainer(((x @ w) ** 2).mean(), optimizer=tg.optim.SGD(0.1))
    trainer.bind(w=np.ones((3, 2), np.float32))
    path = tmp_path / "ck.safetensors"
    trainer.save(path)
    assert mode(path) == 0o644
    os.chmod(path, 0o640)
    trainer.save(path)
    assert mode(path) == 0o640


def test_only_owner_writes_keeps_others_from_writing(tmp_path, umask):
    """Plans and generated code are refused on load when others may write them
    (``check_trusted_file``): even a umask of 002, or a replaced 0666 file, gives 06x4."""
    umask(0o002)
    path = tmp_path / "plan.json"
    with atomic_write(path, only_owner_writes=True) as f:
        f.write("{}")
    assert mode(path) == 0o644
    os.chmod(path, 0o666)
    assert replacement_mode(path, only_owner_writes=True) == 0o644
    with atomic_write(path, only_owner_writes=True) as f:
        f.write("{}")
    assert mode(path) == 0o644


def test_a_plan_saved_under_a_group_umask_loads_again(tmp_path, umask):
    umask(0o002)
    y = _graph()
    path = tmp_path / "plan.json"
    tg.compile(y).save_plan(path)
    assert tg.compile(y, plan=path)(x=np.ones(2, np.float32)).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("writer, what, error", [
    ("tg.save", "file", SerializationError),
    ("save_plan", "plan file", PlanFileError),
    ("explain(html=)", "HTML report", SerializationError),
    ("trace", "trace file", SerializationError),
    ("atomic_write", "file", SerializationError),
])
def test_an_unwritable_path_names_the_file_and_the_fix(tmp_path, writer, what, error):
    folder = tmp_path / "adir"
    folder.mkdir()
    with pytest.raises(error, match=f"cannot write {what} {folder}: it is a directory; give "
                                    f"the path of a {what}"):
        WRITERS[writer](folder)
    missing = tmp_path / "nofolder" / "out.json"
    with pytest.raises(error, match=f"cannot write {what} {missing}: its folder "
                                    f"{missing.parent} does not exist; create the folder"):
        WRITERS[writer](missing)
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    with pytest.raises(error, match=f"{blocker} is not a folder"):
        WRITERS[writer](blocker / "out.json")
    if os.getuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        try:
            with pytest.raises(error, match="Permission denied; check that you may write"):
                WRITERS[writer](locked / "out.json")
        finally:
            os.chmod(locked, 0o700)
    assert sorted(os.listdir(tmp_path)) == ["adir", "afile", "locked"][:2 + (os.getuid() != 0)]


@pytest.mark.parametrize("writer, what, error", [
    ("tg.save", "file", SerializationError),
    ("save_plan", "plan file", PlanFileError),
    ("explain(html=)", "HTML report", SerializationError),
    ("atomic_write", "file", SerializationError),
    ("write_safetensors", "safetensors file", SerializationError),
])
def test_a_fifo_is_refused_not_replaced_by_a_file(tmp_path, writer, what, error):
    """The file was written aside and renamed over whatever the path was: a FIFO became a
    regular file, and as root `tg db export /dev/full` replaced the device node itself."""
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(error, match=f"cannot write {what} {fifo}: it is a FIFO \\(named "
                                    "pipe\\), which writing .* would replace"):
        WRITERS[writer](fifo)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and os.listdir(tmp_path) == ["pipe"]


def test_what_the_body_raises_passes_through_and_leaves_no_file(tmp_path):
    path = tmp_path / "out"
    with pytest.raises(OSError, match="the caller's own"):
        with atomic_write(path) as f:
            f.write("half")
            raise OSError("the caller's own")
    assert os.listdir(tmp_path) == []
