"""The generated Triton kernels in CI: ``tests/kernels/triton`` in a child process on the
simulated GPU, and, in this process (no GPU), that none is offered.

``TG_SIMULATED_CUDA=1`` makes cuda:0 a device in host memory and switches Triton to its
interpreter; it must be set before tensor_graphs (and triton) is imported, so the folder runs
in its own pytest process, in the background (``tests/children.py``). On a machine with a
real GPU the main run also runs the folder directly, on the GPU."""

from __future__ import annotations

import importlib.util

import pytest

from tensor_graphs.kernels import triton as package
from tests import children
from tests.kernels.triton.common import atomic_root

needs_triton = pytest.mark.skipif(not package.installed(), reason="needs triton and torch")


@pytest.mark.slow
@needs_triton
@pytest.mark.child("triton")
def test_the_triton_tests_pass_on_the_simulated_gpu(child_env):
    children.finish("triton", child_env).assert_all_passed()


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None and package.usable(),
                    reason="a GPU is usable here")
def test_no_triton_candidate_without_a_gpu():
    import tensor_graphs as tg
    from tensor_graphs.ir.graph import use_counts
    from tensor_graphs.ir.node import expand_composite
    from tensor_graphs.kernels import generated

    x = tg.input("x", (4, 8), "float32")
    y = tg.softmax(tg.exp(x) * 2.0, axis=-1)
    expand = lambda n: expand_composite(n.op, n.inputs, n.attrs)  # noqa: E731
    found = generated.candidates(atomic_root(y, expand), use_counts([y]), expand)
    assert found and all(c.backend != "triton" for c in found)
