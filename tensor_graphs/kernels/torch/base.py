"""How a torch kernel is registered: ``torch_kernel`` and the dtype groups and tolerances.

A torch kernel function takes torch tensors (its pattern's variables, in order) and the matched
node's attributes it names, and returns a new torch tensor. ``torch_kernel`` registers it:

- ``torch_<label>`` on device "cpu": numpy arrays in, numpy arrays out, converted without
  copies (``convert.to_torch`` / ``convert.to_numpy``);
- ``torch_cuda_<label>`` on device "cuda", only when a GPU is usable (``CUDA``, set by the
  package before ``ops`` is imported): torch CUDA tensors in and out;
- with ``half=(f16_tolerance, bf16_tolerance)``, also ``..._f16`` and ``..._bf16`` variants for
  float16 / bfloat16 inputs: a kernel has one tolerance, and a half-precision result is only as
  close to the float64 reference as its rounding allows.

Kernels whose result is exact in any dtype (movement, comparisons, max...) accept every dtype
they support in one kernel with the tolerance ``EXACT``.
"""

from __future__ import annotations

import functools

from tensor_graphs.kernels.registry import kernel
from tensor_graphs.kernels.torch.convert import to_numpy, to_torch
from tensor_graphs.rewrite import pattern as pat

FLOAT = ("float32", "float64")
INT = ("uint8", "int8", "int32", "int64")
HALF = ("float16", "bfloat16")
NUMERIC = INT + HALF + FLOAT  # every dtype but bool
ALL = ("bool",) + NUMERIC
EXACT = 1e-12  # results that are exact in the input's dtype (no rounding at all)
ELEMENTWISE = 1e-6  # float32 elementwise: a few ulps
REDUCTION = 1e-5  # float32 sums over up to ~1000 terms, norms, softmax, products
HALF_TOL = (4e-3, 3e-2)  # float16, bfloat16: the output rounding and a little more

CUDA: bool = False  # set by tensor_graphs.kernels.torch before ops.py registers the kernels


# ---------------------------------------------------------------------------- registration
def torch_kernel(pattern, label: str | None = None, *, dtypes=FLOAT, typed: int | None = None,
                 ranks=None, contiguous: bool = False, where=None,
                 tolerance: float = ELEMENTWISE, view: bool = False, half=None,
                 cuda_tolerance: float | None = None):
    """Register ``fn`` (torch tensors in, torch tensor out) as torch_<label> on the CPU, its
    half-precision variants when ``half`` is given, and torch_cuda_<label> when CUDA is usable.

    ``dtypes`` constrains every input, or only the first ``typed`` ones (an attention mask or
    index input has a dtype of its own; ``where`` checks it). Returns ``fn`` itself, so the
    functions stay plain torch functions."""

    def decorate(fn):
        name = label or fn.__name__
        common = dict(backend="torch", ranks=ranks, contiguous=contiguous, view=view)
        variants = [("", dtypes, tolerance, cuda_tolerance or tolerance)]
        if half is not None:
            variants += [("_f16", ("float16",), half[0], half[0]),
                         ("_bf16", ("bfloat16",), half[1], half[1])]
        for suffix, dts, tol, cuda_tol in variants:
            if typed is None:
                constraints = dict(dtypes=dts, where=where, **common)
            else:
                constraints = dict(dtypes=None, where=_leading_dtypes(dts, typed, where),
                                   **common)
            kernel(pattern, name=f"torch_{name}{suffix}", device="cpu", tolerance=tol,
                   **constraints)(_on_cpu(fn, view))
            if CUDA:
                kernel(pattern, name=f"torch_cuda_{name}{suffix}", device="cuda",
                       tolerance=cuda_tol, **constraints)(fn)
        return fn

    return decorate


def _leading_dtypes(allowed, count: int, where):
    """A where-constraint: the first ``count`` inputs have a dtype in ``allowed``, then
    ``where`` (if any) holds."""
    names = tuple(allowed)

    def check(shapes, dtypes, attrs):
        for d in dtypes[:count]:
            if d.name not in names:
                return f"dtype {d.name}; accepts {', '.join(names)}"
        return True if where is None else where(shapes, dtypes, attrs)

    return check


def _on_cpu(fn, view: bool):
    """fn with numpy arrays in and out; the arrays and tensors share memory."""

    @functools.wraps(fn)
    def run(*arrays, **attrs):
        out = to_numpy(fn(*[to_torch(a) for a in arrays], **attrs))
        if view and not getattr(arrays[0], "flags", out.flags).writeable:
            out.flags.writeable = False  # a view of a read-only input stays read-only
        return out

    return run


def given(op: str, *names: str) -> pat.OpPat:
    """The pattern ``op(names...)`` for a composite called with only some of its optional
    tensors (the node records which in ``attrs["args"]``)."""
    return pat.OpPat(op, tuple(pat.var(n) for n in names), {"args": tuple(names)})


