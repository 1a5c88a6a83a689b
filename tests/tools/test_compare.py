"""``rljax compare``: per-seed scores from each run's metrics (or eval.json), IQM / mean /
median / optimality gap with stratified bootstrap intervals, performance profiles, the plot; bad
patterns are one error with nothing written."""

import json

import numpy as np
import pytest
from scipy.stats import trim_mean

from rljax.cli import main
from rljax.tools.compare import CompareArgs, compare


def fake_run(path, finals, updates=40):
    """A run directory whose seeds' training returns rise linearly to ``finals``."""
    path.mkdir(parents=True)
    finals = np.asarray(finals, float)
    with open(path / "metrics.jsonl", "w") as f:
        for u in range(1, updates + 1):
            per_seed = finals * u / updates
            row = {"update": u, "env_steps": 512 * u, "episode_return": float(per_seed.mean())}
            if finals.size > 1:
                row["episode_return_per_seed"] = per_seed.tolist()
            f.write(json.dumps(row) + "\n")
    return path


@pytest.fixture
def runs(tmp_path):
    fake_run(tmp_path / "ppo-0", [500.0, 480.0])
    fake_run(tmp_path / "ppo-1", [300.0, 490.0])
    fake_run(tmp_path / "a2c-0", [100.0])
    fake_run(tmp_path / "a2c-1", [200.0])
    return tmp_path


def test_groups_are_aggregated_over_every_seed_of_their_runs(runs, tmp_path):
    args = CompareArgs(patterns=(str(runs / "ppo-*"), str(runs / "a2c-*")), names=("ppo", "a2c"),
                       target=500.0, out=str(tmp_path / "out"), reps=500)  # fmt: skip
    report = compare(args)
    ppo, a2c = report["groups"]["ppo"], report["groups"]["a2c"]
    # The last 5 % of 40 updates is the last 2: (1 + 39/40) / 2 of each final.
    factor = (1.0 + 39.0 / 40.0) / 2.0
    expected = np.array([500.0, 480.0, 300.0, 490.0]) * factor
    np.testing.assert_allclose(sorted(ppo["scores"]), sorted(expected))
    assert ppo["n"] == 4 and a2c["n"] == 2
    assert ppo["iqm"]["value"] == pytest.approx(trim_mean(expected, 0.25))
    assert ppo["optimality_gap"]["value"] == pytest.approx(np.mean(500.0 - expected))
    for entry in (ppo, a2c):
        for name in ("iqm", "mean", "median", "optimality_gap"):
            low, high = entry[name]["ci"]
            assert low <= entry[name]["value"] <= high
    assert ppo["profile"][0] == 1.0 and a2c["profile"][-1] == 0.0
    out = tmp_path / "out"
    assert "| ppo | 4 |" in (out / "compare.md").read_text()
    assert (out / "compare.png").stat().st_size > 10_000


def test_eval_scores_come_from_eval_json(runs, tmp_path):
    (runs / "ppo-0" / "eval.json").write_text(json.dumps({"returns": [[1.0, 3.0], [5.0, 7.0]]}))
    report = compare(CompareArgs(patterns=(str(runs / "ppo-0"),), score="eval",
                                 out=str(tmp_path / "o"), reps=200))  # fmt: skip
    assert report["groups"][str(runs / "ppo-0")]["scores"] == [2.0, 6.0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["{root}/dqn-*"], "pattern '{root}/dqn-*' matches no run directory"),
        (["{root}/ppo-*", "--names", "a", "b"], "--names gives 2 name(s) for 1 pattern(s)"),
        (["{root}/ppo-*", "--score", "eval"], "cannot compare '{root}/ppo-0' by --score eval"),
        (["{root}/empty"], "cannot compare '{root}/empty': no metrics.jsonl"),
    ],
)
def test_bad_input_is_one_error_with_nothing_written(runs, tmp_path, capsys, args, message):
    (runs / "empty").mkdir()
    out = tmp_path / "nothing"
    argv = [a.format(root=runs) for a in args] + ["--out", str(out)]
    assert main(["compare", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(root=runs)) and err.count("\n") == 1, err
    assert not out.exists()
