"""tg.optim against torch.optim: 50 steps on a small MLP's parameters from the same initial
values, the gradients computed by torch from its current parameters each step and fed to both,
so the two differ only by how each computes the update. Parameters, moments and the count are
read back from the compiled program's state; the program is planned once for all the steps."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.numerics import relative_error

torch = pytest.importorskip("torch")

SHAPES = {"fc1.weight": (8, 5), "fc1.bias": (8,), "fc2.weight": (3, 8), "fc2.bias": (3,)}
STEPS = 50

# (id, our optimizer, torch's, the torch state entries to compare with our moments)
CASES = [
    ("sgd", lambda: tg.optim.SGD(0.1),
     lambda ps: torch.optim.SGD(ps, lr=0.1), ()),
    ("sgd-momentum", lambda: tg.optim.SGD(0.05, momentum=0.9),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9), ("momentum_buffer",)),
    ("sgd-nesterov-wd", lambda: tg.optim.SGD(0.05, momentum=0.8, weight_decay=0.1, nesterov=True),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.8, weight_decay=0.1, nesterov=True),
     ("momentum_buffer",)),
    ("sgd-dampening-maximize",  # the first step's buffer is the undamped gradient
     lambda: tg.optim.SGD(0.05, momentum=0.9, dampening=0.5, weight_decay=0.01, maximize=True),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, dampening=0.5, weight_decay=0.01,
                                maximize=True), ("momentum_buffer",)),
    ("adam", lambda: tg.optim.Adam(0.01),
     lambda ps: torch.optim.Adam(ps, lr=0.01), ("exp_avg", "exp_avg_sq")),
    ("adam-l2", lambda: tg.optim.Adam(0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     lambda ps: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
     ("exp_avg", "exp_avg_sq")),
    ("adamw", lambda: tg.optim.AdamW(0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05),
     lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.05),
     ("exp_avg", "exp_avg_sq")),
    ("adamw-amsgrad-maximize",
     lambda: tg.optim.AdamW(0.01, betas=(0.5, 0.9), weight_decay=0.02, amsgrad=True,
                            maximize=True),
     lambda ps: torch.optim.AdamW(ps, lr=0.01, betas=(0.5, 0.9), weight_decay=0.02,
                                  amsgrad=True, maximize=True),
     ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")),
]


def _initial(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {n: rng.standard_normal(s) * 0.5 for n, s in SHAPES.items()}


def _grads(tp: dict, step: int) -> dict[str, np.ndarray]:
    """torch's gradients of an MLP's squared error at its current parameters, on this step's
    batch (so the gradients follow the trajectory, as in training)."""
    rng = np.random.default_rng(1000 + step)
    x = torch.from_numpy(rng.standard_normal((16, 5))).to(tp["fc1.weight"].dtype)
    y = torch.from_numpy(rng.standard_normal((16, 3))).to(x.dtype)
    for p in tp.values():
        p.grad = None
    h = torch.tanh(x @ tp["fc1.weight"].T + tp["fc1.bias"])
    loss = ((h @ tp["fc2.weight"].T + tp["fc2.bias"] - y) ** 2).mean()
    loss.backward()
    return {n: p.grad.numpy().copy() for n, p in tp.items()}


def _run(make_ours, make_torch, dtype: str, lr_at: dict[int, float] | None = None):
    """Both optimizers STEPS steps from the same values; returns (program, updates, torch's
    parameters, torch's optimizer, our parameters' state views after the first step)."""
    params = {n: tg.state(n, s, dtype) for n, s in SHAPES.items()}
    grads = {n: tg.input(f"grad.{n}", s, dtype) for n, s in SHAPES.items()}
    up = make_ours().update(params, grads)
    prog = tg.compile(up.outputs)
    init = {n: v.astype(dtype) for n, v in _initial().items()}
    prog.bind(**init, **up.state_init())
    tp = {n: torch.tensor(v, requires_grad=True) for n, v in init.items()}
    topt = make_torch(list(tp.values()))
    first = None
    for step in range(STEPS):
        if lr_at and step in lr_at:
            prog.bind(**up.lr_value(lr_at[step]))
            for group in topt.param_groups:
                group["lr"] = lr_at[step]
        g = _grads(tp, step)
        prog(**{f"grad.{n}": v for n, v in g.items()})
        topt.step()
        if first is None:
            first = {n: prog.state(n) for n in SHAPES}
    return prog, up, tp, topt, first


def _worst(prog, tp) -> float:
    return max(relative_error(prog.state(n), p.detach().numpy()) for n, p in tp.items())


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_float64_matches_torch_after_50_steps(case):
    _, make_ours, make_torch, moments = case
    prog, up, tp, topt, first = _run(make_ours, make_torch, "float64")
    assert _worst(prog, tp) < 1e-9  # the issue asks 1e-5; float64 kernels do far better
    # the parameters moved (a step that did nothing would match a frozen torch too)
    assert min(relative_error(prog.state(n), v) for n, v in _initial().items()) > 1e-3
    assert int(prog.state(up.count)[0]) == STEPS
    for n, p in tp.items():
        state = topt.state[p]
        if "step" in state:
            assert int(state["step"]) == STEPS
        for what in moments:
            ours = prog.state(f"optim.{n}.{what}")
            assert relative_error(ours, state[what].numpy()) < 1e-9, (n, what)
    # one plan for every step, and the state stayed in the program's buffers: the views read
    # after the first step show the last step's values (no re-plan, no new buffer)
    assert prog.stats["planner_runs"] == 1 and prog.stats["calls"] == STEPS
    assert "copied the state" not in prog.loop  # written over in place (runtime/lower.py)
    for n in SHAPES:
        np.testing.assert_array_equal(first[n], prog.state(n))
        assert np.shares_memory(first[n], prog.state(n))


FLOAT32 = ("sgd-nesterov-wd", "adam", "adamw", "adamw-amsgrad-maximize")


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in FLOAT32], ids=FLOAT32)
def test_float32_matches_torch_after_50_steps(case):
    _, make_ours, make_torch, moments = case
    prog, up, tp, topt, _ = _run(make_ours, make_torch, "float32")
    assert prog.state("fc1.weight").dtype == np.float32
    assert _worst(prog, tp) < 5e-5  # Adam: 3e-6 measured
    for n, p in tp.items():
        for what in moments:
            ours = prog.state(f"optim.{n}.{what}")
            assert relative_error(ours, topt.state[p][what].numpy()) < 1e-5, (n, what)


def test_learning_rate_schedule_binds_without_replanning():
    """A new learning rate mid-run (a state the step reads and never writes) takes effect at
    once and plans nothing; torch's param_groups change at the same steps. Binding it writes
    into the state's buffer: the native loop's recording survives (a weight's bind drops it,
    and the next two calls ran the Python loop again)."""
    schedule = {10: 0.003, 30: 0.0005, 47: 0.001}
    prog, up, tp, _, _ = _run(lambda: tg.optim.AdamW(0.01),
                              lambda ps: torch.optim.AdamW(ps, lr=0.01), "float64", schedule)
    assert _worst(prog, tp) < 1e-9
    assert prog.stats["planner_runs"] == 1
    assert prog.state(up.lr).tolist() == [0.001]
    # and the rate really is read from the state: the same run without the schedule differs
    plain, _, _, _, _ = _run(lambda: tg.optim.AdamW(0.01),
                             lambda ps: torch.optim.AdamW(ps, lr=0.01), "float64")
    assert relative_error(plain.state("fc1.weight"), prog.state("fc1.weight")) > 1e-3
    assert prog.stats["native_runs"] == plain.stats["native_runs"]


@pytest.mark.parametrize("make_ours, make_torch", [
    (lambda: tg.optim.SGD(0.05, momentum=0.9, nesterov=True),
     lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True)),
    (lambda: tg.optim.AdamW(0.01, weight_decay=0.05),
     lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=0.05)),
], ids=["sgd-nesterov", "adamw"])
def test_one_program_computes_loss_gradients_and_step(make_ours, make_torch):
    """The loss, its gradients (reverse mode) and the update in one program, as a training
    step is: the forward and backward read each parameter's value from before the step while
    the same call writes its new version. Losses and parameters follow torch's step by step."""
    from tensor_graphs.ir.autodiff import grad

    params = {n: tg.state(n, s, "float64") for n, s in SHAPES.items()}
    x, y = tg.input("x", (16, 5), "float64"), tg.input("y", (16, 3), "float64")
    h = tg.tanh(x @ params["fc1.weight"].T + params["fc1.bias"])
    err = h @ params["fc2.weight"].T + params["fc2.bias"] - y
    loss = (err * err).mean()
    grads = dict(zip(params, grad(loss, list(params.values()))))
    up = make_ours().update(params, grads)
    prog = tg.compile([loss, *up.outputs])
    prog.bind(**_initial(), **up.state_init())
    tp = {n: torch.tensor(v, requires_grad=True) for n, v in _initial().items()}
    topt = make_torch(list(tp.values()))
    for step in range(STEPS):
        rng = np.random.default_rng(1000 + step)
        xb, yb = rng.standard_normal((16, 5)), rng.standard_normal((16, 3))
        ours = float(prog(x=xb, y=yb)[0])
        topt.zero_grad()
        tl = ((torch.tanh(torch.from_numpy(xb) @ tp["fc1.weight"].T + tp["fc1.bias"])
               @ tp["fc2.weight"].T + tp["fc2.bias"] - torch.from_numpy(yb)) ** 2).mean()
        tl.backward()
        topt.step()
        assert abs(ours - tl.item()) <= 1e-9 * abs(tl.item()), step
    assert _worst(prog, tp) < 1e-9
    assert prog.stats["planner_runs"] == 1


