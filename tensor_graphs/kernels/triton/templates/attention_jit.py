# ruff: noqa: N803  (Triton spells sizes and constexpr parameters in capitals)
"""Attention templates: flash attention, and split-K decode attention (its last split combines).

Both follow the reference (``scaled_dot_product_attention`` in ir/ops/nn.py): scores =
q k^T * scale, a float mask added after the mask is rounded to q's dtype, a bool mask and the
causal triangle (key j <= query i, top-left, also when Sq != Sk) set -inf, softmax over keys,
rows with nothing to attend to give 0. Online softmax in fp32: a running max m, sum l and
accumulator per query row; a block whose scores are all -inf shifts by 0 instead of -inf
(exp(-inf - -inf) would be NaN), and l = 0 at the end means an empty row. NaN and +inf scores
give NaN rows, as the reference does. Every load is masked; tensors of any strides
(a broadcast mask has stride 0); query head h reads kv head h // G (grouped-query attention).

MASK (constexpr): 0 none, 1 bool (nonzero = attend), 2 float (added).
"""

import triton
import triton.language as tl


@triton.jit
def _scores(q, k_ptrs, mask_ptrs, rows, rn, SQ, SK, scale,
            MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr, kmask):
    """One block of scores (rows x keys rn), masked positions -inf."""
    kt = tl.load(k_ptrs, mask=kmask, other=0.0)
    s = tl.dot(q, kt, input_precision=PRECISION) * scale
    valid = (rn[None, :] < SK) & (rows[:, None] < SQ)
    if MASK == 1:
        allowed = tl.load(mask_ptrs, mask=valid, other=0)
        valid = valid & (allowed != 0)
    elif MASK == 2:
        added = tl.load(mask_ptrs, mask=valid, other=0.0)
        s += added.to(q.dtype).to(tl.float32)
    return s, valid


@triton.jit
def _online(s, valid, v, m_i, l_i, acc, PRECISION: tl.constexpr):
    """The running (max, sum, accumulator) after one more block of keys."""
    s = tl.where(valid, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - shift)
    p = tl.exp(s - shift[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def flash(q_ptr, k_ptr, v_ptr, mask_ptr, o_ptr, H, G, SQ, SK, D, DV, scale,
          s_qb, s_qh, s_qm, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
          s_mb, s_mh, s_mm, s_mn, s_ob, s_oh, s_om, s_od,
          MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
          BLOCK_DV: tl.constexpr):
    """Grid (cdiv(SQ, BLOCK_M) * B * H,): one block of query rows of one head, the blocks of a
    head consecutive (they share its K/V in L2). One axis: CUDA's grid axes 1 and 2 stop at
    65535, which B * H passes (a 32 x 128 x 16-head batch), axis 0 at 2**31 - 1."""
    pid = tl.program_id(0)
    blocks = tl.cdiv(SQ, BLOCK_M)
    start = (pid % blocks) * BLOCK_M
    bh = pid // blocks
    b = (bh // H).to(tl.int64)
    h = (bh % H).to(tl.int64)
    kvh = h // G
    rows = start + tl.arange(0, BLOCK_M)
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    rn0 = tl.arange(0, BLOCK_N)

    q_ptrs = q_ptr + b * s_qb + h * s_qh + rows[:, None].to(tl.int64) * s_qm + rd[None, :] * s_qd
    q = tl.load(q_ptrs, mask=(rows[:, None] < SQ) & (rd[None, :] < D), other=0.0)
    k_base = k_ptr + b * s_kb + kvh * s_kh
    v_base = v_ptr + b * s_vb + kvh * s_vh
    m_base = mask_ptr + b * s_mb + h * s_mh + rows[:, None].to(tl.int64) * s_mm

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], tl.float32)
    end = SK
    if CAUSAL:
        end = tl.minimum(SK, start + BLOCK_M)
    for n0 in range(0, end, BLOCK_N):
        rn = n0 + rn0
        rn64 = rn.to(tl.int64)
        k_ptrs = k_base + rn64[None, :] * s_kn + rd[:, None] * s_kd
        s, valid = _scores(q, k_ptrs, m_base + rn64[None, :] * s_mn, rows, rn, SQ, SK, scale,
                           MASK, CAUSAL, PRECISION, (rn[None, :] < SK) & (rd[:, None] < D))
        if CAUSAL:
            valid = valid & (rn[None, :] <= rows[:, None])
        v = tl.load(v_base + rn64[:, None] * s_vn + rdv[None, :] * s_vd,
                    mask=(rn[:, None] < SK) & (rdv[None, :] < DV), other=0.0)
        m_i, l_i, acc = _online(s, valid, v, m_i, l_i, acc, PRECISION)

    out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    o_ptrs = o_ptr + b * s_ob + h * s_oh + rows[:, None].to(tl.int64) * s_om + rdv[None, :] * s_od
    tl.store(o_ptrs, out.to(o_ptr.dtype.element_ty),
             mask=(rows[:, None] < SQ) & (rdv[None, :] < DV))


@triton.jit
def _append(cache, new, first, end, start, R, s_n, s_d, s_nn, s_nd, D,
            BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, FRESH: tl.constexpr):
    """Rows ``start`` .. ``start + R - 1`` of one head's cache (``cache``: its row 0) from
    ``new`` (its R rows), those of them in ``first`` .. ``end - 1`` (this program's keys).
    FRESH: the new rows' cache modifier (``_decode_unit``)."""
    r0 = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, BLOCK_D)
    for n0 in range(0, R, BLOCK_N):
        r = n0 + r0
        at = start + r
        mine = ((r < R) & (at >= first) & (at < end))[:, None] & (rd[None, :] < D)
        rows = tl.load(new + r.to(tl.int64)[:, None] * s_nn + rd[None, :] * s_nd, mask=mine,
                       cache_modifier=FRESH)
        tl.store(cache + at.to(tl.int64)[:, None] * s_n + rd[None, :] * s_d, rows, mask=mine)


