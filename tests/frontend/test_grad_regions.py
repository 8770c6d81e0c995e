"""frontend/grad_regions.py: torch.export's grad-mode regions inlined, what was computed with
grad disabled detached where it leaves. The oracle is torch itself: the inlined graph, run with
autograd, must give the gradients the forward gives when run eagerly under its grad modes.
torch.export writes its regions one after another (tests/train/test_torch_trainer_marks.py
trains such modules); a region nested in another is built here by hand."""

from __future__ import annotations

import operator
from types import SimpleNamespace

import numpy as np
import pytest

from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")

from tensor_graphs.frontend.grad_regions import inline_grad_regions  # noqa: E402

REGION = torch.ops.higher_order.wrap_with_set_grad_enabled
aten = torch.ops.aten


def _eager(x, w):
    """The forward the graphs below spell: grad off around a block that turns it on again."""
    with torch.set_grad_enabled(False):
        d = x * 2.0
        with torch.enable_grad():
            g = d * w + w
        e = g + d
    return e, g, x


def _nested_program():
    """_eager as torch.export would keep it, were regions nested: top(x, w) calls a
    grad-disabled body, which calls a grad-enabled one."""
    inner = torch.fx.Graph()
    v, w = inner.placeholder("v"), inner.placeholder("w")
    prod = inner.call_function(aten.mul.Tensor, (v, w))
    inner.output((inner.call_function(aten.add.Tensor, (prod, w)),))

    owner = torch.nn.Module()
    owner.inner = torch.fx.GraphModule(torch.nn.Module(), inner)
    body = torch.fx.Graph()
    a, w = body.placeholder("a"), body.placeholder("w")
    d = body.call_function(aten.mul.Tensor, (a, 2.0))
    call = body.call_function(REGION, (True, body.get_attr("inner"), d, w))
    g = body.call_function(operator.getitem, (call, 0))
    e = body.call_function(aten.add.Tensor, (g, d))
    body.output((e, g, a))

    root = torch.nn.Module()
    root.body = torch.fx.GraphModule(owner, body)
    top = torch.fx.Graph()
    x, w = top.placeholder("x"), top.placeholder("w")
    call = top.call_function(REGION, (False, top.get_attr("body"), x, w))
    top.output(tuple(top.call_function(operator.getitem, (call, i)) for i in range(3)))
    return SimpleNamespace(graph_module=torch.fx.GraphModule(root, top))


def _gradients(fn, x0, w0, cot):
    x, w = (torch.tensor(v, requires_grad=True) for v in (x0, w0))
    total = sum((o * torch.tensor(c)).sum() for o, c in zip(fn(x, w), cot) if o.requires_grad)
    return [np.zeros_like(x0) if t is None else t.numpy()
            for t in torch.autograd.grad(total, [x, w], allow_unused=True)]


def test_nested_regions_follow_torchs_grad_modes():
    """What the disabled block computed (d, e) carries no gradient, also into the block that
    enables grad again; that block's own result (g, through w) and a value passed through
    unchanged (x) keep theirs."""
    program = inline_grad_regions(_nested_program())
    graph = program.graph_module.graph
    targets = [n.target for n in graph.nodes if n.op == "call_function"]
    assert REGION not in targets and targets.count(aten.detach.default) == 2
    rng = np.random.default_rng(0)
    x0, w0 = rng.standard_normal(5), rng.standard_normal(5)
    cot = [rng.standard_normal(5) for _ in range(3)]
    got = _gradients(program.graph_module, x0, w0, cot)
    want = _gradients(_eager, x0, w0, cot)
    for g, r in zip(got, want):
        assert relative_error(g, r) <= 1e-15
    assert relative_error(want[0], cot[2]) <= 1e-15  # x only through its pass-through


def test_a_program_without_regions_is_left_alone():
    exported = torch.export.export(torch.nn.Linear(3, 2), (torch.randn(4, 3),))
    before = [n.target for n in exported.graph.nodes]
    assert inline_grad_regions(exported) is exported
    assert [n.target for n in exported.graph.nodes] == before
