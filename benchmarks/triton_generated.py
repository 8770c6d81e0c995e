"""On a GPU: the generated Triton kernels of the gallery against torch eager.

    python benchmarks/triton_generated.py [--dtypes float32,float16] [--only TEXT]

For each region of ``kernels/triton/gallery.py`` (GPT-2-sized GELU chains, a broadcast
bias/residual add, softmax, log-softmax over a vocabulary, LayerNorm + residual, RMSNorm) and
each dtype, every launch configuration's kernel is built (checked against the float64
reference and verified first, on this GPU) and timed with ``triton.testing.do_bench`` (median
of its repeats, inputs already on the GPU, the result into a preallocated tensor), beside
the same computation in torch eager. The fastest configuration is what the profiler would
record for the planner. Needs a real GPU (not the simulated one: its timings mean nothing).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import tensor_graphs  # noqa: E402,F401,I001  (first: its thread-pool settings)

import torch  # noqa: E402
import torch.nn.functional as fn  # noqa: E402

EAGER = {  # gallery name -> the same computation in torch, on the region's inputs by name
    "gelu_tanh": lambda a: fn.gelu(a["x"] + a["b"], approximate="tanh"),
    "gelu_erf": lambda a: fn.gelu(a["x"]) * 1.5 + 0.25,
    "bias_relu_residual": lambda a: torch.relu(a["x"] + a["b"]) + a["r"],
    "softmax": lambda a: torch.softmax(a["s"], dim=-1),
    "log_softmax": lambda a: torch.log_softmax(a["logits"], dim=-1),
    "layer_norm_residual": lambda a: fn.layer_norm(a["x"] + a["r"], a["x"].shape[-1:], a["w"],
                                                  a["b"]),
    "rms_norm": lambda a: fn.rms_norm(a["x"], a["x"].shape[-1:], a["w"], eps=1e-6),
}


def main() -> int:
    from triton.testing import do_bench

    from tensor_graphs.kernels.torch import convert
    from tensor_graphs.kernels.triton import gallery, generate
    from tensor_graphs.kernels.triton.generate import build_elementwise, build_rows

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtypes", default="float32,float16")
    p.add_argument("--only", default="")
    args = p.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print("| region | dtype | eager | best generated | config | vs eager |")
    print("| --- | --- | --- | --- | --- | --- |")
    for e in gallery.entries([n for n in gallery.NAMES if args.only in n],
                             args.dtypes.split(",")):
        gen = torch.Generator(device="cuda").manual_seed(0)
        named = {n.name: torch.randn(tuple(int(d) for d in n.shape), generator=gen,
                                     device="cuda", dtype=convert.torch_dtype(n.dtype))
                 for n in e.region.inputs}
        ordered = [named[n.name] for n in e.region.inputs]
        eager = EAGER[e.name]
        t_eager = do_bench(lambda eager=eager, named=named: eager(named))
        configs = generate.ELEMENTWISE_CONFIGS if e.kind == "elementwise" else \
            generate.ROW_CONFIGS
        build = build_elementwise if e.kind == "elementwise" else build_rows
        times = []
        for config in configs:
            k = build(e.region, e.rendered, config)
            out = k.fn(*ordered)
            times.append((do_bench(lambda k=k, a=ordered, o=out: k.fn(*a, out=o)),
                          config.label))
        best, label = min(times)
        print(f"| {e.name} | {e.dtype} | {t_eager * 1e3:.1f} us | {best * 1e3:.1f} us | "
              f"{label} | {best / t_eager:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