@triton.jit
def decode_split(q_ptr, k_ptr, v_ptr, mask_ptr, part_m, part_l, part_o, o_ptr, lock_ptr,
                 kn_ptr, vn_ptr, idx_ptr,
                 HKV, G, SK, D, DV, chunk, scale, R,
                 s_qb, s_qh, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                 s_mb, s_mh, s_mn, s_ob, s_oh, s_od,
                 s_knb, s_knh, s_knn, s_knd, s_vnb, s_vnh, s_vnn, s_vnd,
                 MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr, LAST_COMBINES: tl.constexpr = False,
                 BLOCK_S: tl.constexpr = 2, PDL: tl.constexpr = False,
                 APPEND: tl.constexpr = False):
    """Grid (B * HKV, splits): the G query heads of one kv head (one query row each) over one
    chunk of keys; writes the chunk's max, sum and unnormalised output per head.
    LAST_COMBINES: the last of a kv head's splits to arrive (a counter per program in
    ``lock_ptr``, set back to 0 after) combines its G heads' splits into ``o_ptr``, so no
    second kernel is launched (a launch in a decode step's graph costs about what the
    combine does); else ``decode_combine`` does that.
    APPEND: k and v are kept caches whose rows ``idx[0]`` .. ``idx[0] + R - 1`` this step
    appends (``kn``, ``vn``: (B, HKV, R, D)); the program whose chunk of keys holds a new row
    writes it into the caches before it reads them (a barrier between: no other program
    reads that row), so a decode step's two appends per layer are no launches of their own
    (``runtime/appends.py``). Reading the new rows from kn/vn inside the key loop instead
    spilled 4.5 KB a thread at fp32 and 128 dims.
    PDL (launched with ``launch_pdl``): the next kernel may start at once, and this one waits
    for the kernel before before it reads anything (q and the cache are that kernel's or
    earlier ones' results), so a decode step's next GEMV loads its weights while the
    attention runs."""
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    _decode_unit(tl.program_id(0), tl.program_id(1), tl.num_programs(1), q_ptr, k_ptr, v_ptr,
                 mask_ptr, part_m, part_l, part_o, o_ptr, lock_ptr, kn_ptr, vn_ptr, idx_ptr,
                 HKV, G, SK, D, DV, chunk, scale, R, s_qb, s_qh, s_qd, s_kb, s_kh, s_kn, s_kd,
                 s_vb, s_vh, s_vn, s_vd, s_mb, s_mh, s_mn, s_ob, s_oh, s_od, s_knb, s_knh,
                 s_knn, s_knd, s_vnb, s_vnh, s_vnn, s_vnd, MASK, CAUSAL, PRECISION, BLOCK_G,
                 BLOCK_N, BLOCK_D, BLOCK_DV, LAST_COMBINES, BLOCK_S, APPEND, "")


