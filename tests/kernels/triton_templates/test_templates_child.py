"""The main suite's doors to this folder: its tests in Triton's interpreter under the simulated
GPU (a child pytest: ``TG_SIMULATED_CUDA`` must be set before tensor_graphs is imported), and
the ahead-of-time compile of every template x config for an H100 (child processes: the jit
functions must be compiled ones, which an interpreted process cannot give).

Both skip without triton or torch, so the suite stays green without them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tensor_graphs.kernels.triton import templates
from tensor_graphs.kernels.triton.templates import attention, gather, matmul, rope

FOLDER = Path(__file__).resolve().parent
ROOT = FOLDER.parents[2]
KERNELS = (len(matmul.EPILOGUES) * len(matmul.CONFIGS)
           + 2 * (len(attention.FLASH_CONFIGS) + len(attention.DECODE_CONFIGS))
           + len(rope.CONFIGS) + len(gather.CONFIGS))

needs_triton = pytest.mark.skipif(not templates.triton_installed(), reason="triton missing")


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(templates.REGISTERED, reason="the templates are registered here: this "
                    "process runs the folder's tests itself")
def test_templates_in_the_interpreter(child_env):
    pytest.importorskip("torch")
    env = dict(child_env, TG_SIMULATED_CUDA="1")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
                           str(FOLDER)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=900)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) > KERNELS, out[-3000:]  # every kernel verified


_COMPILE = """
import json, sys
from tensor_graphs.kernels.triton.templates.targets import compile_all, compile_targets
names = [t.name for t in compile_targets()]
print(json.dumps({"names": names, "compiled": compile_all(90, 32, (int(sys.argv[1]), 2))}))
"""


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(templates.REGISTERED and templates.runtime.interpreted(),
                    reason="the main suite compiles (this is the interpreter's child run)")
def test_every_template_and_config_compiles_for_sm90(child_env, tmp_path):
    """triton.compile for GPUTarget("cuda", 90, 32) works without a GPU: every target
    compiles, and its shared memory fits an H100's block (the interpreter cannot tell)."""
    from tensor_graphs.kernels.triton.templates.targets import SHARED_MEMORY

    env = {k: v for k, v in child_env.items() if k not in ("TRITON_INTERPRET",
                                                           "TG_SIMULATED_CUDA")}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # compile for real; leave the user's cache alone
    procs = [subprocess.Popen([sys.executable, "-c", _COMPILE, str(i)], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    names = results[0]["names"]
    compiled = dict(pair for r in results for pair in r["compiled"])
    assert sorted(compiled) == sorted(names) and len(names) >= 20
    too_big = {n: s for n, s in compiled.items() if s > SHARED_MEMORY}
    assert not too_big, f"shared memory over {SHARED_MEMORY} bytes: {too_big}"
    print(f"{len(compiled)} Triton template targets compile for sm_90")
