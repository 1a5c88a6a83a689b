"""The CLI end to end: help, and a short run that writes config, metrics and plot."""

import json
import os
import re
import subprocess
import sys

import pytest

import rljax.cli
from rljax.algos import ALGORITHMS
from rljax.cli import main
from rljax.run.run_log import read_metrics


def test_help_lists_every_field_with_defaults():
    result = subprocess.run(
        [sys.executable, "-m", "rljax", "train", "ppo", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        # One column of groups (tyro sets them side by side from 130 columns, narrower the more
        # flags there are), so no flag's help wraps inside its default.
        env={**os.environ, "COLUMNS": "120"},
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
    plan = config["memory_plan"]  # the compiled programs' figures, per device
    assert plan["mesh"] == "data=2,model=2" and plan["num_seeds"] == seeds
    assert plan["bytes_per_device"]["total"] >= plan["bytes_per_device"]["temporaries"] > 0
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
    expected = "expected train, plan, sweep, eval, compare, export, compress, presets or launch"
    assert f"error: unknown command 'trian'; {expected}" in capsys.readouterr().err
    assert main(["train", "sac"]) == 2
    assert (
        capsys.readouterr().err == "error: unknown algorithm 'sac'; expected one of ppo, dqn, a2c\n"
    )
    # `rljax launch` is rljax.launch.main: its own one-line input errors
    assert main(["launch", "--num-processes", "-1", "--", "train"]) == 2
    assert "launch: error: --num-processes must be an integer >= 1" in capsys.readouterr().err
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"] == {"rljax": "rljax.cli:main"}


@pytest.fixture
def no_training(monkeypatch):
    """``rljax.run.training.train`` replaced by a recorder: parsing only, nothing compiled."""
    import rljax.run.training

    seen = []
    monkeypatch.setattr(rljax.run.training, "train", lambda algo, run: seen.append((algo, run)))
    return seen


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.out + captured.err and "╭" not in captured.err
    return lines[0]


def test_integer_flags_take_exact_integer_literals(no_training, tmp_path, capsys):
    args = ["train", "ppo", "--total-timesteps", "5e5", "--num-envs", "1.6E1", "--seed", "1_000"]
    assert main([*args, "--actor-widths", "64", "1.28e2", "--runs-dir", str(tmp_path)]) == 0
    ((algo, run),) = no_training
    assert (algo.total_timesteps, algo.num_envs, algo.actor_widths) == (500000, 16, (64, 128))
    assert run.seed == 1000 and type(algo.total_timesteps) is int
    for value in ("2.5", "5e-1", "inf", "nan", "abc"):
        assert main(["train", "ppo", "--total-timesteps", value]) == 2
        err = one_error_line(capsys)
        assert err.startswith(f"error: --total-timesteps: {value!r} is not an integer")
    assert len(no_training) == 1 and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr", "fast"], "error: --lr: 'fast' is not a number (e.g. 0.5 or 3e-4)"),
        (
            ["--activation", "sigmoid"],
            "error: invalid choice 'sigmoid' for argument '--activation'. Expected one of "
            "('tanh', 'relu', 'gelu', 'silu')",
        ),
        (["--lrr", "3"], "error: unrecognized options: --lrr, 3; perhaps you meant --lr"),
        (["--num-envs"], "error: missing value for argument '--num-envs'"),
        (["--num-cpu-devices", "4"], "error: --num-cpu-devices is now --num-devices"),
        (["--gru-width=8"], "error: --gru-width is now --recurrent-width"),
    ],
)
def test_parse_errors_are_one_line(no_training, capsys, args, message):
    assert main(["train", "ppo", *args]) == 2
    assert one_error_line(capsys).startswith(message)
    assert no_training == []


def test_num_devices_is_the_one_device_count_flag(no_training, monkeypatch):
    seen = []  # --num-devices also reaches DistributedConfig: set before a multi-process start
    monkeypatch.setattr(rljax.cli, "initialize", seen.append)
    assert main(["train", "ppo", "--num-devices", "8"]) == 0
    ((_, run),) = no_training
    assert run.parallel.num_devices == 8 and seen[0].num_cpu_devices == 8


