"""A padded CUDA graph's cache appends folded into the decode attention that reads them.

A decode step appends each layer's new key and value rows to its kept caches, two launches
(``graphs.device_append``: an ``index_copy_`` each), then attends over the caches. On an H200
each append took 2.2-4.3 us of a ~0.53 ms GPT-2 token, 24 appends a token, to copy 2 x 768
floats. A decode attention kernel that can write the rows itself (``appending`` on its run
function: the Triton template's, ``kernels/triton/templates/attention.py``) takes the copies
over: its two appends only make the caches' longer views, and it gets the new rows as two
more arguments, each program storing those in its chunk of keys before it reads the chunk.
Folded only where that changes nothing else:
- no step between an append and the attention reads the cache (it would see the rows
  unwritten), and none is an in-place kernel or writes an arena place holding the new rows
  (which now stay alive until the attention), the attention's own result included (the
  memory plan may have put it where they were: they died at the append);
- the append grows the keys' axis, and both appends write the same rows (one index).
The padded capture still runs the call at its own dims first and compares the results and
the caches (``graphs._capture_padded``), so a fold that went wrong refuses the graph.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

from tensor_graphs.runtime.graphs import grown, places_overlap  # grown: a folded append


def fold(instructions: Sequence, appends: Mapping[int, object], rows: Callable) -> list:
    """``instructions`` (a padded region's) with each decode attention that reads the results
    of two appends writing the same rows taking over their copies. ``appends``: region
    position -> the key of the rows it writes (equal keys: the same rows); ``rows(key)``: the
    rows' GPU tensor, which the attention reads its first row from."""
    made = {ins.out: pos for pos, ins in enumerate(instructions)}
    out = list(instructions)
    for at, ins in enumerate(instructions):
        appending = _appending(ins)
        if appending is None or len(ins.args) < 3:
            continue
        pair = (made.get(ins.args[1]), made.get(ins.args[2]))
        if pair[0] == pair[1] or any(p not in appends for p in pair) \
                or appends[pair[0]] != appends[pair[1]] \
                or not all(_foldable(instructions, p, at) for p in pair):
            continue
        new = tuple(instructions[p].args[1] for p in pair)  # the rows each appends
        for p in pair:
            out[p] = dataclasses.replace(out[p], fn=grown)
        out = _kept_until(out, new, at)
        out[at] = dataclasses.replace(out[at], fn=appending(rows(appends[pair[0]])),
                                      args=ins.args + new)
    return out


def _appending(ins) -> Callable | None:
    """The kernel's ``appending`` where the step calls the kernel's own run as it is (no
    argument prepared or made dense: the caches must be the ones it writes)."""
    fn = getattr(ins.kernel, "fn", None)
    if fn is None or ins.fn is not fn or ins.contiguous:
        return None
    return getattr(fn, "appending", None)


def _foldable(instructions: Sequence, p: int, at: int) -> bool:
    """Whether the append at ``p`` may leave its copy to the attention at ``at``."""
    append = instructions[p]
    rank = len(append.shape)
    if rank < 2 or int(append.attrs.get("axis", -1)) % rank != rank - 2:
        return False  # not the keys' axis of (..., keys, dims)
    memory = _memory(instructions, append.args[1])
    if memory is False:
        return False
    for other in instructions[p + 1:at]:
        if append.out in other.args:
            return False  # it would read the rows before they are written
        if other.kernel is None or other.kernel.inplace is not None:
            return False
    # nothing writes where the new rows are, the attention's own result included (the
    # memory plan may have put it there: the rows died at the append)
    for other in instructions[p + 1:at + 1]:
        places = (other.place, *getattr(other, "also_places", ()))
        if memory is not None and any(pl is not None and places_overlap(pl, memory)
                                      for pl in places):
            return False
    return True


def _memory(instructions: Sequence, value: int):
    """Where ``value`` lives: the arena place it views (device, offset, bytes), None for
    memory a step of the region allocated (alive as long as the value is), False where
    unknown (made before the region, or by an in-place step)."""
    made = {ins.out: ins for ins in instructions}
    while True:
        ins = made.get(value)
        if ins is None or ins.kernel is None:
            return False
        if ins.place is not None:
            return ins.place
        if ins.kernel.view and ins.args:
            value = ins.args[0]
            continue
        return None if ins.fresh and ins.kernel.inplace is None else False


def _kept_until(instructions: list, values: Sequence[int], at: int) -> list:
    """``instructions`` with ``values`` freed at step ``at`` rather than earlier."""
    out = list(instructions)
    for value in values:
        for pos in range(at):
            if value in out[pos].free:
                out[pos] = dataclasses.replace(
                    out[pos], free=tuple(f for f in out[pos].free if f != value))
                if value not in out[at].free:
                    out[at] = dataclasses.replace(out[at], free=out[at].free + (value,))
    return out
