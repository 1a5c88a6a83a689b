"""Categorical policy over ``logits: [..., A]``, written with ``jax.nn``."""

import jax
import jax.numpy as jnp


def log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """``logits: [..., A]``, ``actions: [...]`` int -> ``[...]``."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_p, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(logits: jax.Array) -> jax.Array:
    """``[..., A]`` -> ``[...]``: ``-sum p log p``."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def sample(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One action per row: ``[..., A]`` -> ``[...]`` int32."""
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)
