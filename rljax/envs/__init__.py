"""Jitted, batched gymnax environments."""

from rljax.envs.gymnax_envs import (
    DISCRETE_ENVS,
    IMAGE_OBS_SHAPES,
    BatchedEnv,
    EnvBatch,
    EnvSpec,
    EpisodeStats,
    Transition,
    check_env_name,
    image_obs_shape,
)

__all__ = [
    "DISCRETE_ENVS",
    "IMAGE_OBS_SHAPES",
    "BatchedEnv",
    "EnvBatch",
    "EnvSpec",
    "EpisodeStats",
    "Transition",
    "check_env_name",
    "image_obs_shape",
]
