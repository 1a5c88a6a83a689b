"""Jitted, batched gymnax environments."""

from rljax.envs.gymnax_envs import (
    CONTINUOUS_ENVS,
    DISCRETE_ENVS,
    ENVS,
    IMAGE_OBS_SHAPES,
    BatchedEnv,
    EnvBatch,
    EnvSpec,
    EpisodeStats,
    Transition,
    check_discrete,
    check_env_name,
    image_obs_shape,
    is_continuous,
)

__all__ = [
    "CONTINUOUS_ENVS",
    "DISCRETE_ENVS",
    "ENVS",
    "IMAGE_OBS_SHAPES",
    "BatchedEnv",
    "EnvBatch",
    "EnvSpec",
    "EpisodeStats",
    "Transition",
    "check_discrete",
    "check_env_name",
    "image_obs_shape",
    "is_continuous",
]
