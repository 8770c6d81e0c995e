"""The project's one error measure, used by verification, the database, tolerances and tests."""

from __future__ import annotations

import math

import numpy as np


def relative_error(got, ref) -> float:
    """Norm-wise relative error ‖got − ref‖ / ‖ref‖, computed in float64.

    0 when the two are equal (both zero included); inf when ``ref`` is zero and ``got`` is not.
    Shapes must match. NaN anywhere gives NaN: compare NaN positions separately.
    """
    got = np.asarray(got, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise ValueError(f"relative_error: shapes differ: {got.shape} vs {ref.shape}")
    diff = (got - ref).ravel()
    with np.errstate(over="ignore"):
        num = float(np.linalg.norm(diff))
        den = float(np.linalg.norm(ref.ravel()))
    if num == 0.0:
        return 0.0
    if math.isinf(num) or math.isinf(den):  # squares overflow: the same ratio, scaled down
        scale = max(float(np.max(np.abs(diff))), float(np.max(np.abs(ref), initial=0.0)))
        if math.isfinite(scale):
            num = float(np.linalg.norm(diff / scale))
            den = float(np.linalg.norm(ref.ravel() / scale))
    return num / den if den else math.inf
