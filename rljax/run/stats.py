"""Small statistics for learning curves and headline figures (plots, summaries, experiments).

    smooth(returns, window=20)                      trailing moving average, same length
    mean_ci(per_seed, axis=1)                       (mean, half-width) of a 95 % t-interval
    steps_to_threshold(steps, curve, 475.0)         first step the *smoothed* curve reaches it
    held_from(steps, curve, 475.0)                  first step after which it never drops below

Intervals are confidence intervals of the mean (Student t over seeds or episodes), not spreads;
with one sample the half-width is NaN (no interval), never zero.
"""

from __future__ import annotations

import math

import numpy as np


def smooth(values, window: int = 20) -> np.ndarray:
    """Trailing moving average over the last ``window`` points (fewer at the start), NaNs
    ignored: ``values [N] -> [N]``."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"smooth takes a 1-d series, got shape {x.shape}")
    window = max(1, int(window))
    valid = np.isfinite(x)
    sums = np.cumsum(np.where(valid, x, 0.0))
    counts = np.cumsum(valid)
    lag = lambda c: np.concatenate([np.zeros(window), c[:-window]]) if len(c) > window else 0  # noqa: E731
    total, n = sums - lag(sums), counts - lag(counts)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.maximum(n, 1), np.nan)


def t_quantile(df: int, level: float = 0.95) -> float:
    """Two-sided Student t quantile (``scipy.stats.t``) for ``df`` degrees of freedom."""
    from scipy import stats

    return float(stats.t.ppf(0.5 + level / 2, df))


def mean_ci(samples, axis: int = -1, level: float = 0.95):
    """``(mean, half_width)`` along ``axis``: the ``level`` t-interval of the mean; half-width
    NaN where fewer than two finite samples."""
    x = np.asarray(samples, dtype=float)
    n = np.sum(np.isfinite(x), axis=axis)
    with np.errstate(invalid="ignore", divide="ignore"), _quiet():
        mean = np.nanmean(x, axis=axis)
        sem = np.nanstd(x, axis=axis, ddof=1) / np.sqrt(n)
    q = np.vectorize(lambda k: t_quantile(int(k) - 1, level) if k >= 2 else math.nan)(n)
    return mean, sem * q


def band(mean, half_width, low: float | None = None, high: float | None = None):
    """``(lower, upper)`` of ``mean ± half_width`` clipped to the quantity's range (e.g. an
    environment's return bounds), NaN half-widths giving no band (lower = upper = mean)."""
    mean = np.asarray(mean, dtype=float)
    hw = np.nan_to_num(np.asarray(half_width, dtype=float), nan=0.0)
    lower, upper = mean - hw, mean + hw
    if low is not None or high is not None:
        lower, upper = np.clip(lower, low, high), np.clip(upper, low, high)
    return lower, upper


def steps_to_threshold(steps, curve, threshold: float, window: int = 20) -> float | None:
    """The first of ``steps`` at which ``smooth(curve, window)`` reaches ``threshold`` (None if
    never): one lucky update does not count, a sustained average does."""
    s = smooth(curve, window)
    hit = np.flatnonzero(s >= threshold)
    return float(np.asarray(steps)[hit[0]]) if hit.size else None


def held_from(steps, curve, threshold: float, window: int = 20) -> float | None:
    """The first of ``steps`` from which ``smooth(curve, window)`` stays at or above
    ``threshold`` to the end (None if it ends below)."""
    s = smooth(curve, window)
    below = np.flatnonzero(~(s >= threshold))
    if below.size == 0:
        return float(np.asarray(steps)[0]) if len(s) else None
    if below[-1] == len(s) - 1:
        return None
    return float(np.asarray(steps)[below[-1] + 1])


class _quiet:
    """Silence numpy's 'mean of empty slice' / 'degrees of freedom' warnings (all-NaN columns
    are expected, and give NaN)."""

    def __enter__(self):
        import warnings

        self._ctx = warnings.catch_warnings()
        self._ctx.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
