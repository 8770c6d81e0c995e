"""CUDA graphs' rules without a GPU (``runtime/graphs.py``): where a program's instructions
divide and why one is refused, the LRU of graphs, the calls that count as syncs, and the
warm-up's checks. The capture and replay themselves run in tests/gpu/test_cuda_graphs.py."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.ops.names import DIM, INPUT, STATE, STATE_UPDATE, WEIGHT
from tensor_graphs.runtime import graphs


def _kernel(op="add", view=False, inplace=None, backend="torch"):
    return SimpleNamespace(op=op, view=view, inplace=inplace, backend=backend)


def _ins(name, args, out, reads="cuda", device="cuda", place=(("cuda", 0, 64)),
         copy_in=False, **kernel):
    return SimpleNamespace(name=name, args=tuple(args), out=out, reads=reads, device=device,
                           place=place, kernel=_kernel(**kernel), copy_in=copy_in,
                           contiguous=False, fn=None, free=(), fresh=place is None)


def _leaf(op, name):
    return SimpleNamespace(op=SimpleNamespace(name=op), name=name)


LEAVES = [(0, _leaf(INPUT, "x")), (1, _leaf(WEIGHT, "w")), (2, _leaf(STATE, "kv")),
          (3, _leaf(DIM, None))]
KINDS = {0: "cpu", 1: "cuda", 2: "cuda", 3: "cuda"}


def _program():
    """x -> GPU: matmul, a view, a state append; one result back to the host."""
    return [
        _ins("copy_host_to_cuda", [0], 4, reads="cpu"),
        _ins("torch_cuda_matmul", [4, 1], 5),
        _ins("torch_cuda_reshape", [5], 6, place=None, op="reshape", view=True),
        _ins("torch_cuda_state_update", [2, 6], 7, place=None, op=STATE_UPDATE),
        _ins("torch_cuda_add", [6, 3], 8),
        _ins("copy_cuda_to_host", [8], 9, device="cpu"),
        _ins("numpy_exp", [9], 10, reads="cpu", device="cpu"),
    ]


def _analyze(instructions, leaves=LEAVES, kinds=KINDS, outputs=(10, 7)):
    return graphs.analyze(instructions, leaves, kinds, {1}, outputs)


def test_the_split_of_a_program():
    split = _analyze(_program())
    assert (split.first, split.last) == (1, 5)  # after the input's copy, before the host's
    assert split.live == (7, 8)  # the new state (an output) and what the suffix copies
    assert split.states == (2,) and split.held == (3,)  # the weight (1) is static
    assert split.prefix == (0,) and split.region == (1, 2, 3, 4)


@pytest.mark.parametrize(("change", "reason"), [
    (lambda p: p.insert(3, _ins("numpy_neg", [5], 11, reads="cpu", device="cpu")),
     "numpy_neg runs on the host, or copies to it, between the first and the last GPU step"),
    (lambda p: p.insert(3, _ins("copy_cuda_to_host", [5], 11, device="cpu")),
     "copy_cuda_to_host runs on the host, or copies to it, between"),
    (lambda p: p.insert(3, _ins("copy_host_to_cuda", [0], 11, reads="cpu")),
     "copy_host_to_cuda runs on the host, or copies to it, between"),
    (lambda p: p.__setitem__(4, _ins("torch_cuda_add", [6, 3], 8, place=None)),
     "torch_cuda_add allocates its result (no out= place in the arena) and the result leaves "
     "the graph (an output, or read after the last GPU step)"),
    (lambda p: p.__setitem__(slice(4, 5), [  # what the suffix reads: a view of memory
        _ins("torch_cuda_relu", [5], 11, place=None, op="relu"),  # allocated inside
        _ins("torch_cuda_reshape", [11], 8, place=None, op="reshape", view=True)]),
     "torch_cuda_reshape allocates its result"),
    (lambda p: p.insert(2, _ins("copy_host_to_cuda", [0], 11, reads="cpu", copy_in=True,
                                place=("cuda", 32, 64))),
     "copy_host_to_cuda (a feed, staged before the graph) shares its arena place with "
     "torch_cuda_matmul, an earlier GPU step"),
    (lambda p: p.__setitem__(0, _ins("copy_host_to_cuda", [0], 4, reads="cpu", place=None)),
     "copy_host_to_cuda brings a value to the GPU outside the arena (no place)"),
])
def test_refusals_name_the_step_and_the_rule(change, reason):
    program = _program()
    change(program)
    with pytest.raises(graphs.Refused, match=reason.replace("(", r"\(").replace(")", r"\)")):
        _analyze(program)


def test_in_place_kernels_and_views_take_no_memory():
    program = _program()
    program.insert(2, _ins("torch_cuda_relu_", [5], 5, place=None, op="relu", inplace=0))
    assert _analyze(program).first == 1


def test_a_result_allocated_and_read_inside_the_region_is_allowed():
    """torch SDPA or rotary without out=: a graph replays the allocation at its address."""
    program = _program()
    program.insert(2, _ins("torch_cuda_relu", [5], 11, place=None, op="relu"))
    program.insert(3, _ins("torch_cuda_add", [11, 5], 12, place=("cuda", 128, 64)))
    split = _analyze(program)
    assert split.region == (1, 2, 3, 4, 5, 6) and split.live == (7, 8)


def test_a_feed_copied_among_the_gpu_steps_is_staged_before_the_region():
    program = _program()
    program.insert(4, _ins("copy_host_to_cuda", [0], 11, reads="cpu", copy_in=True,
                           place=("cuda", 256, 64)))
    program.insert(5, _ins("torch_cuda_mul", [8, 11], 12, place=("cuda", 512, 64)))
    program[-2] = _ins("copy_cuda_to_host", [12], 9, device="cpu")
    split = _analyze(program)
    assert split.prefix == (0, 4) and split.region == (1, 2, 3, 5, 6)
    assert (split.first, split.last) == (1, 7) and split.live == (7, 12)


def test_an_input_on_the_gpu_and_a_program_without_gpu_steps_are_refused():
    with pytest.raises(graphs.Refused, match="input 'x' lives on the GPU"):
        _analyze(_program(), kinds={**KINDS, 0: "cuda"})
    host = [_ins("numpy_exp", [0], 4, reads="cpu", device="cpu")]
    with pytest.raises(graphs.Refused, match="no step runs on the GPU per call"):
        _analyze(host, outputs=(4,))


def test_graphs_are_an_lru_by_dims_and_the_split_follows_the_instruction_list():
    cache = graphs.Graphs(limit=2)
    for key in ("a", "b"):
        cache.put(key, key.upper())
    assert cache.get("a") == "A"  # a is now the newest
    cache.put("c", "C")
    assert list(cache.entries) == ["a", "c"]
    calls = []
    program = _program()
    split = cache.split(program, lambda: calls.append(1) or _analyze(program))
    assert cache.split(program, lambda: calls.append(1)) is split and calls == [1]
    assert cache.entries == {}  # a new list: the graphs of the old one are gone
    cache.put("d", "D")
    other = list(program)  # an equal list of its own (a tool swapped the instructions)
    refused = cache.split(other, lambda: _analyze([]))
    assert refused == "no step runs on the GPU per call" and cache.entries == {}
    cache.put("e", "E")
    cache.clear()
    assert cache.entries == {}


# ----------------------------------------------------------------------------- syncs
@pytest.fixture
def torch():
    return pytest.importorskip("torch")


class _FakeStream:
    def __init__(self, device=None):
        self.waited: list = []

    def wait_stream(self, other) -> None:
        self.waited.append(other)


@pytest.fixture
def real_gpu_warm_up(torch, monkeypatch):
    """The real GPU's branch of ``warming`` on this machine: torch's stream and sync-debug
    calls stand in, the mode kept in a dict (what set/get_sync_debug_mode touch process-wide)."""
    mode = {"now": "warn"}  # a user's own setting, to be given back
    monkeypatch.setattr(graphs, "simulated_cuda", lambda: None)
    monkeypatch.setattr(graphs, "torch_device", lambda device: "cpu")
    monkeypatch.setattr(torch.cuda, "Stream", _FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    current = _FakeStream()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: mode["now"])
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode",
                        lambda m: mode.__setitem__("now", m))
    return mode, current


@pytest.mark.parametrize("fails", [False, True])
def test_the_warm_up_gives_the_sync_debug_mode_back(real_gpu_warm_up, fails):
    """The warm-up raises on syncs through torch's process-wide sync debug mode; afterwards,
    also when a kernel of the warm-up raised, the mode is the caller's again and the current
    stream waits for the side stream's work."""
    mode, current = real_gpu_warm_up

    def warm_up():
        with graphs.warming("cuda:0", [], []) as checker:
            assert isinstance(checker, graphs.Checker)
            assert mode["now"] == "error"
            if fails:
                raise RuntimeError("a kernel failed in the warm-up")

    if fails:
        with pytest.raises(RuntimeError, match="warm-up"):
            warm_up()
    else:
        warm_up()
    assert mode["now"] == "warn"
    assert len(current.waited) == 1


