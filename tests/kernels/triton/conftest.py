"""The generated Triton kernels' tests: on a real GPU as they are, in CI on the simulated one.

``TG_SIMULATED_CUDA=1`` must be set before tensor_graphs is imported (it also switches Triton
to its interpreter), so the main suite runs this folder in a child process with it set
(``tests/kernels/test_triton_simulated.py``); in the main process itself, without a GPU real
or simulated, every test here is skipped. The interpreter runs a kernel's programs one by one
in numpy (~0.6 ms each): shapes stay tiny and blocks large."""

from __future__ import annotations

import importlib.util

import pytest

if importlib.util.find_spec("torch") is None or importlib.util.find_spec("triton") is None:
    pytest.skip("needs torch and triton", allow_module_level=True)  # (not imported here: the
    # simulated GPU switches on Triton's interpreter before triton is first imported)


@pytest.fixture(autouse=True)
def _needs_a_gpu():
    from tensor_graphs.kernels import triton as package

    if not package.usable():
        pytest.skip("no GPU, real or simulated (tests/kernels/test_triton_simulated.py runs "
                    "this folder with TG_SIMULATED_CUDA=1)")


@pytest.fixture
def expand():
    """The planner's decomposition: one node object per composite."""
    from tensor_graphs.ir.node import expand_composite

    memo = {}

    def fn(n):
        if n not in memo:
            memo[n] = expand_composite(n.op, n.inputs, n.attrs)
        return memo[n]

    return fn
