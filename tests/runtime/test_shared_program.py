"""A program called the ways a server or a training loop calls it: from several threads at
once, and with torch tensors that autograd tracks (``nn.Parameter``, a model's output)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")


def _program():
    x = tg.input("x", (3, 8))
    w = tg.weight("w", (8, 8))
    y = tg.relu(x @ w) + x
    return tg.compile(y, db=":memory:"), y


def test_threads_sharing_a_program_get_their_own_results():
    """Calls share the program's arenas: from several threads they run one at a time (two
    to four of 60 results were another call's, silently, on the host too)."""
    prog, y = _program()
    W = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    prog.bind(w=W)
    wrong = []

    def worker(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(100):
            X = rng.standard_normal((3, 8)).astype(np.float32)
            ref = tg.evaluate(y, {"x": X, "w": W}, dtype="float64")
            if relative_error(prog(x=X), ref) > 1e-5:
                wrong.append(seed)

    with ThreadPoolExecutor(4) as pool:  # (list: a worker's exception is raised here)
        list(pool.map(worker, range(4)))
    assert wrong == []


def test_a_parameter_is_a_tensor_to_bind_and_to_feed():
    """``nn.Parameter`` (its class's module is ``torch.nn.parameter``) is a tensor: it was read
    as an array, and bind raised torch's "Can't call numpy() on Tensor that requires grad"."""
    prog, y = _program()
    rng = np.random.default_rng(1)
    W = rng.standard_normal((8, 8)).astype(np.float32)
    X = rng.standard_normal((3, 8)).astype(np.float32)
    prog.bind(w=torch.nn.Parameter(torch.from_numpy(W.copy())))
    ref = tg.evaluate(y, {"x": X, "w": W}, dtype="float64")
    got = prog(x=torch.nn.Parameter(torch.from_numpy(X.copy())))
    assert relative_error(got, ref) < 1e-5
