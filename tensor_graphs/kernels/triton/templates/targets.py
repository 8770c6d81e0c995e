"""Ahead-of-time compile targets: every template x config, for a GPU this machine may not have.

``triton.compile(ASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
options=...)`` compiles without a GPU, so CI checks that every config of every template
compiles for an H100 and fits its shared memory (``aot.SHARED_MEMORY``), which the interpreter
cannot tell. Each target compiles the template's heaviest use of the config: fp32 operands
(twice the bytes of fp16 per tile) as well as fp16, the largest head dim, every epilogue input.
``aot.compile_target`` compiles them, as it does the generated kernels. The jit modules must be
imported compiled, not interpreted: ``compile_targets`` refuses a process running Triton's
interpreter (``kernels.triton.require_compiler``).
"""

from __future__ import annotations

from collections.abc import Iterator

from tensor_graphs.kernels.triton import require_compiler
from tensor_graphs.kernels.triton.aot import Target
from tensor_graphs.kernels.triton.templates import argmax, attention, chain, gather, matmul, rope
from tensor_graphs.kernels.triton.templates.runtime import jit, next_power_of_2

HEAD_DIMS = (64, 128)  # GPT-2's, Llama's and Qwen3's


POINTER = {"float32": "*fp32", "float16": "*fp16", "bfloat16": "*bf16", "float64": "*fp64",
           "uint8": "*u8", "int32": "*i32", "int64": "*i64"}


def _module(name: str):
    require_compiler()
    return jit(name)


