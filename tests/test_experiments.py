"""The learning-curve studies' figures (experiments/bench_harness.py): steps to a threshold come
from the smoothed curve, intervals are confidence intervals clipped to the return's range, and a
study without greedy evaluation says so. Pure numpy on made-up curves; nothing is trained."""

import numpy as np

from experiments.bench_harness import ci_str, curve_study_markdown, summarise_curves


def report_of(returns, threshold=475.0, return_range=(0.0, 500.0), eval_returns=None):
    """A minimal stored study (as its JSON holds it) for ``returns: [U, S]``."""
    returns = np.asarray(returns, float)
    return {
        "title": "made-up",
        "config_summary": "made-up curves",
        "seeds": list(range(returns.shape[1])),
        "num_updates": len(returns),
        "env_steps_per_update": 1000,
        "final_fraction": 0.05,
        "threshold": threshold,
        "return_range": list(return_range),
        "machine": "test",
        "wall_s": 0.0,
        "script": "experiments/made_up.py",
        "row": {"study": "made-up", "num_seeds": returns.shape[1], "env_steps": 0},
        "eval": eval_returns,
        "per_seed": [{"seed": i, "episode_return": c.tolist()} for i, c in enumerate(returns.T)],
    }


def test_one_lucky_update_is_not_steps_to_threshold():
    # 100 updates at 300 with a single update at 500 (update 5), then 500 from update 60 on
    curve = np.full(100, 300.0)
    curve[4] = 500.0
    curve[59:] = 500.0
    report = report_of(np.stack([curve, curve], axis=1))
    summarise_curves(report)
    th = report["threshold_steps"]
    assert th["window"] == 2
    # smoothed over 2 updates: 400 at updates 5, 6 and 60, 500 from update 61 (61,000 steps)
    assert th["reach"] == [61_000.0, 61_000.0]
    assert th["held"] == [61_000.0, 61_000.0]
    text = curve_study_markdown(report)
    assert "reaches 475 (median over seeds: 61.0k env steps)" in text
    assert "5.0k" not in text  # the lucky update never appears as a result


def test_intervals_are_clipped_to_the_return_range():
    assert ci_str(490.0, 30.0, 0.0, 500.0) == "490.0 [460.0, 500.0]"
    assert ci_str(5.0, 30.0, 0.0, None) == "5.0 [0.0, 35.0]"
    assert ci_str(500.0, float("nan"), 0.0, 500.0) == "500.0"  # one sample: no interval
    rng = np.random.default_rng(0)
    curves = np.clip(rng.normal(480, 40, size=(40, 3)), 0, 500)
    report = report_of(curves)
    summarise_curves(report)
    upper = float(report["row"]["final_return_str"].split(", ")[1].rstrip("]"))
    assert upper <= 500.0


def test_greedy_evaluation_is_the_headline_and_its_absence_is_said():
    curves = np.full((40, 2), 450.0)
    report = report_of(curves)
    summarise_curves(report)
    text = curve_study_markdown(report)
    assert "no greedy evaluation" in text
    evaluation = {"episodes": 3, "updates": [20, 40], "returns": [[[400] * 3] * 2, [[500] * 3] * 2]}
    report = report_of(curves, eval_returns=evaluation)
    summarise_curves(report)
    assert report["row"]["eval_return_str"] == "500.0 [500.0, 500.0]"  # the last evaluation
    assert report["row"]["eval_at_max"] == 6
    text = curve_study_markdown(report)
    assert "no greedy evaluation" not in text and "6 of 6 episodes at the maximum" in text
