"""The int8-dynamic kernels (``quant_dyn.c``) and the int8 packers stay inside their buffers
(issue 23: a benchmark run with the grouped kernels uncommitted aborted in malloc). An overrun
that lands in a neighbour's memory shows only later, in malloc or another array; here each
output sits between guard values checked after the call, so one is caught without
AddressSanitizer, on the sizes where the edge code runs: rows past a 6-row tile, columns past
a 16-column panel and a 64-column task, K not a multiple of 4 or of a 32-row block, on every
instruction path this CPU runs and on 1 and 2 threads. (The same cases under ASan:
``TG_C_SANITIZE=address``, docs/ARCHITECTURE.md "C backend".)"""

import itertools

import numpy as np
import pytest

import tensor_graphs  # noqa: F401  (before numpy's pools start: its thread settings)
from tensor_graphs import threads
from tensor_graphs.errors import ShapeError
from tensor_graphs.kernels.c import build, lib, quant
from tensor_graphs.kernels.c import quant_dyn as qd
from tensor_graphs.kernels.c.lib import I64, P

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")

PATHS = [name for name in qd.ISAS if build.available() and qd.supported(name)]
GUARD = 64  # float32 values each side of an output
SENTINEL = np.float32(-7.25e33)


def _between_guards(shape, dtype, fill):
    """A C-contiguous array of ``shape`` inside a larger one, GUARD values of ``fill`` each
    side; returns (the whole buffer, the array)."""
    size = int(np.prod(shape))
    buf = np.full(size + 2 * GUARD, fill, dtype)
    return buf, buf[GUARD:GUARD + size].reshape(shape)


def _guards_intact(buf, fill) -> bool:
    return bool((buf[:GUARD] == fill).all() and (buf[-GUARD:] == fill).all())


def _reference(a, q, s, group):
    """dynamic_quant(a, group) @ dequantize(q, s) in float64 (no ties in random data)."""
    m, k = a.shape
    rows = a.astype(np.float64).reshape(m, k // (group or k), -1)
    top = np.abs(rows).max(-1, keepdims=True)
    scale = np.where(top > 0, top / 127.0, 1.0)
    qa = (np.clip(np.round(rows / scale), -127, 127) * scale).reshape(m, k)
    return qa @ (q * np.repeat(s.astype(np.float64), k // s.shape[0], axis=0))


def _schemes(k):
    """(activation group, weight scale rows) the kernels take for this K: per row x per
    column, and where K allows groups of 32 / 64 against scales per 32 / 64 / 96 rows."""
    out = [(0, 1)]
    for group, ng in itertools.product((0, 32, 64), (1, k // 32, k // 64, k // 96)):
        gw = k // ng if ng else 0
        if (group, ng) == (0, 1) or not ng or k % ng or (group and k % group):
            continue
        small, big = sorted((group or k, gw))
        if small % 32 == 0 and big % small == 0 and (group, ng) not in out:
            out.append((group, ng))
    return out


@pytest.mark.parametrize("nt", [1, 2])
@pytest.mark.parametrize("path", PATHS)
def test_outputs_stay_between_their_guards(path, nt):
    """Every write lands in the output, and the output is the reference's (the guards and the
    result checked after each call)."""
    rng = np.random.default_rng(17 + nt)
    before = threads.get_num_threads()
    threads.set_num_threads(nt)
    try:
        with threads.full_team():  # 2 threads even while the machine is busy
            for m, n, k in itertools.product((1, 7, 13, 100), (1, 17, 65, 100),
                                             (1, 33, 64, 96, 160, 192)):
                for group, rows in _schemes(k):
                    a = rng.standard_normal((m, k)).astype(np.float32)
                    q = rng.integers(-128, 128, (k, n), dtype=np.int8)
                    s = (rng.random((rows, n)) * 0.01 + 1e-3).astype(np.float32)
                    res = rng.standard_normal((m, n)).astype(np.float32)
                    buf, out = _between_guards((m, n), np.float32, SENTINEL)
                    qd.gemm(a, qd.pack(q), s, bias=np.ones(n, np.float32), act="relu", out=out,
                            res=res, path=qd.ISAS[path], group=group)
                    case = (path, nt, m, k, n, group, s.shape)
                    assert _guards_intact(buf, SENTINEL), case
                    ref = np.maximum(_reference(a, q, s, group) + 1.0, 0.0) + res
                    err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
                    assert err < 1e-5, (case, err)
    finally:
        threads.set_num_threads(before)


@pytest.mark.parametrize("library, symbol, size", [
    ("quant_dyn", "tg_q8d_pack", qd.packed_bytes), ("quant", "tg_q8_pack", quant.packed_bytes)])
def test_packers_stay_within_their_size(library, symbol, size):
    """The C packers write ``size(K, N)`` bytes and no more, and read a weight through
    negative, transposed and zero strides as through its contiguous copy."""
    rng = np.random.default_rng(3)
    pack = lib.func(library, symbol, P, I64, I64, I64, I64, P)
    for k, n in itertools.product((1, 3, 33, 65, 100), (1, 3, 17, 33, 100)):
        base = rng.integers(-128, 128, (k, n), dtype=np.int8)
        for view in (base, base[::-1], base[:, ::-1], base[::-1, ::-1],
                     np.ascontiguousarray(base.T).T, np.broadcast_to(base[:1], (k, n))):
            want = quant.pack_int8(np.ascontiguousarray(view), library, symbol, size)
            nbytes = size(k, n)
            # the packed buffer 64-byte aligned (its vector loads), guard bytes after it
            raw = np.full(nbytes + 2 * GUARD + 64, 0x5A, np.int8)
            start = GUARD + (-(raw.ctypes.data + GUARD) % 64)
            pack(view.ctypes.data, k, n, view.strides[0], view.strides[1],
                 raw.ctypes.data + start)
            assert (raw[:start] == 0x5A).all() and (raw[start + nbytes:] == 0x5A).all(), \
                (library, k, n, view.strides)
            assert np.array_equal(raw[start:start + nbytes], want), (library, k, n,
                                                                     view.strides)


def test_scale_rows_that_do_not_divide_k_are_refused():
    """K = 1088 with 33 rows of weight scales: k // 33 = 32 passes the C side's group checks,
    which then read a 34th row past ``s`` (AddressSanitizer: heap-buffer-overflow on the
    AVX2 and portable paths; a silently wrong result on AVX-512, whose masked load it does not
    see). The call is refused before it reaches C."""
    k, n = 1088, 5
    a = np.ones((2, k), np.float32)
    packed = qd.pack(np.ones((k, n), np.int8))
    with pytest.raises(ShapeError, match=r"\(33, 5\) for K = 1088"):
        qd.gemm(a, packed, np.ones((33, n), np.float32))
    # 34 rows (one per 32 of K) is the grouped product itself
    np.testing.assert_allclose(qd.gemm(a, packed, np.ones((34, n), np.float32)), float(k))


def test_packed_sizes_agree_with_the_c_layout():
    """``packed_bytes`` (memory accounting) is the size tg_q8d_pack writes (``pack`` allocates
    by the C side's own size, so a drift cannot overrun the heap, but the accounting would be
    wrong)."""
    for k, n in itertools.product((1, 3, 4, 31, 32, 33, 1024, 1025), (1, 15, 16, 17, 1000)):
        assert qd.packed_bytes(k, n) == qd._c_packed_bytes(k, n), (k, n)
        assert qd.pack(np.zeros((k, n), np.int8)).nbytes == qd.packed_bytes(k, n)
