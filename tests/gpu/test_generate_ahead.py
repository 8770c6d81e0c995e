"""A GPU generator chooses each token on the GPU and queues the next step before it reads the
token on the host (``Generator._tokens_ahead``): the host's work per step overlaps the GPU's
instead of adding to it. Its tokens stay transformers', eos and ended rows included; the
host reader it waits through never hands back a value a later copy overwrote.

Runs on a real GPU as it is, and in CI on the simulated one (see conftest)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tensor_graphs.runtime import values
from tests.gpu import tiny


class _Logged:
    """The decode program, each call noted in ``log`` ("step")."""

    def __init__(self, program, log: list):
        self._program, self._log = program, log

    def __call__(self, **feeds):
        self._log.append("step")
        return self._program(**feeds)

    def __getattr__(self, name):
        return getattr(self._program, name)


@pytest.mark.slow  # ~10 s on the simulated GPU: its first steps run the Triton interpreter
def test_each_step_is_queued_before_the_previous_token_is_read(slow_host, monkeypatch):
    from tensor_graphs.nn import Generator

    gen = Generator.from_transformers(tiny.gpt2(), max_len=16, max_prompt=8, db=slow_host,
                                      device="cuda")
    log: list = []
    gen.decode = _Logged(gen.decode, log)
    start = values.HostReader.start

    def noted(self, value):
        read = start(self, value)

        def reading():
            log.append("read")
            return read()
        return reading

    monkeypatch.setattr(values.HostReader, "start", noted)
    prompt = np.random.default_rng(3).integers(0, 211, (1, 8))
    tokens = gen(prompt, 5)
    # the prefill's token is read after the first decode step is queued, and so on; the last
    # token queues nothing (the cache holds prompt + 4)
    assert log == ["step", "read"] * 4 + ["read"], log
    expected = tiny.greedy(tiny.gpt2(), prompt, 5)
    np.testing.assert_array_equal(tokens, expected)


@pytest.mark.slow  # ~15 s on the simulated GPU
def test_an_eos_ends_a_row_and_the_others_go_on_as_transformers(slow_host):
    """Batch 2, an eos that one row meets first: that row gets the pad token afterwards (it
    was fed its own argmax, not the pad, which changes only its own hidden tokens), the other
    row's tokens are transformers'; the generation stops early when both have ended."""
    from tensor_graphs.nn import Generator

    lm = tiny.gpt2()
    prompt = np.random.default_rng(5).integers(0, 211, (2, 6))
    ids = torch.from_numpy(prompt)
    with torch.no_grad():
        free = lm.generate(ids, max_new_tokens=8, do_sample=False, pad_token_id=0,
                           attention_mask=torch.ones_like(ids)).numpy()[:, 6:]
    # the eos: row 0's third token, where row 1 does not have it before its last
    eos = int(free[0, 2])
    assert eos not in free[1, :7].tolist(), free  # (the seed gives rows that differ)
    with torch.no_grad():
        expected = lm.generate(ids, max_new_tokens=8, do_sample=False, eos_token_id=eos,
                               pad_token_id=7, attention_mask=torch.ones_like(ids)).numpy()
    gen = Generator.from_transformers(lm, max_len=16, max_prompt=6, batch=2, db=slow_host,
                                      device="cuda", eos_token_id=eos, pad_token_id=7)
    got = gen(prompt, 8)
    np.testing.assert_array_equal(got, expected)
    assert (got[0, 9:] == 7).all(), got


@pytest.mark.slow  # ~15 s on the simulated GPU
def test_a_left_padded_batch_gives_transformers_tokens_in_cuda_graphs(slow_host):
    """Prompts of 7 and 4 tokens, the second left-padded: the padded programs take each row's
    padding (``pad``) as a feed, so their steps are queued ahead and replayed as CUDA graphs
    (padded to the cache length's bucket) like the unpadded ones, with transformers' tokens."""
    from tensor_graphs.nn import Generator

    lm = tiny.gpt2()
    rng = np.random.default_rng(11)
    ids = np.zeros((2, 7), np.int64)
    ids[0], ids[1, 3:] = rng.integers(1, 211, 7), rng.integers(1, 211, 4)
    mask = (ids != 0).astype(np.int64)
    with torch.no_grad():
        expected = lm.generate(torch.from_numpy(ids), max_new_tokens=10, do_sample=False,
                               pad_token_id=0, attention_mask=torch.from_numpy(mask)).numpy()
    gen = Generator.from_transformers(lm, max_len=24, max_prompt=8, batch=2, db=slow_host,
                                      device="cuda")
    for _ in range(2):  # the second generation replays the graphs the first captured
        np.testing.assert_array_equal(gen(ids, 10, attention_mask=mask), expected)
    decode = gen._padded[1]
    assert decode.loop.startswith("cuda graph: replayed"), decode.loop
    assert decode.stats["graph_runs"] >= 9, decode.stats


def test_the_host_reader_reads_each_copy_as_it_was_even_after_its_slot_is_reused():
    """Three copies through two slots, read last to first: the third copy took the first's
    slot, so the first was read before it was overwritten."""
    device = "cuda" if torch.cuda.is_available() else "cpu"  # (the simulated GPU's: the host)
    reader = values.HostReader(slots=2)
    made = [torch.full((2, 1), i, dtype=torch.int64, device=device) for i in range(3)]
    tickets = [reader.start(t) for t in made]
    for t in made:
        t.fill_(-1)  # the sources change after each copy was queued
    got = [ticket() for ticket in reversed(tickets)][::-1]
    assert [g.tolist() for g in got] == [[[0], [0]], [[1], [1]], [[2], [2]]], got
    assert all(isinstance(g, np.ndarray) for g in got)
    assert reader.start(np.array([4]))().tolist() == [4]


@pytest.mark.slow  # ~10 s on the simulated GPU
def test_a_sampling_gpu_generator_draws_on_the_host_as_a_cpu_one(slow_host):
    """Sampling needs the scores on the host, so a sampling GPU generator runs the host loop
    (no step queued ahead); with one seed it draws the tokens a CPU generator draws."""
    from tensor_graphs.nn import Generator

    prompt = np.random.default_rng(5).integers(0, 211, (1, 6))
    draws = {}
    for device in ("cuda", "cpu"):
        gen = Generator.from_transformers(tiny.gpt2(), max_len=12, max_prompt=6, db=slow_host,
                                          device=device, do_sample=True, top_k=20, seed=11)
        assert not gen._ahead
        draws[device] = gen(prompt, 6)
    np.testing.assert_array_equal(draws["cuda"], draws["cpu"])
