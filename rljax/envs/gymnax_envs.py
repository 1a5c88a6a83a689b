"""Batched gymnax environments with flattened observations and episode statistics.

Arrays carry a leading environment axis ``B`` sharded along ``data`` (the ``batch`` rule).
gymnax >= 1.0 auto-resets inside ``step``; the observation it returns after an episode ends is
the first of the next episode, and ``final_observation`` is the last one of the old episode, which
a learner needs to bootstrap through a time-limit truncation.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from rljax.errors import ConfigError
from rljax.parallel.rules import constrain, constrain_batch

# Discrete-action gymnax environments (MNISTBandit-bsuite is left out: it downloads MNIST).
DISCRETE_ENVS = (
    "CartPole-v1",
    "Acrobot-v1",
    "MountainCar-v0",
    "Asterix-MinAtar",
    "Breakout-MinAtar",
    "Freeway-MinAtar",
    "Seaquest-MinAtar",
    "SpaceInvaders-MinAtar",
    "Catch-bsuite",
    "DeepSea-bsuite",
    "MemoryChain-bsuite",
    "UmbrellaChain-bsuite",
    "DiscountingChain-bsuite",
    "SimpleBandit-bsuite",
    "FourRooms-misc",
    "MetaMaze-misc",
    "BernoulliBandit-misc",
    "GaussianBandit-misc",
    "Pong-misc",
    "FrozenLake-misc",
    "CartPole-v1-po",  # rljax.envs.wrappers: CartPole with the velocities masked
)


# Continuous-action gymnax environments (Box action spaces; the policy is a diagonal Gaussian).
CONTINUOUS_ENVS = (
    "Pendulum-v1",
    "MountainCarContinuous-v0",
    "Reacher-misc",
    "Swimmer-misc",
)
ENVS = DISCRETE_ENVS + CONTINUOUS_ENVS

# Brax environments (the optional extra) are named ``brax/<name>``: see rljax/envs/brax_envs.py.
BRAX_PREFIX = "brax/"


# The environments whose observations are images, ``[H, W, C]`` (what ``network="cnn"`` needs):
# known before any environment is built, so configs are checked before JAX starts.
IMAGE_OBS_SHAPES = {
    "Asterix-MinAtar": (10, 10, 4),
    "Breakout-MinAtar": (10, 10, 4),
    "Freeway-MinAtar": (10, 10, 7),
    "Seaquest-MinAtar": (10, 10, 10),
    "SpaceInvaders-MinAtar": (10, 10, 6),
    "Pong-misc": (30, 40, 3),
}


def check_env_name(name: str) -> None:
    if name.startswith(BRAX_PREFIX):
        from rljax.envs.brax_envs import check_brax_name

        return check_brax_name(name)
    if name not in ENVS:
        raise ConfigError(
            f"unknown environment {name!r}; known gymnax environments: discrete actions: "
            + ", ".join(DISCRETE_ENVS)
            + "; continuous actions: "
            + ", ".join(CONTINUOUS_ENVS)
            + f"; Brax environments (pip install 'rljax[brax]'): {BRAX_PREFIX}<name>"
        )


def is_continuous(name: str) -> bool:
    """Whether environment ``name`` has a continuous (Box) action space; known before any
    environment is built, so configs are checked before JAX starts."""
    return name in CONTINUOUS_ENVS or name.startswith(BRAX_PREFIX)


def check_discrete(name: str, algorithm: str) -> None:
    """A ``ConfigError`` when ``algorithm`` (discrete actions only) is given a continuous
    environment."""
    if is_continuous(name):
        raise ConfigError(
            f"{algorithm} supports discrete action spaces only, and {name} has a continuous (Box) "
            f"action space; the continuous environments ({', '.join(CONTINUOUS_ENVS)}, "
            f"{BRAX_PREFIX}*) train with ppo or a2c (a Gaussian policy)"
        )


class EnvSpec(NamedTuple):
    name: str
    obs_dim: int  # flattened: observations are [B, obs_dim]
    num_actions: int  # discrete: the number of actions; continuous: 0
    obs_shape: tuple[int, ...] | None = None  # one observation before flattening (None: unknown)
    continuous: bool = False  # a Box action space: actions are float vectors [A]
    action_dim: int = 0  # continuous: A, the size of an action vector
    action_low: tuple[float, ...] = ()  # continuous: the Box's lower bounds, [A]
    action_high: tuple[float, ...] = ()  # continuous: the Box's upper bounds, [A]


def image_obs_shape(name: str, need: str = "network=cnn") -> tuple[int, int, int]:
    """``[H, W, C]`` of environment ``name``'s image observations; a ``ConfigError`` naming the
    image environments when it has none."""
    if name not in IMAGE_OBS_SHAPES:
        raise ConfigError(
            f"{need} needs image observations [H, W, C], and {name} does not have them; the "
            "image environments are " + ", ".join(IMAGE_OBS_SHAPES)
        )
    return IMAGE_OBS_SHAPES[name]


@struct.dataclass
class EpisodeStats:
    """Per-environment running and last-completed episode return/length, all ``[B@data]``."""

    running_return: jax.Array
    running_length: jax.Array
    last_return: jax.Array
    last_length: jax.Array
    completed: jax.Array  # episodes finished since the start of training

    def after(self, reward: jax.Array, done: jax.Array) -> EpisodeStats:
        """The statistics after one step with ``reward: [B]`` that ended the episodes ``done``."""
        ep_return = self.running_return + reward
        ep_length = self.running_length + 1
        return EpisodeStats(
            running_return=jnp.where(done, 0.0, ep_return),
            running_length=jnp.where(done, 0, ep_length),
            last_return=jnp.where(done, ep_return, self.last_return),
            last_length=jnp.where(done, ep_length, self.last_length),
            completed=self.completed + done.astype(jnp.int32),
        )


class Transition(NamedTuple):
    """One batched step. ``final_obs`` is ``obs_next`` unless the episode ended here."""

    obs: jax.Array  # [B@data, D] the observation acted on
    reward: jax.Array  # [B@data]
    terminated: jax.Array  # [B@data] bool, true end: no bootstrap
    truncated: jax.Array  # [B@data] bool, time limit without termination: bootstrap
    final_obs: jax.Array  # [B@data, D] last observation of the step (pre-reset)


@struct.dataclass
class EnvBatch:
    state: Any  # gymnax env state, leaves [B@data, ...]
    obs: jax.Array  # [B@data, D]
    stats: EpisodeStats


class BatchedEnv:
    """``num_envs`` copies of one gymnax environment, vmapped and sharded along ``data``."""

    def __init__(self, name: str, num_envs: int):
        check_env_name(name)
        # Imported here: importing gymnax starts the JAX backend, which must wait until the
        # number of emulated CPU devices is set.
        from gymnax.environments import spaces

        from rljax.envs.wrappers import make

        self.env, self.params = make(name)
        obs_shape = self.env.observation_space(self.params).shape
        obs_shape = tuple(int(n) for n in obs_shape)
        obs_dim = int(math.prod(obs_shape))
        space = self.env.action_space(self.params)
        if isinstance(space, spaces.Discrete):
            self.spec = EnvSpec(name, obs_dim, int(space.n), obs_shape)
        elif isinstance(space, spaces.Box):
            # Bounds may be scalars (Pendulum) or arrays (Reacher): broadcast to the shape.
            shape = tuple(int(n) for n in space.shape) or (1,)
            low, high = (
                np.broadcast_to(np.asarray(b, np.float32), shape).ravel()
                for b in (space.low, space.high)
            )
            bounds = dict(action_low=tuple(map(float, low)), action_high=tuple(map(float, high)))
            dim = int(math.prod(shape))
            self.spec = EnvSpec(name, obs_dim, 0, obs_shape, True, dim, **bounds)
            self._action_shape = tuple(int(n) for n in space.shape)
        else:
            raise ConfigError(
                f"{name} has a {type(space).__name__} action space; need Discrete or Box"
            )
        self.num_envs = num_envs
        self._resets_like_gymnax = resets_like_gymnax(self.env)

    @property
    def time_limit(self) -> int | None:
        """Steps after which an episode is truncated (``None`` when the env has no such field)."""
        limit = getattr(self.params, "max_steps_in_episode", None)
        return None if limit is None else int(limit)

    def _flat(self, obs):
        return obs.reshape(self.num_envs, -1).astype(jnp.float32)

    def reset(self, key: jax.Array) -> EnvBatch:
        keys = jax.random.split(key, self.num_envs)
        obs, state = jax.vmap(self.env.reset, in_axes=(0, None))(keys, self.params)
        zeros_f = jnp.zeros(self.num_envs, jnp.float32)
        zeros_i = jnp.zeros(self.num_envs, jnp.int32)
        stats = EpisodeStats(zeros_f, zeros_i, zeros_f, zeros_i, zeros_i)
        return constrain_batch(EnvBatch(state, self._flat(obs), stats))

    def step_keys(self, key: jax.Array, steps: int):
        """The randomness of ``steps`` batched steps, drawn at once (rows for ``step``): a
        ``StepDraws`` ``[steps, B@batch, ...]`` when the environment auto-resets as gymnax's
        ``Environment.step`` does, else keys ``[steps, B@batch]``.

        gymnax's ``step`` splits its key and computes a fresh reset at every step for every
        environment, ended or not; ``StepDraws`` holds those resets computed ahead, so a
        rollout makes its random draws in three calls instead of two per step (on CPU each is a
        rolled loop of its own)."""
        if not self._resets_like_gymnax:
            return step_keys(key, steps, self.num_envs)
        step_key, reset_key = jax.random.split(key)
        reset = jax.vmap(jax.vmap(self.env.reset_env, in_axes=(0, None)), in_axes=(0, None))
        obs, state = reset(step_keys(reset_key, steps, self.num_envs), self.params)
        obs = obs.reshape(steps, self.num_envs, -1).astype(jnp.float32)
        state = jax.tree.map(lambda x: constrain(x, None, "batch"), state)
        return StepDraws(step_keys(step_key, steps, self.num_envs), obs, state)

    def step(self, key, batch: EnvBatch, action: jax.Array):
        """``key``: one key, one per environment ``[B@batch]``, or a row of ``step_keys``;
        ``action``: ``[B@data]`` int (discrete) or ``[B@data, A]`` float within the bounds
        (continuous) -> ``(EnvBatch, Transition)``."""
        if self.spec.continuous:
            action = action.reshape(self.num_envs, *self._action_shape)
        if isinstance(key, StepDraws):
            return self._step_drawn(key, batch, action)
        keys = env_keys(key, self.num_envs)
        obs, state, reward, terminated, truncated, info = jax.vmap(
            self.env.step, in_axes=(0, 0, 0, None)
        )(keys, batch.state, action, self.params)
        return self._after_step(batch, obs, state, reward, terminated, truncated, info)

    def _step_drawn(self, draws: StepDraws, batch: EnvBatch, action: jax.Array):
        """gymnax's ``Environment.step`` (gymnax 1.0) with the reset drawn ahead."""
        obs_st, state_st, reward, terminated, info = jax.vmap(
            self.env.step_env, in_axes=(0, 0, 0, None)
        )(draws.keys, batch.state, action, self.params)
        truncated = jax.vmap(self.env.is_truncated, in_axes=(0, None))(state_st, self.params)
        done = jnp.logical_or(terminated, truncated)

        def select(reset, stepped):
            mask = done.reshape(done.shape + (1,) * (stepped.ndim - 1))
            return jnp.where(mask, reset, stepped).astype(stepped.dtype)

        state = jax.tree.map(select, draws.reset_state, state_st)
        obs = select(draws.reset_obs, self._flat(obs_st))
        info = {**info, "final_observation": obs_st}
        return self._after_step(batch, obs, state, reward, terminated, truncated, info)

    def _after_step(self, batch, obs, state, reward, terminated, truncated, info):
        reward = reward.astype(jnp.float32)
        terminated = terminated.astype(bool)
        truncated = jnp.logical_and(truncated.astype(bool), jnp.logical_not(terminated))
        done = jnp.logical_or(terminated, truncated)
        stats = batch.stats.after(reward, done)
        new_batch = constrain_batch(EnvBatch(state, self._flat(obs), stats))
        transition = Transition(
            batch.obs, reward, terminated, truncated, self._flat(info["final_observation"])
        )
        return new_batch, transition


