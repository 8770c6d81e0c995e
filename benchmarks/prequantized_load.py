"""Loading a quantized GPT-2 from a prequantized file against quantizing float weights at bind
time (issue 23): seconds to the first tokens and peak resident memory.

    python benchmarks/prequantized_load.py [--layers 12] [--tokens 8] [--repeats 2]
                                           [--schemes int8-weight,int4-weight]

GPT-2 (random weights from transformers' default config: no network) is written once to a
temporary folder two ways: its float32 state dict, and per scheme the file
``tg.save_quantized`` writes (``<name>.q``/``<name>.scale`` per quantized weight, the other
weights float: the tied token table too, which the embedding gathers). Each run is a fresh
process (peak RSS is per process), alternating the two: *float*
``Generator.from_safetensors(float file, config, quantize=scheme)``, the int8/int4 values
computed from the float weights by the first call's prelude, and *prequantized*
``Generator.from_safetensors(quantized file, config)``, which reads no float copy of a
quantized weight. Printed per scheme and way: the file's size, the seconds to build the
generator (read, plan, compile), to build it and generate ``tokens`` tokens after an 8-token
prompt, and the process's peak RSS; medians over repeats with min-max. Plans are estimated
(an in-memory database), the same for both ways.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _config(layers: int):
    import transformers

    return transformers.GPT2Config(n_layer=layers, bos_token_id=None, eos_token_id=None)


def _write_files(folder: str, layers: int, schemes: list[str]) -> dict[str, str]:
    """The float file and one prequantized file per scheme, from one random GPT-2."""
    import torch
    import transformers

    import tensor_graphs as tg
    from tensor_graphs.runtime.weights import write_safetensors

    torch.manual_seed(0)
    cfg = _config(layers)
    lm = transformers.GPT2LMHeadModel(cfg).eval()
    weights = {k: v.numpy() for k, v in lm.state_dict().items() if k != "lm_head.weight"}
    paths = {"float": os.path.join(folder, "float.safetensors")}
    write_safetensors(paths["float"], weights)
    logits = tg.nn.GPT2(tg.nn.GPT2Config.from_hf(cfg))(tg.input("input_ids", (1, "seq"),
                                                                 "int64"))
    for scheme in schemes:
        paths[scheme] = os.path.join(folder, f"{scheme}.safetensors")
        tg.save_quantized(paths[scheme], logits, weights, scheme)
    return paths


def _child(path: str, scheme: str | None, layers: int, tokens: int) -> None:
    """One load and generation in this process; prints its figures as JSON."""
    import numpy as np

    from tensor_graphs.nn import Generator

    cfg = _config(layers)
    start = time.perf_counter()
    gen = Generator.from_safetensors(path, cfg, max_len=8 + tokens, max_prompt=8,
                                     quantize=scheme, db=":memory:")
    built = time.perf_counter() - start
    gen(np.arange(8)[None, :], tokens)
    done = time.perf_counter() - start
    print(json.dumps({"build": built, "total": done, "rss_mb": _peak_rss_mb()}))


def _peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (reset by exec, unlike ru_maxrss, which
    Linux carries over from the parent that spawned this child)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _run(path: str, scheme: str | None, args) -> dict:
    cmd = [sys.executable, __file__, "--child", path, "--layers", str(args.layers),
           "--tokens", str(args.tokens)] + (["--scheme", scheme] if scheme else [])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _spread(values: list[float], fmt: str) -> str:
    return (f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"
            if len(values) > 1 else f"{values[0]:{fmt}}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--tokens", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--schemes", default="int8-weight,int4-weight")
    p.add_argument("--child")
    p.add_argument("--scheme")
    args = p.parse_args()
    if args.child:
        _child(args.child, args.scheme, args.layers, args.tokens)
        return
    schemes = args.schemes.split(",")
    with tempfile.TemporaryDirectory() as folder:
        paths = _write_files(folder, args.layers, schemes)
        print(f"GPT-2 {args.layers} layers, {args.tokens} tokens, {args.repeats} repeats; "
              f"float file {os.path.getsize(paths['float']) / 1e6:.0f} MB")
        for scheme in schemes:
            runs: dict[str, list[dict]] = {"float": [], "prequantized": []}
            for _ in range(args.repeats):  # alternating, each way in a fresh process
                runs["float"].append(_run(paths["float"], scheme, args))
                runs["prequantized"].append(_run(paths[scheme], None, args))
            size = os.path.getsize(paths[scheme]) / 1e6
            print(f"{scheme}: prequantized file {size:.0f} MB")
            for way, got in runs.items():
                print(f"  {way:13s} build {_spread([r['build'] for r in got], '.1f')} s, "
                      f"build + tokens {_spread([r['total'] for r in got], '.1f')} s, "
                      f"peak RSS {_spread([r['rss_mb'] for r in got], '.0f')} MB")


if __name__ == "__main__":
    main()
