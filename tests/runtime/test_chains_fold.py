"""The rules that run a padded graph's consecutive GEMV and decode attention steps as
persistent chains (``runtime/chains.py``), on instruction lists written out here: which steps
form a run, what ends one, and that the stand-ins launch once per group of ``MAX_CHAIN``, in
order, after the group's last (``chain.chained``, with the chain launcher recorded). The
kernel itself is tested against float64 in ``tests/kernels/triton_templates/test_chain.py``,
and a GPT-2 decode through it in ``tests/gpu/test_cuda_graphs.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tensor_graphs.runtime import chains
from tensor_graphs.runtime.graphs import grown
from tensor_graphs.runtime.lower import Instruction


def _gemv(name: str):
    """A GEMV kernel's run as the runtime sees it: ``link`` and ``chained`` (a stand-in
    maker that records the runs it was given and marks each stand-in)."""
    def run(*args, out=None):
        return name

    run.link = lambda *args, out=None: (name, args)
    run.chained = lambda runs: [SimpleNamespace(chained=r, group=tuple(runs)) for r in runs]
    return run


def _kernel(fn=None, *, view=False, inplace=None):
    return SimpleNamespace(fn=fn or (lambda *a, **k: None), view=view, inplace=inplace)


def _step(out, args, kernel, *, contiguous=False, also=()):
    return Instruction(fn=kernel.fn, args=args, attrs={}, out=out, free=(), name=f"step{out}",
                       shape=(1, 8), contiguous=contiguous, kernel=kernel, also=also)


def _gemv_step(out, arg):
    return _step(out, (arg,), _kernel(_gemv(f"gemv{out}")))


def _runs(instructions) -> list[list[int]]:
    """The runs the fold made: each chained step's ``out``, grouped by their call."""
    groups: dict[tuple, list[int]] = {}
    for ins in chains.fold(instructions):
        if isinstance(ins.fn, SimpleNamespace):
            groups.setdefault(ins.fn.group, []).append(ins.out)
    return list(groups.values())


def test_consecutive_chainable_steps_and_what_launches_nothing_between_form_one_run():
    """Views and the appends a decode attention took over (``grown``) launch nothing; the
    attention itself runs as ``appending(rows)``'s function, which can be a stage too."""
    attention = _step(7, (4, 6), _kernel())
    attention = attention.__class__(**{**attention.__dict__, "fn": _gemv("attention")})
    appended = _step(6, (3,), _kernel())
    appended = appended.__class__(**{**appended.__dict__, "fn": grown})
    steps = [_step(1, (0,), _kernel()),  # not chainable
             _gemv_step(2, 1), _step(3, (2,), _kernel(view=True)), _gemv_step(4, 3),
             appended, attention, _gemv_step(5, 7),
             _step(8, (5,), _kernel())]  # a step's result read by a launch
    assert _runs(steps) == [[2, 4, 7, 5]]


@pytest.mark.parametrize("breaker", ["kernel", "contiguous", "also", "inplace"])
def test_a_step_that_launches_or_is_not_a_plain_gemv_call_ends_a_run(breaker):
    middle = {
        "kernel": _step(3, (2,), _kernel()),  # launches: it could read a result not written
        "contiguous": _step(3, (2,), _kernel(_gemv("c")), contiguous=True),  # made dense
        "also": _step(3, (2,), _kernel(_gemv("a")), also=(9,)),  # stores besides its result
        "inplace": _step(3, (2,), _kernel(_gemv("i"), inplace=0)),
    }[breaker]
    steps = [_gemv_step(1, 0), _gemv_step(2, 1), middle, _gemv_step(4, 3), _gemv_step(5, 4)]
    assert _runs(steps) == [[1, 2], [4, 5]]


def test_a_lone_gemv_a_run_of_views_and_a_step_calling_another_function_stay():
    other = _gemv_step(3, 2)
    other = other.__class__(**{**other.__dict__, "fn": lambda *a, **k: None})  # (prepared)
    steps = [_gemv_step(1, 0), _step(2, (1,), _kernel()), other, _gemv_step(4, 3),
             _step(5, (4,), _kernel(view=True))]
    assert _runs(steps) == []
    assert [i.fn for i in chains.fold(steps)] == [i.fn for i in steps]


def test_chains_off_folds_nothing(monkeypatch):
    steps = [_gemv_step(1, 0), _gemv_step(2, 1)]
    monkeypatch.setattr(chains, "CHAINS", False)
    assert _runs(steps) == []


torch = pytest.importorskip("torch")


