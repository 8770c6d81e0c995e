"""A sample during which the process's threads waited for a core is taken again.

The run delay is faked (``_run_delay``): the test decides which takes were contended and
checks which time the sample keeps and what it spent, with a fake kernel whose calls take
known times.
"""

from __future__ import annotations

import itertools

import pytest

from tensor_graphs.profiler import measure


class Clock:
    """A kernel whose n-th take lasts ``times[n]`` seconds per call (perf_counter faked)."""

    def __init__(self, monkeypatch, times, waits):
        self.now = 0.0
        self.times = list(times)
        self.take = -1
        self.delay = 0.0
        waits = iter(waits)
        monkeypatch.setattr(measure.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(measure.time, "sleep", lambda s: None)

        def run_delay():
            return self.delay
        monkeypatch.setattr(measure, "_run_delay", run_delay)
        self._waits = waits
        self.calls_in_take = 0

    def fn(self):
        if self.calls_in_take == 0:
            self.take += 1
            self.delay += next(self._waits)  # waited for a core during this take
        self.now += self.times[self.take]
        self.calls_in_take = (self.calls_in_take + 1) % 10


def test_a_contended_take_is_retaken_and_the_clean_one_kept(monkeypatch):
    # 10 calls a take: the first take lasts 5 ms and waited 4 ms for a core; the second is clean
    clock = Clock(monkeypatch, [500e-6, 40e-6], [4e-3, 0.0])
    seconds, spent = measure._uncontended_sample(clock.fn, 10)
    assert seconds == pytest.approx(40e-6)
    assert spent == pytest.approx(10 * 540e-6)
    assert clock.take == 1


def test_a_clean_take_is_kept_at_once(monkeypatch):
    # waited 0.1 ms of 1 ms: under CONTENDED (12.5 %)
    clock = Clock(monkeypatch, [100e-6, 40e-6], [1e-4, 0.0])
    assert measure._uncontended_sample(clock.fn, 10) == (pytest.approx(100e-6),
                                                         pytest.approx(1e-3))
    assert clock.take == 0


def test_always_contended_keeps_the_fastest_of_retakes_plus_one(monkeypatch):
    times = [900e-6, 300e-6, 700e-6, 500e-6, 800e-6, 600e-6, 400e-6, 200e-6]
    clock = Clock(monkeypatch, times, itertools.repeat(1.0))
    seconds, spent = measure._uncontended_sample(clock.fn, 10)
    assert clock.take == measure.RETAKES  # RETAKES + 1 takes, the last (200 us) not taken
    assert seconds == pytest.approx(min(times[:measure.RETAKES + 1]))
    assert spent == pytest.approx(10 * sum(times[:measure.RETAKES + 1]))


def test_the_budget_stops_the_retakes(monkeypatch):
    clock = Clock(monkeypatch, [500e-6] * 8, itertools.repeat(1.0))
    seconds, spent = measure._uncontended_sample(clock.fn, 10, budget=12e-3)
    assert clock.take == 2  # 5 ms, 10 ms, 15 ms spent: past the 12 ms budget after the third
    assert spent == pytest.approx(15e-3)


def test_on_a_gpu_one_take(monkeypatch):
    clock = Clock(monkeypatch, [500e-6, 40e-6], itertools.repeat(1.0))
    seconds, _ = measure._uncontended_sample(clock.fn, 10, sync=lambda: None)
    assert clock.take == 0 and seconds == pytest.approx(500e-6)


def test_run_delay_reads_this_process():
    first = measure._run_delay()
    if first is None:
        pytest.skip("no /proc/self/task/*/schedstat here")
    assert first >= 0.0 and measure._run_delay() >= first
