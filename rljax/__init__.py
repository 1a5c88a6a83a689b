"""rljax: sharded reinforcement learning on jitted gymnax environments."""

from rljax.algos import PPO, PPOConfig, PPOState
from rljax.errors import ConfigError
from rljax.runner import RunConfig, ShardedRun, train

__all__ = ["PPO", "ConfigError", "PPOConfig", "PPOState", "RunConfig", "ShardedRun", "train"]
__version__ = "0.1.0"
