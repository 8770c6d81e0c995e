# ruff: noqa: N803  (Triton spells sizes and constexpr parameters in capitals)
"""The RoPE template: out = x * cos + rotate_half(x) * sin (Hugging Face's layout).

Dims i and i + D/2 of the last axis form a rotation pair: with x1, x2 the halves,
out1 = x1 * cos1 - x2 * sin1 and out2 = x2 * cos2 + x1 * sin2, in fp32, rounded once. x, cos,
sin and out are (A, B, C, D) views of one broadcast shape (stride 0 where cos and sin
broadcast: never copied); a program takes BLOCK_R rows c of one (a, b).
"""

import triton
import triton.language as tl


@triton.jit
def rope(x_ptr, cos_ptr, sin_ptr, o_ptr, AB, B, C, HALF,
         s_x0, s_x1, s_x2, s_x3, s_c0, s_c1, s_c2, s_c3, s_s0, s_s1, s_s2, s_s3,
         s_o0, s_o1, s_o2, s_o3, BLOCK_R: tl.constexpr, BLOCK_H: tl.constexpr):
    """Grid (A * B * cdiv(C, BLOCK_R),): the (a, b) of one block of rows vary fastest (they
    share its cos and sin rows). One axis: CUDA's grid axes 1 and 2 stop at 65535, which the
    row blocks of a long sequence pass, axis 0 at 2**31 - 1."""
    pid = tl.program_id(0)
    ab = pid % AB
    a = (ab // B).to(tl.int64)
    b = (ab % B).to(tl.int64)
    rows = (pid // AB) * BLOCK_R + tl.arange(0, BLOCK_R)
    r64 = rows.to(tl.int64)[:, None]
    j = tl.arange(0, BLOCK_H)[None, :]
    inside = (rows[:, None] < C) & (j < HALF)

    x = x_ptr + a * s_x0 + b * s_x1 + r64 * s_x2
    cs = cos_ptr + a * s_c0 + b * s_c1 + r64 * s_c2
    sn = sin_ptr + a * s_s0 + b * s_s1 + r64 * s_s2
    x1 = tl.load(x + j * s_x3, mask=inside, other=0.0).to(tl.float32)
    x2 = tl.load(x + (j + HALF) * s_x3, mask=inside, other=0.0).to(tl.float32)
    c1 = tl.load(cs + j * s_c3, mask=inside, other=0.0).to(tl.float32)
    c2 = tl.load(cs + (j + HALF) * s_c3, mask=inside, other=0.0).to(tl.float32)
    s1 = tl.load(sn + j * s_s3, mask=inside, other=0.0).to(tl.float32)
    s2 = tl.load(sn + (j + HALF) * s_s3, mask=inside, other=0.0).to(tl.float32)

    o = o_ptr + a * s_o0 + b * s_o1 + r64 * s_o2
    kind = o_ptr.dtype.element_ty
    tl.store(o + j * s_o3, (x1 * c1 - x2 * s1).to(kind), mask=inside)
    tl.store(o + (j + HALF) * s_o3, (x2 * c2 + x1 * s2).to(kind), mask=inside)
