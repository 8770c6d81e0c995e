"""torch.compile(model, backend="tensor_graphs") the way users call it: bugs a hunt found,
each compared with eager torch on the same weights."""

import threading
import warnings

import pytest

import tensor_graphs  # noqa: F401  (before torch: its thread pools start quiet)

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402

from tensor_graphs.frontend import dynamo  # noqa: E402
from tensor_graphs.frontend.dynamo import EagerFallbackWarning  # noqa: E402
from tests.frontend.dynamo_spy import Spy, err, fresh_dynamo  # noqa: E402, F401

TOL = 1e-5
OPTIONS = {"db": ":memory:"}


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.SiLU(), nn.Linear(16, 4)).eval()


def test_a_parameter_given_new_data_is_seen():
    """``param.data = w`` swaps the memory but keeps the version counter, which was all the
    backend compared: the program kept the weights bound first and the results went silently
    wrong (relative error ~1)."""
    m = _mlp()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled(x)
        m[0].weight.data = torch.randn(16, 8)
        assert err(compiled(x), m(x)) <= TOL
    assert [p.calls for p in spy.ours] == [2]  # our program ran both calls


def test_a_call_in_another_thread_while_a_larger_size_replans():
    """A size past the bound re-plans; the new bounds were set before the new plan existed,
    so another thread's call in that window ran the old plan past its bound: a ShapeError,
    and the graph was sent to eager torch for good with a misleading warning."""
    m = _mlp()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, dynamic=True, options=OPTIONS)
    plan = dynamo.compiler.compile
    inputs = {n: torch.randn(n, 8) for n in (3, 70, 100)}
    other: dict = {}

    def call_other():
        with warnings.catch_warnings(record=True) as seen, torch.no_grad():
            warnings.simplefilter("always")
            other["out"] = compiled(inputs[100])
        other["fallback"] = [w for w in seen if w.category is EagerFallbackWarning]

    def replan(*args, **kwargs):  # the second plan (for 70) with a call of 100 meanwhile
        if spy.ours and spy.ours[0].compiles == 1 and "thread" not in other:
            other["thread"] = threading.Thread(target=call_other)
            other["thread"].start()
            other["thread"].join(timeout=1.0)  # it waits for this plan, or ran without it
        return plan(*args, **kwargs)

    with torch.no_grad():
        compiled(inputs[3])  # planned with the bound 64
        dynamo.compiler.compile = replan
        try:
            got = compiled(inputs[70])
        finally:
            dynamo.compiler.compile = plan
        other["thread"].join()
        assert err(got, m(inputs[70])) <= TOL
        assert err(other["out"], m(inputs[100])) <= TOL
    assert not other["fallback"]
    (prog,) = spy.ours
    assert not prog._eager and prog.calls == 3


def test_a_sliced_input_after_a_dense_one_runs_as_our_program():
    """Dynamo recompiles for an input of new strides with the strides as symbolic graph
    inputs that nothing reads; they were refused as sizes no tensor has, and the graph ran
    in eager torch from then on."""
    m = _mlp()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", EagerFallbackWarning)
        for x in (torch.randn(3, 8), torch.randn(3, 16)[:, :8], torch.randn(5, 16)[:, 8:]):
            assert err(compiled(x), m(x)) <= TOL
    assert spy.ours and all(not p._eager for p in spy.ours)
    assert sum(p.calls for p in spy.ours) == 3


class _Scaled(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x, alpha: float):
        return self.fc(x) * alpha


def test_calls_outside_the_plan_are_warned_of_once():
    """A float argument Dynamo stops specializing (the second value) reaches the program as
    a constant; every call with another value then ran in eager torch, silently. Now the
    first such call warns (once), and the results stay eager's."""
    torch.manual_seed(0)
    m = _Scaled().eval()
    spy = Spy()
    compiled = torch.compile(m, backend=spy, options=OPTIONS)
    x = torch.randn(3, 8)
    with torch.no_grad(), warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for alpha in (0.5, 0.75, 1.5, 2.5):
            assert err(compiled(x, alpha), m(x, alpha)) <= TOL
    told = [str(w.message) for w in seen if w.category is EagerFallbackWarning]
    assert len(told) == 1 and "took as a constant (0.75) has another value" in told[0], told
    assert "specialize_float" in told[0]
