"""The one error measure: norm-wise relative error against the float64 reference."""

import math

import numpy as np

from tensor_graphs.numerics import relative_error


def test_the_norm_wise_ratio_and_its_edge_cases():
    assert relative_error([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert relative_error([0.0], [0.0]) == 0.0
    assert math.isclose(relative_error([3.0, 4.0], [0.0, 4.0]), 3.0 / 4.0)
    assert relative_error([1.0], [0.0]) == math.inf
    assert math.isnan(relative_error([np.nan], [1.0]))


def test_huge_values_whose_squares_overflow_keep_the_ratio():
    """A hypothesis case: exp of a large input gives 3.4e283, whose square overflows float64;
    the ratio is computed scaled down instead of inf / inf = nan."""
    ref = np.array([3.39184798e283, -1e300])
    got = ref * (1 + 1e-15)
    assert 0.9e-15 < relative_error(got, ref) < 1.2e-15  # 1 + 1e-15 rounds
    assert math.isclose(relative_error([1e300, 1e300], [1e300, 0.0]), 1.0)
