# ruff: noqa: N803  (Triton spells sizes and constexpr parameters in capitals)
"""Split argmax over a row's last axis: programs over chunks of the row, the last to arrive
picking among their answers.

The reference's rule (``argmax`` in ir/ops/reductions.py): the first index of the maximum, and
a NaN counts as the maximum (so the first NaN wins). Each lane of a program keeps the first
index of its own largest value and of its first NaN; the row's first maximum is the least
index among the lanes holding the largest value. A chunk's answer is (value, index), with a
NaN value when it met a NaN (its index that NaN's): the chunks' answers combine by the same
rule, the least index among NaN answers, else among the largest values.
"""

import triton
import triton.language as tl


@triton.jit
def _pick(v, i, valid, N):
    """The first maximum of answers ``v`` at indices ``i`` (NaN counts as the maximum):
    (its value, its index); N where nothing is valid."""
    isnan = v != v
    first_nan = tl.min(tl.where(valid & isnan, i, N), 0)
    top = tl.max(tl.where(valid & ~isnan, v, float("-inf")), 0)
    first_top = tl.min(tl.where(valid & ~isnan & (v == top), i, N), 0)
    found_nan = first_nan < N
    return tl.where(found_nan, float("nan"), top), tl.where(found_nan, first_nan, first_top)


@triton.jit
def argmax_split(x_ptr, o_ptr, part_v, part_i, lock_ptr, N, chunk, s_xr, s_xn,
                 BLOCK: tl.constexpr, BLOCK_S: tl.constexpr, FINISH: tl.constexpr,
                 LAST_PICKS: tl.constexpr):
    """Grid (rows, splits): one chunk of one row. FINISH (one split): the row's index goes to
    o_ptr. Else the chunk's answer goes to part_v/part_i[row, split]; LAST_PICKS: the last
    split of the row to arrive (a counter per row in ``lock_ptr``, set back to 0 after) picks
    the row's index, so no second kernel is launched; else ``argmax_combine`` does."""
    row = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    first = split * chunk
    last = tl.minimum(first + chunk, N)
    lanes = tl.arange(0, BLOCK)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], N, tl.int32)  # N: the lane has taken no value yet
    nan_i = tl.full([BLOCK], N, tl.int32)
    base = x_ptr + row * s_xr
    for n0 in range(first, last, BLOCK):
        idx = n0 + lanes
        valid = idx < last
        x = tl.load(base + idx.to(tl.int64) * s_xn, mask=valid, other=0.0).to(tl.float32)
        isnan = x != x
        nan_i = tl.minimum(nan_i, tl.where(valid & isnan, idx, N))
        # strictly larger, so a lane keeps its first index of a tie; its first value (even
        # -inf) is taken, so a row of -inf answers its first index
        take = valid & ~isnan & ((x > best_v) | (best_i == N))
        best_v = tl.where(take, x, best_v)
        best_i = tl.where(take, idx, best_i)
    lane_nan = nan_i < N
    v, i = _pick(tl.where(lane_nan, float("nan"), best_v), tl.where(lane_nan, nan_i, best_i),
                 lane_nan | (best_i < N), N)
    if FINISH:
        tl.store(o_ptr + row, i.to(tl.int64))
    else:
        at = row * splits + split
        tl.store(part_v + at, v)
        tl.store(part_i + at, i)
        if LAST_PICKS:
            tl.debug_barrier()  # the answer stored before the arrival is counted
            arrived = tl.atomic_add(lock_ptr + row, 1, sem="acq_rel")
            if arrived == splits - 1:
                _finish(part_v, part_i, o_ptr, row, splits, N, BLOCK_S)
                tl.atomic_xchg(lock_ptr + row, 0)  # ready for the next call


@triton.jit
def _finish(part_v, part_i, o_ptr, row, S, N, BLOCK_S: tl.constexpr):
    """The row's index from its S chunks' answers, read from L2 (``.cg``: in the last
    arriving program another program's answer must never come from a stale L1 line)."""
    rs = tl.arange(0, BLOCK_S)
    valid = rs < S
    v = tl.load(part_v + row * S + rs, mask=valid, other=0.0, cache_modifier=".cg")
    i = tl.load(part_i + row * S + rs, mask=valid, other=0, cache_modifier=".cg")
    _, at = _pick(v, i, valid, N)
    tl.store(o_ptr + row, at.to(tl.int64))


@triton.jit
def argmax_combine(part_v, part_i, o_ptr, S, N, BLOCK_S: tl.constexpr):
    """Grid (rows,): a row's index from its S chunks' answers."""
    _finish(part_v, part_i, o_ptr, tl.program_id(0).to(tl.int64), S, N, BLOCK_S)
