"""The run's ``learning_curve.png``: training and evaluation return, and loss / entropy / KL panels.

    plot_learning_curve("runs/x/metrics.jsonl", "runs/x/learning_curve.png", "ppo CartPole-v1")
    fig = learning_curve_figure(rows, title)        # a matplotlib Figure (no pyplot state)

The return panel shows the training return (mean over seeds) raw and smoothed
(``rljax.run.stats.smooth``), with one seed or more; with several seeds a band: the 95 %
confidence interval of the mean over seeds of the smoothed per-seed curves
(``rljax.run.stats.mean_ci``), clipped to the range of returns observed (never a min-max spread
and never above the environment's maximum); evaluation points with their 95 % interval over
episodes. Extra panels for ``loss``, ``entropy`` and ``approx_kl`` appear when the rows have them
(DQN: loss only).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rljax.run.stats import band, mean_ci, smooth

SMOOTH_FRACTION = 0.05  # the smoothing window: 5 % of the run's updates (at least 1)
EXTRA_PANELS = (("loss", "loss"), ("entropy", "policy entropy"), ("approx_kl", "approx. KL"))
COLUMNS = (
    "env_steps",
    "episodes",
    "episode_return",
    "episode_return_per_seed",
    "eval_return",
    "eval_return_ci",
    *(name for name, _ in EXTRA_PANELS),
)


def read_columns(metrics_path: str | Path) -> list[dict]:
    """The rows of ``metrics.jsonl`` reduced to the plotted columns (unreadable lines, e.g. a
    torn last line, are skipped)."""
    rows = []
    with open(metrics_path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and "env_steps" in row:
                rows.append({k: row[k] for k in COLUMNS if k in row})
    return rows


def _column(rows, name) -> np.ndarray:
    return np.array([np.nan if r.get(name) is None else r[name] for r in rows], dtype=float)


def _return_panel(ax, rows, window: int) -> None:
    rows = [r for r in rows if r.get("episodes", 1)]  # updates that finished episodes
    if not rows:
        ax.text(0.5, 0.5, "no episode finished yet", ha="center", transform=ax.transAxes)
        return
    steps = _column(rows, "env_steps")
    mean = _column(rows, "episode_return")
    ax.plot(steps, mean, color="C0", alpha=0.3, lw=0.8, label="training (raw)")
    ax.plot(steps, smooth(mean, window), color="C0", lw=1.8, label=f"training (smoothed, {window})")
    evals = [r for r in rows if r.get("eval_return") is not None]
    eval_mean = _column(evals, "eval_return")
    observed = mean
    if "episode_return_per_seed" in rows[0]:
        per_seed = np.array(
            [[np.nan if v is None else v for v in r["episode_return_per_seed"]] for r in rows],
            dtype=float,
        )
        observed = per_seed
        smoothed = np.stack([smooth(c, window) for c in per_seed.T], axis=1)
        centre, half = mean_ci(smoothed, axis=1)
        lower, upper = band(centre, half, np.nanmin(per_seed), np.nanmax(per_seed))
        label = f"95 % CI of the mean ({per_seed.shape[1]} seeds)"
        ax.fill_between(steps, lower, upper, color="C0", alpha=0.2, lw=0, label=label)
    if evals:  # intervals clipped to the returns observed (never above the maximum)
        low = np.nanmin([np.nanmin(observed), np.nanmin(eval_mean)])
        high = np.nanmax([np.nanmax(observed), np.nanmax(eval_mean)])
        lower, upper = band(eval_mean, _column(evals, "eval_return_ci"), low, high)
        ax.errorbar(
            _column(evals, "env_steps"), eval_mean, yerr=[eval_mean - lower, upper - eval_mean],
            fmt="o-", color="C1", ms=3, lw=1, capsize=2, label="greedy evaluation (95 % CI)",
        )  # fmt: skip
    ax.legend(fontsize="small", loc="best", framealpha=0.8)


def learning_curve_figure(rows: list[dict], title: str = ""):
    """A ``matplotlib.figure.Figure``: the return panel, then one panel per extra column."""
    # A Figure without pyplot: no global backend switch (notebooks keep inline plots).
    from matplotlib.figure import Figure

    extras = [(k, label) for k, label in EXTRA_PANELS if any(r.get(k) is not None for r in rows)]
    window = max(1, int(round(len(rows) * SMOOTH_FRACTION)))
    if extras:
        fig = Figure(figsize=(10, 6.5), layout="constrained")
        grid = fig.add_gridspec(2, len(extras))
        axes = [fig.add_subplot(grid[0, :])] + [
            fig.add_subplot(grid[1, i]) for i in range(len(extras))
        ]
    else:
        fig = Figure(figsize=(7, 4.5), layout="constrained")
        axes = [fig.add_subplot()]
    ret = axes[0]
    _return_panel(ret, rows, window)
    ret.set_ylabel("episode return")
    ret.set_title("episode return")
    for ax, (name, label) in zip(axes[1:], extras, strict=True):
        values = [r for r in rows if r.get(name) is not None]
        steps, y = _column(values, "env_steps"), _column(values, name)
        ax.plot(steps, y, color="C2", alpha=0.3, lw=0.8)
        ax.plot(steps, smooth(y, window), color="C2", lw=1.5)
        ax.ticklabel_format(axis="y", useOffset=False)
        ax.set_title(label)
    from matplotlib.ticker import EngFormatter, MaxNLocator

    for ax in axes:
        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 200k, 1.5M: no overlapping labels
        ax.xaxis.set_major_locator(MaxNLocator(6 if ax is ret else 4))
        ax.set_xlabel("environment steps (per seed)")
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return fig


def plot_learning_curve(metrics_path: str | Path, out_path: str | Path, title: str = "") -> Path:
    """``learning_curve_figure`` of ``metrics.jsonl`` saved as ``out_path`` (PNG)."""
    fig = learning_curve_figure(read_columns(metrics_path), title)
    fig.savefig(out_path, dpi=100)
    return Path(out_path)
