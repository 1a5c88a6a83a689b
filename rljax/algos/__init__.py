"""Algorithms as pure functions over pytree training states."""

from typing import Any, NamedTuple

from rljax.algos import ppo
from rljax.algos.ppo import PPO, PPOConfig, PPOState, gae


class Algorithm(NamedTuple):
    config_type: type
    build: Any  # (config, rules) -> algorithm with init / update / logical_specs
    validate: Any  # (config, data_size, model_size) -> None, raises ConfigError


ALGORITHMS = {"ppo": Algorithm(PPOConfig, PPO, ppo.validate)}

__all__ = ["ALGORITHMS", "Algorithm", "PPO", "PPOConfig", "PPOState", "gae"]
