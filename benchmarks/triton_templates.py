"""On a GPU: every Triton template config against torch on model-shaped calls, and the error
the TF32 configs really show.

    python benchmarks/triton_templates.py [--out DIR] [--only TEXT]

Each row times one template config (``triton.testing.do_bench``: median ms over ~100 calls
after warm-up, the first call's compile excluded) and torch doing the same computation eagerly
(``F.linear`` then the activation and the add; ``F.scaled_dot_product_attention``; the RoPE
formula; ``F.embedding``), both on the same tensors, and checks the template's result against
torch's in float64 (norm-wise relative error). fp32 GEMM rows time the "ieee" configs against
cuBLAS in full fp32 and the TF32 configs against cuBLAS with TF32 allowed; the few-row
(decode) shapes also time the GEMV configs. The table goes to
``DIR/triton_templates.md`` as each row finishes. Run where a GPU is usable (the ``device``
tool's machine: ``--out $OUT``); the simulated GPU is refused (the interpreter's timings mean
nothing).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402,N812

from tensor_graphs.kernels import registry  # noqa: E402
from tensor_graphs.kernels.triton import templates  # noqa: E402
from tensor_graphs.kernels.triton.templates import attention, gather, matmul, rope  # noqa: E402

DEVICE = "cuda"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
GEMMS = [  # (label, epilogue, M, K, N)
    ("GPT-2 c_fc prefill", "linear_gelu_tanh", 128, 768, 3072),
    ("GPT-2 c_fc decode", "linear_gelu_tanh", 1, 768, 3072),
    ("GPT-2 c_proj + residual", "linear_add", 128, 3072, 768),
    ("4096 square, no bias", "linear_nobias", 2048, 4096, 4096),
    ("Qwen3 down + residual decode", "linear_nobias_add", 1, 3072, 1024),
    ("GPT-2 c_proj + residual decode", "linear_add", 1, 3072, 768),
    ("GPT-2 LM head decode", "linear_nobias", 1, 768, 50257),
]
ATTENTION = [  # (label, B, Hq, Hkv, Sq, Sk, D, causal, mask)
    ("GPT-2 prefill", 1, 12, 12, 128, 128, 64, True, None),
    ("Qwen3-ish prefill GQA", 1, 16, 8, 1024, 1024, 128, True, None),
    ("MiniLM 32x128 padding", 32, 12, 12, 128, 128, 32, False, "bool"),
]
DECODES = [  # (label, B, Hq, Hkv, Sk, D)
    ("GPT-2 decode 1k", 1, 12, 12, 1024, 64),
    ("Qwen3-ish decode 4k GQA", 1, 16, 8, 4096, 128),
    ("long cache 32k GQA", 1, 32, 8, 32768, 128),
]


def bench(fn, *args, **kwargs) -> tuple[float, float]:
    """Milliseconds of fn(*args, **kwargs) launched one by one (host overhead included where
    the GPU waits for it), and replayed in a CUDA graph (the GPU's time alone; NaN where the
    capture failed)."""
    from triton.testing import do_bench, do_bench_cudagraph

    call = lambda: fn(*args, **kwargs)  # noqa: E731
    eager = float(do_bench(call, warmup=10, rep=60))
    try:
        graph = float(do_bench_cudagraph(call, rep=40))
    except Exception:  # noqa: BLE001 - a capture failure is a finding, not a crash
        graph = float("nan")
    return eager, graph


def rel(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


class Table:
    def __init__(self, path: Path | None):
        self.path = path
        self.lines = ["| kernel | call | dtype | ours ms | torch ms | ours/torch | ours graph ms "
                      "| torch graph ms | graph ratio | error |",
                      "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        self._write()

    def row(self, name, call, dtype, ours, theirs, error):
        """``ours``, ``theirs``: (launched ms, graph ms) from ``bench``."""
        line = (f"| {name} | {call} | {dtype} | {ours[0]:.4f} | {theirs[0]:.4f} | "
                f"{ours[0] / theirs[0]:.2f} | {ours[1]:.4f} | {theirs[1]:.4f} | "
                f"{ours[1] / theirs[1]:.2f} | {error:.1e} |")
        self.lines.append(line)
        print(line, flush=True)
        self._write()

    def note(self, text: str):
        self.lines.append("")
        self.lines.append(text)
        print(text, flush=True)
        self._write()

    def _write(self):
        if self.path is not None:
            self.path.write_text("\n".join(self.lines) + "\n")


def gemm_rows(table: Table, only: str):
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for label, epi, m, k, n in GEMMS:
        e = next(x for x in matmul.EPILOGUES if x.label == epi)
        for dname in ("bf16", "fp32"):  # fp16 times as bf16 does
            dt = DTYPES[dname]
            x = torch.randn(m, k, device=DEVICE, generator=gen).to(dt)
            w = (torch.randn(n, k, device=DEVICE, generator=gen) / math.sqrt(k)).to(dt)
            b = torch.randn(n, device=DEVICE, generator=gen).to(dt)
            r = torch.randn(m, n, device=DEVICE, generator=gen).to(dt)
            args = (x, w) + ((b,) if e.bias else ()) + ((r,) if e.residual else ())

            def compute(x, w, b, r, e=e):
                y = F.linear(x, w, b if e.bias else None)
                if e.act == "gelu_tanh":
                    y = F.gelu(y, approximate="tanh")
                return y + r if e.residual else y

            def eager(x=x, w=w, b=b, r=r):
                return compute(x, w, b, r)

            want = compute(x.double(), w.double(), b.double(), r.double())
            gemv = matmul.GEMV_CONFIGS if m <= matmul.GEMV_ROWS else ()  # a few rows only
            for cfg in matmul.CONFIGS + gemv:
                name = f"triton_{epi}_{cfg.label}"
                if only and only not in name and only not in label:
                    continue
                if dname != "fp32" and getattr(cfg, "precision", "") == "tf32":
                    continue
                fn = registry.get(name).fn
                got = fn(*args)
                torch.backends.cuda.matmul.allow_tf32 = getattr(cfg, "precision", "") == "tf32"
                ours, theirs = bench(fn, *args), bench(eager)
                torch.backends.cuda.matmul.allow_tf32 = False
                table.row(name, f"{label} ({m}x{k}x{n})", dname, ours, theirs, rel(got, want))


def attention_rows(table: Table, only: str):
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    for label, bsz, hq, hkv, sq, sk, d, causal, mask in ATTENTION:
        for dname in ("bf16", "fp32"):
            dt = DTYPES[dname]
            q = torch.randn(bsz, hq, sq, d, device=DEVICE, generator=gen).to(dt)
            k = torch.randn(bsz, hkv, sk, d, device=DEVICE, generator=gen).to(dt)
            v = torch.randn(bsz, hkv, sk, d, device=DEVICE, generator=gen).to(dt)
            m = None
            if mask == "bool":
                lengths = torch.randint(sk // 2, sk + 1, (bsz,), device=DEVICE, generator=gen)
                m = (torch.arange(sk, device=DEVICE)[None, :] < lengths[:, None])[:, None, None]

            def eager(q=q, k=k, v=v, m=m, causal=causal):
                return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=causal,
                                                      enable_gqa=q.shape[1] != k.shape[1])

            want = F.scaled_dot_product_attention(
                q.double(), k.double(), v.double(), attn_mask=m, is_causal=causal,
                enable_gqa=hq != hkv)
            for cfg in attention.FLASH_CONFIGS:
                name = f"triton_flash_attention{'_mask' if m is not None else ''}_{cfg.label}"
                if only and only not in name and only not in label:
                    continue
                fn = registry.get(name).fn
                args = (q, k, v) + ((m,) if m is not None else ())
                got = fn(*args, is_causal=causal, scale=None)
                ours = bench(fn, *args, is_causal=causal, scale=None)
                table.row(name, f"{label} ({bsz}x{hq}/{hkv}x{sq}x{sk}x{d})", dname, ours,
                          bench(eager), rel(got, want))


def decode_rows(table: Table, only: str):
    gen = torch.Generator(device=DEVICE).manual_seed(2)
    for label, bsz, hq, hkv, sk, d in DECODES:
        for dname in ("bf16", "fp32"):
            dt = DTYPES[dname]
            q = torch.randn(bsz, hq, 1, d, device=DEVICE, generator=gen).to(dt)
            k = torch.randn(bsz, hkv, sk, d, device=DEVICE, generator=gen).to(dt)
            v = torch.randn(bsz, hkv, sk, d, device=DEVICE, generator=gen).to(dt)

            def eager(q=q, k=k, v=v):
                return F.scaled_dot_product_attention(q, k, v,
                                                      enable_gqa=q.shape[1] != k.shape[1])

            want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(),
                                                  enable_gqa=hq != hkv)
            names = [f"triton_decode_attention_{c.label}" for c in attention.DECODE_CONFIGS]
            if sk <= 4096:  # flash runs one row in a 64-row tile: long caches waste minutes
                names += [f"triton_flash_attention_{c.label}" for c in attention.FLASH_CONFIGS]
            for name in names:
                if only and only not in name and only not in label:
                    continue
                fn = registry.get(name).fn
                got = fn(q, k, v, is_causal=False, scale=None)
                ours = bench(fn, q, k, v, is_causal=False, scale=None)
                table.row(name, f"{label} ({bsz}x{hq}/{hkv}x1x{sk}x{d})", dname, ours,
                          bench(eager), rel(got, want))


def small_rows(table: Table, only: str):
    gen = torch.Generator(device=DEVICE).manual_seed(3)
    dt = torch.bfloat16
    x = torch.randn(1, 16, 1024, 128, device=DEVICE, generator=gen).to(dt)
    cos = torch.randn(1024, 128, device=DEVICE, generator=gen).to(dt)
    sin = torch.randn(1024, 128, device=DEVICE, generator=gen).to(dt)

    def eager_rope():
        x1, x2 = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-x2, x1), dim=-1) * sin

    want = (x.double() * cos.double()
            + torch.cat((-x.double()[..., 64:], x.double()[..., :64]), -1) * sin.double())
    for cfg in rope.CONFIGS:
        name = f"triton_rotary_embedding_{cfg.label}"
        if only and only not in name:
            continue
        fn = registry.get(name).fn
        got = fn(x, cos, sin)
        table.row(name, "RoPE (1x16x1024x128)", "bf16", bench(fn, x, cos, sin),
                  bench(eager_rope), rel(got, want))
    table_ = torch.randn(151936, 1024, device=DEVICE, generator=gen).to(dt)
    for shape in ((1, 1), (1, 2048)):
        ids = torch.randint(0, 151936, shape, device=DEVICE, generator=gen)
        for cfg in gather.CONFIGS:
            name = f"triton_embedding_{cfg.label}"
            if only and only not in name:
                continue
            fn = registry.get(name).fn
            got = fn(ids, table_)
            table.row(name, f"embedding {shape} of 151936x1024", "bf16",
                      bench(fn, ids, table_), bench(F.embedding, ids, table_),
                      rel(got, F.embedding(ids, table_)))


def tf32_error(table: Table):
    """The norm-wise error of the TF32 configs against float64 on unit-normal and on biased
    (normal / 2 + 1) data, at K = 768 and 4096: what their declared tolerance must cover."""
    gen = torch.Generator(device=DEVICE).manual_seed(4)
    worst = 0.0
    for k in (768, 4096):
        for biased in (False, True):
            x = torch.randn(512, k, device=DEVICE, generator=gen)
            w = torch.randn(768, k, device=DEVICE, generator=gen)
            if biased:
                x, w = x / 2 + 1, w / 2 + 1
            want = x.double() @ w.double().t()
            for cfg in matmul.CONFIGS:
                if cfg.precision != "tf32":
                    continue
                got = registry.get(f"triton_linear_nobias_{cfg.label}").fn(x, w)
                worst = max(worst, rel(got, want))
    table.note(f"TF32 configs: largest norm-wise error {worst:.2e} over K = 768, 4096, "
               f"normal and biased data (declared {templates.runtime.TF32:g}).")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--only", default="", help="only rows whose kernel or call names this")
    args = p.parse_args(argv)
    if not templates.REGISTERED or templates.runtime.interpreted():
        print("needs a real GPU with triton (not the simulated one)", file=sys.stderr)
        return 2
    import triton

    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    table = Table(args.out / "triton_templates.md" if args.out else None)
    table.note(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
               f"triton {triton.__version__}")
    with torch.no_grad():
        tf32_error(table)
        gemm_rows(table, args.only)
        attention_rows(table, args.only)
        decode_rows(table, args.only)
        small_rows(table, args.only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
