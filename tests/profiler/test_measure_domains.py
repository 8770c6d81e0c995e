"""The profiler's made-up inputs lie where real data lies for the ops that read them
(``ir/domains.py``): a log, sqrt or fractional pow of an argument reads positive values, as a
log of a softmax or a sqrt of a variance does. On normal inputs a generated loop's ``logf``
took glibc's slow path on half its lanes and its row read ~40x the time real data costs."""

from __future__ import annotations

import numpy as np

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


def test_the_rule_is_one_table_for_verification_too():
    from tensor_graphs.kernels.signatures import POSITIVE as VERIFIED_POSITIVE

    x = tg.input("x", (4,))
    assert input_domains(tg.rsqrt(x), (x,)) == {x: POSITIVE}
    assert {"log", "sqrt", "rsqrt"} <= VERIFIED_POSITIVE


def test_a_generated_log_is_timed_on_the_values_it_reads():
    """log(x) on (256, 4096): 10 ms a call on normal inputs (glibc's vector logf on the
    negative lanes), 0.24 ms on positive ones, the time log(x*x + 1) takes on any input.
    Measured side by side (interleaved rounds), the two stay within a small factor."""
    x = tg.input("x", (256, 4096))
    calls = []
    for root in (tg.log(x), tg.log(x * x + 1.0)):
        kernel = codegen.fuse_elementwise(root, [x], register=False)
        calls.append(Call(kernel, root, (x,), {}, signature([x], {})))
    log_x, log_square = measure_together(calls, repeats=5, min_sample=2e-3, max_seconds=1.0)
    assert log_x.failure is None and log_square.failure is None
    assert log_x.seconds < 4 * log_square.seconds, (log_x.seconds, log_square.seconds)