@triton.jit
def _decode_unit(pid, split, splits, q_ptr, k_ptr, v_ptr, mask_ptr, part_m, part_l, part_o,
                 o_ptr, lock_ptr, kn_ptr, vn_ptr, idx_ptr, HKV, G, SK, D, DV, chunk, scale, R,
                 s_qb, s_qh, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh, s_vn, s_vd,
                 s_mb, s_mh, s_mn, s_ob, s_oh, s_od,
                 s_knb, s_knh, s_knn, s_knd, s_vnb, s_vnh, s_vnn, s_vnd,
                 MASK: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_DV: tl.constexpr, LAST_COMBINES: tl.constexpr, BLOCK_S: tl.constexpr,
                 APPEND: tl.constexpr, FRESH: tl.constexpr):
    """One program's work of ``decode_split``: (batch x kv head ``pid``, ``split`` of
    ``splits``). FRESH: the cache modifier of q's and the new rows' loads (".cg" in a
    persistent chain, ``chain_jit``, where the projection before wrote them in the same
    kernel: never a stale L1 line)."""
    b = (pid // HKV).to(tl.int64)
    kvh = (pid % HKV).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    heads = kvh * G + g  # the query heads of this kv head
    rd = tl.arange(0, BLOCK_D)
    rdv = tl.arange(0, BLOCK_DV)
    rn0 = tl.arange(0, BLOCK_N)
    zero = tl.zeros([BLOCK_G], tl.int32)  # every row is query position 0

    q = tl.load(q_ptr + b * s_qb + heads[:, None] * s_qh + rd[None, :] * s_qd,
                mask=(g[:, None] < G) & (rd[None, :] < D), other=0.0, cache_modifier=FRESH)
    k_base = k_ptr + b * s_kb + kvh * s_kh
    v_base = v_ptr + b * s_vb + kvh * s_vh
    m_base = mask_ptr + b * s_mb + heads[:, None] * s_mh

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], tl.float32)
    first = split * chunk
    last = tl.minimum(first + chunk, SK)
    if CAUSAL:  # query 0 attends key 0 only
        last = tl.minimum(last, 1)
    if APPEND:  # this step's rows into the caches (those in this program's keys) first
        start = tl.load(idx_ptr).to(tl.int32)
        end = tl.minimum(first + chunk, SK)  # (written even where causal reads fewer)
        _append(k_base, kn_ptr + b * s_knb + kvh * s_knh, first, end, start, R, s_kn, s_kd,
                s_knn, s_knd, D, BLOCK_N, BLOCK_D, FRESH)
        _append(v_base, vn_ptr + b * s_vnb + kvh * s_vnh, first, end, start, R, s_vn, s_vd,
                s_vnn, s_vnd, DV, BLOCK_N, BLOCK_DV, FRESH)
        tl.debug_barrier()  # every thread's rows stored before any thread reads the cache
    for n0 in range(first, last, BLOCK_N):
        rn = n0 + rn0
        rn64 = rn.to(tl.int64)
        k_ptrs = k_base + rn64[None, :] * s_kn + rd[:, None] * s_kd
        s, valid = _scores(q, k_ptrs, m_base + rn64[None, :] * s_mn, g, rn, G, last, scale,
                           MASK, CAUSAL, PRECISION, (rn[None, :] < last) & (rd[:, None] < D))
        if CAUSAL:
            valid = valid & (rn[None, :] <= zero[:, None])
        v = tl.load(v_base + rn64[:, None] * s_vn + rdv[None, :] * s_vd,
                    mask=(rn[:, None] < last) & (rdv[None, :] < DV), other=0.0)
        m_i, l_i, acc = _online(s, valid, v, m_i, l_i, acc, PRECISION)

    at = (b * HKV * G + heads) * splits + split  # (batch, query head, split)
    tl.store(part_m + at, m_i, mask=g < G)
    tl.store(part_l + at, l_i, mask=g < G)
    tl.store(part_o + at[:, None] * DV + rdv[None, :], acc,
             mask=(g[:, None] < G) & (rdv[None, :] < DV))
    if LAST_COMBINES:
        tl.debug_barrier()  # every thread's parts stored before the arrival is counted
        arrived = tl.atomic_add(lock_ptr + pid, 1, sem="acq_rel")
        if arrived == splits - 1:
            for i in range(0, G):
                head = kvh * G + i
                _combine(part_m, part_l, part_o, o_ptr + b * s_ob + head * s_oh,
                         (b * HKV * G + head) * splits, splits, DV, s_od, BLOCK_S, BLOCK_DV)
            tl.atomic_xchg(lock_ptr + pid, 0)  # ready for the next call


@triton.jit
def _combine(part_m, part_l, part_o, o_row, first, S, DV, s_od,
             BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    """One query head's output (at ``o_row``) from its S splits' partial softmaxes, stored
    from ``first`` on. Loaded from L2 (``.cg``): in the last arriving program of
    ``decode_split`` another program's parts must never come from a stale L1 line."""
    rs = tl.arange(0, BLOCK_S)
    rdv = tl.arange(0, BLOCK_DV)
    at = first + rs
    ms = tl.load(part_m + at, mask=rs < S, other=float("-inf"), cache_modifier=".cg")
    top = tl.max(ms, 0)
    w = tl.exp(ms - tl.where(top == float("-inf"), 0.0, top))
    total = tl.sum(tl.load(part_l + at, mask=rs < S, other=0.0, cache_modifier=".cg") * w, 0)
    parts = tl.load(part_o + at[:, None] * DV + rdv[None, :],
                    mask=(rs[:, None] < S) & (rdv[None, :] < DV), other=0.0,
                    cache_modifier=".cg")
    out = tl.sum(parts * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(o_row + rdv * s_od, out.to(o_row.dtype.element_ty), mask=rdv < DV)


@triton.jit
def decode_combine(part_m, part_l, part_o, o_ptr, H, S, DV, s_ob, s_oh, s_od,
                   BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr):
    """Grid (B * H,): one query head's output from its S splits' partial softmaxes."""
    pid = tl.program_id(0)
    b = (pid // H).to(tl.int64)
    h = (pid % H).to(tl.int64)
    _combine(part_m, part_l, part_o, o_ptr + b * s_ob + h * s_oh, pid.to(tl.int64) * S, S,
             DV, s_od, BLOCK_S, BLOCK_DV)
