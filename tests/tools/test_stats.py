"""rljax.tools.stats: IQM as rliable defines it (scipy's trim_mean at 25 %), the optimality gap,
performance profiles, and stratified percentile bootstrap intervals."""

import numpy as np
import pytest
from scipy.stats import trim_mean

from rljax.tools.stats import (
    bootstrap_ci,
    iqm,
    mean,
    optimality_gap,
    performance_profile,
    summarise,
)


@pytest.mark.parametrize("n", [1, 3, 4, 7, 32, 101])
def test_iqm_is_scipys_trimmed_mean_at_a_quarter(n):
    x = np.random.default_rng(n).normal(size=n) * 10
    assert iqm(x) == pytest.approx(trim_mean(x, 0.25))


def test_hand_computed_values():
    x = np.array([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 100.0])
    assert iqm(x) == pytest.approx((2 + 3 + 4 + 5) / 4)  # the outlier does not count
    assert optimality_gap([0.2, 0.9, 1.5], target=1.0) == pytest.approx((0.8 + 0.1 + 0.0) / 3)
    np.testing.assert_allclose(performance_profile([1, 2, 3, 4], [0, 2, 4]), [1.0, 0.5, 0.0])


def test_stratified_bootstrap_keeps_each_stratum_whole():
    # Each stratum is resampled within itself: two constant seeds always average to 5.
    assert bootstrap_ci(mean, [np.zeros(3), np.full(3, 10.0)]) == (5.0, 5.0)
    # Unstratified (one stratum), the mean of the same six scores varies.
    low, high = bootstrap_ci(mean, [np.r_[np.zeros(3), np.full(3, 10.0)]])
    assert low < 5.0 < high


def test_bootstrap_interval_of_a_mean_matches_the_normal_theory_width():
    x = np.random.default_rng(0).normal(3.0, 2.0, size=400)
    low, high = bootstrap_ci(mean, [x], reps=4000, seed=1)
    half = 1.96 * x.std() / np.sqrt(x.size)
    assert low == pytest.approx(x.mean() - half, abs=0.1 * half)
    assert high == pytest.approx(x.mean() + half, abs=0.1 * half)
    assert bootstrap_ci(mean, [x], reps=500, seed=1) == bootstrap_ci(mean, [x], reps=500, seed=1)


def test_summarise_reports_every_statistic_with_an_interval_around_it():
    strata = [np.random.default_rng(s).normal(100.0, 5.0, size=16) for s in range(3)]
    report = summarise(strata, reps=500)
    everything = np.concatenate(strata)
    assert report["iqm"]["value"] == pytest.approx(trim_mean(everything, 0.25))
    assert report["median"]["value"] == pytest.approx(np.median(everything))
    for name in ("mean", "median", "iqm"):
        low, high = report[name]["ci"]
        assert low <= report[name]["value"] <= high
