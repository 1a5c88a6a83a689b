"""``rljax eval``: a checkpoint evaluated again reproduces training's own evaluation with the same
key, on one device or another mesh; eval.json; bad input is one error line with nothing
written."""

import json
import shutil

import numpy as np
import pytest

from rljax.cli import main
from rljax.tools.evaluate import EVAL_FILE, EvalArgs, evaluate_run


def logged_eval(result, update):
    (row,) = [r for r in result.metrics if r["update"] == update and "eval_return" in r]
    return row["eval_return"]


@pytest.mark.parametrize("mesh", ["data=1,model=1", "data=2"])
def test_eval_reproduces_trainings_own_evaluation(trained, mesh, capsys):
    args = EvalArgs(run_dir=str(trained.run_dir), step=3, episodes=4, mesh=mesh)
    report = evaluate_run(args)
    assert report["step"] == 3 and report["policy"] == "greedy"
    assert report["mean"]["value"] == pytest.approx(logged_eval(trained, 3), rel=1e-6)
    saved = json.loads((trained.run_dir / EVAL_FILE).read_text())
    assert saved["returns"] == report["returns"] and len(saved["returns"][0]) == 4
    low, high = saved["iqm"]["ci"]
    assert low <= saved["iqm"]["value"] <= high
    assert "iqm" in capsys.readouterr().out


def test_the_newest_checkpoint_is_the_default_and_sampling_changes_the_actions(trained):
    greedy = evaluate_run(EvalArgs(run_dir=str(trained.run_dir), episodes=4))
    assert greedy["step"] == 6
    assert greedy["mean"]["value"] == pytest.approx(logged_eval(trained, 6), rel=1e-6)
    sampled = evaluate_run(EvalArgs(run_dir=str(trained.run_dir), episodes=4, sample=True))
    assert sampled["policy"] == "sampled" and np.isfinite(sampled["returns"]).all()


@pytest.mark.parametrize(
    "args, message",
    [
        (["{run}", "--step", "4"], "cannot evaluate '{run}': no checkpoint step 4; steps: 3, 6"),
        (["{missing}"], "cannot evaluate '{missing}': no such run directory"),
        (["{damaged}"], "cannot evaluate '{damaged}': {damaged}/config.json is damaged"),
        (["{run}", "--episodes", "0"], "--episodes must be >= 1, got 0"),
        (["{run}", "--render", "out.mp4"], "--render writes a .gif, got 'out.mp4'"),
        (["{unrenderable}", "--render", "x.gif"], "rendering Reacher-misc is not supported"),
    ],
)
def test_bad_input_is_one_error_line_and_nothing_is_written(
    trained, tmp_path, capsys, args, message
):
    run = str(trained.run_dir)
    (trained.run_dir / EVAL_FILE).unlink(missing_ok=True)
    damaged = tmp_path / "damaged"
    shutil.copytree(run, damaged)
    (damaged / "config.json").write_text("{not json")
    unrenderable = tmp_path / "reacher"
    shutil.copytree(run, unrenderable)
    config = json.loads((unrenderable / "config.json").read_text())
    config["algo"]["env"] = "Reacher-misc"
    (unrenderable / "config.json").write_text(json.dumps(config))
    paths = dict(run=run, missing=str(tmp_path / "missing"), damaged=str(damaged),
                 unrenderable=str(unrenderable))  # fmt: skip
    before = sorted(p.name for p in trained.run_dir.iterdir())
    assert main(["eval", *(a.format(**paths) for a in args)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(**paths)) and err.count("\n") == 1, err
    assert sorted(p.name for p in trained.run_dir.iterdir()) == before
    assert not (damaged / EVAL_FILE).exists() and not (unrenderable / EVAL_FILE).exists()
