"""gymnax environment wrappers, and the environment names that build a wrapped environment.

``WRAPPED_ENVS`` maps a name such as ``"CartPole-v1-po"`` to the gymnax environment it wraps and
how; ``make(name)`` builds either kind, so ``BatchedEnv`` (and ``rljax train --env``) take these
names like gymnax's own.

A wrapper keeps gymnax >= 1.0's truncation rule: ``step`` returns ``terminated`` and ``truncated``
separately, and ``info["final_observation"]`` (the last observation of an episode that ended
here, from which a truncation bootstraps) goes through the same observation transform as the
observation itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp


class ObservationWrapper:
    """A gymnax environment whose observations (and ``info["final_observation"]``) pass through
    ``observation(obs)``; every other attribute is the wrapped environment's."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)

    def observation(self, obs: jax.Array) -> jax.Array:
        raise NotImplementedError

    def observation_space(self, params):
        raise NotImplementedError

    @partial(jax.jit, static_argnames=("self",))
    def reset(self, key: jax.Array, params=None) -> tuple[jax.Array, Any]:
        obs, state = self._env.reset(key, params)
        return self.observation(obs), state

    def reset_env(self, key: jax.Array, params) -> tuple[jax.Array, Any]:
        obs, state = self._env.reset_env(key, params)
        return self.observation(obs), state

    def step_env(self, key: jax.Array, state, action, params):
        """gymnax's ``step_env`` (no auto-reset): ``(obs, state, reward, terminated, info)``."""
        obs, state, reward, terminated, info = self._env.step_env(key, state, action, params)
        return self.observation(obs), state, reward, terminated, info

    @partial(jax.jit, static_argnames=("self",))
    def step(self, key: jax.Array, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        info = {**info, "final_observation": self.observation(info["final_observation"])}
        return self.observation(obs), state, reward, terminated, truncated, info


class KeepObservation(ObservationWrapper):
    """Only the observation entries ``keep`` (indices into a flat observation ``[D]``): e.g.
    CartPole's ``[x, x_dot, theta, theta_dot]`` with ``keep=(0, 2)`` is ``[x, theta]``, a
    partially observable task whose velocities a policy must infer from memory."""

    def __init__(self, env, keep: Sequence[int]):
        super().__init__(env)
        self.keep = tuple(int(i) for i in keep)

    def observation(self, obs: jax.Array) -> jax.Array:
        return jnp.take(obs, jnp.asarray(self.keep), axis=-1)

    def observation_space(self, params):
        from gymnax.environments import spaces

        inner = self._env.observation_space(params)
        low = jnp.broadcast_to(jnp.asarray(inner.low), inner.shape)[jnp.asarray(self.keep)]
        high = jnp.broadcast_to(jnp.asarray(inner.high), inner.shape)[jnp.asarray(self.keep)]
        return spaces.Box(low, high, (len(self.keep),), inner.dtype)


# name -> (gymnax environment, wrapper class, wrapper arguments)
WRAPPED_ENVS: dict[str, tuple[str, type, dict[str, Any]]] = {
    # Partially observable CartPole: the cart and pole velocities (entries 1 and 3) removed, the
    # observation is [x, theta] (PureJaxRL's / popgym's "masked" CartPole).
    "CartPole-v1-po": ("CartPole-v1", KeepObservation, {"keep": (0, 2)}),
}


def make(name: str):
    """``(env, params)`` of a gymnax environment name or a ``WRAPPED_ENVS`` name."""
    import gymnax

    if name in WRAPPED_ENVS:
        inner, wrapper, kwargs = WRAPPED_ENVS[name]
        env, params = gymnax.make(inner)
        return wrapper(env, **kwargs), params
    return gymnax.make(name)
