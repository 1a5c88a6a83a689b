"""Algorithms as pure functions over pytree training states, and their registry.

``ALGORITHMS`` maps a name to an ``Algorithm`` subclass; the CLI's subcommands, saved runs and
``train(config)`` look algorithms up here. Adding one: a module + one line below.
"""

from __future__ import annotations

from rljax.algos.a2c import A2C, A2CConfig, A2CState
from rljax.algos.base import Algorithm
from rljax.algos.dqn import DQN, DQNConfig, DQNState
from rljax.algos.ppo import PPO, PPOConfig, PPOState, gae
from rljax.errors import ConfigError

ALGORITHMS: dict[str, type[Algorithm]] = {
    "ppo": PPO,
    "dqn": DQN,
    "a2c": A2C,
}


def algorithm_for(config) -> type[Algorithm]:
    """The registered algorithm whose config type is exactly ``type(config)``."""
    for algorithm in ALGORITHMS.values():
        if type(config) is algorithm.config_type:
            return algorithm
    raise ConfigError(
        f"no registered algorithm takes a {type(config).__name__} (registered: "
        f"{', '.join(f'{n}: {a.config_type.__name__}' for n, a in ALGORITHMS.items())}); "
        "for your own algorithm class pass an instance, e.g. train(MyPPO(MyPPOConfig()))"
    )


__all__ = [
    "A2C",
    "ALGORITHMS",
    "A2CConfig",
    "A2CState",
    "DQN",
    "Algorithm",
    "DQNConfig",
    "DQNState",
    "PPO",
    "PPOConfig",
    "PPOState",
    "algorithm_for",
    "gae",
]
