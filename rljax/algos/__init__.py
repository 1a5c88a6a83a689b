"""Algorithms as pure functions over pytree training states."""

from typing import Any, NamedTuple

from rljax.algos import dqn, ppo
from rljax.algos.dqn import DQN, DQNConfig, DQNState
from rljax.algos.ppo import PPO, PPOConfig, PPOState, gae


class Algorithm(NamedTuple):
    config_type: type
    build: Any  # (config, rules, replicas) -> algorithm with init / update / logical_specs
    validate: Any  # (config, data_size, model_size) -> None, raises ConfigError


ALGORITHMS = {
    "ppo": Algorithm(PPOConfig, PPO, ppo.validate),
    "dqn": Algorithm(DQNConfig, DQN, dqn.validate),
}

__all__ = [
    "ALGORITHMS",
    "DQN",
    "Algorithm",
    "DQNConfig",
    "DQNState",
    "PPO",
    "PPOConfig",
    "PPOState",
    "gae",
]
