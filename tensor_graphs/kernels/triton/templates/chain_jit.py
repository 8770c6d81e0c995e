# ruff: noqa: N803, N806  (Triton spells sizes and constexpr parameters in capitals)
"""A persistent chain: a decode step's GEMVs and decode attentions as one kernel.

A program per GPU unit (SM), all resident at once, runs its units of each stage in turn with a
grid-wide barrier between stages (``_grid_sync``), so a decode block's attention, its output
projection, MLP and the next block's q/k/v projection are one launch instead of five (on an
H200 a launch in a decode step's graph cost ~2.6 us before its first byte). A stage is a
GEMV (``matmul_jit._gemv_unit``: a row's column block x a split of K, as ``gemv_split``'s
programs) or a decode attention (``attention_jit._decode_unit``: a kv head x a split of the
keys, as ``decode_split``'s); the same bodies as the one-launch kernels. Before each barrier
a program loads the first weights of its next GEMV stage where they are a bound weight
(PREFETCH), so the wait overlaps those reads, as PDL overlaps a launch. Results of earlier
stages are read through L2 (``.cg``): another SM wrote them in this kernel.

With L2 on, each program also asks L2 for its share of the next GEMV stage's bound weights
(``prefetch.global.L2``, a line each; the first two stages' at the start) while it works on
this one. A decode GEMV reads a few MB that no program reuses, and on an H200 four of them
one launch each read at 1.4 TB/s of 4.8: each starts cold and ends with a tail. Prefetched,
HBM streams the next stage's weights during this stage's math and barrier, and the stage
reads them from L2. A prefetch is only a hint: nothing it does changes a result.

``stages``: each stage's runtime arguments (``chain.py`` builds them); CONSTS: its
constexprs, ``(KIND, PREFETCH, ...)`` then the kind's own (``K_*`` / ``G_*`` / ``A_*``
positions: Triton reads a constexpr tuple's items by index only, unpacked they stop being
constexpr; and no strings: Triton 3.6, the H200's, cannot index a constexpr tuple that holds
one, so an attention stage's precision is a flag, A_TF32).
"""

import triton
import triton.language as tl

from tensor_graphs.kernels.triton.templates.attention_jit import _decode_unit
from tensor_graphs.kernels.triton.templates.matmul_jit import _gemv_first, _gemv_unit

# every stage's first two constexprs: its kind, and whether its first weights are loaded
# before its barrier (a GEMV on a bound weight)
K_KIND, K_PREFETCH = tl.constexpr(0), tl.constexpr(1)
GEMV, DECODE = tl.constexpr(0), tl.constexpr(1)
# a GEMV stage's constexprs after those two
G_BLOCK_N, G_BLOCK_K, G_HAS_BIAS, G_HAS_RES, G_ACT, G_NORM, G_FINISH, G_LAST_ADDS, \
    G_MAX_SPLITS, G_NORM_BLOCK, G_ONE_TILE = (tl.constexpr(i) for i in range(2, 13))
# a decode attention stage's
A_MASK, A_CAUSAL, A_TF32, A_BLOCK_G, A_BLOCK_N, A_BLOCK_D, A_BLOCK_DV, A_BLOCK_S, \
    A_APPEND = (tl.constexpr(i) for i in range(2, 11))


@triton.jit
def _grid_sync(sync_ptr, arrivals, SPIN: tl.constexpr):
    """A barrier across a persistent kernel's programs, all resident (one a GPU unit at
    most): each arrives once (``sync[0]`` counts, never set back inside a call) and waits
    until ``arrivals`` have, the count every program reaches at this barrier. Release on
    the arrival and acquire after the wait, with the block's threads held on both sides,
    as CUDA's grid sync does. After SPIN polls it stops waiting and sets ``sync[2]`` (the
    chain's results are then wrong, and ``chain.chain_failed`` says so) rather than hang
    the GPU."""
    tl.debug_barrier()  # every thread's stores of the stage issued before the arrival
    tl.atomic_add(sync_ptr, 1, sem="release", scope="gpu")
    seen = tl.load(sync_ptr, volatile=True)
    spins = 0
    while (seen < arrivals) & (spins < SPIN):
        seen = tl.load(sync_ptr, volatile=True)
        spins += 1
    seen = tl.atomic_add(sync_ptr, 0, sem="acquire", scope="gpu")
    if seen < arrivals:
        tl.atomic_xchg(sync_ptr + 2, 1)
    tl.debug_barrier()


