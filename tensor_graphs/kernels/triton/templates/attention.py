"""Attention kernels from ``attention_jit.py``: flash attention and split-K decode attention.

Patterns: ``scaled_dot_product_attention(q, k, v)`` and ``(q, k, v, attn_mask)``, as the
torch CUDA kernels declare them; attributes ``is_causal`` and ``scale``. q, k, v are
(batch, heads, seq, dim) or (heads, seq, dim) of one float dtype with head dims up to 128
(what one program keeps in registers and shared memory); the mask is bool or float and
broadcasts to the scores (batch, heads, Sq, Sk) (an expanded view: stride 0, never copied).

- ``triton_flash_attention*``: a program per (block of query rows, batch x head), looping over
  key blocks (up to the diagonal when causal); the programs on grid axis 0 (CUDA's axes 1 and
  2 stop at 65535 blocks).
- ``triton_decode_attention*``: only for one query row (Sq == 1, a decode step). A program
  per (batch x kv head, split of the keys) takes the G query heads that share the kv head as
  the rows of its tiles (grouped-query attention reads each K/V block once for all G), and the
  last split of a kv head to finish combines the splits' partial softmaxes (counted in
  ``arrival_counters``; a second kernel does it where no counters can be made, inside a CUDA
  graph's capture), as the GEMV's last split adds its parts: on an H200 the combine kernel
  took 1.4 us per layer and token beside the split's 5.3. The number of splits aims at two
  waves of an H100's 132 SMs, up to the config's limit.

fp32 operands multiply in full fp32 ("ieee"): TF32 scores would put errors of ~1e-3 x |score|
into the exponent, 9% on logits of 88, so there is no TF32 variant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tensor_graphs.kernels.registry import Occupancy, kernel
from tensor_graphs.kernels.triton.templates.chain import Prepared, chained
from tensor_graphs.kernels.triton.templates.runtime import (
    PROGRAMS,
    REDUCTION,
    arrival_counters,
    deliver,
    float_dtypes,
    grid_fits,
    interpreted,
    ints,
    jit,
    next_power_of_2,
    pdl,
    source_text,
    target,
    torch,
)
from tensor_graphs.rewrite import pattern as pat

JIT = "attention_jit"
SDPA = "scaled_dot_product_attention"
MAX_HEAD_DIM = 128
PRECISION = "ieee"
TF32 = {"ieee": False, "tf32": True}  # a precision as a chain stage's flag (chain_jit.A_TF32)
NO_MASK, BOOL_MASK, FLOAT_MASK = 0, 1, 2  # attention_jit's MASK codes
COMBINE_WARPS = 4


@dataclass(frozen=True)
class Flash:
    block_m: int
    block_n: int
    warps: int
    stages: int

    @property
    def label(self) -> str:
        return f"m{self.block_m}n{self.block_n}"


@dataclass(frozen=True)
class Decode:
    block_n: int
    max_splits: int
    warps: int
    stages: int

    @property
    def label(self) -> str:
        return f"n{self.block_n}s{self.max_splits}"


FLASH_CONFIGS = (
    Flash(64, 64, 4, 2),  # short sequences, many heads: more programs
    Flash(128, 64, 8, 2),  # prefill: a taller query block per program reuses each K/V block
)
DECODE_CONFIGS = (
    Decode(64, 16, 4, 2),  # a few hundred keys: small chunks, up to 16 splits
    Decode(128, 64, 4, 2),  # long caches: larger chunks, up to 64 splits
)


# ---------------------------------------------------------------------------- shapes
def _as_4d(q, k, v, mask):
    """(q, k, v, mask) as (B, H, S, D) views; the mask expanded to the scores' shape (stride 0
    where it broadcasts), bool viewed as uint8, None when absent."""
    three = q.dim() == 3
    scores = tuple(q.shape[:-1]) + (k.shape[-2],)
    if mask is not None:
        mask = mask.expand(scores)
        if mask.dtype == torch.bool:
            mask = mask.view(torch.uint8)
    if three:
        q, k, v = q[None], k[None], v[None]
        mask = None if mask is None else mask[None]
    return q, k, v, mask


def _mask_code(mask) -> int:
    if mask is None:
        return NO_MASK
    return BOOL_MASK if mask.dtype == torch.uint8 else FLOAT_MASK


def _scale(scale, d: int) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _blocks(d: int, dv: int) -> tuple[int, int]:
    return max(16, next_power_of_2(d)), max(16, next_power_of_2(dv))


def flash(cfg: Flash, q, k, v, mask, is_causal, scale, out=None):
    """softmax(q k^T * scale + mask) v with the flash template."""
    shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    o = target(shape, q, out)
    q4, k4, v4, m4 = _as_4d(q, k, v, mask)
    b, h, sq, d = q4.shape
    hkv, sk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
    if o.numel():
        o4 = o.view(b, h, sq, dv)
        mm = o4 if m4 is None else m4
        block_d, block_dv = _blocks(d, dv)
        grid = (-(-sq // cfg.block_m) * b * h,)
        jit(JIT).flash[grid](
            q4, k4, v4, mm, o4, h, h // hkv, sq, sk, d, dv, _scale(scale, d),
            *q4.stride(), *k4.stride(), *v4.stride(), *mm.stride(), *o4.stride(),
            MASK=_mask_code(m4), CAUSAL=bool(is_causal), PRECISION=PRECISION,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d, BLOCK_DV=block_dv,
            num_warps=cfg.warps, num_stages=cfg.stages)
    return deliver(o, out)


def splits_for(cfg: Decode, sk: int, programs: int) -> tuple[int, int]:
    """(splits, keys per split): enough splits for ``PROGRAMS`` programs in all, at most the
    config's, each a whole number of key blocks and none empty."""
    blocks = max(1, -(-sk // cfg.block_n))
    want = max(1, min(cfg.max_splits, blocks, -(-PROGRAMS // max(1, programs))))
    chunk = -(-blocks // want) * cfg.block_n
    return max(1, -(-sk // chunk)), chunk


def split_block(cfg: Decode) -> int:
    """The combine kernel's block over splits: every split of the config at once."""
    return max(2, next_power_of_2(cfg.max_splits))


class _DecodeCall:
    """What a decode attention's launch passes its kernel, for ``decode_split`` alone or as a
    stage of a persistent chain (``chain.py``): the runtime arguments in ``decode_split``'s
    order and the constexprs. ``o``: the result (B, H, 1, DV) has elements."""

    def __init__(self, cfg: Decode, q, k, v, mask, is_causal, scale, o, append, counters):
        q4, k4, v4, m4 = _as_4d(q, k, v, mask)
        b, h, _, d = q4.shape
        hkv, sk, dv = k4.shape[1], k4.shape[2], v4.shape[3]
        if append is not None:
            kn, vn, rows = _new_rows(append)
            new = (kn, vn, rows, kn.shape[2], *kn.stride(), *vn.stride())
        else:  # (unread: APPEND is off)
            new = (q4, q4, q4, 0) + (0,) * 8
        o4 = self.o4 = o.view(b, h, 1, dv)
        mm = o4 if m4 is None else m4
        self.heads, self.h, self.dv = b * hkv, h, dv
        self.splits, chunk = splits_for(cfg, sk, b * hkv)
        rows = b * h * self.splits  # one scratch allocation: max, sum, then outputs per split
        part = torch.empty(rows * (dv + 2), dtype=torch.float32, device=q.device)
        self.parts = part[:rows], part[rows:2 * rows], part[2 * rows:]
        block_d, block_dv = _blocks(d, dv)
        self.counters = counters(b * hkv)
        self.pointers = (q4, k4, v4, mm, *self.parts, o4,
                         part if self.counters is None else self.counters, *new[:3])
        self.sizes = (hkv, h // hkv, sk, d, dv, chunk, _scale(scale, d), new[3])
        self.strides = (q4.stride(0), q4.stride(1), q4.stride(3), *k4.stride(), *v4.stride(),
                        mm.stride(0), mm.stride(1), mm.stride(3), o4.stride(0), o4.stride(1),
                        o4.stride(3), *new[4:])
        self.constexprs = dict(
            MASK=_mask_code(m4), CAUSAL=bool(is_causal), PRECISION=PRECISION,
            BLOCK_G=max(16, next_power_of_2(h // hkv)), BLOCK_N=cfg.block_n,
            BLOCK_D=block_d, BLOCK_DV=block_dv, LAST_COMBINES=self.counters is not None,
            BLOCK_S=split_block(cfg), APPEND=append is not None)

    def stage(self) -> tuple:
        """The stage tuple of a chain (``chain_jit._decode_stage``)."""
        return (*self.pointers, *self.sizes, self.heads, self.splits, *self.strides)

    def stage_constexprs(self) -> tuple:
        """The stage's constexprs, in ``chain_jit``'s order (no prefetch: no weights)."""
        c = self.constexprs
        return (1, False, c["MASK"], c["CAUSAL"], TF32[c["PRECISION"]], c["BLOCK_G"], c["BLOCK_N"],
                c["BLOCK_D"], c["BLOCK_DV"], c["BLOCK_S"], c["APPEND"])


def decode(cfg: Decode, q, k, v, mask, is_causal, scale, out=None, append=None):
    """Attention of one query row per head: split-K partial softmaxes, combined by the last
    split of each kv head to arrive (or by ``decode_combine``: see the module doc).
    ``append``: (k_new, v_new, rows), k and v being kept caches whose rows ``rows[0]`` on
    (consecutive, as many as k_new has; ``rows`` on the GPU) this step appends: each program
    stores those in its chunk of keys before it reads the chunk (``appending``)."""
    o = target(tuple(q.shape[:-1]) + (v.shape[-1],), q, out)
    if o.numel():
        call = _DecodeCall(cfg, q, k, v, mask, is_causal, scale, o, append,
                           lambda heads: arrival_counters(q.device, heads))
        mod = jit(JIT)
        mod.decode_split[(call.heads, call.splits)](
            *call.pointers, *call.sizes, *call.strides, **call.constexprs,
            num_warps=cfg.warps, num_stages=cfg.stages, **pdl(q.device))
        if call.counters is None:
            o4 = call.o4
            mod.decode_combine[(o4.shape[0] * call.h,)](
                *call.parts, o4, call.h, call.splits, call.dv, o4.stride(0), o4.stride(1),
                o4.stride(3), BLOCK_S=split_block(cfg), BLOCK_DV=call.constexprs["BLOCK_DV"],
                num_warps=COMBINE_WARPS)
    elif append is not None:  # nothing to attend with: the rows still go into the caches
        _, k4, v4, _ = _as_4d(q, k, v, mask)
        kn, vn, rows = _new_rows(append)
        k4.index_copy_(2, rows, kn)
        v4.index_copy_(2, rows, vn)
    return deliver(o, out)


def _new_rows(append: tuple) -> tuple:
    """``decode``'s ``append`` with the new rows as (B, HKV, R, D), as ``_as_4d`` views the
    caches."""
    kn, vn, rows = append
    return ((kn[None], vn[None]) if kn.dim() == 3 else (kn, vn)) + (rows,)


@dataclass(frozen=True)
class DecodeLink:
    """A decode attention as a stage of a persistent chain (``chain.py``): ``decode``'s
    arguments."""

    cfg: Decode
    q: object
    k: object
    v: object
    mask: object
    is_causal: bool
    scale: object
    out: object = None
    append: tuple | None = None

    def target(self):
        """The tensor the result is written to (``out`` itself where the kernel can)."""
        return target(tuple(self.q.shape[:-1]) + (self.v.shape[-1],), self.q, self.out)

    def copies(self) -> bool:
        """False: the kernel reads q, k, v and the mask through views (``_as_4d``)."""
        return False

    def prepare(self, early: bool) -> Prepared:
        """The stage's arguments for the chain; ``early`` is unused (no weights to load)."""
        o = self.target()
        if not o.numel():
            raise ValueError("a chain's decode attention has nothing to attend with")
        call = _DecodeCall(self.cfg, self.q, self.k, self.v, self.mask, self.is_causal,
                           self.scale, o, self.append,
                           lambda heads: arrival_counters(self.q.device, heads))
        if call.counters is None:
            raise RuntimeError("no arrival counters for a chain's decode attention inside a "
                               "capture; call it once before capturing")
        return Prepared(call.stage(), call.stage_constexprs(), o, None, None, self.cfg.warps,
                        self.cfg.stages)

    def alone(self):
        """The attention as a launch of its own (``decode``)."""
        return decode(self.cfg, self.q, self.k, self.v, self.mask, self.is_causal, self.scale,
                      self.out, self.append)


def occupancy(cfg: Flash | Decode):
    """The ``Occupancy`` of a config's call: its programs, and the share of its ``tl.dot``
    rows that are real (flash: query rows in blocks of ``block_m``; decode: the query heads of
    a kv head, in a block of at least 16)."""
    def of(shapes) -> Occupancy:
        q, k = tuple(shapes[0]), tuple(shapes[1])
        heads, sq, hkv, sk = math.prod(q[:-2]), q[-2], math.prod(k[:-2]), k[-2]
        if isinstance(cfg, Flash):
            blocks = -(-sq // cfg.block_m)
            return Occupancy(max(1, heads * blocks), sq / (blocks * cfg.block_m) if sq else 1.0)
        group = heads // max(1, hkv)
        splits, _ = splits_for(cfg, sk, hkv)
        return Occupancy(max(1, hkv * splits), group / max(16, next_power_of_2(group)))

    return of


# ---------------------------------------------------------------------------- constraints
def constraint(decode_only: bool, dtypes: tuple[str, ...], name: str = "", cfg=None):
    """The ``where`` of the attention kernels (torch's, plus what the templates hold); with a
    config, also that its launch fits CUDA's grid."""
    def fits(shapes, dts, attrs):
        q, k, v = (tuple(s) for s in shapes[:3])
        if len({len(q), len(k), len(v)}) != 1 or len(q) not in (3, 4):
            return "q, k and v must all be (batch, heads, seq, dim) or (heads, seq, dim)"
        if q[:-3] != k[:-3] or k[:-3] != v[:-3]:
            return "q, k and v must have one batch size (no broadcasting of the batch axis)"
        if len(set(dts[:3])) > 1:
            return "q, k and v must share one dtype"
        if len(shapes) > 3:
            m, mdt = tuple(shapes[3]), dts[3]
            if len(m) > len(q):
                return "attn_mask has more axes than the scores"
            if not (mdt.is_bool or mdt.name in dtypes or mdt.name == "float64"):
                return f"attn_mask must be bool or a float of {dtypes + ('float64',)}"
        if not ints(q, k, v):
            return True
        hq, hkv = q[-3], k[-3]
        if hkv == 0 or hq % hkv or k[-3] != v[-3]:
            return "the query heads must be a multiple of the kv heads (and k, v heads equal)"
        if max(q[-1], v[-1]) > MAX_HEAD_DIM:
            return f"head dims up to {MAX_HEAD_DIM} (got {q[-1]} and {v[-1]})"
        if decode_only and q[-2] != 1:
            return f"one query row (decode), got Sq = {q[-2]}"
        if cfg is None:
            return True
        heads = math.prod(q[:-2])  # batch x query heads
        blocks = 1 if decode_only else -(-q[-2] // cfg.block_m)
        return grid_fits(name, heads * blocks, q)  # decode: bounds both kernels (B x HKV, B x H)

    return fits


def signatures(decode_only: bool, masked: bool, dtypes: tuple[str, ...]):
    """Verification cases: tiny in the interpreter; longer sequences on a GPU."""
    def cases():
        sq = 1 if decode_only else 7
        table = [  # q, k, v, mask (shape, dtype; None: q's), is_causal, scale
            ((1, 4, sq, 8), (1, 2, 33, 8), (1, 2, 33, 8), ((sq, 33), "bool"), False, None),
            ((2, 2, sq, 16), (2, 2, 70, 16), (2, 2, 70, 16), ((2, 1, 1, 70), None), True, 0.3),
            ((2, sq, 8), (2, 33, 8), (2, 33, 12), ((sq, 33), None), False, None),
            ((1, 1, 1, 4), (1, 1, 1, 4), (1, 1, 1, 4), ((1, 1), "bool"), False, None),
        ]
        if not decode_only:
            table.append(((1, 2, 33, 8), (1, 2, 33, 8), (1, 2, 33, 8), ((33, 33), "bool"),
                          True, 0.125))
            # several query blocks per head (the grid's block index), three key blocks
            table.append(((1, 2, 130, 8), (1, 2, 130, 8), (1, 2, 130, 8), ((130, 130), "bool"),
                          True, None))
        if not interpreted():
            table += [((1, 1, sq, 64), (1, 1, 1025, 64), (1, 1, 1025, 64),
                       ((sq, 1025), "bool"), True, None),
                      ((1, 8, sq, 128), (1, 2, 4099, 128), (1, 2, 4099, 128),
                       ((1, 1, sq, 4099), None), False, None)]
        out = []
        for dt in dtypes:
            for qs, ks, vs, (ms, mdt), causal, sc in (table if dt == dtypes[0] else table[:3]):
                sig = {"q": (qs, dt), "k": (ks, dt), "v": (vs, dt),
                       "attrs": {"is_causal": causal, "scale": sc}}
                if masked:
                    sig["attn_mask"] = (ms, mdt or dt)
                out.append(sig)
        return out

    return cases


# fp32 q, k, v run the flash tile's tl.dot in "ieee" precision, on the FMA units: on an H200
# GPT-2's masked prefill attention ((1, 12, 128, 64), 50 MFLOP) took 65.7 us a call in the
# m64n64 config, ~8% of the 50 TFLOP/s the cost model assumes for a GPU's fp32 once its grid
# (24 programs) is counted; estimated at 8.7 us, it had displaced torch's SDPA in every fp32
# plan made without measurements (measured rows replace the share)
FLASH_FP32_SHARE = 0.08


def register() -> None:
    text = source_text(JIT)
    dtypes = float_dtypes()
    for masked in (False, True):
        if masked:
            pattern = SDPA
            suffix = "_mask"
        else:
            pattern = pat.OpPat(SDPA, tuple(pat.var(n) for n in ("q", "k", "v")),
                                {"args": ("q", "k", "v")})
            suffix = ""
        for kind, configs, decode_only in (("flash", FLASH_CONFIGS, False),
                                           ("decode", DECODE_CONFIGS, True)):
            for cfg in configs:
                name = f"triton_{kind}_attention{suffix}_{cfg.label}"
                fn = _function(kind, cfg, masked)
                fn.source_text = f"{text}\n# {name}: {cfg}"
                kernel(pattern, backend="triton", name=name, device="cuda", dtypes=None,
                       where=_typed(dtypes, constraint(decode_only, dtypes, name, cfg)),
                       tolerance=REDUCTION, signatures=signatures(decode_only, masked, dtypes),
                       writes_out=True, occupancy=occupancy(cfg),
                       efficiency=None if decode_only else {"float32": FLASH_FP32_SHARE})(fn)


def _typed(dtypes: tuple[str, ...], where):
    """q, k and v have a dtype of ``dtypes`` (the mask has its own), then ``where``."""
    def check(shapes, dts, attrs):
        for d in dts[:3]:
            if d.name not in dtypes:
                return f"dtype {d.name}; accepts {', '.join(dtypes)}"
        return where(shapes, dts, attrs)

    return check


def _function(kind: str, cfg, masked: bool):
    run_one = flash if kind == "flash" else decode
    if masked:
        def run(q, k, v, attn_mask, is_causal, scale, *, out=None):
            return run_one(cfg, q, k, v, attn_mask, is_causal, scale, out)
    else:
        def run(q, k, v, is_causal, scale, *, out=None):
            return run_one(cfg, q, k, v, None, is_causal, scale, out)
    what = ("flash attention" if kind == "flash" else
            "split-K decode attention (one query row)")
    run.__doc__ = (f"softmax(q k^T * scale{' + mask' if masked else ''}) v, {what}, causal or "
                   f"not, grouped-query heads ({cfg.label}, {cfg.warps} warps).")
    if kind == "decode":
        run.appending = _appending(cfg, masked)
        run.link, run.chained = _linking(cfg, masked, None), chained
    return run


def _linking(cfg: Decode, masked: bool, rows):
    """``link(*args, out=None, is_causal, scale)``: a decode kernel's call (``rows``: the
    appending run's, else None) as a ``DecodeLink`` of a persistent chain (``chain.py``)."""
    def link(q, k, v, *rest, is_causal, scale, out=None) -> DecodeLink:
        mask = rest[0] if masked else None
        new = rest[1:] if masked else rest
        append = (new[0], new[1], rows) if rows is not None else None
        return DecodeLink(cfg, q, k, v, mask, is_causal, scale, out, append)
    return link


def _appending(cfg: Decode, masked: bool):
    """``appending(rows)``: the decode kernel's run with two more tensor arguments after its
    own, k_new and v_new, which it writes into k and v (the caches' views an append made,
    its rows not yet written) at ``rows`` before it attends (``decode``'s ``append``): what
    a padded CUDA graph runs in place of a layer's two appends and its attention
    (``runtime/appends.py``)."""
    def appending(rows):
        if masked:
            def run(q, k, v, attn_mask, k_new, v_new, is_causal, scale, *, out=None):
                return decode(cfg, q, k, v, attn_mask, is_causal, scale, out,
                              (k_new, v_new, rows))
        else:
            def run(q, k, v, k_new, v_new, is_causal, scale, *, out=None):
                return decode(cfg, q, k, v, None, is_causal, scale, out, (k_new, v_new, rows))
        run.link, run.chained = _linking(cfg, masked, rows), chained
        return run

    return appending
