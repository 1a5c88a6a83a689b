"""Jitted, batched gymnax environments, and Brax ones (``brax/<name>``) as an optional extra."""

from rljax.envs.gymnax_envs import (
    BRAX_PREFIX,
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
    make_env,
)

__all__ = [
    "BRAX_PREFIX",
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
    "make_env",
]
