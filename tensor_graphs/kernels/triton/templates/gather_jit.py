# ruff: noqa: N803  (Triton spells sizes and constexpr parameters in capitals)
"""The embedding template: out[i, :] = table[ids[i], :].

A program copies BLOCK_R ids' rows, BLOCK_D columns of them. An id outside [0, rows) reads
nothing: its row is NaN (the reference raises there; a GPU kernel cannot, and reading past the
table would be worse).
"""

import triton
import triton.language as tl


@triton.jit
def embedding(ids_ptr, table_ptr, o_ptr, N, V, D, s_i, s_tv, s_td,
              BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    """Grid (cdiv(N, BLOCK_R) * cdiv(D, BLOCK_D),), the row blocks varying fastest. One axis:
    CUDA's grid axes 1 and 2 stop at 65535 blocks, axis 0 at 2**31 - 1."""
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(N, BLOCK_R)
    rows = (pid % row_blocks) * BLOCK_R + tl.arange(0, BLOCK_R)
    cols = (pid // row_blocks) * BLOCK_D + tl.arange(0, BLOCK_D)
    ids = tl.load(ids_ptr + rows.to(tl.int64) * s_i, mask=rows < N, other=0).to(tl.int64)
    known = (ids >= 0) & (ids < V)
    inside = (rows[:, None] < N) & (cols[None, :] < D)
    values = tl.load(table_ptr + ids[:, None] * s_tv + cols[None, :] * s_td,
                     mask=inside & known[:, None], other=float("nan"))
    tl.store(o_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], values, mask=inside)
