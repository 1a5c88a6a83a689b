"""Temporal-difference targets shared by value-based algorithms: n-step returns cut at episode
ends, (Double) Q bootstrap values and the TD loss."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def nstep_return(rewards, terminated, truncated, gamma: float):
    """n-step return of windows ``[N, n]`` cut at the first episode end.

    Returns ``(partial_return [N], bootstrap_discount [N], end [N])``: the target is
    ``partial_return + bootstrap_discount * V(final_obs[:, end])``. With ``m = end`` the first
    terminated or truncated step (``n - 1`` if none), ``partial_return = sum_{k<=m} gamma^k r_k``
    and ``bootstrap_discount = gamma^(m+1)``, or 0 when step ``m`` terminated.
    """
    n = rewards.shape[-1]
    ended = jnp.logical_or(terminated, truncated)
    # Steps after the first end belong to the next episode.
    before_end = jnp.cumsum(ended, axis=-1) - ended  # ends strictly before k
    inside = before_end == 0
    discounts = gamma ** jnp.arange(n, dtype=jnp.float32)
    partial = jnp.sum(jnp.where(inside, rewards * discounts, 0.0), axis=-1)
    end = jnp.minimum(jnp.sum(inside, axis=-1) - 1, n - 1)
    terminal = jnp.take_along_axis(terminated, end[:, None], axis=-1)[:, 0]
    bootstrap = jnp.where(terminal, 0.0, gamma ** (end + 1).astype(jnp.float32))
    return partial, bootstrap, end


def bootstrap_value(target_q: jax.Array, online_q: jax.Array | None = None) -> jax.Array:
    """``[N, A]`` -> ``[N]``: ``max_a Q_target``, or with ``online_q`` (Double DQN)
    ``Q_target(argmax_a Q_online)``."""
    chooser = target_q if online_q is None else online_q
    action = jnp.argmax(chooser, axis=-1)
    return jnp.take_along_axis(target_q, action[:, None], axis=-1)[:, 0]


def td_loss(error: jax.Array, kind: str) -> jax.Array:
    if kind == "huber":
        return optax.huber_loss(error, delta=1.0)
    return jnp.square(error)
