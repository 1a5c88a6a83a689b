"""The default learning_curve.png: smoothed return, CI bands within the observed range, panels."""

import json

import numpy as np

from rljax.run.plots import learning_curve_figure, plot_learning_curve
from rljax.run.run_log import plot_learning_curve as from_run_log


def write_rows(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"torn": ')
    return path


def ppo_rows(n=60, seeds=3):
    rng = np.random.default_rng(0)
    rows = []
    for u in range(1, n + 1):
        per_seed = np.clip(u * 10 + rng.normal(0, 80, seeds), 0, 500)
        row = {"update": u, "env_steps": u * 512, "episodes": 4.0,
               "episode_return": float(per_seed.mean()),
               "episode_return_per_seed": per_seed.tolist(),
               "loss": 1.0 / u, "entropy": 0.69 - u / 200, "approx_kl": 0.01}  # fmt: skip
        if u % 20 == 0:
            row.update(eval_return=float(per_seed.max()), eval_return_ci=5.0)
        rows.append(row)
    return rows


def test_ppo_rows_give_return_loss_entropy_kl_panels_and_clipped_ci_bands(tmp_path):
    rows = ppo_rows()
    metrics = write_rows(tmp_path / "metrics.jsonl", rows)
    out = plot_learning_curve(metrics, tmp_path / "curve.png", "ppo CartPole-v1")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fig = learning_curve_figure(rows, "ppo")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["episode return", "loss", "policy entropy", "approx. KL"]
    ret = fig.axes[0]
    labels = ret.get_legend_handles_labels()[1]
    assert labels[:2] == ["training (raw)", "training (smoothed, 3)"]
    assert "95 % CI of the mean (3 seeds)" in labels and "greedy evaluation (95 % CI)" in labels
    (band,) = [c for c in ret.collections if c.get_label().startswith("95 % CI of the mean")]
    y = np.concatenate([p.vertices[:, 1] for p in band.get_paths()])
    assert y.max() <= 500.0 and y.min() >= 0.0  # never outside the returns observed
    (evals,) = ret.containers  # the evaluation's error bars, clipped the same way
    bars = np.concatenate([seg[:, 1] for seg in evals.lines[2][0].get_segments()])
    assert bars.max() <= 500.0 and any(r.get("eval_return") == 500.0 for r in rows)
    assert from_run_log is plot_learning_curve  # the old import keeps working


def test_dqn_rows_with_one_seed_give_a_loss_panel_only(tmp_path):
    row = lambda u: {"update": u, "env_steps": u * 100, "episodes": float(u > 2),  # noqa: E731
                     "episode_return": 9.0 + u, "loss": 0.5}  # fmt: skip
    rows = [row(u) for u in range(1, 30)]
    out = plot_learning_curve(write_rows(tmp_path / "m.jsonl", rows), tmp_path / "c.png", "dqn")
    assert out.stat().st_size > 1000
    fig = learning_curve_figure(rows)
    assert [ax.get_title() for ax in fig.axes] == ["episode return", "loss"]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["training (raw)", "training (smoothed, 1)"]  # no band with one seed
