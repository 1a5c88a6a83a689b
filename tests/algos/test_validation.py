"""Algorithm configs: every float finite, every counter within int32, before anything compiles."""

import dataclasses

import jax.numpy as jnp
import pytest

from rljax import DQN, PPO, DQNConfig, PPOConfig
from rljax.errors import ConfigError
from rljax.parallel.sync import SyncConfig


@pytest.mark.parametrize(
    "algorithm, config, message",
    [
        (PPO, PPOConfig(lr=float("inf")), "lr must be a finite number, got inf"),
        (PPO, PPOConfig(clip_eps=float("nan")), "clip_eps must be a finite number, got nan"),
        (PPO, PPOConfig(vf_coef=float("nan")), "vf_coef must be a finite number"),
        (PPO, PPOConfig(total_timesteps=3_000_000_000), "does not fit the int32 counters"),
        (DQN, DQNConfig(total_timesteps=3_000_000_000), "does not fit the int32 counters"),
        (
            PPO,
            PPOConfig(num_envs=1, num_steps=1, num_minibatches=1, total_timesteps=2 * 10**9),
            "8,000,000,000 optimizer steps .* do not fit the int32 step counter",
        ),
        (DQN, DQNConfig(per_eps=0.0), "per_eps must be > 0"),
        (DQN, DQNConfig(per_eps=-1.0), "per_eps must be > 0"),
        (
            PPO,
            PPOConfig(sync=SyncConfig(threshold=float("nan"))),
            "sync.threshold must be a finite number",
        ),
    ],
)
def test_unrepresentable_values_are_one_clear_error(algorithm, config, message):
    with pytest.raises(ConfigError, match=message):
        algorithm.validate(config)


def test_zero_epsilon_decay_means_epsilon_end_at_once():
    config = DQNConfig(epsilon_decay_steps=0)
    DQN.validate(config)
    assert float(DQN(config).epsilon(jnp.int32(0))) == pytest.approx(config.epsilon_end)


def test_a_config_of_another_algorithm_is_refused():
    with pytest.raises(ConfigError, match="PPO needs a PPOConfig, got DQNConfig"):
        PPO.validate(DQNConfig())


def test_sweepable_and_resumable_are_declared_on_the_fields():
    assert PPO.sweepable() == ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef")
    assert DQN.sweepable() == ("tau", "gamma", "lr")
    resumable = [f.name for f in dataclasses.fields(PPOConfig) if f.metadata.get("resumable")]
    assert resumable == ["total_timesteps"]
