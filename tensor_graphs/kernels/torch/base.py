"""How a torch kernel is registered: ``torch_kernel``, the dtype groups and the tolerances.

A torch kernel function takes torch tensors (its pattern's variables, in order) and the matched
node's attributes it names, and returns a new torch tensor. ``torch_kernel`` registers it:

- ``torch_<label>`` on device "cpu": numpy arrays in, numpy arrays out, converted without
  copies (``convert.to_torch`` / ``convert.to_numpy``);
- ``torch_cuda_<label>`` on device "cuda", only when a GPU is usable (``CUDA``, set by the
  package before ``ops`` is imported): torch CUDA tensors in and out.

``writes_out=True``: the function takes ``out=`` (a torch tensor, or None to allocate) and
writes its result there (``torch.add(a, b, out=out)``); the CPU kernel then fills a given numpy
``out`` buffer through its zero-copy tensor view and returns that buffer (the registry's
``writes_out`` contract). The CUDA kernel is the function itself, also ``writes_out``: a
program hands it its place in the GPU's arena (a tensor view) and the result lands there.

Tolerances follow the verifier's convention: a kernel's tolerance bounds its error on float32
and float64 outputs; a float16/bfloat16 output is allowed its own rounding on top
(``max(tolerance, 2 * unit roundoff)``), so one kernel covers every float dtype. Kernels whose
result is exact in any dtype (movement, comparisons, max...) declare ``EXACT``.
"""

from __future__ import annotations

import functools
import inspect

from tensor_graphs.ir import dtypes as _dtypes
from tensor_graphs.ir.dtypes import FLOATS
from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.torch.convert import to_numpy, to_torch
from tensor_graphs.rewrite import pattern as pat

EXACT = 1e-12  # results that are exact in the input's dtype (no rounding at all)
ELEMENTWISE = 1e-6  # float32 elementwise: a few ulps (measured: below 1e-7)
REDUCTION = 1e-5  # float32 sums over ~1000 terms, norms, softmax, matmul (measured: < 1e-6)

CUDA: bool = False  # set by tensor_graphs.kernels.torch before ops.py registers the kernels


# ---------------------------------------------------------------------------- registration
def torch_kernel(pattern, label: str | None = None, *, dtypes=FLOATS, typed: int | None = None,
                 ranks=None, contiguous: bool = False, where=None,
                 tolerance: float = ELEMENTWISE, view: bool = False,
                 cuda_tolerance: float | None = None, cuda=None, cuda_dtypes=None,
                 signatures=None, writes_out: bool = False, cuda_occupancy=None):
    """Register ``fn`` (torch tensors in, torch tensor out) as torch_<label> on the CPU and as
    torch_cuda_<label> when CUDA is usable.

    ``dtypes`` constrains every input, or only the first ``typed`` ones (an attention mask or
    an index input has a dtype of its own; ``where`` checks it). ``signatures`` are verification
    cases (see ``kernels.signatures``) for kernels the generic cases do not reach. ``cuda``
    replaces ``fn`` on CUDA (a kernel without tensor inputs must say where its result goes),
    or is False to register no CUDA kernel. ``cuda_dtypes`` and ``cuda_tolerance`` replace
    ``dtypes`` and ``tolerance`` on CUDA, where torch implements fewer dtypes for some ops and
    computes some functions less exactly. ``cuda_occupancy``: the CUDA kernel's
    ``Occupancy`` at given shapes (``kernels.registry.kernel``), where torch's launch keeps
    few of a GPU's SMs busy. Returns ``fn`` itself, so the functions stay plain torch
    functions."""

    def decorate(fn):
        name = label or fn.__name__
        common = dict(backend="torch", ranks=ranks, contiguous=contiguous, view=view,
                      signatures=signatures)
        kernel(pattern, name=f"torch_{name}", device="cpu", tolerance=tolerance,
               writes_out=writes_out, **_dtype_constraints(dtypes, typed, where), **common)(
                   _on_cpu(fn, view, writes_out))
        if CUDA and cuda is not False:
            on_cuda = cuda or fn
            kernel(pattern, name=f"torch_cuda_{name}", device="cuda",
                   tolerance=cuda_tolerance or tolerance,
                   writes_out=writes_out and (on_cuda is fn or _takes_out(on_cuda)),
                   occupancy=cuda_occupancy,
                   **_dtype_constraints(cuda_dtypes or dtypes, typed, where), **common)(on_cuda)
        return fn

    return decorate


def _takes_out(fn) -> bool:
    """A CUDA replacement that takes ``out=`` too (iota's, which must name its device)."""
    return "out" in inspect.signature(fn).parameters


def _dtype_constraints(dtypes, typed: int | None, where) -> dict:
    """The registry's dtypes/where constraints: ``dtypes`` for every input, or for the first
    ``typed`` ones only."""
    if typed is None:
        return dict(dtypes=dtypes, where=where)
    return dict(dtypes=None, where=_leading_dtypes(dtypes, typed, where))


def _leading_dtypes(allowed, count: int, where):
    """A where-constraint: the first ``count`` inputs have a dtype in ``allowed``, then
    ``where`` (if any) holds."""
    accepted = tuple(_dtypes.as_dtype(d) for d in allowed)
    names = ", ".join(d.name for d in accepted)

    def check(shapes, dtypes, attrs):
        for d in dtypes[:count]:
            if d not in accepted:
                return f"dtype {d.name}; accepts {names}"
        return True if where is None else where(shapes, dtypes, attrs)

    return check


def _on_cpu(fn, view: bool, writes_out: bool = False):
    """fn with numpy arrays in and out; the arrays and tensors share memory. With
    ``writes_out``, a numpy ``out`` is viewed as a tensor, filled by fn and returned."""
    if writes_out:
        @functools.wraps(fn)
        def into(*arrays, out=None, **attrs):
            tensors = [to_torch(a) for a in arrays]
            if out is None:
                return to_numpy(fn(*tensors, **attrs))
            target = to_torch(out)
            result = fn(*tensors, out=target, **attrs)
            if result is not target:  # a path of fn that allocated after all
                target.copy_(result)
            return out

        return into

    @functools.wraps(fn)
    def run(*arrays, **attrs):
        out = to_numpy(fn(*[to_torch(a) for a in arrays], **attrs))
        if view and (0 in out.strides or not getattr(arrays[0], "flags", out.flags).writeable):
            out.flags.writeable = False  # as numpy's own views: broadcast or of a read-only input
        return out

    return run


def given(op: str, *names: str) -> pat.OpPat:
    """The pattern ``op(names...)`` for a composite called with only some of its optional
    tensors (the node records which in ``attrs["args"]``)."""
    return pat.OpPat(op, tuple(pat.var(n) for n in names), {"args": tuple(names)})


