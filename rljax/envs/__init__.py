"""Jitted, batched gymnax environments."""

from rljax.envs.gymnax_envs import (
    DISCRETE_ENVS,
    BatchedEnv,
    EnvBatch,
    EnvSpec,
    EpisodeStats,
    Transition,
    check_env_name,
)

__all__ = [
    "DISCRETE_ENVS",
    "BatchedEnv",
    "EnvBatch",
    "EnvSpec",
    "EpisodeStats",
    "Transition",
    "check_env_name",
]
