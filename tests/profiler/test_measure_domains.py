"""The profiler's made-up inputs lie where real data lies for the ops that read them
(``ir/domains.py``): a log, sqrt or fractional pow of an argument reads positive values, as a
log of a softmax or a sqrt of a variance does. On normal inputs a generated loop's ``logf``
took glibc's slow path on half its lanes and its row read ~40x the time real data costs."""

from __future__ import annotations

import numpy as np
import pytest

import tensor_graphs as tg
from tensor_graphs.ir.domains import POSITIVE, input_domains
from tensor_graphs.kernels.c import codegen
from tensor_graphs.planner.search import signature
from tensor_graphs.profiler.measure import Call, measure_together, random_inputs


def _drawn(root, *arguments):
    call = Call(None, root, arguments, {}, "")
    return random_inputs(call, np.random.default_rng(0))


def test_operands_of_log_sqrt_and_fractional_pow_are_drawn_positive():
    x, y, z, w = (tg.input(n, (64, 8)) for n in "xyzw")
    drawn = _drawn(tg.log(x * y + 1.0) + tg.sqrt(tg.sum(z, axis=-1, keepdims=True))
                   + tg.pow(w, 0.5), x, y, z, w)
    assert all((drawn[a] > 0).all() for a in (x, y, z, w))


def test_operands_a_draw_cannot_help_or_that_need_nothing_stay_normal():
    x, y, z = (tg.input(n, (64, 8)) for n in "xyz")
    # log(x*x + 1) is defined everywhere; x ** 2 too; log(y - 3) is not fixed by any y > 0
    drawn = _drawn(tg.log(x * x + 1.0) + tg.pow(z, 2.0) + tg.log(y - 3.0), x, y, z)
    assert all((drawn[a] < 0).any() for a in (x, y, z))
    assert input_domains(tg.exp(x) + y, (x, y)) == {}


_X, _Y = tg.input("x", (64, 8)), tg.input("y", (64, 8))


@pytest.mark.parametrize("root", [
    tg.log(_X * -2.0), tg.log(-2.0 * _X), tg.log(_X / -2.0), tg.log(-2.0 / _X),
    tg.log(_X * 0.0), tg.log(_X / 0.0), tg.log(_X + -3.0), tg.log(-3.0 + _X),
    tg.sqrt(tg.minimum(_X, -1.0)), tg.log(_X * _Y * -0.5),
    tg.log(_X * tg.expand(tg.constant(np.float32(-2.0)), (64, 8))),
], ids=["mul_neg", "neg_mul", "div_neg", "neg_div", "mul_zero", "div_zero", "add_neg",
        "neg_add", "min_neg", "mul_mul_neg", "mul_expanded_neg"])
def test_a_negative_or_zero_constant_stops_the_trace(root):
    """log(x * -2) on positive x is NaN on every lane (all slow path): worse than normal x,
    which leaves half of them in the domain. A multiplier or divisor <= 0, or a negative
    addend, stops the trace at that op."""
    assert input_domains(root, (_X, _Y)) == {}
    drawn = _drawn(root, _X, _Y)
    assert (drawn[_X] < 0).any() and (drawn[_X] > 0).any()


@pytest.mark.parametrize("root", [
    tg.log(_X * 2.0), tg.log(_X / 2.0), tg.log(2.0 / _X), tg.log(_X + 0.0), tg.log(_X + 3.0),
    tg.sqrt(tg.maximum(_X, -1.0)), tg.log(_X * _Y * 0.5),
], ids=["mul_pos", "div_pos", "pos_div", "add_zero", "add_pos", "max_neg", "mul_mul_pos"])
def test_a_positive_constant_keeps_the_trace(root):
    assert input_domains(root, (_X, _Y))[_X] == POSITIVE
    assert (_drawn(root, _X, _Y)[_X] > 0).all()


def test_a_stop_on_one_path_leaves_the_others():
    assert input_domains(tg.log(_X * -2.0) + tg.log(_Y + 1.0), (_X, _Y)) == {_Y: POSITIVE}


def test_the_rule_is_one_table_for_verification_too():
    from tensor_graphs.kernels.signatures import POSITIVE as VERIFIED_POSITIVE

    x = tg.input("x", (4,))
    assert input_domains(tg.rsqrt(x), (x,)) == {x: POSITIVE}
    assert {"log", "sqrt", "rsqrt"} <= VERIFIED_POSITIVE


def test_a_generated_log_is_timed_on_the_values_it_reads():
    """log(x) on (256, 4096): 10 ms a call on normal inputs (glibc's vector logf on the
    negative lanes), 0.24 ms on positive ones, the time log(x*x + 1) takes on any input.
    The draw is the deterministic part; the timing check, measured side by side (interleaved
    rounds), allows 10x where the slow path costs ~40x, and takes the best of three tries
    so a loaded machine cannot fail it."""
    x = tg.input("x", (256, 4096))
    calls = []
    for root in (tg.log(x), tg.log(x * x + 1.0)):
        kernel = codegen.fuse_elementwise(root, [x], register=False)
        calls.append(Call(kernel, root, (x,), {}, signature([x], {})))
    assert (random_inputs(calls[0], np.random.default_rng(0))[x] > 0).all()
    ratios = []
    for _ in range(3):
        log_x, log_square = measure_together(calls, repeats=5, min_sample=2e-3,
                                             max_seconds=1.0)
        assert log_x.failure is None and log_square.failure is None
        ratios.append(log_x.seconds / log_square.seconds)
        if ratios[-1] < 10:
            break
    assert min(ratios) < 10, ratios
