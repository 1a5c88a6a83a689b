"""Algorithms as pure functions over pytree training states."""

from typing import Any, NamedTuple

from rljax.algos import dqn, ppo
from rljax.algos.dqn import DQN, DQNConfig, DQNState
from rljax.algos.ppo import PPO, PPOConfig, PPOState, gae


class Algorithm(NamedTuple):
    config_type: type
    build: Any  # (config, rules, replicas) -> algorithm with init / update / logical_specs
    validate: Any  # (config, data_size, model_size) -> None, raises ConfigError
    sweepable: tuple[str, ...]  # float config fields held in the state's traced hparams


ALGORITHMS = {
    "ppo": Algorithm(PPOConfig, PPO, ppo.validate, ppo.SWEEPABLE),
    "dqn": Algorithm(DQNConfig, DQN, dqn.validate, dqn.SWEEPABLE),
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
