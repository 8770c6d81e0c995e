"""C scaled dot-product attention (float32): plain and tiled flash-style, causal, GQA, mask.

Inputs are (batch, heads, seq, dim) or (heads, seq, dim), read through their batch, head and
row strides (only the last axis must be dense), so a KV cache's active prefix or heads permuted
out of a projection are never copied first; k/v may have fewer heads than q (grouped-query
attention); the mask (float32 added, or bool: True = attend, read as bytes, never converted
to a float copy per call) broadcasts to (batch, heads, Sq, Sk) and is read through strides
(never expanded). Eight kernels cover {plain, flash} x {no mask, mask} x {not causal, causal},
any ``scale``. K and V are packed once per call into 16-wide panels (V is read in place with
AVX-512 and a value dim that is a multiple of 32) and both products run on register-blocked
micro-kernels, OpenMP over (batch, head, block of <= 66 query rows), or over kv heads when there
are at least 8 per thread (each task packs its head's K into the thread's own buffer); see
attention.c.
``c_flash_attention*`` tiles the keys in blocks of ``FLASH_BLOCK`` with an online softmax and
never holds more than 66 x FLASH_BLOCK scores per thread, for long sequences; the plain one
keeps 66 x Sk. Each writes into ``out=`` when given one
(``writes_out``: see the registry).

``*_bshd`` (eight more): ``permute(attention, (0, 2, 1, 3))`` with the result written as
(batch, seq, heads, dim), so the reshape to (batch, seq, heads * dim) that a transformer block
does next is a view, not a copy (a copy keeps a program out of the native loop). They see only
the permute's attributes, so the attention's are pinned in the pattern: ``is_causal`` per kernel
and ``scale`` at its default (None, 1/sqrt(dim)).
"""

from __future__ import annotations

import ctypes
import math

import numpy as np

from tensor_graphs.errors import TensorGraphsError
from tensor_graphs.kernels.c import lib
from tensor_graphs.kernels.c.lib import F32, I32, I64, P, ptr
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.rewrite import pattern as pat

LIB = "attention"
SOURCE = lib.source(LIB)
FLASH_BLOCK = 256  # keys per block: one block up to GPT-2's 128-256 tokens, L2-sized tiles


def _fits(has_mask: bool, causal: bool, heads_last: bool = False):
    def fits(shapes, dtypes, attrs):
        if bool(attrs.get("is_causal", causal)) != causal:
            return f"this kernel is for is_causal={causal}"
        reason = lib.failure(LIB)
        if reason is not None:
            return reason
        if any(d.name != "float32" for d in dtypes[:3]):
            return f"q, k, v must be float32, got {', '.join(d.name for d in dtypes[:3])}"
        if has_mask and dtypes[3].name not in ("float32", "bool"):
            return f"attn_mask must be float32 (added) or bool (True = attend), got " \
                f"{dtypes[3].name}"
        q, k, v = (tuple(s) for s in shapes[:3])
        if len(q) not in ((4,) if heads_last else (3, 4)) or len(k) != len(q) \
                or len(v) != len(q):
            return f"q, k, v must all be rank {'4' if heads_last else '3 or all rank 4'}, got " \
                f"{q}, {k}, {v}"
        if not (q[:-3] == k[:-3] == v[:-3]):
            return f"q, k, v need equal batch dims (no broadcasting), got {q}, {k}, {v}"
        hq, sq, d = q[-3:]
        hkv, sk, dk = k[-3:]
        if v[-3] != hkv or v[-2] != sk:
            return f"k and v need the same heads and sequence length, got {k}, {v}"
        if dk != d:
            return f"q and k need the same head dim, got {q}, {k}"
        if hkv == 0 or hq % hkv:
            return f"q heads ({hq}) must be a multiple of k/v heads ({hkv})"
        if sk == 0 or d == 0:
            return "needs at least one key and a non-empty head dim"
        if has_mask:
            m = tuple(shapes[3])
            full = q[:-1] + (sk,)
            try:
                ok = len(m) <= len(full) and np.broadcast_shapes(m, full) == full
            except ValueError:
                ok = False
            if not ok:
                return f"attn_mask {m} must broadcast to the scores' shape {full}"
        return True

    return fits


def _rows(x: np.ndarray) -> np.ndarray:
    """``x`` itself when its last axis is dense (the kernel reads the others by stride)."""
    if (x.strides[-1] == x.itemsize or x.shape[-1] == 1) and x.dtype == np.float32:
        return x
    return np.ascontiguousarray(x, np.float32)


