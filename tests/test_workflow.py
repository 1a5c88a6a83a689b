"""Research workflow: sweeps in one jit, evaluation, TensorBoard events, wandb (stubbed)."""

import dataclasses
import struct
import sys
import types

import jax
import numpy as np
import pytest

from rljax import PPO, ConfigError, PPOConfig, RunConfig, train
from rljax.evaluation import Evaluator
from rljax.parallel import make_mesh
from rljax.runner import ShardedRun
from rljax.sweep import settings_of, sweep

TINY = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2)


def test_sweep_equals_the_settings_run_one_by_one(tmp_path):
    grid = {"lr": [2.5e-4, 3e-3], "ent_coef": [0.0, 0.05]}
    run = RunConfig(runs_dir=str(tmp_path), run_name="sweep", quiet=True, log_every=4)
    result = sweep(TINY, grid, seeds=[0, 5], run=run)
    assert result.returns.shape == (4, 4, 2) and len(result.settings) == 4
    mesh = make_mesh("data=1,model=1")
    for i, setting in [(0, result.settings[0]), (3, result.settings[3])]:
        single = ShardedRun(PPO(dataclasses.replace(TINY, **setting)), mesh, chunk_size=4)
        for j, seed in enumerate([0, 5]):
            _, metrics = single.run_chunk(single.init(jax.random.key(seed)), 4)
            np.testing.assert_allclose(
                result.returns[:, i, j], metrics["episode_return"], rtol=1e-5, atol=1e-5
            )
    rows = (tmp_path / "sweep" / "lr=0.003,ent_coef=0.05" / "metrics.jsonl").read_text()
    assert len(rows.splitlines()) == 4
    assert "| 0.003 | 0.05 |" in (tmp_path / "sweep" / "summary.md").read_text()
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "grid, message",
    [
        ({"learning_rate": [1e-3]}, "sweep field 'learning_rate' is not a PPOConfig field"),
        ({"num_envs": [4, 8]}, "sweep field 'num_envs' cannot be swept in one jit"),
        ({"lr": []}, "sweep field 'lr' has no values"),
        ({"lr": ["fast"]}, "value 'fast' is not a number"),
        ({}, "empty sweep grid"),
        ({"lr": [-1.0]}, "lr (learning rate) must be > 0, got -1.0"),
    ],
)
def test_bad_sweep_specs_are_rejected(grid, message):
    with pytest.raises(ConfigError) as info:
        settings_of(TINY, grid)
    assert message in str(info.value)


def test_evaluation_is_deterministic_and_separate_from_training():
    ppo = PPO(TINY)
    state = ppo.init(jax.random.key(0))
    evaluate = jax.jit(Evaluator(ppo, num_envs=4))
    first = evaluate(state.params, jax.random.key(1))
    second = evaluate(state.params, jax.random.key(1))
    assert {k: float(v) for k, v in first.items()} == {k: float(v) for k, v in second.items()}
    assert float(first["eval_finished"]) == 1.0  # every environment ended its episode
    assert 5 <= float(first["eval_return"]) <= 500


def read_scalars(event_file):
    """TFRecord framing: length (u64), crc (u32), payload, crc (u32); payloads are Events."""
    from tensorboardX.proto import event_pb2

    scalars, data = {}, event_file.read_bytes()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


class FakeWandbRun:
    """Records what ``RunLog`` sends to ``wandb`` (wandb itself is optional and not installed)."""

    def __init__(self, **init_kwargs):
        self.init_kwargs, self.logged, self.finished = init_kwargs, [], False
        self.config_data = {}
        self.config = types.SimpleNamespace(update=lambda data, **_: self.config_data.update(data))

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_tensorboard_wandb_and_evaluation_rows(tmp_path, monkeypatch):
    wandb_runs = []
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.init = lambda **kwargs: wandb_runs.append(FakeWandbRun(**kwargs)) or wandb_runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = dataclasses.replace(TINY, total_timesteps=4 * 16 * 6)
    run = RunConfig(
        runs_dir=str(tmp_path),
        run_name="tb",
        log_every=2,
        eval_every=3,
        eval_episodes=4,
        tensorboard=True,
        wandb=True,
        quiet=True,
        measure_comm=False,
    )
    result = train(config, run)
    (wandb_run,) = wandb_runs
    assert wandb_run.init_kwargs["mode"] == "offline"
    assert wandb_run.init_kwargs["dir"] == str(tmp_path / "tb")
    assert wandb_run.config_data["algo"]["env"] == "CartPole-v1" and wandb_run.finished
    assert [step for step, _ in wandb_run.logged] == [64 * u for u in range(1, 7)]
    assert [data["loss"] for _, data in wandb_run.logged] == [r["loss"] for r in result.metrics]
    evaluated = [r["update"] for r in result.metrics if "eval_return" in r]
    assert evaluated == [4, 6]  # first chunk end at or after each multiple of eval_every
    assert set(result.compile_seconds) == {"init", "chunk", "eval"}  # none inside the timed loop
    (event_file,) = (tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*")
    scalars = read_scalars(event_file)
    assert [step for step, _ in scalars["episode_return"]] == [64 * u for u in range(1, 7)]
    assert [step for step, _ in scalars["eval_return"]] == [64 * 4, 64 * 6]
    np.testing.assert_allclose(
        [v for _, v in scalars["loss"]], [r["loss"] for r in result.metrics], rtol=1e-6
    )


def test_missing_wandb_is_one_clear_message_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    run = RunConfig(runs_dir=str(tmp_path), run_name="w", wandb=True, quiet=True)
    with pytest.raises(ConfigError, match=r"--wandb needs wandb: pip install"):
        train(TINY, run)
    assert not (tmp_path / "w").exists()
