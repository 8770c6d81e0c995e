"""A program's bound weights read back to the host, for the writers that need the values it
was built from (``save_quantized`` of a generator or an imported module quantized at bind
time). Why read back rather than keep the caller's arrays for later: a reference held for a
save that may never come keeps a second host copy of the float model alive for the object's
lifetime wherever the program holds its own (on a GPU, or converted on binding); read back,
a copy exists only while the file is written, and it is what the program quantizes."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from tensor_graphs.errors import ArgumentError
from tensor_graphs.runtime.values import on_host


def bound_weights(program, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The weights ``program`` (a ``CompiledGraph``) has bound, by name, as host arrays
    (a GPU's copied, a host array as it is): ``names`` of them, or all."""
    bound = program._bound
    names = list(bound) if names is None else list(names)
    missing = sorted(n for n in names if n not in bound)
    if missing:
        raise ArgumentError(f"the program has no weight bound as {missing[:5]}"
                            f"{' ...' if len(missing) > 5 else ''}: bind it first "
                            "(prog.bind(name=array))")
    return {n: on_host(bound[n]) for n in names}


__all__ = ["bound_weights"]
