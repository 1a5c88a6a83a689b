"""rljax: sharded reinforcement learning on jitted gymnax environments."""

from rljax.algos import (
    A2C,
    ALGORITHMS,
    DQN,
    PPO,
    A2CConfig,
    A2CState,
    Algorithm,
    DQNConfig,
    DQNState,
    PPOConfig,
    PPOState,
)
from rljax.errors import ConfigError
from rljax.run import Hook, RunConfig, ShardedRun, TrainResult, train
from rljax.tools.export import Policy, load_policy

__all__ = [
    "A2C",
    "ALGORITHMS",
    "Algorithm",
    "DQN",
    "PPO",
    "A2CConfig",
    "A2CState",
    "ConfigError",
    "DQNConfig",
    "DQNState",
    "Hook",
    "PPOConfig",
    "PPOState",
    "Policy",
    "RunConfig",
    "ShardedRun",
    "TrainResult",
    "load_policy",
    "train",
]
__version__ = "0.1.0"
