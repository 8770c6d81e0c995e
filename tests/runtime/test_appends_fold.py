"""The rules that fold a padded graph's two cache appends into the decode attention reading
them (``runtime/appends.py``), on instruction lists written out here: what folds, and each
condition that keeps the appends as they are. The kernels' own work is tested with the
Triton template (``tests/kernels/triton_templates``) and a GPT-2 decode on the GPU
(``tests/gpu/test_cuda_graphs.py``)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from tensor_graphs.runtime import appends
from tensor_graphs.runtime.lower import Instruction

ARENA = ("cuda", 0, 4096)  # (device, offset, bytes): where the projection writes q, k, v


def _kernel(fn=None, *, view=False, inplace=None):
    return SimpleNamespace(fn=fn or (lambda *a, **k: None), view=view, inplace=inplace)


def _step(out, args, kernel, *, place=None, fresh=True, free=(), attrs=None,
          shape=(1, 2, 9, 4)):
    return Instruction(fn=kernel.fn, args=args, attrs=attrs or {}, out=out, free=free,
                       name=f"step{out}", shape=shape, contiguous=False, place=place,
                       fresh=fresh, kernel=kernel)


def _attend(*args, **kwargs):
    return "attended"


_attend.appending = lambda rows: ("appending at", rows)

VIEW = _kernel(view=True)
APPEND = _kernel()
KEYS = {"axis": 2, "offset": 0}


def _decode(between=(), append_attrs=KEYS, attention_place=None):
    """qkv (0) in the arena; k_new (1), v_new (2), q (7) its views; the caches (3, 4) leaves;
    appends making 5 and 6; ``between``: steps after the appends, before the attention (8),
    which writes its result at ``attention_place``."""
    return [
        _step(0, (10,), _kernel(), place=ARENA),
        _step(1, (0,), VIEW, fresh=False),
        _step(2, (0,), VIEW, fresh=False),
        _step(7, (0,), VIEW, fresh=False),
        _step(5, (3, 1), APPEND, fresh=False, free=(1,), attrs=append_attrs),
        _step(6, (4, 2), APPEND, fresh=False, free=(2,), attrs=append_attrs),
        *between,
        _step(8, (7, 5, 6), _kernel(_attend), free=(7,), place=attention_place),
    ]


def _fold(instructions, rows=("rows", "rows")):
    at = {pos: key for pos, key in zip((4, 5), rows)}
    return appends.fold(instructions, at, lambda key: f"tensor of {key}")


def test_two_appends_of_the_same_rows_fold_into_the_attention_reading_them():
    folded = _fold(_decode())
    attention = folded[-1]
    assert folded[4].fn is appends.grown and folded[5].fn is appends.grown
    assert attention.args == (7, 5, 6, 1, 2)  # the new rows after its own arguments
    assert attention.fn == ("appending at", "tensor of rows")
    # the new rows live until the attention, which frees them
    assert folded[4].free == () and folded[5].free == ()
    assert set(attention.free) == {7, 1, 2}


def test_what_keeps_the_appends_as_they_are():
    unfolded = _decode()
    cases = {
        "a step reads the cache before the attention":
            _fold(_decode([_step(9, (5,), _kernel())])),
        "a step writes where the new rows are":
            _fold(_decode([_step(9, (0,), _kernel(), place=("cuda", 1024, 64))])),
        "an in-place step runs between":
            _fold(_decode([_step(9, (3,), _kernel(inplace=0), fresh=False)])),
        "the attention writes its result where the new rows are (they died at the "
        "appends, so the memory plan could put it there: a batch-2 Llama's did)":
            _fold(_decode(attention_place=("cuda", 2048, 512))),
        "the appends write different rows": _fold(_decode(), rows=("rows", "other rows")),
        "an append grows another axis": _fold(_decode(append_attrs={"axis": 3})),
    }
    for why, folded in cases.items():
        assert [ins.fn for ins in folded if ins.out in (5, 6, 8)] == \
            [ins.fn for ins in unfolded if ins.out in (5, 6, 8)], why
    # a step writing elsewhere in the arena is no reason
    apart = _fold(_decode([_step(9, (0,), _kernel(), place=("cuda", 8192, 64))],
                          attention_place=("cuda", 4096, 512)))
    assert apart[-1].args == (7, 5, 6, 1, 2)


def test_an_attention_called_through_a_wrapper_is_left_alone():
    """A step whose run is not the kernel's own (an argument prepared per call) may hand the
    kernel other tensors than the caches: no fold."""
    instructions = _decode()
    instructions[-1] = dataclasses.replace(instructions[-1], fn=lambda *a, **k: None)
    folded = _fold(instructions)
    assert folded[-1].args == (7, 5, 6) and folded[4].fn is APPEND.fn


def test_a_folded_append_views_the_cache_with_room_and_copies_nothing():
    torch = pytest.importorskip("torch")
    cache = torch.zeros(1, 2, 8, 4)
    state, new = cache.narrow(2, 0, 5), torch.ones(1, 2, 1, 4)
    longer = appends.grown(state, new, axis=2)
    assert tuple(longer.shape) == (1, 2, 6, 4)
    assert longer.data_ptr() == cache.data_ptr() and not np.any(cache.numpy())
