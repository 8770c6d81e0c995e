"""tg.kernels.load: a user's file of kernels is admitted only after verification."""

from __future__ import annotations

import textwrap

import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError, KernelVerificationError
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
    with pytest.raises(ArgumentError, match="no such file"):
        tg.kernels.load(tmp_path / "missing.py")
    with pytest.raises(ArgumentError, match="SyntaxError"):
        tg.kernels.load(write(tmp_path, "broken.py", "def f(:\n"))
    bad_pattern = "import tensor_graphs as tg\n@tg.kernel('no_such_op', backend='numpy')\n" \
                  "def f(x):\n    return x\n"
    with pytest.raises(ArgumentError, match="unknown op"):
        tg.kernels.load(write(tmp_path, "bad.py", bad_pattern))
    assert registry._PENDING is None  # registration works normally afterwards
