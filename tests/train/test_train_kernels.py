"""The training step's backward runs on C kernels: products of transposed, sliced and
head-permuted views on c_matmul_strided (no dense copy of a view, no numpy or torch matmul),
its sums on c_sum, cross entropy's mask cast on c_cast_bool. Planned from estimates alone (an
empty database), so the test sees what the planner is offered, not this machine's rows; the
steps agree with the same step on numpy's kernels."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.kernels.c import build
from tensor_graphs.numerics import relative_error

pytestmark = pytest.mark.skipif(not build.available(), reason="no C compiler")
B, S, V = 2, 16, 64


def trainer(**options) -> tg.Trainer:
    model = tg.nn.GPT2(tg.nn.GPT2Config(vocab_size=V, n_positions=S, n_embd=32, n_layer=1,
                                        n_head=2))
    ids, targets = tg.input("ids", (B, S), "int64"), tg.input("targets", (B * S,), "int64")
    loss = tg.cross_entropy(tg.reshape(model(ids), (B * S, V)), targets)
    return tg.Trainer(loss, optimizer=tg.optim.AdamW(1e-2), db=":memory:", **options)


@pytest.mark.slow
def test_backward_products_sums_and_casts_are_c_kernels():
    ours = trainer()
    used = collections.Counter(s.kernel.name for s in ours.program.plan.steps)
    assert used["c_matmul_strided"] >= 8 and used["c_sum"] >= 8 and used["c_cast_bool"] == 1
    others = {n for n in used if n.startswith(("torch_", "numpy_matmul", "numpy_sum",
                                               "numpy_cast"))}
    assert not others, others
    reference = trainer(backends=["numpy"])
    rng = np.random.default_rng(0)
    values = {n: (rng.standard_normal(tuple(p.shape)) * 0.1).astype(np.float32)
              for n, p in ours.params.items()}
    ours.bind(**values)
    reference.bind(**values)
    for _ in range(4):
        batch = dict(ids=rng.integers(0, V, (B, S)), targets=rng.integers(0, V, (B * S,)))
        got, want = ours.step(**batch), reference.step(**batch)
        assert abs(got - want) <= 1e-5 * abs(want)
    got = ours.weights()
    for name, value in reference.weights().items():  # Adam amplifies rounding where v ~ 0
        assert relative_error(got[name], value) < 1e-4, name
