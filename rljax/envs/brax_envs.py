"""Brax environments behind ``BatchedEnv``'s interface: ``brax/<name>`` (the optional extra,
``pip install 'rljax[brax]'``).

Arrays carry a leading environment axis ``B`` sharded along ``data`` (the ``batch`` rule), as in
``rljax.envs.gymnax_envs``. Brax's ``EpisodeWrapper`` counts steps and sets
``info["truncation"]`` at the time limit; ``step`` maps it onto ``truncated`` (bootstrap from
``final_obs``) and the rest of ``done`` onto ``terminated``, then resets the environments that
ended from fresh keys, as gymnax does (Brax's own ``AutoResetWrapper`` would restart every
episode from the same first state).
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import math
import warnings

import jax
import jax.numpy as jnp

from rljax.envs.gymnax_envs import (
    BRAX_PREFIX,
    EnvBatch,
    EnvSpec,
    EpisodeStats,
    Transition,
    env_keys,
    step_keys,
)
from rljax.errors import ConfigError
from rljax.parallel.rules import constrain_batch

INSTALL = "pip install 'rljax[brax]'"

# brax.envs' registry (brax 0.14), known without importing brax so names are checked before JAX
# starts; every one has actions in [-1, 1]. Left out: fast (Brax's unit-test stub) and swimmer,
# whose fluid model calls jnp.clip(a_min=...), which current JAX no longer has (brax 0.14.2).
BRAX_ENVS = (
    "ant",
    "halfcheetah",
    "hopper",
    "humanoid",
    "humanoidstandup",
    "inverted_double_pendulum",
    "inverted_pendulum",
    "pusher",
    "reacher",
    "walker2d",
)

# Brax's training default (brax.envs.create); the time limit after which ``truncated`` is set.
EPISODE_LENGTH = 1000


def check_brax_name(name: str) -> None:
    """A ``ConfigError`` when ``name`` is not ``brax/<a Brax environment>`` or Brax is missing.

    Names outside ``BRAX_ENVS`` (environments registered with
    ``brax.envs.register_environment``) are looked up in Brax's registry, which imports Brax.
    """
    env = name.removeprefix(BRAX_PREFIX)
    installed = importlib.util.find_spec("brax") is not None
    if env not in BRAX_ENVS and not (installed and env in _registry(name)):
        raise ConfigError(
            f"unknown Brax environment {name!r}; known: "
            + ", ".join(BRAX_PREFIX + n for n in BRAX_ENVS)
            + " (or any name registered with brax.envs.register_environment)"
        )
    if not installed:
        raise ConfigError(f"{name} needs Brax, which is not installed; install it with: {INSTALL}")


def _registry(name: str):
    envs, _ = _import_brax(name)
    return getattr(envs, "_envs", {})


@contextlib.contextmanager
def _quiet():
    """Brax's own warnings, none of which the user can act on: jaxopt (a dependency) and Brax say
    they are unmaintained, and Brax's contact code reads a field that MuJoCo >= 4 deprecates."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "JAXopt is no longer maintained", DeprecationWarning)
        warnings.filterwarnings("ignore", "Accessing `.*` directly from `Data`", DeprecationWarning)
        warnings.filterwarnings("ignore", "Brax System, piplines and environments", UserWarning)
        yield


def _import_brax(name: str):
    """``(brax.envs, brax.envs.wrappers.training)``; a ``ConfigError`` saying how to install
    them when the import fails."""
    try:
        # Importing mujoco prints that its optional warp backend is missing.
        with _quiet(), contextlib.redirect_stdout(io.StringIO()):
            from brax import envs
            from brax.envs.wrappers import training
    except ImportError as error:
        raise ConfigError(f"{name} needs Brax ({error}); install it with: {INSTALL}") from error
    return envs, training


class BraxEnv:
    """``num_envs`` copies of one Brax environment, vmapped and sharded along ``data``; the same
    members as ``BatchedEnv`` (``spec``, ``num_envs``, ``time_limit``, ``reset``, ``step``).

    ``backend``: Brax's physics pipeline (``None``: the environment's default, ``generalized``
    for most); ``episode_length``: the time limit.
    """

    def __init__(
        self,
        name: str,
        num_envs: int,
        episode_length: int = EPISODE_LENGTH,
        backend: str | None = None,
    ):
        check_brax_name(name)
        envs, training = _import_brax(name)
        kwargs = {} if backend is None else {"backend": backend}
        with _quiet():
            base = envs.get_environment(name.removeprefix(BRAX_PREFIX), **kwargs)
            # Brax's observation_size runs a reset op by op (seconds); tracing one is enough.
            obs = jax.eval_shape(base.reset, jax.random.key(0)).obs
        obs_dim, action_dim = int(math.prod(obs.shape)), int(base.action_size)
        self.env = training.EpisodeWrapper(base, episode_length, action_repeat=1)
        bounds = dict(action_low=(-1.0,) * action_dim, action_high=(1.0,) * action_dim)
        self.spec = EnvSpec(name, obs_dim, 0, (obs_dim,), True, action_dim, **bounds)
        self.num_envs = num_envs

    @property
    def time_limit(self) -> int:
        """Steps after which an episode is truncated."""
        return int(self.env.episode_length)

    def _reset_states(self, key: jax.Array):
        """``key``: one key, or one per environment ``[B]``."""
        with _quiet():
            return jax.vmap(self.env.reset)(env_keys(key, self.num_envs))

    def step_keys(self, key: jax.Array, steps: int) -> jax.Array:
        """The keys of ``steps`` batched steps, ``[steps, B@batch]``."""
        return step_keys(key, steps, self.num_envs)

    def _obs(self, state) -> jax.Array:
        return state.obs.reshape(self.num_envs, -1).astype(jnp.float32)

    def reset(self, key: jax.Array) -> EnvBatch:
        state = self._reset_states(key)
        zeros_f = jnp.zeros(self.num_envs, jnp.float32)
        zeros_i = jnp.zeros(self.num_envs, jnp.int32)
        stats = EpisodeStats(zeros_f, zeros_i, zeros_f, zeros_i, zeros_i)
        return constrain_batch(EnvBatch(state, self._obs(state), stats))

    def step(self, key: jax.Array, batch: EnvBatch, action: jax.Array):
        """``key``: one key, or one per environment ``[B@batch]``; ``action``: ``[B@data, A]``
        float in ``[-1, 1]`` -> ``(EnvBatch, Transition)``."""
        action = action.reshape(self.num_envs, self.spec.action_dim).astype(jnp.float32)
        with _quiet():
            state = jax.vmap(self.env.step)(batch.state, action)
        reward = jnp.broadcast_to(state.reward, (self.num_envs,)).astype(jnp.float32)
        done = jnp.broadcast_to(state.done, (self.num_envs,)) > 0
        # EpisodeWrapper: truncation = 1 - done of the inner env at the time limit, so an
        # episode that terminates on its last step counts as terminated.
        truncated = jnp.logical_and(state.info["truncation"] > 0, done)
        terminated = jnp.logical_and(done, jnp.logical_not(truncated))
        final_obs = self._obs(state)
        fresh = self._reset_states(key)

        def select(new, old):
            mask = done.reshape(done.shape + (1,) * (old.ndim - 1))
            return jnp.where(mask, new, old).astype(new.dtype)  # the reset state's types

        state = jax.tree.map(select, fresh, state)
        stats = batch.stats.after(reward, done)
        new_batch = constrain_batch(EnvBatch(state, self._obs(state), stats))
        return new_batch, Transition(batch.obs, reward, terminated, truncated, final_obs)