def test_every_sync_row_names_a_torch_function(torch):
    for path, _ in graphs.SYNCS:
        obj = torch
        for part in path.split("."):
            obj = getattr(obj, part)
        assert callable(obj), path


def test_the_watch_stops_calls_that_wait_for_the_gpu(torch):
    x = torch.arange(6.0)
    watch = graphs._watch()
    with watch:
        torch.add(x, 1, out=torch.empty(6))  # asynchronous on a GPU: allowed
        x.reshape(2, 3)[:, 1:]
        for call, why in [(lambda: x[2].item(), "(.item())"),
                          (lambda: bool((x > 2).any()), "(bool(tensor))"),
                          (lambda: x[x > 2], "boolean mask"),
                          (lambda: torch.nonzero(x), "(nonzero)")]:
            with pytest.raises(graphs.Synced, match=why.replace("(", r"\(").replace(")", r"\)")):
                call()
        watch.active = False  # (Triton's interpreter reads tensors on the host by design)
        assert x[2].item() == 2.0


def test_sync_reasons_from_the_watch_and_from_cuda():
    try:
        try:
            raise graphs.Synced("a value read on the host (.item())")
        except graphs.Synced as exc:
            raise EvaluationError("kernel k on inputs of shapes (3,): Synced") from exc
    except EvaluationError as exc:
        assert graphs.sync_reason(exc) == "a value read on the host (.item())"
    cuda = RuntimeError("called a synchronizing CUDA operation\nmore")
    assert graphs.sync_reason(EvaluationError("k").with_traceback(None)) is None
    wrapped = EvaluationError("kernel k")
    wrapped.__cause__ = cuda
    assert graphs.sync_reason(wrapped) == "called a synchronizing CUDA operation"


