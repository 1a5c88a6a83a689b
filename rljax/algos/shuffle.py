"""Random permutations for minibatch shuffling, cheaper than ``jax.random.permutation`` on CPU."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# Sort rounds are added until the expected number of pairs tied in every round is at most this.
MAX_EXPECTED_TIES = 1 / 32
MAX_ROUNDS = 4  # beyond (n > 2**20 with 32-bit keys) it is jax.random.permutation


def label_bits(n: int) -> int:
    """The low bits of a sort key that carry a row label: ``bit_length(n - 1)``, at least 1."""
    return max(1, (n - 1).bit_length())


def rounds_for(n: int, key_bits: int = 32) -> int | None:
    """Sorts ``permutation`` makes for ``n`` rows, or None when it is ``jax.random.permutation``."""
    random_bits = key_bits - label_bits(n)
    if random_bits < 1:
        return None
    pairs = n * (n - 1) / 2
    rounds = max(1, math.ceil(math.log2(max(pairs, 1) / MAX_EXPECTED_TIES) / random_bits))
    return rounds if rounds <= MAX_ROUNDS else None


def permutation(key: jax.Array, n: int, key_bits: int = 32) -> jax.Array:
    """A random permutation of ``range(n)``: int32 ``[n]``.

    Like ``jax.random.permutation``, it sorts random keys, but as a single uint32 operand
    (``jax.random.permutation`` sorts keys and values together). XLA's CPU sort has a fast path
    for one integer operand: 27 us against 55 us for ``n = 512`` (8 vmapped seeds: 119 us against
    520 us), 3.3 ms against 17.5 ms for ``n = 32768`` (two rounds, below).

    Each key carries a row label in its ``b = bit_length(n - 1)`` low bits and ``key_bits - b``
    random bits above them, so the sort returns the labels. In the first round the label is
    ``index ^ c`` (``c`` random): two keys whose random bits tie come out in an order that is a
    fair coin (the highest bit where their indices differ is flipped by ``c`` with probability
    1/2), not by index. While that round leaves more than ``MAX_EXPECTED_TIES`` tied pairs
    expected, further rounds sort the current positions under fresh random bits; a tie there keeps
    the previous round's order, which is random unless the pair tied in every round before too
    (``jax.random.permutation``'s rounds work the same way). Only pairs tied in every round (at
    most ``MAX_EXPECTED_TIES`` expected) share a coin, and three rows tied in every round (far
    rarer) reach only 4 of their 6 orders. ``key_bits`` below 32 narrows the keys (more ties, more
    rounds: for tests).
    """
    if not 1 <= key_bits <= 32:
        raise ValueError(f"key_bits must be in [1, 32], got {key_bits}")
    rounds = rounds_for(n, key_bits)
    if rounds is None:
        return jax.random.permutation(key, n).astype(jnp.int32)
    bits = label_bits(n)
    low, keep = jnp.uint32(2**bits - 1), jnp.uint32(2**key_bits - 1)
    keys = jax.random.split(key, rounds + 1)
    flip = jax.random.bits(keys[1], (), jnp.uint32) & low

    def sorted_labels(sort_key, labels):
        random = (jax.random.bits(sort_key, (n,), jnp.uint32) << bits) & keep
        return jax.lax.sort(random | labels) & low

    positions = jnp.arange(n, dtype=jnp.uint32)
    order = sorted_labels(keys[0], positions ^ flip) ^ flip
    for sort_key in keys[2:]:
        order = order[sorted_labels(sort_key, positions)]
    return order.astype(jnp.int32)
