"""tg.kernels.load: a user's file of kernels is admitted only after verification."""

from __future__ import annotations

import importlib.util
import inspect
import os
import textwrap
from pathlib import Path

import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, KernelVerificationError, UntrustedPathError
from tensor_graphs.kernels import registry

GOOD = '''
import numpy as np
import tensor_graphs as tg

@tg.kernel("tanh", backend="numpy", name="user_tanh", dtypes=("float32", "float64"))
def user_tanh(x):
    """tanh in float64, rounded once."""
    return np.asarray(np.tanh(x.astype(np.float64))).astype(x.dtype)

@tg.kernel(lambda a, b, c: a * b + c, backend="numpy", name="user_fma")
def user_fma(a, b, c):
    return a * b + c
'''

MIXED = '''
import numpy as np
import tensor_graphs as tg

@tg.kernel("sigmoid", backend="numpy", name="user_sigmoid", dtypes=("float32",))
def user_sigmoid(x):
    with np.errstate(over="ignore"):
        return np.asarray(1 / (1 + np.exp(-x.astype(np.float64)))).astype(np.float32)

@tg.kernel("exp", backend="numpy", name="user_exp_wrong", dtypes=("float32",))
def user_exp_wrong(x):
    return np.exp(x) + np.float32(1e-3)  # off by 1e-3: must be rejected
'''


@pytest.fixture
def cleanup():
    before = set(registry._KERNELS)
    yield
    for name in set(registry._KERNELS) - before:
        registry.unregister(name)


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_load_admits_verified_kernels(tmp_path, cleanup):
    admitted = tg.kernels.load(write(tmp_path, "good.py", GOOD))
    assert [k.name for k in admitted] == ["user_tanh", "user_fma"]
    assert registry.get("user_tanh") is admitted[0]
    names = {k.name for k, _ in tg.kernels.matching(tg.tanh(tg.input("x", (4, 16))))}
    assert "user_tanh" in names
    assert tg.kernels.verify("user_fma").ok


def test_a_wrong_kernel_is_rejected_and_the_others_stay(tmp_path, cleanup):
    with pytest.raises(KernelVerificationError) as info:
        tg.kernels.load(write(tmp_path, "mixed.py", MIXED))
    err = info.value
    assert "user_exp_wrong" in str(err) and "relative error" in str(err)
    assert [r.kernel for r in err.reports] == ["user_exp_wrong"]
    assert [k.name for k in err.admitted] == ["user_sigmoid"]
    assert "user_exp_wrong" not in registry._KERNELS
    assert registry.get("user_sigmoid").backend == "numpy"


def test_loading_the_same_file_again_replaces_its_kernels(tmp_path, cleanup):
    path = write(tmp_path, "good.py", GOOD)
    first = tg.kernels.load(path)
    second = tg.kernels.load(path)
    assert registry.get("user_tanh") is second[0] and second[0] is not first[0]


def test_a_taken_name_is_refused(tmp_path, cleanup):
    clash = GOOD.replace('name="user_tanh"', 'name="numpy_tanh"')
    with pytest.raises(ArgumentError, match="numpy_tanh.*taken"):
        tg.kernels.load(write(tmp_path, "clash.py", clash))
    assert registry.get("numpy_tanh").fn.__module__.startswith("tensor_graphs.")
    assert "user_fma" not in registry._KERNELS  # nothing from that file is registered


def test_files_that_do_not_import(tmp_path, cleanup):
    with pytest.raises(ArgumentError, match="missing.py: no such kernel file"):
        tg.kernels.load(tmp_path / "missing.py")
    with pytest.raises(ArgumentError, match="is a directory, not a regular file"):
        tg.kernels.load(tmp_path)  # it said "no such file"
    with pytest.raises(ArgumentError, match="SyntaxError"):
        tg.kernels.load(write(tmp_path, "broken.py", "def f(:\n"))
    bad_pattern = "import tensor_graphs as tg\n@tg.kernel('no_such_op', backend='numpy')\n" \
                  "def f(x):\n    return x\n"
    with pytest.raises(ArgumentError, match="unknown op"):
        tg.kernels.load(write(tmp_path, "bad.py", bad_pattern))
    assert registry._PENDING is None  # registration works normally afterwards


# ----------------------------------------------------------------------------- trust
MARKS = '''
import pathlib
pathlib.Path({marker!r}).write_text("the file ran")
'''
ROOT = hasattr(os, "getuid") and os.getuid() == 0  # only root can give files away


def test_a_kernel_file_others_could_write_is_not_run(tmp_path, cleanup):
    marker = tmp_path / "ran"
    folder = tmp_path / "kernels"
    folder.mkdir()
    path = write(folder, "good.py", MARKS.format(marker=str(marker)) + GOOD)
    os.chmod(path, 0o666)
    with pytest.raises(UntrustedPathError, match="refusing to load kernel file .*good.py: it "
                       "is writable by group and others"):
        tg.kernels.load(path)
    os.chmod(path, 0o644)
    os.chmod(folder, 0o777)  # not sticky: another user could replace the file
    with pytest.raises(UntrustedPathError, match="its folder .*kernels is writable"):
        tg.kernels.load(path)
    os.chmod(folder, 0o755)
    if ROOT:
        os.chown(path, 12345, 12345)
        with pytest.raises(UntrustedPathError, match="owned by uid 12345"):
            tg.kernels.load(path)
    assert not marker.exists() and "user_tanh" not in registry._KERNELS


def test_a_planted_pycache_file_is_not_run(tmp_path, cleanup):
    # in a sticky shared folder (/tmp) another user can create __pycache__ and leave bytecode
    # that matches the source's size and time; the loader must compile the source it checked
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o1777)
    path = write(shared, "good.py", GOOD)
    marker = tmp_path / "ran"
    planted = compile(MARKS.format(marker=str(marker)) + textwrap.dedent(GOOD), str(path),
                      "exec")
    cached = Path(importlib.util.cache_from_source(str(path)))
    cached.parent.mkdir()
    st = path.stat()
    cached.write_bytes(importlib._bootstrap_external._code_to_timestamp_pyc(
        planted, st.st_mtime, st.st_size))
    if ROOT:
        for p in (cached, cached.parent):
            os.chown(p, 12345, 12345)
    admitted = tg.kernels.load(path)
    assert not marker.exists(), "the planted bytecode ran"
    assert [k.name for k in admitted] == ["user_tanh", "user_fma"]
    assert "def user_tanh" in inspect.getsource(registry.get("user_tanh").fn)
