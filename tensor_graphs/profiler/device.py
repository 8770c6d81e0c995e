"""Where a measured call's values live, and how its time is waited for.

A CPU kernel takes and returns host arrays and finishes before it returns. A GPU kernel (a
torch CUDA kernel, a generated Triton kernel) takes torch tensors in the GPU's memory and only
*queues* its work: the call returns after the launch, so a clock read around back-to-back
calls would time launches, not the kernel, and every GPU kernel would look as cheap as its
launch. So a GPU call's inputs are made on the host and moved to the GPU once, outside the
timing (``to_device``), its result is brought back for the check against the reference
(``to_host``), and its samples are taken with the device synchronized before and after
(``sync``). A copy between the host and a GPU reads its input where the copy starts
(``copies.placement``): a host array for ``copy_host_to_cuda``, a GPU tensor for
``copy_cuda_to_host``, so each is timed as the real move it makes.

A kernel that reads and writes GPU memory is timed as a program runs it: inside a CUDA graph
(``replay``). A GPU program is replayed as one graph after its first calls
(``runtime/graphs.py``), where a kernel costs its GPU time and the gap to the next one, not
its launch from Python: timed launch by launch, a small Triton kernel read its launcher (27-60
us on an H100's host, against a torch op's 7), and the planner kept unfused torch ops that
the graph replays at a few microseconds each over one fused kernel. A kernel whose launches
cannot be captured (one that waits for the GPU) is timed launch by launch: such a step also
keeps its program out of a graph, so its launch is what a call pays. Copies between the host
and a GPU are never captured (a program's graph holds none; its feeds and results move
outside it).

The simulated GPU (``devices.simulated_cuda``) keeps its tensors in host memory and runs torch
ops synchronously: the same path with nothing to wait for (its times are CPU times), and its
"graph" calls the launches one after the other.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tensor_graphs.devices import cuda_available, raising_syncs, simulated_cuda, torch_device
from tensor_graphs.errors import DeviceError
from tensor_graphs.kernels import copy as copies


@dataclass(frozen=True)
class DeviceIO:
    """How to call one kernel: ``to_device`` moves a host input to where it reads it,
    ``to_host`` brings a result back as a numpy array, ``sync`` (or None) waits for the work
    queued so far, ``replay`` (or None: timed launch by launch) captures ``n`` back-to-back
    calls of a function as a graph and returns what replays them (it raises where they
    cannot be captured)."""

    to_device: Callable
    to_host: Callable
    sync: Callable[[], None] | None
    replay: Callable[[Callable[[], object], int], Callable[[], None]] | None = None


HOST = DeviceIO(lambda a: a, np.asarray, None)


def on_gpu(kernel) -> bool:
    """Whether ``kernel`` reads or writes a GPU's memory (a GPU kernel, or a copy to or from
    one)."""
    return "cuda" in copies.placement(kernel)


def device_io(kernel) -> DeviceIO:
    """The ``DeviceIO`` of ``kernel``; raises DeviceError for a GPU kernel without a usable
    GPU (real or simulated)."""
    if not on_gpu(kernel):
        return HOST
    if not cuda_available():
        raise DeviceError(f"kernel {kernel.name} runs on a GPU and none is usable here (no "
                          "CUDA-enabled torch or no GPU); measure it on a GPU machine, or set "
                          "TG_SIMULATED_CUDA=1 to exercise the path with CPU timings")
    from tensor_graphs.kernels.torch import convert

    source, _ = copies.placement(kernel)
    where = torch_device("cuda")

    def to_device(a):
        return convert.to_cuda(a, where) if source == "cuda" else a

    sync = None if simulated_cuda() is not None else _synchronize
    replay = graphed if copies.placement(kernel) == ("cuda", "cuda") else None
    return DeviceIO(to_device, convert.to_host, sync, replay)


def _synchronize() -> None:
    import torch

    torch.cuda.synchronize()


def graphed(fn: Callable[[], object], n: int) -> Callable[[], None]:
    """What replays ``n`` back-to-back calls of ``fn`` (GPU work) as one CUDA graph: captured
    on a real GPU, called in turn on the simulated one. Raises where the calls cannot be
    captured."""
    return (_in_turn if simulated_cuda() is not None else _cuda_graph)(fn, n)


def _cuda_graph(fn: Callable[[], object], n: int) -> Callable[[], None]:
    """``n`` calls of ``fn`` captured in one CUDA graph; returns its ``replay``. First one
    call on a side stream with torch's sync debug mode raising, as the runtime warms a
    region before it captures (``runtime/graphs.warming``): a call that waits for the GPU
    raises here instead of breaking the capture."""
    import torch

    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    try:
        with raising_syncs(), torch.cuda.stream(side):
            fn()
    finally:
        torch.cuda.current_stream().wait_stream(side)
    with warnings.catch_warnings():  # a view's call launches nothing: its replay times ~0
        warnings.filterwarnings("ignore", message="The CUDA Graph is empty")
        with torch.cuda.graph(graph):
            for _ in range(n):
                fn()
    torch.cuda.synchronize()
    return _Replay(graph, fn)


@dataclass(frozen=True)
class _Replay:
    """A captured graph's replay, holding the function it captured: the graph reads and
    writes the tensors that function holds by their addresses, so they must live as long as
    the graph. Returning ``graph.replay`` alone let a timer's inputs be freed when its
    ``__init__`` returned; the next timer's tensors took their memory, and on an H200 an
    embedding's replay read floats as its indices (torch's device-side assert, which ended
    a fresh database's GPU profile of GPT-2)."""

    graph: object
    captured: Callable[[], object]

    def __call__(self) -> None:
        self.graph.replay()


def _in_turn(fn: Callable[[], object], n: int) -> Callable[[], None]:
    """The simulated GPU's stand-in for ``_cuda_graph``: the ``n`` calls one after another
    (its kernels run on the host as they are called)."""
    def replay() -> None:
        for _ in range(n):
            fn()
    return replay
