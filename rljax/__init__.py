"""rljax: sharded reinforcement learning on jitted gymnax environments."""

from rljax.algos import DQN, PPO, DQNConfig, DQNState, PPOConfig, PPOState
from rljax.errors import ConfigError
from rljax.run import Hook, RunConfig, ShardedRun, TrainResult, train

__all__ = [
    "DQN",
    "PPO",
    "ConfigError",
    "DQNConfig",
    "DQNState",
    "Hook",
    "PPOConfig",
    "PPOState",
    "RunConfig",
    "ShardedRun",
    "TrainResult",
    "train",
]
__version__ = "0.1.0"
