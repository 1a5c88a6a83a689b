"""rljax: sharded reinforcement learning on jitted gymnax environments."""

from rljax.algos import (
    A2C,
    DQN,
    PPO,
    A2CConfig,
    A2CState,
    DQNConfig,
    DQNState,
    PPOConfig,
    PPOState,
)
from rljax.errors import ConfigError
from rljax.runner import RunConfig, ShardedRun
from rljax.training import TrainResult, train

__all__ = [
    "A2C",
    "DQN",
    "PPO",
    "A2CConfig",
    "A2CState",
    "ConfigError",
    "DQNConfig",
    "DQNState",
    "PPOConfig",
    "PPOState",
    "RunConfig",
    "ShardedRun",
    "TrainResult",
    "train",
]
__version__ = "0.1.0"
