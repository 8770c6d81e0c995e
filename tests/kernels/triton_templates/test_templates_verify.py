"""Every Triton template x config matches the float64 reference (``tg.kernels.verify``).

Runs where the templates are registered: on a GPU, or under the simulated GPU, where Triton's
interpreter runs them on CPU tensors (``test_templates_child.py`` starts a pytest of this
folder with ``TG_SIMULATED_CUDA=1``). The interpreter computes float32 and float16 (its
bfloat16 is wrong); a GPU adds bfloat16 and larger cases (see each module's ``signatures``).
"""

from __future__ import annotations

import zlib

import pytest

import tensor_graphs as tg
from tensor_graphs.kernels.triton import templates
from tensor_graphs.kernels.triton.templates import argmax, attention, gather, matmul, rope

pytestmark = pytest.mark.skipif(not templates.REGISTERED,
                                reason="the templates need triton and a GPU (or the simulated "
                                       "one: test_templates_child.py runs this folder there)")

PACKAGE = "tensor_graphs.kernels.triton.templates"
KERNELS = [k for k in tg.kernels.all() if k.fn.__module__.startswith(PACKAGE)]


def expected_names() -> set[str]:
    """One kernel per (pattern, config), as the config tables say."""
    names = {f"triton_{e.label}_{c.label}" for e in matmul.EPILOGUES
             for c in matmul.configs(e)}
    for suffix in ("", "_mask"):
        names |= {f"triton_flash_attention{suffix}_{c.label}" for c in attention.FLASH_CONFIGS}
        names |= {f"triton_decode_attention{suffix}_{c.label}"
                  for c in attention.DECODE_CONFIGS}
    names |= {f"triton_rotary_embedding_{c.label}" for c in rope.CONFIGS}
    names |= {f"triton_embedding_{c.label}" for c in gather.CONFIGS}
    names |= {f"triton_argmax_{c.label}" for c in argmax.CONFIGS}
    return names


def test_every_template_and_config_is_a_kernel():
    assert {k.name for k in KERNELS} == expected_names()
    assert all(k.backend == "triton" and k.device == "cuda" and k.writes_out for k in KERNELS)


@pytest.mark.parametrize("kernel", KERNELS, ids=[k.name for k in KERNELS])
def test_template_matches_reference(kernel):
    # the seed test_verify_all uses: one verification per kernel and process
    report = tg.kernels.verify(kernel, seed=zlib.crc32(kernel.name.encode()))
    assert report.ok, str(report)
    floats = [d for d in ("float32", "float16", "bfloat16") if kernel.dtypes is None
              or d in {t.name for t in kernel.dtypes}]
    tested = set(report.by_dtype)
    if tested == {"int64"}:  # an index (argmax): the dtypes of the inputs its cases read
        tested = {d for d in floats for case in report.shapes if f" {d};" in case}
    assert "float32" in tested, str(report)
    if "_tf32_" not in kernel.name:  # the TF32 configs take float32 only
        assert {"float16"} <= tested, f"{kernel.name}: no float16 case ran ({tested})"
    if "bfloat16" in floats and not templates.runtime.interpreted():
        assert "bfloat16" in tested


def test_a_norm_prologue_longer_than_its_tile_loops_over_the_row(monkeypatch):
    """Rows longer than ``NORM_TILE`` take the looped statistics (two passes from memory):
    with the tile made 64 wide, the cases' rows of 300 and 520 take that path."""
    monkeypatch.setattr(matmul, "NORM_TILE", 64)
    kernel = next(k for k in KERNELS if k.name == "triton_ln_matmul_bias_gemv_n16k256")
    report = tg.kernels.verify(kernel, seed=1)
    assert report.ok, str(report)
