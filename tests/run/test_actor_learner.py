"""The actor-learner layout through train(): hooks, evaluation, metrics, checkpoints, resume after
SIGKILL (bitwise), and one ConfigError per bad input before anything compiles."""

import json
import os
import subprocess
import sys
from pathlib import Path

import chex
import jax
import numpy as np
import pytest

from rljax import PPO, ConfigError, PPOConfig, RunConfig, train
from rljax.algos.a2c import A2CConfig
from rljax.cli import main
from rljax.parallel.actor_learner import split_layouts
from rljax.run.actor_learner import ActorLearnerRun
from rljax.run.checkpoint import Checkpointer
from rljax.run.loop import TIMING_COLUMNS
from rljax.run.run_log import read_metrics
from rljax.tools.evaluate import EvalArgs, evaluate_run
from rljax.tools.runs import load_run
from tests.run.kill import kill_after_checkpoint
from tests.run.trees import host_state

TINY = PPOConfig(
    num_envs=4, num_steps=8, total_timesteps=4 * 8 * 12, num_minibatches=2, update_epochs=2,
    actor_widths=(8, 8), critic_widths=(8, 8),
)  # fmt: skip


def al_run(tmp_path, **flat):
    return RunConfig.make(
        actor_mesh="data=2", learner_mesh="data=1,model=2", max_staleness=2, log_every=4,
        checkpoint_every=8, checkpoint_min_seconds=0, eval_every=8, eval_episodes=2,
        runs_dir=str(tmp_path), quiet=True,
        **flat,
    )  # fmt: skip


def test_train_runs_hooks_evaluation_checkpoints_and_logs_staleness(tmp_path):
    config = PPOConfig(**{**TINY.__dict__, "off_policy": "vtrace", "normalize_obs": True})
    result = train(config, al_run(tmp_path, run_name="al"))
    rows = result.metrics
    assert [r["update"] for r in rows] == list(range(1, 13))
    versions = np.array([r["policy_version"] for r in rows])
    staleness = np.arange(12) - versions  # row u is update u, applied to version u - 1
    assert staleness.max() <= 2 and (staleness[2:] == 2).all()
    assert [r["staleness"] for r in rows] == list(staleness)
    assert rows[-1]["staleness_max"] == 2 and rows[-1]["staleness_mean"] == 2
    assert rows[0]["staleness_mean"] == pytest.approx((0 + 1 + 2 + 2) / 4)
    assert "eval_return" in rows[7] and 0 < rows[-1]["importance_weight"] <= 1
    with Checkpointer(result.run_dir / "checkpoints") as ckpt:
        assert ckpt.latest_valid_step() == 12
    plan = json.loads((result.run_dir / "config.json").read_text())["memory_plan"]
    assert plan["layout"] == "actor-learner" and plan["fits"] and plan["max_staleness"] == 2
    assert plan["actor"]["bytes_per_device"]["state"]["queued parameters"] > 0
    assert int(result.state.learner.update_step) == 12
    # The tools read it as a one-mesh run: the learner's parameters, the actors' normaliser, and
    # `rljax eval` reproduces training's own evaluation at update 12.
    loaded = load_run(result.run_dir)
    chex.assert_trees_all_close(
        jax.device_get(loaded.state.params), jax.device_get(result.state.learner.params)
    )
    chex.assert_trees_all_close(
        jax.device_get(loaded.state.obs_stats), jax.device_get(result.state.actor.obs_stats)
    )
    report = evaluate_run(EvalArgs(run_dir=str(result.run_dir), step=12, episodes=2))
    assert report["mean"]["value"] == pytest.approx(rows[-1]["eval_return"], rel=1e-6)


def test_bad_input_gets_one_config_error_each_before_compiling(tmp_path):
    cases = {
        "need 10 devices": dict(actor_mesh="data=2", learner_mesh="data=4,model=2"),
        "needs --learner-mesh": dict(actor_mesh="data=2"),
        "needs --actor-mesh": dict(learner_mesh="data=2"),
        "max_staleness must be >= 0": dict(
            actor_mesh="data=1", learner_mesh="data=1", max_staleness=-1
        ),
        "applies to the actor-learner layout only": dict(max_staleness=1),
        "cannot be combined with --actor-mesh": dict(
            mesh="data=2", actor_mesh="data=1", learner_mesh="data=1"
        ),
    }
    for message, flat in cases.items():
        run = RunConfig.make(runs_dir=str(tmp_path), quiet=True, **flat)
        with pytest.raises(ConfigError, match=message):
            train(TINY, run)
    run = RunConfig.make(runs_dir=str(tmp_path), actor_mesh="data=1", learner_mesh="data=1")
    with pytest.raises(ConfigError, match="feed-forward PPO only, not A2C"):
        train(A2CConfig(), run)
    with pytest.raises(ConfigError, match="not recurrent PPO"):
        train(PPOConfig(recurrent="gru"), run)
    assert not any(tmp_path.iterdir())  # nothing written


def test_sweep_refuses_the_layout(capsys):
    flags = ["--actor-mesh", "data=1", "--learner-mesh", "data=1"]
    assert main(["sweep", "ppo", *flags]) != 0
    assert "actor-learner layout" in capsys.readouterr().err


# -- resume after SIGKILL: 60 updates of 2048 env steps, killed after the checkpoint at 10 ------
ARGS = [
    "ppo",
    "--num-envs", "16",
    "--num-steps", "128",
    "--total-timesteps", str(16 * 128 * 60),
    "--log-every", "5",
    "--checkpoint-every", "10",
    "--checkpoint-min-seconds", "0",
    "--eval-every", "0",
    "--actor-mesh", "data=1",
    "--learner-mesh", "data=1",
    "--max-staleness", "1",
]  # fmt: skip


def cli(*args):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "2", "PYTHONUNBUFFERED": "1"}
    return [sys.executable, "-m", "rljax", "train", *args], env


def restored(run_dir):
    actor, learner = split_layouts("data=1", "data=1")
    config = PPOConfig(num_envs=16, num_steps=128, total_timesteps=16 * 128 * 60)
    run = ActorLearnerRun(PPO(config), actor, learner, max_staleness=1)
    with Checkpointer(Path(run_dir) / "checkpoints") as ckpt:
        step, state, _ = ckpt.restore_latest(run.abstract_state())
    return step, host_state(state)


def untimed(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


def test_sigkill_after_checkpoint_then_resume_is_bitwise_identical(tmp_path):
    command, env = cli(*ARGS, "--runs-dir", str(tmp_path), "--run-name", "full")
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)

    command, env = cli(*ARGS, "--runs-dir", str(tmp_path), "--run-name", "killed")
    kill_after_checkpoint(command, env, tmp_path / "killed", 10)
    assert 10 <= len(read_metrics(tmp_path / "killed" / "metrics.jsonl")) < 60

    command, env = cli("ppo", "--resume", str(tmp_path / "killed"))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "resumed from update" in result.stdout

    step_a, full = restored(tmp_path / "full")
    step_b, resumed = restored(tmp_path / "killed")
    assert step_a == step_b == 60
    chex.assert_trees_all_equal(resumed, full)  # learner, actors, queued parameters, keys
    rows_full = read_metrics(tmp_path / "full" / "metrics.jsonl")
    rows_resumed = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert [r["update"] for r in rows_resumed] == list(range(1, 61))
    assert untimed(rows_resumed) == untimed(rows_full)
