"""Checking one gradient: tg.grad's graphs evaluated by the reference interpreter in float64,
against torch.autograd and against a central finite difference along a random direction.

Every float input of the case is differentiated; the output's cotangent is a random input
(``seed``), so a non-scalar op's whole Jacobian is exercised, not only its sum. The error is
the project's one measure, ||got - ref|| / ||ref||.
"""

from __future__ import annotations

import numpy as np

import tensor_graphs as tg
from tensor_graphs.ir.graph import leaves
from tensor_graphs.numerics import relative_error


def float_leaves(arrays, kinds=()) -> tuple[list, dict]:
    """Leaves a, b, c... for the arrays (None stays None); float arrays become float64 leaves."""
    nodes, feeds = [], {}
    for i, a in enumerate(arrays):
        if a is None:
            nodes.append(None)
            continue
        name = "abcdefgh"[i]
        dt = "float64" if a.dtype.kind == "f" else tg.ir.dtypes.from_numpy(a.dtype)
        kind = kinds[i] if i < len(kinds) else "input"
        nodes.append((tg.state if kind == "state" else tg.input)(name, a.shape, dt))
        feeds[name] = a
    return nodes, feeds


def tg_grads(build, arrays, kwargs, wrt_index, rng, kinds=()):
    """(output value, cotangent, gradients) of build(*leaves, **kwargs) for the inputs at
    wrt_index, through tg.grad and tg.evaluate."""
    nodes, feeds = float_leaves(arrays, kinds)
    y = build(*nodes, **kwargs)
    cot = rng.standard_normal(tuple(int(d) for d in y.shape))
    seed = tg.input("seed", y.shape, "float64")
    grads = tg.grad(y, [nodes[i] for i in wrt_index], seed=seed)
    for g, i in zip(grads, wrt_index):
        assert g.shape == nodes[i].shape and g.dtype == nodes[i].dtype, (g, nodes[i])
    used = {leaf.name for leaf in leaves([y, *grads])}  # a zero gradient reads no seed
    got = tg.evaluate([y, *grads], {k: v for k, v in {**feeds, "seed": cot}.items() if k in used})
    return got[0], cot, got[1:], (nodes, y, feeds)


def torch_grads(torch_fn, arrays, kwargs, wrt_index, cot):
    """torch.autograd's gradients of the same case (zeros where an input is unused); None
    when the torch function has no such case."""
    import torch

    ts = [None if a is None else torch.tensor(a, requires_grad=i in wrt_index)
          for i, a in enumerate(arrays)]
    out = torch_fn(torch, *ts, **kwargs)
    if out is None:
        return None
    wrt = [ts[i] for i in wrt_index]
    found = torch.autograd.grad(out, wrt, grad_outputs=torch.tensor(cot, dtype=out.dtype),
                                allow_unused=True)
    return [np.zeros(a.shape) if f is None else f.detach().numpy()
            for a, f in zip([arrays[i] for i in wrt_index], found)]


def finite_difference(build_graph, arrays, wrt_index, grads, cot, rng, step=1e-6) -> tuple:
    """(directional derivative from a central difference, the same from the gradients) along
    a random direction v: d/dt <cot, f(x + t v)> = sum_i <grad_i, v_i>."""
    nodes, y, feeds = build_graph
    names = [nodes[i].name for i in wrt_index]
    dirs = [rng.standard_normal(arrays[i].shape) for i in wrt_index]
    scale = [step * (1.0 + float(np.max(np.abs(arrays[i]), initial=0.0))) for i in wrt_index]

    def f(t: float) -> np.ndarray:
        moved = dict(feeds)
        for name, v, s in zip(names, dirs, scale):
            moved[name] = feeds[name] + t * s * v
        return tg.evaluate(y, moved)

    up, down = f(1.0), f(-1.0)
    with np.errstate(invalid="ignore"):  # a constant nan or inf (a pad value) moves by 0
        moved = np.where((up == down) | (np.isnan(up) & np.isnan(down)), 0.0, up - down)
    fd = float(np.sum(cot * moved)) / 2.0
    analytic = sum(float(np.sum(g * v)) * s for g, v, s in zip(grads, dirs, scale))
    return fd, analytic


def check_case(build, arrays, kwargs, wrt_index, torch_fn=None, tol=1e-9, fd_tol=1e-5,
               seed_key=0, kinds=(), fd=True) -> None:
    rng = np.random.default_rng(seed_key)
    _, cot, got, graph = tg_grads(build, arrays, kwargs, wrt_index, rng, kinds)
    if torch_fn is not None:
        ref = torch_grads(torch_fn, arrays, kwargs, wrt_index, cot)
        if ref is not None:
            floor = 1e-12 * float(np.linalg.norm(cot))  # a zero gradient vs torch's rounding
            for i, g, r in zip(wrt_index, got, ref):
                err = relative_error(g, r)
                assert err <= tol or float(np.linalg.norm(g - r)) <= floor, \
                    f"input {i}: gradient error {err:.3g} vs torch (tol {tol})"
    if fd:
        numeric, analytic = finite_difference(graph, arrays, wrt_index, got, cot, rng)
        bound = fd_tol * max(abs(analytic), 1e-3 * sum(float(np.linalg.norm(g)) for g in got),
                             1e-12)
        assert abs(numeric - analytic) <= bound, \
            f"finite difference {numeric:.10g} vs gradients {analytic:.10g}"
