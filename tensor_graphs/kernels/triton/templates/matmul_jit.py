# ruff: noqa: N803, N806  (Triton spells sizes and constexpr parameters in capitals)
"""The GEMM template: c = act(a @ b + bias) + res, one (BLOCK_M, BLOCK_N) tile per program.

Plain pointer arithmetic on any strides (a transposed weight is b with swapped strides; no
block pointers: triton 3.9 refuses them), grouped tile order (GROUP_M rows of tiles share b's
columns in L2), fp32 accumulation, and the epilogue applied to the fp32 tile before its one
rounding to c's dtype. Every load is masked, so any M, N, K works with power-of-two tiles;
BLOCK_K >= 16 (the GPU's tl.dot needs it) whatever K is. Offsets along M and N are 64-bit:
a large activation times its row stride passes 2**31.
"""

import triton
import triton.language as tl

# ACT codes (constexpr): which activation the epilogue applies.
NONE, RELU, GELU, GELU_TANH = 0, 1, 2, 3


@triton.jit
def _activation(y, ACT: tl.constexpr):
    if ACT == 1:  # relu; NaN stays NaN (y < 0 is false for it)
        y = tl.where(y < 0, 0.0, y)
    elif ACT == 2:  # gelu, erf form
        y = 0.5 * y * (1.0 + tl.math.erf(y * 0.7071067811865476))
    elif ACT == 3:  # gelu, tanh form; tanh(u) = sign(u) (1 - e) / (1 + e), e = exp(-2|u|)
        u = 0.7978845608028654 * (y + 0.044715 * y * y * y)
        e = tl.exp(-2.0 * tl.abs(u))
        t = (1.0 - e) / (1.0 + e)
        y = 0.5 * y * (1.0 + tl.where(u < 0, -t, t))
    return y


