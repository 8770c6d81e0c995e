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

from tensor_graphs.kernels import triton as package
from tensor_graphs.kernels.triton import templates
from tensor_graphs.kernels.triton.templates import argmax, attention, gather, matmul, rope
from tests import children

FOLDER = Path(__file__).resolve().parent
ROOT = FOLDER.parents[2]
KERNELS = (sum(len(matmul.configs(e)) for e in matmul.EPILOGUES)
           + 2 * (len(attention.FLASH_CONFIGS) + len(attention.DECODE_CONFIGS))
           + len(rope.CONFIGS) + len(gather.CONFIGS) + len(argmax.CONFIGS))

needs_triton = pytest.mark.skipif(not package.installed(), reason="needs triton and torch")


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(templates.REGISTERED, reason="the templates are registered here: this "
                    "process runs the folder's tests itself")
@pytest.mark.child("templates")
def test_templates_in_the_interpreter(child_env):
    pytest.importorskip("torch")
    done = children.finish("templates", child_env)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) > KERNELS, out[-3000:]  # every kernel verified


_COMPILE = """
import json, sys
from tensor_graphs.kernels.triton.aot import compile_target
from tensor_graphs.kernels.triton.templates.targets import compile_targets
todo = list(compile_targets())
done = [compile_target(t, 90) for t in todo[int(sys.argv[1])::2]]
print(json.dumps({"names": [t.name for t in todo],
                  "compiled": {d.name: [d.ok, d.shared, d.error] for d in done}}))
"""


@needs_triton
@pytest.mark.slow
@pytest.mark.skipif(package.interpreted(),
                    reason="the main suite compiles (this is the interpreter's child run)")
def test_every_template_and_config_compiles_for_sm90(child_env, tmp_path):
    """triton.compile for GPUTarget("cuda", 90, 32) works without a GPU: every target
    compiles, with the alignment a launch specialises it on, and its shared memory fits an
    H100's block (the interpreter cannot tell). ``aot.compile_target`` compiles them, as
    ``tg kernels compile`` does."""
    from tensor_graphs.kernels.triton.aot import SHARED_MEMORY

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
    compiled = {name: done for r in results for name, done in r["compiled"].items()}
    assert sorted(compiled) == sorted(names) and len(names) >= 20
    refused = {n: error for n, (ok, _, error) in compiled.items() if not ok}
    assert not refused, refused  # a compile error, or shared memory over SHARED_MEMORY[90]
    assert max(shared for _, shared, _ in compiled.values()) <= SHARED_MEMORY[90]
    print(f"{len(compiled)} Triton template targets compile for sm_90")
