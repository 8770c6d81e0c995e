"""Row regions split across programs (``kernels/triton/splitrows.py``): several programs per
row, a two-phase reduction per level (partials, then a combine per row) and the epilogue over
each chunk; checked against the float64 reference, offered only for long static rows."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.kernels.triton import build, generate
from tensor_graphs.kernels.triton.build import Config
from tests.kernels.triton.common import DTYPES, agrees, atomic_root, run, within
from tests.kernels.triton.test_triton_rows import GALLERY, fresh

SMALL = Config(16, 2)  # blocks of 16: a row of 50 is 4 chunks
CHECKED = Config(256, 2)  # the checks' rows of 33 and 1025: 1 and 5 chunks


def kernel(y, expand, config=CHECKED, verify=True):
    """The split kernel of ``y``'s row region (built directly: the generator offers it only
    at SPLIT_MIN_WIDTH and above)."""
    from tensor_graphs.kernels.triton import splitrows

    got = generate.row_region(atomic_root(y, expand), use_counts([y]), expand)
    assert got is not None, "no row region"
    _covers, region, _top, _ = got
    rendered = splitrows.render(region)
    return generate.build_split(region, rendered, config, verify=verify), region


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(GALLERY))
def test_split_rows_pass_their_checks(name, dtype, expand):
    """Building checks the kernel on rows of 1, 7, 33 and 1025 (strided every other trial)
    and runs tg.kernels.verify(strict=True); fresh inputs then agree with float64."""
    y = GALLERY[name](dtype)
    k, region = kernel(y, expand)
    assert (k.backend, k.device, k.writes_out) == ("triton", "cuda", True)
    assert k.name.startswith("triton_split_")
    feeds = fresh(region, np.random.default_rng(5))
    got = run(k, *[feeds[n.name] for n in region.inputs])
    within(k, got, tg.evaluate(y, feeds, dtype="float64"), dtype)


def test_chunks_fill_the_gpu_and_none_is_empty():
    assert build.split_count(4, 50257, 1024) == (50, 1024)  # 200 programs of 1 block
    assert build.split_count(1, 50257, 2048) == (25, 2048)  # every block its own program
    assert build.split_count(264, 50257, 4096) == (1, 53248)  # enough rows: one chunk
    for rows, width, block in ((3, 33, 16), (1, 1, 16), (7, 1025, 64), (2, 9000, 4096)):
        s, chunk = build.split_count(rows, width, block)
        assert chunk % block == 0 and (s - 1) * chunk < width <= s * chunk


@pytest.mark.slow  # ~13 s: 50 x 3 programs over blocks of 1024 in the interpreter
def test_a_vocabulary_row_in_many_chunks_agrees_with_float64(expand):
    """log-softmax over 50257 (a GPT-2 vocabulary) on one row: 50 chunks at block 1024, the
    max and the sum of exps each combined from 50 partials."""
    y = tg.log_softmax(tg.input("x", (1, 50257), "float32"))
    k, _ = kernel(y, expand, Config(1024, 4), verify=False)
    x = (np.random.default_rng(3).standard_normal((1, 50257)) * 4).astype(np.float32)
    x[0, 40000] = 30.0  # the max in a late chunk
    agrees(run(k, x), tg.evaluate(y, {"x": x}, dtype="float64"))


def test_float64_rows_sum_in_float64(expand):
    from tests.kernels.triton.test_triton_rows import layer_norm_residual

    y = layer_norm_residual("float64")
    k, region = kernel(y, expand)
    feeds = fresh(region, np.random.default_rng(6))
    feeds["x"] = feeds["x"] + 1e4  # far from zero: float32 partials would lose the variance
    got = run(k, *[feeds[n.name] for n in region.inputs])
    ref = tg.evaluate(y, feeds, dtype="float64")
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-12


def test_nan_in_any_chunk_and_masked_logits(expand):
    from tests.kernels.triton.test_triton_rows import softmax

    y = softmax("float32", d=50)
    k, _ = kernel(y, expand, SMALL, verify=False)  # 4 chunks of 16
    x = np.random.default_rng(7).standard_normal((3, 50)).astype(np.float32)
    x[0, 37] = np.nan  # in the third chunk: the whole row is NaN
    x[1, :49] = -np.inf  # one live logit, in the last chunk: probability 1
    x[2, 3] = 80.0
    got = run(k, x)
    assert np.isnan(got[0]).all()
    np.testing.assert_array_equal(got[1], np.eye(50, dtype=np.float32)[49])
    agrees(got[2], tg.evaluate(y, {"x": x}, dtype="float64")[2])


def test_offered_for_long_static_rows_only(expand):
    def candidates(d, seq=None):
        shape = (2, seq or d)
        y = tg.log_softmax(tg.input("x", shape, "float32"))
        root = atomic_root(y, expand)
        return [generate.split_candidate(root, use_counts([y]), expand, config=c)
                for c in generate.SPLIT_CONFIGS]

    assert all(c is None for c in candidates(4096))
    assert all(c is None for c in candidates(0, seq="vocab"))  # symbolic width
    long = candidates(generate.SPLIT_MIN_WIDTH)
    assert all(c is not None and c.generator.startswith("triton_split_rows") for c in long)
    assert len({c.name for c in long}) == len(generate.SPLIT_CONFIGS)
    names = [n for n, _ in generate.generator_rows()]
    assert sum(n.startswith("triton_split_rows_") for n in names) == len(generate.SPLIT_CONFIGS)


@pytest.mark.slow  # a child process compiling 15 kernels (~10-60 s cold)
def test_split_kernels_compile_for_sm_90(child_env, tmp_path):
    """``tg kernels compile`` compiles the gallery's split log-softmax (5 kernels: part and
    combine per level, final) under each configuration for an H100, without a GPU, in a
    process without the interpreter (this folder's runs under the simulated GPU)."""
    import subprocess
    import sys
    from pathlib import Path

    from tensor_graphs.kernels import triton as package

    env = dict(child_env, TG_CACHE_DIR=str(tmp_path / "cache"),
               TRITON_CACHE_DIR=str(tmp_path / "triton"))
    for name in ("TG_SIMULATED_CUDA", package.INTERPRET):
        env.pop(name, None)
    res = subprocess.run(
        [sys.executable, "-m", "tensor_graphs.cli", "kernels", "compile", "--arch", "sm_90",
         "--region", "log_softmax_split", "--dtype", "float32", "--no-templates"],
        cwd=Path(__file__).resolve().parents[3], env=env, capture_output=True, text=True,
        timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    configs = len(generate.ROW_CONFIGS)
    assert res.stdout.startswith(f"sm_90: {configs} Triton kernels x configurations compiled "
                                 f"({5 * configs} compiles; "), res.stdout
