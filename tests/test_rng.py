"""rljax.rng: draws from one bits call match jax's samplers and numpy references."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.rng import index_from_bits, uniform_from_bits


def test_uniform_from_bits_is_jax_uniform():
    key = jax.random.key(3)
    np.testing.assert_array_equal(
        uniform_from_bits(jax.random.bits(key, (4096,))), jax.random.uniform(key, (4096,))
    )


def test_uniform_from_bits_range():
    edges = jnp.array([0, 511, 2**32 - 1], jnp.uint32)
    np.testing.assert_array_equal(uniform_from_bits(edges), [0.0, 0.0, 1.0 - 2.0**-23])


@pytest.mark.parametrize("n", [1, 2, 7, 1000, 2**31 - 1])
def test_index_from_bits_matches_numpy_modulo(n):
    bits = jax.random.bits(jax.random.key(n), (2048,))
    index = index_from_bits(bits, jnp.int32(n))
    assert index.dtype == jnp.int32
    np.testing.assert_array_equal(index, np.asarray(bits, np.uint64) % n)


def test_index_from_bits_is_uniform():
    counts = np.bincount(index_from_bits(jax.random.bits(jax.random.key(0), (70_000,)), 7))
    expected = 70_000 / 7
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 22.5  # 6 degrees of freedom, p = 0.001
