"""Sweeps in one jit: members on the seed axis of ShardedRun, run by the same Loop as train."""

import dataclasses

import jax
import numpy as np
import pytest

from rljax import PPO, ConfigError, PPOConfig, RunConfig
from rljax.parallel import make_mesh
from rljax.run.sharded import ShardedRun
from rljax.run.sweep import settings_of, sweep

TINY = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2)


def test_sweep_equals_the_settings_run_one_by_one(tmp_path):
    grid = {"lr": [2.5e-4, 3e-3], "ent_coef": [0.0, 0.05]}
    run = RunConfig.make(runs_dir=str(tmp_path), run_name="sweep", quiet=True, log_every=4)
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