def _help(*argv: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "rljax", *argv, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_help_groups_every_flag_with_a_description(algorithm):
    text = _help("train", algorithm)
    assert text.startswith(f"usage: rljax train {algorithm} ")
    groups = "algorithm network parallelism run checkpoints evaluation logging distributed"
    assert re.findall(r"╭─ (\w+) options", text) == groups.split()
    entries: list[list[str]] = []  # one per flag: its lines inside the box
    for line in text.splitlines():
        inner = line.strip("│ ").rstrip()
        if re.match(r"│ --\S", line):
            entries.append([inner])
        elif entries and entries[-1] and line.startswith("│" + " " * 10):
            entries[-1].append(inner)
        else:  # a group's description, a rule or a box border ends the flag
            entries.append([])
    entries = [e for e in entries if e]
    flags = [e[0].split()[0].rstrip(",") for e in entries]
    assert len(flags) > 30 and len(set(flags)) == len(flags)
    for entry in entries:
        first, *rest = entry
        usage, _, same_line = first.partition("  ")
        description = re.sub(r"\(default:.*", "", " ".join([same_line, *rest]).strip())
        assert len(description.strip()) > 5, f"{usage} has no description"
    for hidden in ("--debug-nonfinite-at", "--num-cpu-devices"):
        assert hidden not in text
    assert "--num-devices" in text and "--preset" in text


def test_train_and_sweep_without_algorithm_print_usage(capsys):
    assert main(["train", "--help"]) == 0 and "rljax sweep {" in capsys.readouterr().out
    assert main(["sweep"]) == 2


def test_plan_prints_the_figures_writes_nothing_and_one_error_over_budget(tmp_path, capsys):
    runs = tmp_path / "runs"
    args = ["plan", "ppo", "--mesh", "data=2", "--num-envs", "8", "--num-steps", "8",
            "--total-timesteps", "128", "--update-epochs", "1", "--num-minibatches", "1",
            "--runs-dir", str(runs), "--memory-per-device", "1kB"]  # fmt: skip
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out.startswith("memory plan: ppo on CartPole-v1, mesh data=2,model=1 (2 devices)")
    budget = "budget: 1.0 kB per device (--memory-per-device)"
    expected = ["parameters: ", "optimizer state", "gradients", "activations/temporaries", budget]
    expected.append("largest array: params")
    assert all(line in out for line in expected), out
    assert len(err.splitlines()) == 1 and "Traceback" not in out + err
    assert err.startswith("error: this run needs ") and "--memory-per-device allows 1.0 kB" in err
    assert "no mesh of the 8 device(s) fits: lower " in err
    assert not runs.exists()


def test_dry_run_plans_instead_of_training(no_training, monkeypatch, capsys, tmp_path):
    import rljax.run.plan

    class Planned:
        def table(self):
            return "memory plan: (table)"

        def check(self):
            return self

    seen = []
    monkeypatch.setattr(rljax.run.plan, "plan", lambda algo, run: seen.append(run) or Planned())
    assert main(["train", "ppo", "--dry-run", "--runs-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "memory plan: (table)\n"
    assert len(seen) == 1 and no_training == [] and list(tmp_path.iterdir()) == []
    assert main(["sweep", "ppo", "--lr", "1e-4,3e-4", "--dry-run"]) == 2
    assert "rljax sweep has no --dry-run" in one_error_line(capsys)


def test_train_ppo_on_a_continuous_env_and_dqn_refusing_it(tmp_path, capsys):
    common = ["--num-envs", "4", "--runs-dir", str(tmp_path), "--quiet"]
    assert main(["train", "dqn", "--env", "Pendulum-v1", *common, "--run-name", "dqn"]) == 2
    err = one_error_line(capsys)
    assert "dqn supports discrete action spaces only" in err and "ppo" in err
    assert list(tmp_path.iterdir()) == []  # refused before anything was written
    ppo = ["--num-steps", "16", "--total-timesteps", str(4 * 16 * 2), "--run-name", "pendulum"]
    assert main(["train", "ppo", "--env", "Pendulum-v1", *common, *ppo]) == 0
    rows = read_metrics(tmp_path / "pendulum" / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2] and rows[-1]["env_steps"] == 2 * 64