def test_the_warm_up_check_allows_out_places_views_and_appends_only_where_results_leave(
        torch):
    buf, other = torch.empty(4), torch.empty(4)
    region = [_ins("k", [0], 1), _ins("v", [0], 2, place=None, view=True)]
    check = graphs.Checker(region, [buf, None], frozenset({1, 2}))
    check.begin_step("k", 0)
    check.after(region[0], {}, [other], [other], buf, buf)
    with pytest.raises(graphs.Refused, match="k allocated its result instead of writing"):
        check.after(region[0], {}, [other], [other], torch.empty(4), torch.empty(4))
    check.begin_step("v", 1)
    check.after(region[1], {}, [other], [other], other[1:], other[1:])  # a view of its input
    with pytest.raises(graphs.Refused, match="v allocated its result .it is neither a view"):
        check.after(region[1], {}, [other], [other], other.clone(), other.clone())
    strided = torch.empty(4, 2)[:, 0]
    made = strided.contiguous()  # a view of the dense copy is none of its input
    with pytest.raises(graphs.Refused, match="v allocated its result .it is neither a view"):
        check.after(region[1], {}, [strided], [made], made[1:], made[1:])
    inside = graphs.Checker(region, [buf, None])  # results used inside the region only
    inside.begin_step("k", 0)
    inside.after(region[0], {}, [other], [other], torch.empty(4), torch.empty(4))
    inside.begin_step("v", 1)
    inside.after(region[1], {}, [strided], [made], made[1:], made[1:])
    assert [c[0] for c in inside.calls] == ["k"]


