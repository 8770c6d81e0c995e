"""Triton candidates in plans: offered on GPU slots only, chosen, built (checked, verified)
after planning, and run by the runtime with its arena view as ``out=``."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.errors import NoPathError
from tensor_graphs.ir.graph import use_counts
from tensor_graphs.kernels import generated
from tests.kernels.triton.common import atomic_root


def block(dt="float32"):
    x, b = tg.input("x", (4, 33), dt), tg.input("b", (33,), dt)
    return tg.softmax(tg.gelu(x + b, approximate="tanh") * 1.5, axis=-1)


def feeds(dt="float32"):
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((4, 33)).astype(dt),
            "b": rng.standard_normal(33).astype(dt)}


def test_every_configuration_is_offered_at_a_root(expand):
    y = block()
    root = atomic_root(y, expand)
    found = [c for c in generated.candidates(root, use_counts([y]), expand)
             if c.backend == "triton"]
    kinds = [c.generator.split("_")[1] for c in found]  # the softmax's epilogue is both
    assert sorted(kinds) == ["elementwise"] * 3 + ["rows"] * 3
    assert all(c.device == "cuda" for c in found)
    c_ones = [c for c in generated.candidates(root, use_counts([y]), expand)
              if c.backend == "c"]
    assert c_ones and all(c.device == "cpu" for c in c_ones)


@pytest.mark.parametrize("dt", ["float32", "float16"])
def test_a_gpu_plan_takes_one_triton_step_and_runs_it(dt):
    """With only Triton (and copies) allowed, the softmax of a GELU chain is one generated
    row kernel on cuda:0 between the copies, checked before it runs."""
    y = block(dt)
    prog = tg.compile(y, device="cuda", db=":memory:", backends=("triton",),
                      tolerance=1e-5 if dt == "float32" else 1e-2)
    steps = [s for s in prog.plan.steps if s.kernel.backend == "triton"]
    assert len(steps) == 1 and steps[0].device == "cuda"
    assert steps[0].kernel.name.startswith("triton_row_") and len(steps[0].nodes) > 20
    got = np.asarray(prog(**feeds(dt)))
    ref = tg.evaluate(y, feeds(dt), dtype="float64")
    err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert err < (1e-6 if dt == "float32" else 2.0 ** -9), err


def test_an_elementwise_chain_is_one_triton_step():
    x = tg.input("x", (3, 17), "float32")
    y = tg.gelu(x) * 2.0 + tg.exp(-x)
    prog = tg.compile(y, device="cuda", db=":memory:", backends=("triton",))
    names = [s.kernel.name for s in prog.plan.steps if s.kernel.backend == "triton"]
    assert len(names) == 1 and names[0].startswith("triton_ew_")
    xv = np.random.default_rng(1).standard_normal((3, 17)).astype(np.float32)
    ref = tg.evaluate(y, {"x": xv}, dtype="float64")
    got = np.asarray(prog(x=xv))
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-6


def test_triton_kernels_are_never_placed_on_the_cpu():
    with pytest.raises(NoPathError):
        tg.compile(block(), device="cpu", db=":memory:", backends=("triton",))


def test_generated_c_stays_on_the_cpu_in_a_gpu_plan():
    prog = tg.compile(block(), device="cuda", db=":memory:", backends=("c",))
    assert all(s.device == "cpu" for s in prog.plan.steps if s.kernel.backend == "c")
