"""CUDA graphs' rules without a GPU (``runtime/graphs.py``): where a program's instructions
divide and why one is refused, the LRU of graphs, the calls that count as syncs, and the
warm-up's checks. The capture and replay themselves run in tests/gpu/test_cuda_graphs.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.ops.names import DIM, INPUT, STATE, STATE_UPDATE, WEIGHT
from tensor_graphs.runtime import graphs


def _kernel(op="add", view=False, inplace=None, backend="torch"):
    return SimpleNamespace(op=op, view=view, inplace=inplace, backend=backend)


def _ins(name, args, out, reads="cuda", device="cuda", place=(("cuda", 0, 64)), **kernel):
    return SimpleNamespace(name=name, args=tuple(args), out=out, reads=reads, device=device,
                           place=place, kernel=_kernel(**kernel), copy_in=False,
                           contiguous=False, fn=None)


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


@pytest.mark.parametrize(("change", "reason"), [
    (lambda p: p.insert(3, _ins("numpy_neg", [5], 11, reads="cpu", device="cpu")),
     "numpy_neg runs on the host, or copies to it, between the first and the last GPU step"),
    (lambda p: p.insert(3, _ins("copy_cuda_to_host", [5], 11, device="cpu")),
     "copy_cuda_to_host runs on the host, or copies to it, between"),
    (lambda p: p.insert(3, _ins("copy_host_to_cuda", [0], 11, reads="cpu")),
     "copy_host_to_cuda runs on the host, or copies to it, between"),
    (lambda p: p.insert(2, _ins("torch_cuda_relu", [5], 11, place=None, op="relu")),
     "torch_cuda_relu allocates its result (no out= place in the arena)"),
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


def test_the_warm_up_check_allows_out_places_views_and_appends_only(torch):
    buf, other = torch.empty(4), torch.empty(4)
    region = [_ins("k", [0], 1), _ins("v", [0], 2, place=None, view=True)]
    check = graphs.Checker(region, [buf, None])
    check.begin_step("k", 0)
    check.after(region[0], {}, [other], [other], buf, buf)
    with pytest.raises(graphs.Refused, match="k allocated its result instead of writing"):
        check.after(region[0], {}, [other], [other], torch.empty(4), torch.empty(4))
    check.begin_step("v", 1)
    check.after(region[1], {}, [other], [other], other[1:], other[1:])  # a view of its input
    with pytest.raises(graphs.Refused, match="v allocated its result .it is neither a view"):
        check.after(region[1], {}, [other], [other], other.clone(), other.clone())
    dense = SimpleNamespace(**{**vars(region[0]), "contiguous": True})
    check.begin_step("k", 0)
    strided = torch.empty(4, 2)[:, 0]
    with pytest.raises(graphs.Refused, match="made dense by a copy"):
        check.after(dense, {}, [strided], [strided.contiguous()], buf, buf)


def test_the_simulated_replay_calls_the_warm_ups_launches_again(torch):
    out, x = torch.empty(3), torch.ones(3)
    ins = SimpleNamespace(name="k", fn=lambda a, out=None: torch.neg(a, out=out),
                          kernel=_kernel(), contiguous=False)
    view = SimpleNamespace(name="v", fn=lambda a: a[1:], kernel=_kernel(view=True),
                           contiguous=False)
    check = graphs.Checker([ins, view], [out, None])
    check.begin_step("k", 0)
    check.after(ins, {}, [x], [x], ins.fn(x, out=out), out)
    check.begin_step("v", 1)
    check.after(view, {}, [out], [out], out[1:], out[1:])
    sim = graphs.SimulatedGraph()
    sim.capture(lambda: pytest.fail("the stand-in runs nothing to capture"), check)
    assert [c[0] for c in sim.calls] == ["k"]  # a view launches nothing
    x.fill_(2.0)  # the same argument tensor, new contents: the replay sees them
    sim.replay()
    assert torch.equal(out, torch.full((3,), -2.0))
    name, _, args, kw, buf = sim.calls[0]
    sim.calls[0] = (name, lambda a, out=None: -a, args, kw, buf)
    with pytest.raises(EvaluationError, match="kernel k did not write into its out= place"):
        sim.replay()