def _target(kernel: str, variant: str, fn, pointers: dict, floats: tuple, units: tuple,
            constexprs: dict, warps: int, stages: int = 3, **options) -> Target:
    """Every argument of ``fn`` typed as a launch on aligned, contiguous tensors specializes
    it: ``pointers`` (name -> dtype) and the other ints 16-byte divisible, ``units`` (the
    innermost strides) the constant 1, ``floats`` fp32 scalars, ``constexprs`` by value.
    Divisibility lets loads vectorize, which is what lets the pipeliner stage them in shared
    memory: the compile whose shared memory must fit. ``kernel`` names the template x config
    the compile checks (several compiles, ``variant`` the dtype and head dim, check one)."""
    sig, attrs, values = {}, {}, dict(constexprs)
    for i, arg in enumerate(fn.arg_names):
        if arg in units:
            values[arg] = 1
        if arg in values:
            sig[arg] = "constexpr"
        elif arg in pointers:
            sig[arg] = POINTER[pointers[arg]]
        elif arg in floats:
            sig[arg] = "fp32"
        else:
            sig[arg] = "i32"
        if sig[arg] not in ("constexpr", "fp32"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return Target(kernel + variant, fn, sig, values,
                  {"num_warps": warps, "num_stages": stages, **options}, attrs, kernel)


# a chain's stages' runtime arguments (``matmul._GemvCall.stage``,
# ``attention._DecodeCall.stage``): their pointers' dtypes (None: the stage's float dtype), the
# other slots ints but scale, and the positions that are 1 as a decode's contiguous operands
# launch them (specialised: constexpr)
GEMV_SLOTS = (None,) * 5 + ("float32", "int32", None, None) + ("i32",) * 15
GEMV_UNITS = (14, 16, 17, 19, 21, 22, 23)  # stride_ak, _bn, _bias, _rn, _cn, _lnw, _lnb
DECODE_SLOTS = (None,) * 4 + ("float32",) * 3 + (None, "int32", None, None, "int64") + \
    ("i32",) * 6 + ("fp32",) + ("i32",) * 28
DECODE_UNITS = (24, 28, 32, 35, 38, 42, 46)  # s_qd, s_kd, s_vd, s_mn, s_od, s_knd, s_vnd


def _chain_targets() -> Iterator[Target]:
    """``chain_jit.chain`` as a GPT-2 decode block runs it, in fp32 with PDL and every
    weight prefetched: LayerNorm + q/k/v in one split (FINISH), the decode attention
    (appending the new rows, masked), the output projection + the residual split over K,
    LayerNorm + the MLP's up projection + gelu, its down projection + the residual; each GEMV
    config with each decode config, so every stage body, barrier and prefetch compiles, with
    the fewest pipeline stages of its configs (``chain.chain``'s launch) and its shared
    memory within the block's limit."""
    ch = _module("chain_jit")
    gelu = matmul.ACTS["gelu_tanh"]

    def gemv(cfg, norm, finish, act=0, res=True):
        return (0, True, cfg.block_n, cfg.block_k, True, res, act, norm, finish, not finish,
                next_power_of_2(cfg.max_splits), matmul.NORM_TILE if norm else 16, True)

    def typed(slots, units):
        return tuple("constexpr" if k in units else POINTER["float32"] if t is None
                     else POINTER.get(t, t) for k, t in enumerate(slots))

    for cfg, dec in zip(matmul.GEMV_CONFIGS, attention.DECODE_CONFIGS):
        decode = (1, False, attention.FLOAT_MASK, False, attention.TF32[attention.PRECISION], 16,
                  dec.block_n, max(HEAD_DIMS), max(HEAD_DIMS), attention.split_block(dec), True)
        consts = (gemv(cfg, 1, True, 0, False), decode, gemv(cfg, 0, False),
                  gemv(cfg, 1, False, gelu, False), gemv(cfg, 0, False))
        layout = [(GEMV_SLOTS, GEMV_UNITS), (DECODE_SLOTS, DECODE_UNITS)] + \
            [(GEMV_SLOTS, GEMV_UNITS)] * 3
        constexprs, attrs = {}, {}
        for j, (slots, units) in enumerate(layout):
            for k, t in enumerate(slots):
                if k in units:
                    constexprs[(3, j, k)] = 1
                elif t != "fp32":  # pointers and ints aligned as a launch's are
                    attrs[(3, j, k)] = [["tt.divisibility", 16]]
        constexprs.update(CONSTS=consts, STAGES=len(consts), ONLY=-1, PDL=True,
                          SPIN=chain.SPIN, L2=True)
        signature = {"sync_ptr": "*i32", "M": "i32", "eps": "fp32",
                     "stages": tuple(typed(slots, units) for slots, units in layout),
                     **dict.fromkeys(("CONSTS", "STAGES", "ONLY", "PDL", "SPIN", "L2"),
                                     "constexpr")}
        name = f"chain_decode_{dec.label}_{cfg.label}"
        yield Target(f"{name}_float32_pdl", ch.chain, signature, constexprs,
                     {"num_warps": max(cfg.warps, dec.warps),
                      "num_stages": min(cfg.stages, dec.stages), "launch_pdl": True}, attrs,
                     name)


def compile_targets() -> Iterator[Target]:
    """Every (template, config) to compile, each in the dtypes that bound its resources."""
    mm = _module(matmul.JIT)
    gemm_units = ("stride_ak", "stride_bk", "stride_bias", "stride_rn", "stride_cn")
    for cfg in matmul.CONFIGS:
        for dt in (("float32",) if cfg.precision == "tf32" else ("float16", "float32")):
            ptrs = dict.fromkeys(("a_ptr", "b_ptr", "bias_ptr", "res_ptr", "c_ptr"), dt)
            consts = dict(HAS_BIAS=True, HAS_RES=True, ACT=matmul.ACTS["gelu"],
                          PRECISION=cfg.precision, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
                          BLOCK_K=cfg.block_k, GROUP_M=matmul.GROUP_M)
            yield _target(f"gemm_{cfg.label}", f"_{dt}", mm.gemm, ptrs, (), gemm_units, consts,
                          cfg.warps, cfg.stages)

    gemv_units = ("stride_ak", "stride_bk", "stride_bias", "stride_rn", "stride_cn",
                  "stride_lnw", "stride_lnb")
    epilogue = dict(HAS_BIAS=True, HAS_RES=True, ACT=matmul.ACTS["gelu"])
    # per GEMV config (dtype, FINISH, LAST_ADDS, NORM, PDL, PREFETCH): one split with the
    # epilogue in fp16 and fp32; K split in fp32, its last split adding the parts, or leaving
    # that to gemv_combine (in a capture that found too few arrival counters); a LayerNorm
    # or RMSNorm prologue (NORM 1, 2); launched with PDL (a Hopper's launches: runtime.pdl),
    # its first weights loaded before its wait or after it (b a bound weight or not:
    # matmul._dependent)
    variants = (("float16", True, False, 0, False, False),
                ("float32", True, False, 0, False, False),
                ("float32", False, True, 0, False, False),
                ("float32", False, False, 0, False, False),
                ("float32", False, True, 1, False, False),
                ("float32", False, True, 1, True, True),
                ("float32", False, True, 2, True, True),
                ("float32", False, True, 0, True, False))
    for cfg in matmul.GEMV_CONFIGS:
        for dt, finish, last, norm, dependent, early in variants:
            ptrs = dict.fromkeys(("a_ptr", "b_ptr", "bias_ptr", "res_ptr", "c_ptr", "ln_w_ptr",
                                  "ln_b_ptr"), dt)
            ptrs.update(part_ptr="float32", lock_ptr="int32")
            consts = dict(epilogue, NORM=norm, FINISH=finish, LAST_ADDS=last,
                          BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
                          MAX_SPLITS=next_power_of_2(cfg.max_splits),
                          NORM_BLOCK=matmul.NORM_TILE if norm else 16, ONE_TILE=True,
                          PDL=dependent, PREFETCH=early)
            variant = ("_finish" if finish else "_last_adds" if last else "") + \
                ("", "_norm", "_rms")[norm] + ("_pdl" if dependent else "") + \
                ("_prefetch" if early else "")
            yield _target(f"gemv_split_{cfg.label}", f"_{dt}{variant}", mm.gemv_split, ptrs,
                          ("eps",), gemv_units, consts, cfg.warps, cfg.stages,
                          **({"launch_pdl": True} if dependent else {}))
    yield from _chain_targets()
    ptrs = dict.fromkeys(("bias_ptr", "res_ptr", "c_ptr", "part_ptr"), "float32")
    yield _target("gemv_combine", "", mm.gemv_combine, ptrs, (), gemv_units[2:5],
                  dict(epilogue, BLOCK_N=matmul.COMBINE_BLOCK), 4)

    at = _module(attention.JIT)
    flash_units = ("s_qd", "s_kd", "s_vd", "s_mn", "s_od")
    for cfg in attention.FLASH_CONFIGS:
        for d, dt in [(d, "float16") for d in HEAD_DIMS] + [(max(HEAD_DIMS), "float32")]:
            ptrs = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "mask_ptr", "o_ptr"), dt)
            consts = dict(MASK=attention.FLOAT_MASK, CAUSAL=True,
                          PRECISION=attention.PRECISION, BLOCK_M=cfg.block_m,
                          BLOCK_N=cfg.block_n, BLOCK_D=d, BLOCK_DV=d)
            yield _target(f"flash_{cfg.label}", f"_d{d}_{dt}", at.flash, ptrs, ("scale",),
                          flash_units, consts, cfg.warps, cfg.stages)
    d = max(HEAD_DIMS)
    for cfg in attention.DECODE_CONFIGS:
        for dt in ("float16", "float32"):
            ptrs = dict.fromkeys(("q_ptr", "k_ptr", "v_ptr", "mask_ptr", "o_ptr"), dt)
            ptrs.update(dict.fromkeys(("part_m", "part_l", "part_o"), "float32"))
            ptrs.update(lock_ptr="int32")
            ptrs.update(kn_ptr=dt, vn_ptr=dt, idx_ptr="int64")
            # its last split combining (launched with PDL, or not: runtime.pdl), or
            # decode_combine; appending the new rows to the caches (runtime/appends.py)
            for last, dependent, append in ((True, True, True), (True, True, False),
                                            (True, False, False), (False, False, False)):
                consts = dict(MASK=attention.FLOAT_MASK, CAUSAL=False,
                              PRECISION=attention.PRECISION, BLOCK_G=16, BLOCK_N=cfg.block_n,
                              BLOCK_D=d, BLOCK_DV=d, LAST_COMBINES=last,
                              BLOCK_S=attention.split_block(cfg), PDL=dependent,
                              APPEND=append)
                yield _target(f"decode_split_{cfg.label}",
                              f"_d{d}_{dt}" + ("_last_combines" if last else "")
                              + ("_pdl" if dependent else "") + ("_append" if append else ""),
                              at.decode_split, ptrs, ("scale",),
                              ("s_qd", "s_kd", "s_vd", "s_mn", "s_od", "s_knd", "s_vnd"),
                              consts, cfg.warps, cfg.stages,
                              **({"launch_pdl": True} if dependent else {}))
        ptrs = dict.fromkeys(("part_m", "part_l", "part_o", "o_ptr"), "float32")
        consts = dict(BLOCK_S=attention.split_block(cfg), BLOCK_DV=d)
        yield _target(f"decode_combine_{cfg.label}", f"_d{d}", at.decode_combine, ptrs, (),
                      ("s_od",), consts, attention.COMBINE_WARPS)

    rp = _module(rope.JIT)
    for cfg in rope.CONFIGS:
        ptrs = dict.fromkeys(("x_ptr", "cos_ptr", "sin_ptr", "o_ptr"), "float32")
        yield _target(f"rope_{cfg.label}", "", rp.rope, ptrs, (), ("s_x3", "s_c3", "s_s3", "s_o3"),
                      dict(BLOCK_R=cfg.block_r, BLOCK_H=max(HEAD_DIMS) // 2), cfg.warps)

    gt = _module(gather.JIT)
    for cfg in gather.CONFIGS:
        ptrs = {"ids_ptr": "int64", "table_ptr": "float32", "o_ptr": "float32"}
        yield _target(f"embedding_{cfg.label}", "", gt.embedding, ptrs, (), ("s_i", "s_td"),
                      dict(BLOCK_R=cfg.block_r, BLOCK_D=cfg.block_d), cfg.warps)

    am = _module(argmax.JIT)
    for cfg in argmax.CONFIGS:  # per config: one chunk, the last chunk picking, or neither
        for variant, finish, last in (("_finish", True, False), ("_last_picks", False, True),
                                      ("", False, False)):
            ptrs = {"x_ptr": "float32", "o_ptr": "int64", "part_v": "float32",
                    "part_i": "int32", "lock_ptr": "int32"}
            consts = dict(BLOCK=cfg.block, BLOCK_S=argmax.split_block(cfg), FINISH=finish,
                          LAST_PICKS=last)
            yield _target(f"argmax_split_{cfg.label}", variant, am.argmax_split, ptrs, (),
                          ("s_xn",), consts, cfg.warps)
        yield _target(f"argmax_combine_{cfg.label}", "", am.argmax_combine,
                      {"part_v": "float32", "part_i": "int32", "o_ptr": "int64"}, (), (),
                      dict(BLOCK_S=argmax.split_block(cfg)), argmax.COMBINE_WARPS)
