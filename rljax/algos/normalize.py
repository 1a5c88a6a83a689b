"""Running observation normalisation: one per-feature mean/variance that PPO, A2C and DQN keep in
their training state (``state.obs_stats``) when ``normalize_obs`` is set; and reward scaling
(``normalize_rewards``, PPO and A2C: ``state.reward_scaling``).

    stats = init_stats(obs_dim)              # mean 0, var 1, count 0
    stats = update(stats, obs)               # obs [..., D]: every leading axis is a sample
    x = normalize(stats, obs)                # (obs - mean) / sqrt(var + EPSILON), clipped to +-CLIP

``scale_rewards`` divides rewards by the running standard deviation of each environment's
discounted return (Stable-Baselines3's VecNormalize): the return accumulates ``G = gamma G + r``
and restarts after every episode end, terminated or truncated.

``update`` merges the batch's mean and (population) variance into the running ones with Chan et
al.'s parallel formula, so feeding the data in batches gives the mean and variance of all of it.
The batch statistics are plain reductions over the whole array: under ``jit`` an ``obs`` sharded
along the batch (data shards, processes) reduces globally (XLA adds the all-reduce), so every
shard and replica holds the same statistics. Callers reduce outside any per-replica ``vmap``.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import struct

EPSILON = 1e-8
"""added to the variance before the square root (as Stable-Baselines3's VecNormalize): a constant
feature maps to 0 instead of dividing by zero."""
CLIP = 10.0
"""normalised observations are clipped to [-CLIP, CLIP] (Stable-Baselines3's and Brax's 10): a
rare outlier, or a feature whose variance is still ~0, cannot blow up the network's inputs."""


class RunningStats(struct.PyTreeNode):
    """Per-feature statistics of every observation seen so far."""

    mean: jax.Array  # [D] float32
    var: jax.Array  # [D] float32, population variance (1 before any data)
    count: jax.Array  # int32 scalar: observations merged (bounded like the run's step counters)


def init_stats(dim: int) -> RunningStats:
    """No data yet: ``mean`` 0, ``var`` 1, ``count`` 0, so ``normalize`` is the identity (then
    clipped) until the first ``update``."""
    return RunningStats(
        jnp.zeros((dim,), jnp.float32), jnp.ones((dim,), jnp.float32), jnp.zeros((), jnp.int32)
    )


def update(stats: RunningStats, obs: jax.Array) -> RunningStats:
    """``stats`` merged with ``obs: [..., D]`` (all leading axes are samples; reduced globally
    when sharded). With ``count == 0`` the result is exactly the batch's mean and variance."""
    x = obs.astype(jnp.float32)
    samples = tuple(range(x.ndim - 1))  # reduce in place: no reshape of a sharded batch
    n = math.prod(x.shape[:-1])
    batch_mean = jnp.mean(x, axis=samples)
    batch_var = jnp.mean(jnp.square(x - batch_mean), axis=samples)  # two passes: no cancellation
    total = stats.count + n
    weight = n / total.astype(jnp.float32)  # the batch's share of the merged data
    delta = batch_mean - stats.mean
    mean = stats.mean + delta * weight
    # Chan et al.: M2 = M2_a + M2_b + delta^2 n_a n_b / n, divided by n.
    var = (
        (1.0 - weight) * stats.var
        + weight * batch_var
        + jnp.square(delta) * weight * (1.0 - weight)
    )
    return RunningStats(mean, var, total)


def normalize(stats: RunningStats, obs: jax.Array, clip: float = CLIP) -> jax.Array:
    """``obs: [..., D]`` -> ``(obs - mean) / sqrt(var + EPSILON)`` clipped to ``[-clip, clip]``,
    float32. Reads ``stats`` only (frozen)."""
    x = (obs.astype(jnp.float32) - stats.mean) * jax.lax.rsqrt(stats.var + EPSILON)
    return jnp.clip(x, -clip, clip)


class RewardScaling(struct.PyTreeNode):
    """The state of ``normalize_rewards``."""

    returns: jax.Array  # [B@batch] float32: each environment's discounted return so far
    stats: RunningStats  # [1]: statistics of every discounted return seen


def init_reward_scaling(num_envs: int) -> RewardScaling:
    return RewardScaling(jnp.zeros((num_envs,), jnp.float32), init_stats(1))


def scale_rewards(
    scaling: RewardScaling, reward: jax.Array, done: jax.Array, gamma, clip: float = CLIP
) -> tuple[RewardScaling, jax.Array]:
    """``reward, done: [T, B@batch]`` (done: terminated or truncated) -> ``(scaling with the
    rollout's discounted returns merged, reward / sqrt(var + EPSILON) clipped to +-clip)``.

    Step ``t``'s return is ``G_t = gamma G_{t-1} + r_t``, and ``G`` restarts at 0 after a done
    step. The whole rollout's returns are merged first and every reward is divided by the
    resulting standard deviation (not a new one per step: one division for the rollout). Only the
    scale changes: the rewards are not centred, so the sign of every reward is kept."""

    def accumulate(g, step):
        r, d = step
        g = gamma * g + r.astype(jnp.float32)
        return jnp.where(d, 0.0, g), g

    returns, history = jax.lax.scan(accumulate, scaling.returns, (reward, done))
    stats = update(scaling.stats, history[..., None])
    scaled = reward.astype(jnp.float32) * jax.lax.rsqrt(stats.var[0] + EPSILON)
    return RewardScaling(returns, stats), jnp.clip(scaled, -clip, clip)