def test_stand_ins_launch_each_group_once_after_its_last_member(monkeypatch):
    """Eight GEMV calls: a group of five and one of three, each launched by its last
    member's call, its links in order with each result's tensor as its out. A member whose
    out= place the kernel cannot write launches the ones before it, then runs alone; a
    chain the kernel refuses runs its GEMVs one by one, in order."""
    from tensor_graphs.kernels.triton.templates import chain, matmul

    launched: list[list] = []
    monkeypatch.setattr(chain, "chain", lambda links: launched.append(list(links)))
    cfg = matmul.GEMV_CONFIGS[0]
    plain = next(e for e in matmul.EPILOGUES if e.label == "matmul")
    alone = []

    def run(a, b, *, out=None):  # the kernel's own run, called for a member run alone
        alone.append(out)
        return out

    run.link = matmul._linking(cfg, plain, run)
    x, w = torch.ones(1, 8), torch.ones(8, 8)
    outs = [torch.empty(1, 8) for _ in range(8)]
    for i, (fn, out) in enumerate(zip(chain.chained([run] * 8), outs)):
        assert fn(x, w, out=out) is out
        assert len(launched) == (0 if i < 4 else 1 if i < 7 else 2)
    assert [len(g) for g in launched] == [5, 3] and not alone
    assert [link.out for g in launched for link in g] == outs
    assert all(link.a is x and link.b is w for g in launched for link in g)

    launched.clear()
    stand_ins = chain.chained([run, run, run])
    odd = torch.empty(1, 8, dtype=torch.float64)  # the kernel would write elsewhere, then copy
    stand_ins[0](x, w, out=outs[0])
    assert stand_ins[1](x, w, out=odd) is odd
    assert [len(g) for g in launched] == [1] and alone == [odd]  # the first, then it alone
    stand_ins[2](x, w, out=outs[2])
    assert [len(g) for g in launched] == [1, 1]

    def refuse(links):
        raise ValueError("gemv_chain: every GEMV of a chain has the same rows")

    ran = []
    monkeypatch.setattr(chain, "chain", refuse)
    monkeypatch.setattr(matmul, "gemv", lambda cfg, e, a, b, bias, res, out, norm: ran.append(out))
    for fn, out in zip(chain.chained([run] * 3), outs):
        fn(x, w, out=out)
    assert ran == outs[:3]


def test_a_chain_the_gpu_cannot_build_warns_once_and_is_not_tried_again(monkeypatch):
    """A compile or launch failure of the chain kernel (an older Triton, another GPU) is not
    the user's: the GEMVs of that group run one by one, one warning names the failure, and
    later runs are not chained."""
    from tensor_graphs.kernels.triton.templates import chain, matmul

    monkeypatch.setattr(chain, "_BROKEN", [])

    def fail(links):
        raise TypeError("tuple arguments are not supported")

    ran = []
    monkeypatch.setattr(chain, "chain", fail)
    monkeypatch.setattr(matmul, "gemv", lambda cfg, e, a, b, bias, res, out, norm: ran.append(out))
    cfg = matmul.GEMV_CONFIGS[0]
    plain = next(e for e in matmul.EPILOGUES if e.label == "matmul")

    def run(a, b, *, out=None):
        return out

    run.link = matmul._linking(cfg, plain, run)
    x, w = torch.ones(1, 8), torch.ones(8, 8)
    outs = [torch.empty(1, 8) for _ in range(2)]
    stand_ins = chain.chained([run, run])
    stand_ins[0](x, w, out=outs[0])
    with pytest.warns(RuntimeWarning, match="persistent chain kernel failed .TypeError: tuple "
                                            "arguments are not supported.; its kernels run"):
        stand_ins[1](x, w, out=outs[1])
    assert ran == outs
    assert chain.chained([run, run]) == [run, run]


def test_a_view_that_copies_between_stages_launches_them_first():
    """A view reading dense arguments (a reshape) between stages is made dense by the fold,
    not the runtime: where an argument is not dense it first launches what the chain holds
    (the copy reads it), then copies; a dense one launches nothing."""
    calls = []

    def gemv(name):
        run = _gemv(name)

        def chained(runs):
            made = []
            for r in runs:
                step = SimpleNamespace(chained=r, group=tuple(runs))
                step.flush = lambda r=r: calls.append(("flush", r))
                made.append(step)
            return made
        run.chained = chained
        return run

    reshape = _step(3, (2,), _kernel(lambda x, **k: calls.append(("reshape", x)) or x,
                                     view=True), contiguous=True)
    steps = [_step(2, (1,), _kernel(gemv("a"))), reshape, _step(4, (3,), _kernel(gemv("b")))]
    folded = chains.fold(steps)
    assert not folded[1].contiguous
    dense, strided = torch.ones(2, 3), torch.ones(3, 2).t()
    folded[1].fn(dense)
    assert calls == [("reshape", dense)]
    calls.clear()
    folded[1].fn(strided)
    assert calls[0] == ("flush", steps[0].fn) and calls[1][0] == "reshape"
    assert calls[1][1].is_contiguous() and torch.equal(calls[1][1], strided)


def test_a_stage_whose_argument_the_kernel_copies_launches_the_stages_before_it(monkeypatch):
    """A GEMV's 2-D view of a permuted batch is a copy, made as its call is prepared: it reads
    the argument then, so what the chain holds before it launches first (else, replayed, the
    copy read the previous call's values, left where the stage writes)."""
    from tensor_graphs.kernels.triton.templates import chain, matmul

    launched: list[list] = []
    monkeypatch.setattr(chain, "chain", lambda links: launched.append(list(links)))
    plain = next(e for e in matmul.EPILOGUES if e.label == "matmul")

    def run(a, b, *, out=None):
        return out

    run.link = matmul._linking(matmul.GEMV_CONFIGS[0], plain, run)
    x, w = torch.ones(2, 2, 8), torch.ones(8, 8)
    outs = [torch.empty(2, 2, 8) for _ in range(3)]
    first, second, third = chain.chained([run] * 3)
    first(x, w, out=outs[0])
    second(x, w, out=outs[1])  # (a view: stays pending)
    assert launched == []
    third(outs[1].permute(1, 0, 2), w, out=outs[2])  # its (4, 8) view of a permute: a copy
    assert [[k.out for k in g] for g in launched] == [outs[:2], outs[2:]]