def attention(q, k, v, mask=None, causal=False, flash=False, block=FLASH_BLOCK, out=None,
              scale=None, heads_last=False):
    """The attention of (batch, heads, seq, dim) (or (heads, seq, dim)) inputs into ``out``;
    ``heads_last``: the result written as (batch, seq, heads, dim) (rank 4 only), the layout of
    ``permute(attention, (0, 2, 1, 3))``."""
    rank3 = q.ndim == 3
    q4, k4, v4 = (_rows(x[None] if rank3 else x) for x in (q, k, v))
    b, hq, sq, d = q4.shape
    hkv, sk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    if heads_last:  # (b, sq, hq, dv): strides of batch, head and row
        out = lib.output(out, (b, sq, hq, dv), np.float32)
        out_strides = (sq * hq * dv, dv, hq * dv)
    else:
        out = lib.output(out, q.shape[:-1] + (dv,), np.float32)  # (b,) hq, sq, dv
        out_strides = (hq * sq * dv, sq * dv, dv)
    strides = (ctypes.c_int64 * 5)(0, 0, 0, 0, 0)
    mask_ptr = None
    if mask is not None:  # a bool mask is read as bytes (True = attend: 0 added, else -inf)
        full = np.broadcast_to(mask, q.shape[:-1] + (sk,))
        if rank3:
            full = full[None]
        strides = (ctypes.c_int64 * 5)(*(s // full.itemsize for s in full.strides),
                                       int(mask.dtype == np.bool_))
        mask_ptr = ptr(full)
    qkv = (ctypes.c_int64 * 12)(*(s // 4 for x in (q4, k4, v4) for s in x.strides[:3]),
                                *out_strides)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    args = [ptr(q4), ptr(k4), ptr(v4), mask_ptr, strides, qkv, ptr(out),
            b, hq, hkv, sq, sk, d, dv, scale, int(causal)]
    strides_t = ctypes.POINTER(ctypes.c_int64)
    types = [P, P, P, P, strides_t, strides_t, P, I64, I64, I64, I64, I64, I64, I64, F32, I32]
    if flash:
        fn = lib.func(LIB, "tg_flash_attention_f32", *types, I64)
        args.append(block)
    else:
        fn = lib.func(LIB, "tg_attention_f32", *types)
    fn.restype = ctypes.c_int
    if fn(*args) != 0:
        raise TensorGraphsError("C attention: out of memory for its K/V copies")
    return out


def _heads_last_signatures(has_mask: bool):
    """Verification cases of the permuted kernels: rank 4, GQA, masks of several broadcasts."""
    table = [((1, 4, 7, 8), (1, 2, 33, 8), ((7, 33), "bool")),
             ((2, 2, 1, 4), (2, 2, 1, 4), ((2, 1, 1, 1), "float32")),
             ((1, 1, 7, 16), (1, 1, 1025, 16), ((7, 1025), "bool")),
             ((1, 2, 33, 8), (1, 2, 33, 8), ((33, 33), "float32")),
             ((1, 3, 129, 64), (1, 3, 129, 64), ((1, 1, 129, 129), "bool"))]
    out = []
    for q, kv, mask in table:
        sig = {"q": q, "k": kv, "v": kv}
        if has_mask:
            sig["attn_mask"] = mask
        out.append(sig)
    return out


def _register(flash: bool, has_mask: bool, causal: bool, heads_last: bool = False):
    name = "c_" + ("flash_" if flash else "") + "attention" + ("_mask" if has_mask else "") + \
        ("_causal" if causal else "") + ("_bshd" if heads_last else "")
    names = ("q", "k", "v", "attn_mask") if has_mask else ("q", "k", "v")
    signatures = None
    if heads_last:
        # permute(attention, (0, 2, 1, 3)): the result written as (batch, seq, heads, dim), so
        # the reshape to (batch, seq, heads * dim) that follows in a transformer is a view. The
        # kernel sees only the root's (the permute's) attributes, so the attention's are fixed
        # in the pattern: is_causal, and scale left at its default (None: 1/sqrt(dim)).
        inner = {"is_causal": causal, "scale": _default_scale}
        if not has_mask:
            inner["args"] = names
        pattern = pat.OpPat("permute", (pat.OpPat("scaled_dot_product_attention",
                                                  tuple(pat.var(n) for n in names), inner),),
                            {"perm": (0, 2, 1, 3)})
        signatures = _heads_last_signatures(has_mask)

        if has_mask:
            def run(q, k, v, attn_mask, *, out=None):
                return attention(q, k, v, attn_mask, causal, flash, out=out, heads_last=True)
        else:
            def run(q, k, v, *, out=None):
                return attention(q, k, v, None, causal, flash, out=out, heads_last=True)
    # the op with its attributes free (scale any value; is_causal checked by ``where``)
    elif has_mask:
        pattern = "scaled_dot_product_attention"

        def run(q, k, v, attn_mask, is_causal=causal, scale=None, *, out=None):
            return attention(q, k, v, attn_mask, causal, flash, out=out, scale=scale)
    else:
        pattern = pat.OpPat("scaled_dot_product_attention",
                            tuple(pat.var(n) for n in names), {"args": names})

        def run(q, k, v, is_causal=causal, scale=None, *, out=None):
            return attention(q, k, v, None, causal, flash, out=out, scale=scale)

    run.__doc__ = ((f"tiled flash-style (online softmax, 66 x {FLASH_BLOCK} blocks)" if flash
                    else "plain (66 query rows x all keys)") + " attention" +
                   (", mask (float added, bool True = attend)" if has_mask else "") +
                   (", causal" if causal else "") +
                   (", written as (batch, seq, heads, dim), default scale" if heads_last
                    else ", GQA, any scale"))
    run.source_text = SOURCE + f"\n/* {name} */"
    return kernel(pattern, backend="c", name=name, where=_fits(has_mask, causal, heads_last),
                  tolerance=1e-5, writes_out=True, signatures=signatures)(run)


class _DefaultScale:
    """A pattern predicate: the attention's ``scale`` is its default (None: 1/sqrt(dim));
    shown as ``default`` (docs/kernels.md prints patterns)."""

    def __call__(self, scale) -> bool:
        return scale is None

    def __repr__(self) -> str:
        return "default"


_default_scale = _DefaultScale()


for _flash in (False, True):
    for _mask in (False, True):
        for _causal in (False, True):
            for _heads_last in (False, True):
                _register(_flash, _mask, _causal, _heads_last)
