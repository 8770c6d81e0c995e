"""C scaled dot-product attention (float32): plain and tiled flash-style, causal, GQA, mask.

Inputs are (batch, heads, seq, dim) or (heads, seq, dim), read through their batch, head and
row strides (only the last axis must be dense), so a KV cache's active prefix or heads permuted
out of a projection are never copied first; k/v may have fewer heads than q (grouped-query
attention); the mask (float32 added, or bool: True = attend, read as bytes, never converted
to a float copy per call) broadcasts to (batch, heads, Sq, Sk) and is read through strides
(never expanded). Eight kernels cover
{plain, flash} x {no mask, mask} x {not causal, causal}; ``scale`` must be the default
1/sqrt(dim) (the pattern says so). K and V are packed once per call into 16-wide panels and
both products run on register-blocked 6 x 16 micro-kernels, OpenMP over (batch, head, block of
<= 66 query rows); see attention.c. ``c_flash_attention*`` tiles the keys in blocks of
``FLASH_BLOCK`` with an online softmax and never holds more than 66 x FLASH_BLOCK scores per
thread, for long sequences; the plain one keeps 66 x Sk. Each writes into ``out=`` when given one
(``writes_out``: see the registry).
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


def _fits(has_mask: bool, causal: bool):
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
        if len(q) not in (3, 4) or len(k) != len(q) or len(v) != len(q):
            return f"q, k, v must all be rank 3 or all rank 4, got {q}, {k}, {v}"
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
              scale=None):
    rank3 = q.ndim == 3
    q4, k4, v4 = (_rows(x[None] if rank3 else x) for x in (q, k, v))
    b, hq, sq, d = q4.shape
    hkv, sk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    out = lib.output(out, q.shape[:-1] + (dv,), np.float32)  # (b,) hq, sq, dv
    strides = (ctypes.c_int64 * 5)(0, 0, 0, 0, 0)
    mask_ptr = None
    if mask is not None:  # a bool mask is read as bytes (True = attend: 0 added, else -inf)
        full = np.broadcast_to(mask, q.shape[:-1] + (sk,))
        if rank3:
            full = full[None]
        strides = (ctypes.c_int64 * 5)(*(s // full.itemsize for s in full.strides),
                                       int(mask.dtype == np.bool_))
        mask_ptr = ptr(full)
    qkv = (ctypes.c_int64 * 9)(*(s // 4 for x in (q4, k4, v4) for s in x.strides[:3]))
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


def _register(flash: bool, has_mask: bool, causal: bool):
    name = "c_" + ("flash_" if flash else "") + "attention" + ("_mask" if has_mask else "") + \
        ("_causal" if causal else "")
    # the op with its attributes free (scale any value; is_causal checked by ``where``)
    if has_mask:
        pattern = "scaled_dot_product_attention"

        def run(q, k, v, attn_mask, is_causal=causal, scale=None, *, out=None):
            return attention(q, k, v, attn_mask, causal, flash, out=out, scale=scale)
    else:
        pattern = pat.OpPat("scaled_dot_product_attention",
                            tuple(pat.var(n) for n in ("q", "k", "v")), {"args": ("q", "k", "v")})

        def run(q, k, v, is_causal=causal, scale=None, *, out=None):
            return attention(q, k, v, None, causal, flash, out=out, scale=scale)

    run.__doc__ = ((f"tiled flash-style (online softmax, 66 x {FLASH_BLOCK} blocks)" if flash
                    else "plain (66 query rows x all keys)") + " attention" +
                   (", mask (float added, bool True = attend)" if has_mask else "") +
                   (", causal" if causal else "") + ", GQA, any scale")
    run.source_text = SOURCE + f"\n/* {name} */"
    kernel(pattern, backend="c", name=name, where=_fits(has_mask, causal), tolerance=1e-5,
           writes_out=True)(run)


for _flash in (False, True):
    for _mask in (False, True):
        for _causal in (False, True):
            _register(_flash, _mask, _causal)