class StepDraws(NamedTuple):
    """The randomness of batched steps drawn ahead, leaves ``[..., B@batch, ...]``: the keys of
    gymnax's ``step_env`` and the reset each step would switch an ended episode to."""

    keys: jax.Array  # [..., B@batch]
    reset_obs: jax.Array  # [..., B@batch, D] flattened
    reset_state: Any  # gymnax env state, leaves [..., B@batch, ...]


def resets_like_gymnax(env) -> bool:
    """``env`` steps with gymnax's own ``Environment.step`` (auto-reset from ``reset_env``),
    possibly under an ``ObservationWrapper``; environments that override ``step`` (bsuite's
    DeepSea) keep their own."""
    from gymnax.environments.environment import Environment

    from rljax.envs.wrappers import ObservationWrapper

    inner = env._env if isinstance(env, ObservationWrapper) else env
    return isinstance(inner, Environment) and type(inner).step is Environment.step


def step_keys(key: jax.Array, steps: int, num_envs: int) -> jax.Array:
    """``[steps, num_envs@batch]`` keys from one split: on CPU every split is a rolled loop of
    its own, so a rollout's keys drawn at once spare ``steps - 1`` of them."""
    return constrain(jax.random.split(key, (steps, num_envs)), None, "batch")


def env_keys(key: jax.Array, num_envs: int) -> jax.Array:
    """One key per environment: ``key`` split ``num_envs`` ways, or ``key`` itself when it
    already holds ``[num_envs]`` keys."""
    return key if key.shape == (num_envs,) else jax.random.split(key, num_envs)


def make_env(name: str, num_envs: int):
    """``num_envs`` copies of environment ``name``: a ``BraxEnv`` for ``brax/<name>`` (the
    optional extra), else a gymnax ``BatchedEnv``; both have the same members."""
    if name.startswith(BRAX_PREFIX):
        from rljax.envs.brax_envs import BraxEnv

        return BraxEnv(name, num_envs)
    return BatchedEnv(name, num_envs)
