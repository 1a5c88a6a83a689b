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


def test_integer_flags_take_exact_integer_literals(monkeypatch, tmp_path, capsys):
    import rljax.run.training

    seen = []
    monkeypatch.setattr(rljax.run.training, "train", lambda algo, run: seen.append((algo, run)))
    args = ["train", "ppo", "--total-timesteps", "5e5", "--num-envs", "1.6E1", "--seed", "1_000"]
    assert main([*args, "--actor-widths", "64", "1.28e2", "--runs-dir", str(tmp_path)]) == 0
    ((algo, run),) = seen
    assert (algo.total_timesteps, algo.num_envs, algo.actor_widths) == (500000, 16, (64, 128))
    assert run.seed == 1000 and type(algo.total_timesteps) is int
    monkeypatch.setenv("COLUMNS", "200")
    for value in ("2.5", "5e-1", "inf", "nan", "abc"):
        with pytest.raises(SystemExit) as exit_:  # tyro's parse errors exit 2 (its usual box)
            main(["train", "ppo", "--total-timesteps", value])
        assert exit_.value.code == 2
        captured = capsys.readouterr()
        text = captured.out + captured.err
        assert "--total-timesteps" in text and f"{value!r} is not an integer" in text
        assert "Traceback" not in text
    assert len(seen) == 1 and list(tmp_path.iterdir()) == []
