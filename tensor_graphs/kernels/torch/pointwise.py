"""torch kernels for the pointwise families (ir/ops/pointwise.py): the special functions,
integer division and bit and of atomic.py's SPECIAL tables, and the rounding composites.

Without them a GPU plan had no device kernel for log1p or floor_divide, and every such step
crossed to the host and back. torch's floor_divide (Python's rule), round (half to even) and
the rest have our ops' semantics; its float fmod does not (it loses huge ratios), so fmod is
an int kernel here. An integer zero divisor, which torch reports as a RuntimeError, raises the
reference's EvaluationError instead.
"""

from __future__ import annotations

from tensor_graphs.errors import EvaluationError
from tensor_graphs.ir.dtypes import INTS
from tensor_graphs.ir.dtypes import NUMBERS as NUMERIC
from tensor_graphs.kernels.torch.base import EXACT, torch_kernel
from tensor_graphs.kernels.torch.convert import Lazy

torch = Lazy("torch", globals(), "torch")


@torch_kernel("log1p", writes_out=True)
def log1p(x, *, out=None):
    return torch.log1p(x, out=out)


@torch_kernel("expm1", writes_out=True)
def expm1(x, *, out=None):
    return torch.expm1(x, out=out)


@torch_kernel("log2", writes_out=True)
def log2(x, *, out=None):
    return torch.log2(x, out=out)


@torch_kernel("log10", writes_out=True)
def log10(x, *, out=None):
    return torch.log10(x, out=out)


@torch_kernel("tan", writes_out=True)
def tan(x, *, out=None):
    return torch.tan(x, out=out)


@torch_kernel("erfc", writes_out=True)
def erfc(x, *, out=None):
    return torch.special.erfc(x, out=out)


@torch_kernel("atan2", writes_out=True)
def atan2(a, b, *, out=None):
    return torch.atan2(a, b, out=out)


def _divisor(op: str, a, b) -> None:
    if not a.is_floating_point() and bool((b == 0).any()):
        raise EvaluationError(f"torch_{op}: integer division by zero")


# ints only: torch's vectorised float fmod is not exact for huge ratios (fmod(1e30, 1e-30) is
# nan, C's 8.2e-31); float fmod takes the numpy or C kernel
@torch_kernel("fmod", dtypes=INTS, tolerance=EXACT, writes_out=True)
def fmod(a, b, *, out=None):
    _divisor("fmod", a, b)
    return torch.fmod(a, b, out=out)


# a float quotient rounds once in the input's dtype (the reference's float64 quotient may not)
@torch_kernel("floor_divide", dtypes=NUMERIC, tolerance=1e-7, writes_out=True)
def floor_divide(a, b, *, out=None):
    _divisor("floor_divide", a, b)
    return torch.floor_divide(a, b, out=out)


@torch_kernel("bitwise_and", dtypes=INTS, tolerance=EXACT, writes_out=True)
def bitwise_and(a, b, *, out=None):
    return torch.bitwise_and(a, b, out=out)


@torch_kernel("floor", tolerance=EXACT, writes_out=True)
def floor(x, *, out=None):
    return torch.floor(x, out=out)


@torch_kernel("ceil", tolerance=EXACT, writes_out=True)
def ceil(x, *, out=None):
    return torch.ceil(x, out=out)


@torch_kernel("trunc", tolerance=EXACT, writes_out=True)
def trunc(x, *, out=None):
    return torch.trunc(x, out=out)


@torch_kernel("round_half_even", tolerance=EXACT, writes_out=True)
def round_half_even(x, *, out=None):
    """Half to even: torch's round (decimals 0)."""
    return torch.round(x, out=out)
