"""The CLI end to end: help, and a short run that writes config, metrics and plot."""

import json
import os
import subprocess
import sys

import pytest

from rljax.algos import ALGORITHMS
from rljax.cli import main
from rljax.run.run_log import read_metrics


def test_help_lists_every_field_with_defaults():
    result = subprocess.run(
        [sys.executable, "-m", "rljax", "train", "ppo", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, result.stderr
    for flag in (
        "--env",
        "--num-envs",
        "--lr",
        "--mesh",
        "--num-devices",
        "--num-seeds",
        "--actor-widths",
        "--clip-eps",
        "--total-timesteps",
        "--seed-axis",
    ):
        assert flag in result.stdout
    assert "default: 0.00025" in result.stdout and "default: CartPole-v1" in result.stdout


@pytest.mark.parametrize("seeds", [1, 2])
def test_short_run_writes_config_metrics_and_plot(tmp_path, capsys, seeds):
    code = main(
        [
            "train",
            "ppo",
            "--mesh",
            "data=2,model=2",
            "--num-envs",
            "4",
            "--num-steps",
            "16",
            "--total-timesteps",
            str(4 * 16 * 6),
            "--log-every",
            "4",
            "--num-seeds",
            str(seeds),
            "--runs-dir",
            str(tmp_path),
            "--run-name",
            "short",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    run_dir = tmp_path / "short"
    config = json.loads((run_dir / "config.json").read_text())
    assert config["algorithm"] == "ppo" and config["mesh"]["spec"] == "data=2,model=2"
    assert config["algo"]["num_steps"] == 16
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["update"] for r in rows] == list(range(1, 7))
    assert rows[-1]["env_steps"] == 6 * 64
    assert (seeds > 1) == ("episode_return_per_seed" in rows[0])
    assert (run_dir / "learning_curve.png").stat().st_size > 1000
    assert "steps/s" in out and str(run_dir / "metrics.jsonl") in out


def test_top_level_commands_and_console_script(capsys):
    assert main(["--help"]) == 0
    # subcommands from the registry
    assert "rljax train {" + ",".join(ALGORITHMS) + "}" in capsys.readouterr().out
    assert main(["trian", "ppo"]) == 2
    assert "error: unknown command 'trian'; expected train or launch" in capsys.readouterr().err
    # `rljax launch` is rljax.launch.main: its own one-line input errors
    assert main(["launch", "--num-processes", "-1", "--", "train"]) == 2
    assert "launch: error: --num-processes must be an integer >= 1" in capsys.readouterr().err
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"rljax": "rljax.cli:main"}
