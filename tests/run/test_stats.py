"""rljax.run.stats against direct numpy / scipy computations."""

import math

import numpy as np
from scipy import stats as sp

from rljax.run.stats import band, held_from, mean_ci, smooth, steps_to_threshold


def test_smooth_is_a_trailing_mean():
    x = np.array([0.0, 2.0, 4.0, 6.0, 8.0])
    np.testing.assert_allclose(smooth(x, 2), [0.0, 1.0, 3.0, 5.0, 7.0])
    np.testing.assert_allclose(smooth(x, 10), np.cumsum(x) / np.arange(1, 6))


def test_smooth_ignores_nans():
    np.testing.assert_allclose(smooth([1.0, np.nan, 3.0], 2), [1.0, 1.0, 3.0])


def test_mean_ci_matches_scipy_t_interval():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3, 7))
    mean, hw = mean_ci(x, axis=1)
    for row, m, h in zip(x, mean, hw, strict=True):
        lo, hi = sp.t.interval(0.95, len(row) - 1, loc=row.mean(), scale=sp.sem(row))
        assert math.isclose(m, row.mean()) and math.isclose(h, (hi - lo) / 2)


def test_one_sample_has_no_interval():
    mean, hw = mean_ci(np.array([[5.0]]), axis=1)
    assert mean[0] == 5.0 and np.isnan(hw[0])
    lower, upper = band(mean, hw)
    assert lower[0] == upper[0] == 5.0


def test_band_is_clipped_to_the_return_range():
    lower, upper = band([490.0, 10.0], [30.0, 30.0], low=0.0, high=500.0)
    np.testing.assert_allclose(lower, [460.0, 0.0])
    np.testing.assert_allclose(upper, [500.0, 40.0])


def test_a_single_lucky_update_does_not_reach_the_threshold():
    steps = np.arange(1, 101) * 1000
    curve = np.full(100, 100.0)
    curve[10] = 500.0  # one update touched 500
    curve[60:] = 500.0
    assert steps_to_threshold(steps, curve, 475.0, window=10) == 70_000.0
    assert held_from(steps, curve, 475.0, window=10) == 70_000.0
    curve[-1] = 0.0
    assert held_from(steps, curve, 475.0, window=1) is None