def test_results_allocated_inside_must_not_leave(torch):
    arena, state = torch.empty(16), torch.empty(8)
    values = [arena[:4], state[2:], torch.empty(3), arena[4:8].view(2, 2)]
    assert graphs.allocated(values, [0, 1, 3], [arena, state]) is None
    assert graphs.allocated(values, [0, 2, 3], [arena, state]) == 2


def test_the_simulated_replay_runs_the_region_again_through_its_value_slots(torch):
    """A result allocated inside (``a``) is allocated anew at each replay and handed to its
    reader, as a graph replays the allocation at its captured address; a result that leaves
    (``m``) must be written into its place."""
    from tensor_graphs.runtime.program import _execute

    def step(name, fn, args, out, place=True):
        return SimpleNamespace(name=name, fn=fn, args=args, out=out, kernel=_kernel(),
                               contiguous=False, copy_in=False, free=(), fresh=not place)

    placed, result, x = torch.empty(3), torch.empty(3), torch.ones(3)
    region = [step("k", lambda a, out=None: torch.neg(a, out=out), (0,), 1),
              step("a", lambda a: a * 2, (1,), 2, place=False),
              step("m", lambda a, out=None: torch.add(a, 1, out=out), (2,), 3)]
    outs = [placed, None, result]
    staged = [x, None, None, None]

    def run(recorder):
        _execute(region, list(staged), [{}] * 3, [(3,)] * 3, outs, {}, recorder)

    check = graphs.Checker(region, outs, frozenset({3}))
    run(check)
    assert torch.equal(result, torch.full((3,), -1.0))
    sim = graphs.SimulatedGraph()
    sim.capture(run, check)
    assert [c[0] for c in sim.calls] == ["k", "a", "m"]
    x.fill_(2.0)  # the same argument tensor, new contents: the replay sees them
    sim.replay()
    assert torch.equal(result, torch.full((3,), -3.0))  # through a's new tensor
    region[2] = step("m", lambda a, out=None: a + 1, (2,), 3)  # ignores its place
    with pytest.raises(EvaluationError, match="m allocated its result instead of writing "
                                              "into its out= place"):
        sim.replay()


def test_an_empty_prefix_has_the_address_of_where_it_starts():
    """A graph knows a kept state by its prefix's address. torch gives a tensor of no
    elements a data_ptr of 0, so a prefill from empty caches never matched its graph and
    captured again every generation; ``address`` is where the view starts, empty or not."""
    torch = pytest.importorskip("torch")
    buffer = torch.zeros(2, 3, 8, 4)
    assert buffer.narrow(2, 0, 0).data_ptr() == 0  # (why data_ptr cannot be the mark)
    assert graphs.address(buffer.narrow(2, 0, 0)) == graphs.address(buffer) == \
        buffer.data_ptr()
    assert graphs.address(buffer[1].narrow(1, 0, 0)) == buffer[1].data_ptr()
    other = torch.zeros(2, 3, 8, 4)
    assert graphs.address(other.narrow(2, 0, 0)) != graphs.address(buffer.narrow(2, 0, 0))
    marks = graphs.state_marks([buffer.narrow(2, 0, 0)], [0])
    assert marks == ((0, buffer.data_ptr(), (2, 3, 0, 4), (96, 32, 4, 1)),)
