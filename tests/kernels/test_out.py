"""The writes_out protocol: ``k.fn(*args, out=buf)`` fills ``buf`` and returns it (issue 6).

Registration rules, ``Kernel.__call__`` with ``out=``, verification of the contract (a kernel
that ignores ``out``, returns another array, leaves part of it unwritten or writes other
values fails), in-place kernels, and the backends' kernels that declare it.
"""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import ArgumentError
from tensor_graphs.kernels import registry
from tensor_graphs.kernels.verify import poisoned

make = registry.unregistered  # a kernel object the registry does not keep


def good_exp(x, *, out=None):
    with np.errstate(all="ignore"):
        return np.exp(x, out=out)


def test_registration_records_writes_out_and_out_is_not_an_attribute():
    k = make("exp", good_exp, dtypes=("float32", "float64"), writes_out=True)
    assert k.writes_out and k.attrs == ()
    plain = make("exp", lambda x: np.exp(x), dtypes=("float32",))
    assert not plain.writes_out

    def softmax_out(x, axis, *, out=None):
        return out

    k = make(lambda x: tg.softmax(x), softmax_out, writes_out=True)
    assert k.attrs == ("axis",)


def test_registration_errors():
    def no_out(x):
        return np.exp(x)

    with pytest.raises(ArgumentError, match="out= keyword"):
        make("exp", no_out, writes_out=True)

    def undeclared(x, out=None):
        return np.exp(x)

    with pytest.raises(ArgumentError, match="writes_out=True"):
        make("exp", undeclared)

    def view(x, shape, *, out=None):
        return x.reshape(shape)

    with pytest.raises(ArgumentError, match="view"):
        make("reshape", view, view=True, writes_out=True)


def test_call_with_out_writes_into_it_and_returns_it():
    k = make("exp", good_exp, dtypes=("float32",), writes_out=True)
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    buf = poisoned((3, 4), np.dtype(np.float32))
    assert np.isnan(buf).all()
    got = k(x, out=buf)
    assert got is buf
    np.testing.assert_array_equal(buf, np.exp(x))
    fresh = k(x)
    assert fresh is not buf and np.array_equal(fresh, buf)
    with pytest.raises(ArgumentError, match="C-contiguous"):
        k(x, out=np.empty((4, 3), np.float32).T)
    plain = make("exp", lambda x: np.exp(x), dtypes=("float32",))
    with pytest.raises(ArgumentError, match="writes_out"):
        plain(x, out=buf)


def test_poisoned_buffers():
    assert np.isnan(poisoned((2, 3), np.dtype(np.float16))).all()
    assert np.isnan(poisoned((), np.dtype(np.float64)))
    assert (poisoned((5,), np.dtype(np.int32)) == -1).all()
    assert (poisoned((5,), np.dtype(np.uint8)) == 255).all()
    assert poisoned((4,), np.dtype(np.bool_)).view(np.uint8).tolist() == [255] * 4
    bf16 = tg.bfloat16.np_dtype
    assert np.isnan(poisoned((3,), bf16).astype(np.float32)).all()


def test_a_correct_out_kernel_passes():
    report = tg.kernels.verify(make("exp", good_exp, dtypes=("float32", "float64"),
                                    writes_out=True), seed=0)
    assert report.ok, str(report)


def _fails(k, expected: str):
    report = tg.kernels.verify(k, seed=3)
    assert not report.ok
    assert any(expected in f for f in report.failures), report.failures


def test_a_kernel_that_ignores_out_fails():
    def ignores_out(x, *, out=None):
        return np.exp(x)

    _fails(make("exp", ignores_out, dtypes=("float32",), writes_out=True),
           "returned a different ndarray")


def test_a_kernel_that_returns_a_different_array_fails():
    def copies_out(x, *, out=None):
        if out is None:
            return np.exp(x)
        np.exp(x, out=out)
        return out.copy()  # the right values, but not out itself

    _fails(make("exp", copies_out, dtypes=("float32",), writes_out=True),
           "returned a different ndarray")

    def view_of_out(x, *, out=None):
        if out is None:
            return np.exp(x)
        np.exp(x, out=out)
        return out[...]

    _fails(make("exp", view_of_out, dtypes=("float32",), writes_out=True),
           "returned a different ndarray")


def test_a_kernel_that_half_writes_out_fails():
    def half(x, *, out=None):
        if out is None:
            return np.exp(x)
        flat = out.reshape(-1)
        flat[: flat.size // 2] = np.exp(x.reshape(-1)[: flat.size // 2])
        return out

    _fails(make("exp", half, dtypes=("float32",), writes_out=True), "other values")


def test_a_kernel_whose_out_result_differs_fails():
    def off(x, *, out=None):
        if out is None:
            return np.exp(x)
        np.exp(x, out=out)
        out *= np.float32(1 + 1e-6)  # within tolerance, but not what the plain call returns
        return out

    _fails(make("exp", off, dtypes=("float32",), writes_out=True), "other values")


def test_a_kernel_that_writes_its_input_through_out_fails():
    def scribbles(x, *, out=None):
        result = np.exp(x)
        if out is None:
            return result
        x.reshape(-1)[:1] = 0  # writes an input (only on the out path)
        out[...] = result
        return out

    k = make("exp", scribbles, dtypes=("float32",), writes_out=True, contiguous=True)
    report = tg.kernels.verify(k, seed=4)
    assert not report.ok
    assert any("modified its input" in f for f in report.failures), report.failures


def test_inplace_kernels_are_checked_with_out_as_their_input():
    def relu_inplace(x, *, out=None):
        if out is None:
            return np.maximum(x, 0)
        return np.maximum(x, 0, out=out)

    k = make("relu", relu_inplace, dtypes=("float32",), inplace=0, writes_out=True)
    report = tg.kernels.verify(k, seed=0)
    assert report.ok, str(report)

    def clobbers_first(x, *, out=None):  # zeroes out before reading x: wrong in place
        if out is None:
            return np.maximum(x, 0)
        out.fill(0)
        return np.maximum(x, 0, out=out)

    k = make("relu", clobbers_first, dtypes=("float32",), inplace=0, writes_out=True)
    _fails(k, "passed as that input")


def test_every_c_kernel_writes_out_and_no_view_kernel_does():
    for k in tg.kernels.all():
        if k.backend == "c":
            assert k.writes_out, k.name
        if k.view:
            assert not k.writes_out, k.name
        if k.device == "cuda":
            assert not k.writes_out, k.name



def test_torch_cpu_kernels_fill_a_numpy_buffer_through_a_tensor_view():
    pytest.importorskip("torch")
    bf16 = tg.bfloat16.np_dtype
    add = tg.kernels.get("torch_add")
    assert add.writes_out
    a = np.arange(6, dtype=np.float32).reshape(2, 3).astype(bf16)
    b = np.ones(3, dtype=np.float32).astype(bf16)
    buf = poisoned((2, 3), bf16)
    assert add(a, b, out=buf) is buf
    np.testing.assert_array_equal(buf.astype(np.float32), (a.astype(np.float32) + 1))
    flags = np.array([True, False])
    buf = poisoned((2,), np.dtype(np.bool_))
    assert add(flags, flags[::-1].copy(), out=buf) is buf and buf.tolist() == [True, True]