@triton.jit
def gemm(a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, M, N, K,
         stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_rm, stride_rn,
         stride_cm, stride_cn,
         HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
         PRECISION: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    width = GROUP_M * grid_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % width) % size_m
    pid_n = (pid % width) // size_m

    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    rm64 = rm.to(tl.int64)
    rn64 = rn.to(tl.int64)
    a_ptrs = a_ptr + rm64[:, None] * stride_am + rk[None, :] * stride_ak
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rn64[None, :] * stride_bn
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        a = tl.load(a_ptrs, mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
        b = tl.load(b_ptrs, mask=(kk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk

    if HAS_BIAS:
        bias = tl.load(bias_ptr + rn64 * stride_bias, mask=rn < N, other=0.0)
        acc += bias.to(tl.float32)[None, :]
    acc = _activation(acc, ACT)
    inside = (rm[:, None] < M) & (rn[None, :] < N)
    if HAS_RES:
        res = tl.load(res_ptr + rm64[:, None] * stride_rm + rn64[None, :] * stride_rn,
                      mask=inside, other=0.0)
        acc += res.to(tl.float32)
    c_ptrs = c_ptr + rm64[:, None] * stride_cm + rn64[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _epilogue(acc, rm64, rn, rn64, bias_ptr, res_ptr, c_ptr, M, N, stride_bias, stride_rm,
              stride_rn, stride_cm, stride_cn, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
              ACT: tl.constexpr, FRESH: tl.constexpr):
    """A GEMV's finished row block: + bias, activation, + res, one rounding to c's dtype.
    FRESH: res's cache modifier (``_gemv_unit``)."""
    inside = rn < N
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn64 * stride_bias, mask=inside, other=0.0).to(tl.float32)
    acc = _activation(acc, ACT)
    if HAS_RES:
        acc += tl.load(res_ptr + rm64 * stride_rm + rn64 * stride_rn, mask=inside,
                       other=0.0, cache_modifier=FRESH).to(tl.float32)
    tl.store(c_ptr + rm64 * stride_cm + rn64 * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=inside)


@triton.jit
def _row_stats(row_ptr, K, stride_k, eps, NORM: tl.constexpr, NORM_BLOCK: tl.constexpr,
               ONE_TILE: tl.constexpr, FRESH: tl.constexpr):
    """The norm's shift and 1 / sqrt(var + eps) of one row of K values in fp32: LayerNorm's
    (NORM 1) mean and centered variance, two passes (the mean, then the centered squares);
    RMSNorm's (NORM 2) mean square, one pass (its shift is unused). ONE_TILE (K <=
    NORM_BLOCK): the row is loaded once and the passes read the registers; else each pass
    loops over the row (from L2). Every program of a GEMV does this for its row: on an H200
    a looped version over 128-wide steps made c_fc's fused call 8.1 us where 256-wide steps
    made it 6.4 (each step a load's latency)."""
    rk = tl.arange(0, NORM_BLOCK)
    if ONE_TILE:
        v = tl.load(row_ptr + rk.to(tl.int64) * stride_k, mask=rk < K, other=0.0,
                    cache_modifier=FRESH)
        v = v.to(tl.float32)
        mean = tl.sum(v, 0) / K
        d = tl.where(rk < K, v - mean, 0.0) if NORM == 1 else v  # (RMSNorm: 0 past K)
        var = tl.sum(d * d, 0) / K
    else:
        total = tl.zeros((NORM_BLOCK,), dtype=tl.float32)
        if NORM == 1:
            for k0 in range(0, K, NORM_BLOCK):
                kk = k0 + rk
                total += tl.load(row_ptr + kk.to(tl.int64) * stride_k, mask=kk < K,
                                 other=0.0, cache_modifier=FRESH).to(tl.float32)
        mean = tl.sum(total, 0) / K
        squares = tl.zeros((NORM_BLOCK,), dtype=tl.float32)
        for k0 in range(0, K, NORM_BLOCK):
            kk = k0 + rk
            v = tl.load(row_ptr + kk.to(tl.int64) * stride_k, mask=kk < K, other=0.0,
                        cache_modifier=FRESH)
            d = tl.where(kk < K, v.to(tl.float32) - mean, 0.0)
            squares += d * d
        var = tl.sum(squares, 0) / K
    return mean, 1.0 / tl.sqrt(var + eps)


@triton.jit
def gemv_split(a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, part_ptr, lock_ptr, ln_w_ptr, ln_b_ptr,
               M, N, K, CHUNK, eps,
               stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_rm, stride_rn,
               stride_cm, stride_cn, stride_lnw, stride_lnb,
               HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
               NORM: tl.constexpr, FINISH: tl.constexpr, LAST_ADDS: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MAX_SPLITS: tl.constexpr,
               NORM_BLOCK: tl.constexpr = 16, ONE_TILE: tl.constexpr = True,
               PDL: tl.constexpr = False, PREFETCH: tl.constexpr = False):
    """A few rows (decode): grid (M x column blocks, splits of K). A program sums its split's
    products of one row of a and BLOCK_N columns of b as fp32 FMAs (no tl.dot, whose 16-row
    minimum tile would do 16 times the work of one row), each step's (BLOCK_K, BLOCK_N)
    products summed over K into a BLOCK_N accumulator (a whole-tile accumulator beside the
    step's tile and the next one's took 189 registers a thread in n64k128, 168 so; configs of
    80 were no faster in a layer's chain on an H200: registers are not what bounds it). FINISH (one
    split): the epilogue here; else the partial sum goes to part[split, row, :]. LAST_ADDS:
    the last of a block's splits to arrive (a counter per block in ``lock``, which it sets
    back to 0) loads the parts in one (MAX_SPLITS, BLOCK_N) tile, adds them and applies the
    epilogue, so no second kernel is launched (a GPU launch costs about what a decode step's
    GEMV does); else ``gemv_combine`` does that. On an H200, adding the parts one split after
    another in the last program cost 2.4 us a call, more than the second kernel it saved.
    NORM (1 LayerNorm, 2 RMSNorm; 0 none): a is the norm's input (a pre-norm block's): each
    program computes its row's statistics and normalizes its split of a as it loads it
    (ln_w, ln_b: the norm's weight and LayerNorm's bias), so the normalized row is never
    written out and the norm is no launch of its own (on an H200 the LayerNorm kernel took
    3.7 us a call, as long as the GEMV after it).
    Each step's weights are loaded one step ahead. PDL (programmatic dependent launch,
    launched with ``launch_pdl``): the program lets the next kernel start at once
    (``gdc_launch_dependents``) and waits for the kernel before (``gdc_wait``) before it reads
    a, writes anything or counts its arrival; with PREFETCH (b is a bound weight,
    ``kernels/torch/bound.py``: no kernel still running writes it) it loads its first weights
    before that wait, so a decode step's chain of GEMVs, each a few microseconds of mostly
    latency, overlaps one's launch and first weight loads with the one before. Kernels
    started early only wait, so several may be in flight at once; each one's wait is for
    the whole chain before it, since the kernel before waited too."""
    pid = tl.program_id(0)
    split = tl.program_id(1)
    if PDL:  # the next kernel may start now: it waits for this one before reading
        tl.extra.cuda.gdc_launch_dependents()
    if PREFETCH:  # a bound weight: no kernel still running writes it
        b = _gemv_first(b_ptr, pid, split, M, N, K, CHUNK, stride_bk, stride_bn, BLOCK_N,
                        BLOCK_K, "")
    if PDL:  # what comes next reads the kernels before's results (and writes after them)
        tl.extra.cuda.gdc_wait()
    if not PREFETCH:
        b = _gemv_first(b_ptr, pid, split, M, N, K, CHUNK, stride_bk, stride_bn, BLOCK_N,
                        BLOCK_K, "")
    _gemv_unit(b, pid, split, tl.num_programs(1), a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr,
               part_ptr, lock_ptr, ln_w_ptr, ln_b_ptr, M, N, K, CHUNK, eps, stride_am,
               stride_ak, stride_bk, stride_bn, stride_bias, stride_rm, stride_rn, stride_cm,
               stride_cn, stride_lnw, stride_lnb, HAS_BIAS, HAS_RES, ACT, NORM, FINISH,
               LAST_ADDS, BLOCK_N, BLOCK_K, MAX_SPLITS, NORM_BLOCK, ONE_TILE, "")


@triton.jit
def _gemv_first(b_ptr, unit, split, M, N, K, CHUNK, stride_bk, stride_bn,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, FRESH: tl.constexpr):
    """The first (BLOCK_K, BLOCK_N) tile of b that a unit (a row's column block) of a split
    reads, apart from the rest so it can be loaded before a wait: zeros for a unit past the
    GEMV's (an idle program of a persistent chain)."""
    grid_n = tl.cdiv(N, BLOCK_N)
    rn = (unit % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = split * CHUNK + tl.arange(0, BLOCK_K)
    end = tl.minimum(K, split * CHUNK + CHUNK)
    columns = tl.where(unit < M * grid_n, N, 0)  # (a scalar mask's & is int32 in Triton
    #                                              3.9's interpreter: folded into a bound)
    return tl.load(b_ptr + rk.to(tl.int64)[:, None] * stride_bk
                   + rn.to(tl.int64)[None, :] * stride_bn,
                   mask=(rk < end)[:, None] & (rn[None, :] < columns), other=0.0,
                   cache_modifier=FRESH)


@triton.jit
def _gemv_unit(b, unit, split, splits, a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, part_ptr,
               lock_ptr, ln_w_ptr, ln_b_ptr, M, N, K, CHUNK, eps, stride_am, stride_ak,
               stride_bk, stride_bn, stride_bias, stride_rm, stride_rn, stride_cm, stride_cn,
               stride_lnw, stride_lnb, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
               ACT: tl.constexpr, NORM: tl.constexpr, FINISH: tl.constexpr,
               LAST_ADDS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               MAX_SPLITS: tl.constexpr, NORM_BLOCK: tl.constexpr, ONE_TILE: tl.constexpr,
               FRESH: tl.constexpr):
    """One unit's work from its first tile of b (``_gemv_first``): the products over its
    split of K, then the epilogue (FINISH) or its part (and, for the last split to arrive,
    the sum of the parts and the epilogue). FRESH: the loads' cache modifier (".cg" in a
    persistent chain, whose a, res or even b another program may have written in this
    kernel: never a stale L1 line; a weight is read once either way)."""
    grid_n = tl.cdiv(N, BLOCK_N)
    row = (unit // grid_n).to(tl.int64)
    rn = (unit % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)
    rk = split * CHUNK + tl.arange(0, BLOCK_K)
    end = tl.minimum(K, split * CHUNK + CHUNK)
    a_ptrs = a_ptr + row * stride_am + rk.to(tl.int64) * stride_ak
    b_ptrs = b_ptr + rk.to(tl.int64)[:, None] * stride_bk + rn64[None, :] * stride_bn
    if NORM:
        mean, rstd = _row_stats(a_ptr + row * stride_am, K, stride_ak, eps, NORM,
                                NORM_BLOCK, ONE_TILE, FRESH)
    total = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for k0 in range(0, CHUNK, BLOCK_K):
        inside = (rk + k0) < end
        a = tl.load(a_ptrs, mask=inside, other=0.0, cache_modifier=FRESH).to(tl.float32)
        if NORM:
            kk = (rk + k0).to(tl.int64)
            w = tl.load(ln_w_ptr + kk * stride_lnw, mask=inside, other=0.0).to(tl.float32)
            if NORM == 1:  # LayerNorm's bias
                bn = tl.load(ln_b_ptr + kk * stride_lnb, mask=inside, other=0.0)
                a = tl.where(inside, (a - mean) * rstd * w + bn.to(tl.float32), 0.0)
            else:
                a = tl.where(inside, a * rstd * w, 0.0)
        total += tl.sum(a[:, None] * b.to(tl.float32), 0)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
        ahead = (rk + k0 + BLOCK_K) < end  # (all false after the last step: nothing read)
        b = tl.load(b_ptrs, mask=ahead[:, None] & (rn[None, :] < N), other=0.0,
                    cache_modifier=FRESH)
    if FINISH:
        _epilogue(total, row, rn, rn64, bias_ptr, res_ptr, c_ptr, M, N, stride_bias,
                  stride_rm, stride_rn, stride_cm, stride_cn, HAS_BIAS, HAS_RES, ACT, FRESH)
    else:
        tl.store(part_ptr + (split * M + row) * N + rn64, total, mask=rn < N)
        if LAST_ADDS:
            tl.debug_barrier()  # every thread's part stored before the arrival is counted
            arrived = tl.atomic_add(lock_ptr + unit, 1, sem="acq_rel")
            if arrived == splits - 1:
                rs = tl.arange(0, MAX_SPLITS).to(tl.int64)
                parts = tl.load(part_ptr + (rs[:, None] * M + row) * N + rn64[None, :],
                                mask=(rs[:, None] < splits) & (rn[None, :] < N), other=0.0,
                                cache_modifier=".cg")  # from L2, never a stale L1 line
                summed = tl.sum(parts, 0)  # a fixed order, whichever split came last
                _epilogue(summed, row, rn, rn64, bias_ptr, res_ptr, c_ptr, M, N, stride_bias,
                          stride_rm, stride_rn, stride_cm, stride_cn, HAS_BIAS, HAS_RES, ACT,
                          FRESH)
                tl.atomic_xchg(lock_ptr + unit, 0)  # ready for the next call


@triton.jit
def gemv_combine(bias_ptr, res_ptr, c_ptr, part_ptr, M, N, SPLITS,
                 stride_bias, stride_rm, stride_rn, stride_cm, stride_cn,
                 HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ACT: tl.constexpr,
                 BLOCK_N: tl.constexpr):
    """Grid (M x column blocks,): the splits' partial sums added in split order, then the
    epilogue."""
    pid = tl.program_id(0)
    grid_n = tl.cdiv(N, BLOCK_N)
    row = (pid // grid_n).to(tl.int64)
    rn = (pid % grid_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    rn64 = rn.to(tl.int64)
    acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(part_ptr + (s * M + row) * N + rn64, mask=rn < N, other=0.0)
    _epilogue(acc, row, rn, rn64, bias_ptr, res_ptr, c_ptr, M, N, stride_bias, stride_rm,
              stride_rn, stride_cm, stride_cn, HAS_BIAS, HAS_RES, ACT, "")
