"""A repeated block with several outputs (a KV-cache layer: its residual stream and two cache
updates) is computed once: no kernel outside it fuses one of its outputs, since the block runs
anyway for the others. Found by TG_DEBUG=2's plan check: GPT-2's second layer ran 11 of its
steps twice (60 steps where planning without blocks takes 49)."""

from __future__ import annotations

import numpy as np

import tensor_graphs as tg
from tensor_graphs import nn
from tensor_graphs.compiler import cost_model, prepare
from tensor_graphs.db.store import open_db
from tensor_graphs.ir.graph import leaves
from tensor_graphs.ir.ops.names import WEIGHT
from tensor_graphs.planner.lint import lint_plan
from tensor_graphs.planner.prepare import as_symbols
from tensor_graphs.planner.search import Planner


def test_a_block_with_several_outputs_runs_once():
    model = nn.GPT2(nn.GPT2Config(n_embd=32, n_layer=3, n_head=4, vocab_size=97,
                                  n_positions=64))
    cache = nn.KVCache(max_len=24)
    outputs = [model(cache=cache), *cache.updates]
    bounds = cache.bounds(batch=1, seq=8)
    db = open_db(":memory:")
    prog = tg.compile(outputs, db=db, bounds=bounds)
    assert prog.stats["blocks"] >= 2
    assert lint_plan(prog.plan) == []  # no value made twice
    flat = Planner(prepare(outputs, {}), target="cpu", cost=cost_model(db, ("cpu",)),
                   tolerance=1e-5, dims=as_symbols(bounds)).plan()
    assert len(prog.plan.steps) <= len(flat.steps)
    # and it still computes the model: against the interpreter on random weights
    rng = np.random.default_rng(0)
    weights = {leaf.name: (0.2 * rng.standard_normal(tuple(leaf.shape))).astype(np.float32)
               for leaf in leaves(outputs) if leaf.op.name == WEIGHT}
    prog.bind(**weights, **cache.empty(batch=1))
    ids = rng.integers(0, 97, (1, 5))
    empty = cache.empty(batch=1)
    want = tg.evaluate(outputs[0], {**weights, **empty, "input_ids": ids})
    np.testing.assert_allclose(prog(input_ids=ids)[0], want, rtol=1e-4, atol=1e-4)
