"""The learning-curve studies' figures (experiments/bench_harness.py): steps to a threshold come
from the smoothed curve, intervals are confidence intervals clipped to the return's range, and a
study without greedy evaluation says so. Pure numpy on made-up curves; nothing is trained. The
prepared GPU call (experiments/gpu_bench.sh) parses."""

import numpy as np

from experiments.bench_harness import (
    before_first_episode,
    ci_str,
    completed_mean,
    curve_study_markdown,
    port_final_return,
    summarise_curves,
)


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


def test_large_networks_table_and_budget_come_from_the_saved_settings(tmp_path):
    import json

    from experiments import large_networks_breakout as study

    def setting_json(setting, steps_per_s, compile_s, eval_s):
        report = report_of(np.full((8, 3), 2.0), threshold=None, return_range=(0.0, None))
        report["eval"] = {"episodes": 2, "updates": [4, 8], "returns": [[[1, 3]] * 3] * 2}
        summarise_curves(report)
        report["row"].update(
            env_steps=65_536, steps_per_s=steps_per_s, compile_s=compile_s, init_s=0.0,
            eval_s=eval_s,
        )  # fmt: skip
        report.update(setting=setting, parameters=1000, env_steps_per_update=8192)
        return report

    measure = tmp_path / "large_networks_breakout" / "measure"
    measure.mkdir(parents=True)
    for setting, rate, compile_s, eval_s in (("mlp", 30_000, 10, 2), ("cnn", 3_000, 20, 0)):
        (measure / f"{setting}.json").write_text(
            json.dumps(setting_json(setting, rate, compile_s, eval_s))
        )
    stem = tmp_path / "large_networks_breakout"
    c = study.build_combined(stem, stem, minutes=30)
    # cnn: (1800 s - 20 s compile) x 3,000 steps/s / 3 seeds = 1,780,000 -> 217 updates of 8,192
    plan = {p["setting"]: p["fits_steps"] for p in c["budget_plan"]}
    assert plan == {"mlp": 10_000_000, "cnn": 217 * 8192}
    text = stem.with_suffix(".md").read_text()
    assert "Recommended budget: 1,700,000 env steps per seed" in text
    assert "First table: the short measurement runs" in text
    assert "a different budget from this table's" in text  # the 1e7 baseline vs 65,536
    assert "| cnn | CNN 3x3x16 (SAME) + 2x64 heads | 1,000 | 65,536 | 2.0 [0.9, 3.1] |" in text
    assert json.loads(stem.with_suffix(".json").read_text())["recommended_timesteps"] == 1_700_000
    assert stem.with_suffix(".png").stat().st_size > 0


def test_updates_before_the_first_episode_are_not_a_return_of_zero():
    # Pendulum: returns are negative; the metric reads 0 until a seed's first episode ends.
    returns = np.array([[0.0, 0.0], [0.0, -1200.0], [-1100.0, -900.0], [-200.0, -200.0]])
    episodes = np.array([[0, 0], [0, 16], [16, 32], [32, 48]])
    filled = before_first_episode(returns, episodes)
    np.testing.assert_array_equal(filled[:, 0], [-1100.0, -1100.0, -1100.0, -200.0])
    np.testing.assert_array_equal(filled[:, 1], [-1200.0, -1200.0, -900.0, -200.0])
    report = report_of(filled, threshold=-250.0, return_range=(-3300.0, 0.0))
    summarise_curves(report)
    assert report["threshold_steps"]["reach"] == [4000.0, 4000.0]  # not 1000: zero is no return


def test_final_returns_average_only_envs_that_completed_an_episode():
    # 2 seeds x 3 envs: seed 0 has two completed envs, seed 1 none (it counts 0).
    last = np.array([[100.0, 0.0, 300.0], [0.0, 0.0, 0.0]])
    assert completed_mean(last, last > 0) == (200.0 + 0.0) / 2
    # The port's metrics [S, updates, steps, envs]: only the last step of the last update counts.
    returns = np.zeros((2, 3, 4, 3))
    returns[..., -1, -1, :] = last
    returns[:, 0, 0, :] = 999.0  # an earlier step: ignored
    assert port_final_return({"returned_episode_returns": returns}) == 100.0


def test_gpu_bench_script_parses_and_names_its_commands():
    """The prepared GPU call (experiments/gpu_bench.sh) is valid bash, and an unknown command
    gets its usage line and exit code 2 before anything runs."""
    import subprocess
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "experiments" / "gpu_bench.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    result = subprocess.run(["bash", str(script), "nonsense"], capture_output=True, text=True)
    assert result.returncode == 2
    assert "usage" in result.stderr and "fetch | run" in result.stderr