@pytest.mark.parametrize("name", ["adam", "adamw"])
def test_bfloat16_adam_moves_its_parameters_as_torch_does(name):
    """The bias corrections are computed in float32, as torch computes them in double: in
    bfloat16 beta2 = 0.999 rounds to 1.0, ``1 - beta2**t`` was 0, and no bf16 parameter
    ever moved (the loss stayed flat, with no warning)."""
    import ml_dtypes

    bf16 = ml_dtypes.bfloat16
    ours, theirs = {"adam": (tg.optim.Adam, torch.optim.Adam),
                    "adamw": (tg.optim.AdamW, torch.optim.AdamW)}[name]
    params = {n: tg.state(n, s, "bfloat16") for n, s in SHAPES.items()}
    grads = {n: tg.input(f"grad.{n}", s, "bfloat16") for n, s in SHAPES.items()}
    up = ours(0.01).update(params, grads)
    prog = tg.compile(up.outputs, tolerance=1e-2)  # (the count is float32: 1e-5 otherwise)
    init = {n: v.astype(np.float32).astype(bf16) for n, v in _initial().items()}
    prog.bind(**init, **up.state_init())
    tp = {n: torch.tensor(v.astype(np.float32)).to(torch.bfloat16).requires_grad_()
          for n, v in init.items()}
    topt = theirs(list(tp.values()), lr=0.01)
    rng = np.random.default_rng(7)
    for _ in range(10):
        g = {n: rng.standard_normal(s).astype(np.float32).astype(bf16)
             for n, s in SHAPES.items()}
        for n, p in tp.items():
            p.grad = torch.tensor(g[n].astype(np.float32)).to(torch.bfloat16)
        prog(**{f"grad.{n}": v for n, v in g.items()})
        topt.step()
    for n, p in tp.items():
        got = prog.state(n).astype(np.float32)
        want = p.detach().float().numpy()
        assert relative_error(got, init[n].astype(np.float32)) > 1e-2, n  # it moved
        assert relative_error(got, want) < 1e-2, n
