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
    num = float(np.linalg.norm((got - ref).ravel()))
    if num == 0.0:
        return 0.0
    den = float(np.linalg.norm(ref.ravel()))
    return num / den if den else math.inf
