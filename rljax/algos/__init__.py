"""Algorithms as pure functions over pytree training states."""

from rljax.algos.ppo import PPO, PPOConfig, PPOState, gae

ALGORITHMS = {"ppo": (PPOConfig, PPO)}

__all__ = ["ALGORITHMS", "PPO", "PPOConfig", "PPOState", "gae"]
