"""Aggregate statistics of returns, as rliable defines them (Agarwal et al., 2021, "Deep RL at
the Edge of the Statistical Precipice"), without its dependencies.

    iqm(x)                                   mean of the middle 50 % (scipy's trim_mean(x, 0.25))
    optimality_gap(x, target)                mean shortfall below target: mean(max(target - x, 0))
    bootstrap_ci(iqm, strata, reps, seed)    (low, high): stratified percentile bootstrap
    summarise(strata)                        {"mean"|"median"|"iqm": {"value", "ci"}} at 95 %
    performance_profile(x, taus)             fraction of scores above each tau

``strata`` is a list of 1-d arrays (one per seed or run): a bootstrap replicate resamples each
stratum with replacement within itself, as rliable's ``StratifiedBootstrap`` resamples runs
within each task, then applies the statistic to all of them together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

LEVEL = 0.95
REPS = 2000


def iqm(scores) -> float:
    """Interquartile mean: the mean after cutting ``floor(n / 4)`` scores from each end."""
    x = np.sort(np.asarray(scores, np.float64).ravel())
    cut = int(0.25 * x.size)
    return float(np.mean(x[cut : x.size - cut]))


def median(scores) -> float:
    return float(np.median(np.asarray(scores, np.float64)))


def mean(scores) -> float:
    return float(np.mean(np.asarray(scores, np.float64)))


def optimality_gap(scores, target: float = 1.0) -> float:
    """How far below ``target`` the scores fall on average (scores above it count as 0)."""
    return float(np.mean(np.maximum(target - np.asarray(scores, np.float64), 0.0)))


def performance_profile(scores, taus) -> np.ndarray:
    """``[len(taus)]``: the fraction of ``scores`` strictly above each ``tau``."""
    x = np.asarray(scores, np.float64).ravel()
    return np.array([np.mean(x > tau) for tau in np.asarray(taus, np.float64)])


STATISTICS: dict[str, Callable[[np.ndarray], float]] = {
    "mean": mean,
    "median": median,
    "iqm": iqm,
}


def bootstrap_ci(
    statistic: Callable[[np.ndarray], float],
    strata: Sequence,
    reps: int = REPS,
    seed: int = 0,
    level: float = LEVEL,
) -> tuple[float, float]:
    """The percentile interval of ``statistic`` over ``reps`` stratified resamples; a
    vector-valued ``statistic`` (e.g. a performance profile) gets ``(low [K], high [K])``."""
    groups = [np.asarray(s, np.float64).ravel() for s in strata]
    groups = [g for g in groups if g.size]
    if not groups:
        raise ValueError("bootstrap_ci needs at least one score")
    rng = np.random.default_rng(seed)
    values = np.array(
        [
            statistic(np.concatenate([g[rng.integers(0, g.size, g.size)] for g in groups]))
            for _ in range(reps)
        ]
    )
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(values, [alpha, 1.0 - alpha], axis=0)
    if np.ndim(low):
        return low, high
    return float(low), float(high)


def summarise(strata: Sequence, reps: int = REPS, seed: int = 0) -> dict[str, dict]:
    """``{"mean"|"median"|"iqm": {"value": float, "ci": [low, high]}}`` of every score in
    ``strata`` (a list of per-seed 1-d arrays, or one array)."""
    if isinstance(strata, np.ndarray) and strata.ndim == 1:
        strata = [strata]
    everything = np.concatenate([np.asarray(s, np.float64).ravel() for s in strata])
    return {
        name: {"value": fn(everything), "ci": list(bootstrap_ci(fn, strata, reps, seed))}
        for name, fn in STATISTICS.items()
    }