@triton.jit
def _gemv_first_of(pid, M, s, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """The first tile of b of a program's first unit of GEMV stage ``s``."""
    blocks = M * tl.cdiv(s[9], BLOCK_N)
    return _gemv_first(s[1], pid % blocks, pid // blocks, M, s[9], s[10], s[11], s[15],
                       s[16], BLOCK_N, BLOCK_K, ".cg")


@triton.jit
def _gemv_stage(first, pid, programs, M, eps, s, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                ACT: tl.constexpr, NORM: tl.constexpr, FINISH: tl.constexpr,
                LAST_ADDS: tl.constexpr, MAX_SPLITS: tl.constexpr, NORM_BLOCK: tl.constexpr,
                ONE_TILE: tl.constexpr):
    """A GEMV stage: its units dealt to the programs in turn, the first from the tile
    ``first`` loaded before the stage's barrier. ``s``: ``gemv_split``'s runtime arguments
    with the count of splits after K's chunk (``matmul._GemvCall.stage``)."""
    (a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, part_ptr, lock_ptr, ln_w_ptr, ln_b_ptr, N, K,
     CHUNK, SPLITS, stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_rm,
     stride_rn, stride_cm, stride_cn, stride_lnw, stride_lnb) = s
    blocks = M * tl.cdiv(N, BLOCK_N)
    if pid < blocks * SPLITS:  # its first unit apart: ``first`` dies before the loop (kept
        #                        live through it for a first-iteration test, it spilled)
        _gemv_unit(first, pid % blocks, pid // blocks, SPLITS, a_ptr, b_ptr, bias_ptr,
                   res_ptr, c_ptr, part_ptr, lock_ptr, ln_w_ptr, ln_b_ptr, M, N, K, CHUNK, eps,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_rm,
                   stride_rn, stride_cm, stride_cn, stride_lnw, stride_lnb, HAS_BIAS, HAS_RES,
                   ACT, NORM, FINISH, LAST_ADDS, BLOCK_N, BLOCK_K, MAX_SPLITS, NORM_BLOCK,
                   ONE_TILE, ".cg")
    for u in range(pid + programs, blocks * SPLITS, programs):
        unit = u % blocks
        split = u // blocks
        b = _gemv_first(b_ptr, unit, split, M, N, K, CHUNK, stride_bk, stride_bn, BLOCK_N,
                        BLOCK_K, ".cg")
        _gemv_unit(b, unit, split, SPLITS, a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, part_ptr,
                   lock_ptr, ln_w_ptr, ln_b_ptr, M, N, K, CHUNK, eps, stride_am, stride_ak,
                   stride_bk, stride_bn, stride_bias, stride_rm, stride_rn, stride_cm,
                   stride_cn, stride_lnw, stride_lnb, HAS_BIAS, HAS_RES, ACT, NORM, FINISH,
                   LAST_ADDS, BLOCK_N, BLOCK_K, MAX_SPLITS, NORM_BLOCK, ONE_TILE, ".cg")


LINE = tl.constexpr(128)  # bytes of an L2 line: what one prefetch brings in
PREFETCH_BLOCK = tl.constexpr(512)  # lines a program asks for at a time


@triton.jit
def _line_starts(span, per_line, pid, programs, j, BLOCK: tl.constexpr):
    """The elements (of ``span``, from 0) whose lines a program prefetches, BLOCK at a
    time from its ``j``-th: every ``per_line``-th element of its contiguous share, and the
    span's last element; lanes past the share repeat its last line. Consecutive addresses
    are a line apart, so every line of the span is asked for whatever its alignment."""
    lines = tl.cdiv(span, per_line) + 1  # the last: the span's last element
    share = tl.cdiv(lines, programs)
    start = pid * share
    line = tl.minimum(start + j + tl.arange(0, BLOCK),
                      tl.maximum(tl.minimum(start + share, lines) - 1, 0))
    return tl.minimum(line.to(tl.int64) * per_line, span - 1)


@triton.jit
def _prefetch_weights(pid, programs, s, BLOCK: tl.constexpr):
    """Ask L2 for this program's share of a GEMV stage's weights (``s``: its stage tuple),
    the span from b's first element to its last."""
    b_ptr, N, K, stride_bk, stride_bn = s[1], s[9], s[10], s[15], s[16]
    span = (K - 1).to(tl.int64) * stride_bk + (N - 1).to(tl.int64) * stride_bn + 1
    per_line = LINE // (b_ptr.dtype.element_ty.primitive_bitwidth // 8)
    share = tl.cdiv(tl.cdiv(span, per_line) + 1, programs)
    for j in range(0, share, BLOCK):
        at = b_ptr + _line_starts(span, per_line, pid, programs, j, BLOCK)
        tl.inline_asm_elementwise("mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];", "=r,l", [at],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _decode_stage(pid, programs, s, MASK: tl.constexpr, CAUSAL: tl.constexpr,
                  PRECISION: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_S: tl.constexpr,
                  APPEND: tl.constexpr):
    """A decode attention stage: its units (batch x kv head, split of the keys) dealt to the
    programs in turn; the last split of a kv head to arrive combines them. ``s``:
    ``decode_split``'s runtime arguments with the count of (batch x kv head) and of splits
    after R (``attention._DecodeCall.stage``)."""
    (q_ptr, k_ptr, v_ptr, mask_ptr, part_m, part_l, part_o, o_ptr, lock_ptr, kn_ptr, vn_ptr,
     idx_ptr, HKV, G, SK, D, DV, chunk, scale, R, HEADS, SPLITS, s_qb, s_qh, s_qd, s_kb, s_kh,
     s_kn, s_kd, s_vb, s_vh, s_vn, s_vd, s_mb, s_mh, s_mn, s_ob, s_oh, s_od, s_knb, s_knh,
     s_knn, s_knd, s_vnb, s_vnh, s_vnn, s_vnd) = s
    for u in range(pid, HEADS * SPLITS, programs):
        _decode_unit(u % HEADS, u // HEADS, SPLITS, q_ptr, k_ptr, v_ptr, mask_ptr, part_m,
                     part_l, part_o, o_ptr, lock_ptr, kn_ptr, vn_ptr, idx_ptr, HKV, G, SK, D,
                     DV, chunk, scale, R, s_qb, s_qh, s_qd, s_kb, s_kh, s_kn, s_kd, s_vb, s_vh,
                     s_vn, s_vd, s_mb, s_mh, s_mn, s_ob, s_oh, s_od, s_knb, s_knh, s_knn,
                     s_knd, s_vnb, s_vnh, s_vnn, s_vnd, MASK, CAUSAL, PRECISION, BLOCK_G,
                     BLOCK_N, BLOCK_D, BLOCK_DV, True, BLOCK_S, APPEND, ".cg")


@triton.jit
def chain(sync_ptr, M, eps, stages, CONSTS: tl.constexpr, STAGES: tl.constexpr,
          ONLY: tl.constexpr, PDL: tl.constexpr, SPIN: tl.constexpr, L2: tl.constexpr):
    """The stages in order, a barrier between each two (module docstring). M: a GEMV stage's
    rows (every GEMV of a chain has the same). ONLY >= 0 runs that stage alone with no
    barrier: Triton's interpreter runs programs one after another, so a barrier would wait
    forever there, and a chain is checked stage by stage instead (the same code). The last
    program to leave sets the barrier's counts back to 0 for the next call. L2: prefetch
    each GEMV stage's bound weights into L2 a stage ahead (module docstring; no inline
    assembly in the interpreter)."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if L2:
        if CONSTS[0][K_PREFETCH]:
            _prefetch_weights(pid, programs, stages[0], PREFETCH_BLOCK)
    for i in tl.static_range(STAGES):
        if L2:
            if i + 1 < STAGES:
                if CONSTS[i + 1][K_PREFETCH]:
                    _prefetch_weights(pid, programs, stages[i + 1], PREFETCH_BLOCK)
        if (ONLY < 0) or (ONLY == i):  # (CONSTS[i][...] each time: a name loses constexpr)
            if CONSTS[i][K_PREFETCH]:
                first = _gemv_first_of(pid, M, stages[i], CONSTS[i][G_BLOCK_N],
                                       CONSTS[i][G_BLOCK_K])
            if i == 0:
                if PDL:
                    tl.extra.cuda.gdc_wait()
            elif ONLY < 0:
                _grid_sync(sync_ptr, programs * i, SPIN)
            if CONSTS[i][K_KIND] == GEMV:
                if not CONSTS[i][K_PREFETCH]:
                    first = _gemv_first_of(pid, M, stages[i], CONSTS[i][G_BLOCK_N],
                                           CONSTS[i][G_BLOCK_K])
                _gemv_stage(first, pid, programs, M, eps, stages[i], CONSTS[i][G_BLOCK_N],
                            CONSTS[i][G_BLOCK_K], CONSTS[i][G_HAS_BIAS], CONSTS[i][G_HAS_RES],
                            CONSTS[i][G_ACT], CONSTS[i][G_NORM], CONSTS[i][G_FINISH],
                            CONSTS[i][G_LAST_ADDS], CONSTS[i][G_MAX_SPLITS],
                            CONSTS[i][G_NORM_BLOCK], CONSTS[i][G_ONE_TILE])
            else:
                _decode_stage(pid, programs, stages[i], CONSTS[i][A_MASK],
                              CONSTS[i][A_CAUSAL],
                              "tf32" if CONSTS[i][A_TF32] else "ieee",
                              CONSTS[i][A_BLOCK_G], CONSTS[i][A_BLOCK_N],
                              CONSTS[i][A_BLOCK_D], CONSTS[i][A_BLOCK_DV],
                              CONSTS[i][A_BLOCK_S], CONSTS[i][A_APPEND])
    if ONLY < 0:
        tl.debug_barrier()
        left = tl.atomic_add(sync_ptr + 1, 1, sem="acq_rel", scope="gpu")
        if left == programs - 1:  # every program is past every barrier
            tl.atomic_xchg(sync_ptr, 0)
            tl.atomic_xchg(sync_ptr + 1, 0)
