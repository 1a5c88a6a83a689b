"""Random permutations for minibatch shuffling, cheaper than ``jax.random.permutation`` on CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The one-sort path is taken while the expected number of tied keys is at most this (n <= 512).
MAX_EXPECTED_TIES = 1 / 32


def permutation(key: jax.Array, n: int) -> jax.Array:
    """A random permutation of ``range(n)``: int32 ``[n]``.

    Like ``jax.random.permutation``, it sorts random 32-bit keys, but as a single uint32 operand
    (``jax.random.permutation`` sorts keys and values together). XLA's CPU sort has a fast path
    for one integer operand: 27 us against 55 us for ``n = 512`` (8 vmapped seeds: 119 us against
    520 us). Each key carries
    ``index ^ c`` in its ``b = bit_length(n - 1)`` low bits (``c`` random), so the sort returns
    the indices, and two keys whose random high bits tie come out in an order that is a fair coin
    (the highest bit where their indices differ is flipped by ``c`` with probability 1/2), not by
    index. Only two or more ties at once (probability about ``ties**2 / 2``, below 2e-4 for
    ``n = 512``) share that coin. For larger ``n``, where ``32 - b`` random bits tie more often
    than ``MAX_EXPECTED_TIES``, it is ``jax.random.permutation``.
    """
    bits = max(1, (n - 1).bit_length())
    expected_ties = n * (n - 1) / 2 / 2 ** (32 - bits)
    if expected_ties > MAX_EXPECTED_TIES:
        return jax.random.permutation(key, n).astype(jnp.int32)
    sort_key, flip_key = jax.random.split(key)
    low = jnp.uint32(2**bits - 1)
    flip = jax.random.bits(flip_key, (), jnp.uint32) & low
    labels = jnp.arange(n, dtype=jnp.uint32) ^ flip
    packed = jax.lax.sort((jax.random.bits(sort_key, (n,), jnp.uint32) << bits) | labels)
    return ((packed & low) ^ flip).astype(jnp.int32)
