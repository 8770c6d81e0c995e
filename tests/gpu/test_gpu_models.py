"""Whole models on a GPU with nothing else to set: a GPT-2-shaped graph of our layers through
``tg.compile(..., device="cuda")`` (weights bound, and loaded from safetensors straight onto
the GPU), and transformers' GPT-2 through ``tg.from_torch(..., device="cuda")``, each matching
the float64 reference (||got - ref|| / ||ref||).

Runs on a real GPU, and in CI on the simulated one (see conftest). Random weights, no
downloads."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import tensor_graphs as tg
from tensor_graphs.demo import gpt2_style, random_feeds
from tensor_graphs.devices import torch_device
from tensor_graphs.numerics import relative_error

GPU = torch.device(torch_device("cuda"))
TOL = 1e-4


def _gpt(layers: int = 2):
    return gpt2_style(layers, d_model=256, heads=4, vocab=512, n_ctx=32)


def test_gpt2_shaped_graph_runs_on_the_gpu_and_matches_the_reference():
    y = _gpt()
    dims = {"batch": 1, "seq": 16}
    prog = tg.compile(y, device="cuda", db=":memory:", bounds=dims)
    on_gpu = [s for s in prog.plan.steps if s.device == "cuda" and not s.is_copy]
    assert len(on_gpu) >= 8, prog.explain()  # the GEMMs at least
    feeds = random_feeds(y, dims)
    prog.bind(**{k: v for k, v in feeds.items() if k != "ids"})
    for seq in (16, 11):  # one plan for every length up to the bounds
        ids = np.random.default_rng(seq).integers(0, 512, (1, seq))
        got = prog(ids=ids)
        ref = tg.evaluate(y, {**feeds, "ids": ids}, dtype="float64")
        assert isinstance(got, np.ndarray)
        assert relative_error(got, ref) < TOL
    assert prog.stats["planner_runs"] == 1
    memory = prog.memory()
    weights = sum(v.nbytes for k, v in feeds.items() if k != "ids")
    assert memory["cuda:0"] >= weights  # the weights are the GPU's


def test_safetensors_load_straight_onto_the_gpu(tmp_path, copies):
    from tensor_graphs.runtime.weights import write_safetensors

    y = _gpt(1)
    dims = {"batch": 1, "seq": 8}
    feeds = random_feeds(y, dims)
    weights = {k: v for k, v in feeds.items() if k != "ids"}
    path = tmp_path / "gpt.safetensors"
    write_safetensors(path, weights)
    prog = tg.compile(y, device="cuda", db=":memory:", bounds=dims)
    prog.bind_safetensors(path)
    assert copies["to_gpu"] == 0  # no numpy array moved over: loaded on the GPU
    bound = prog._bound
    assert set(bound) == set(weights)
    assert all(isinstance(t, torch.Tensor) and t.device == GPU for t in bound.values())
    ids = np.random.default_rng(1).integers(0, 512, (1, 8))
    ref = tg.evaluate(y, {**feeds, "ids": ids}, dtype="float64")
    assert relative_error(prog(ids=ids), ref) < TOL


def test_from_torch_gpt2_on_the_gpu():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=128, n_head=4, vocab_size=512,
                                  n_positions=64, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids):
            return self.m(input_ids=ids, use_cache=False).logits

    wrapped = Logits(model)
    exact = Logits(copy.deepcopy(model).double())
    seq = torch.export.Dim("seq", max=32)
    prog = tg.from_torch(wrapped, (torch.randint(0, 512, (1, 9)),), ({1: seq},),
                         device="cuda", db=":memory:")
    assert any(s.device == "cuda" and not s.is_copy for s in prog.plan.steps), prog.explain()
    bound = prog.program._bound
    assert all(isinstance(t, torch.Tensor) and t.device == GPU for t in bound.values())
    params = dict(wrapped.named_parameters())
    shared = [n for n in bound if n in params]
    assert shared and all(bound[n].data_ptr() != params[n].data_ptr() for n in shared)
    for n in (9, 14):
        ids = torch.randint(0, 512, (1, n))
        with torch.no_grad():
            ref = exact(ids).numpy()
        for feed in (ids, ids.to(GPU)):  # on the host, or already on the GPU
            got = prog(feed)
            assert relative_error(np.asarray(got, np.float64), ref) < TOL
    assert prog.program.stats["planner_runs"] == 1
