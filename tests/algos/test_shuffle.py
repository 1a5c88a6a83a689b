"""Minibatch shuffling: ``shuffle.permutation`` draws every order of ``range(n)`` equally often."""

import itertools

import jax
import numpy as np
import pytest

from rljax.algos import shuffle


@pytest.mark.parametrize("n", [1, 2, 7, 512, 513, 5000])  # 513 and 5000: jax.random.permutation
def test_it_is_a_permutation(n):
    orders = jax.vmap(shuffle.permutation, in_axes=(0, None))(
        jax.random.split(jax.random.key(n), 3), n
    )
    assert orders.dtype == np.int32 and orders.shape == (3, n)
    for order in np.asarray(orders):
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
    if n > 2:
        assert len({tuple(o) for o in np.asarray(orders)}) == 3


def test_all_orders_are_equally_likely():
    draws = 24_000
    keys = jax.random.split(jax.random.key(0), draws)
    orders = np.asarray(jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 4)))(keys))
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([index[tuple(o)] for o in orders], minlength=24)
    expected = draws / 24
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 49.7, (chi2, counts)  # the 99.9 % quantile of chi-square with 23 dof


def test_each_position_is_uniform_at_the_fast_paths_largest_size():
    n, draws = 512, 4000
    orders = np.asarray(
        jax.jit(jax.vmap(lambda k: shuffle.permutation(k, n)))(
            jax.random.split(jax.random.key(1), draws)
        )
    )
    # Where row 0 lands, and which row lands first: both uniform over 512 places.
    for sample in ((orders == 0).argmax(axis=1), orders[:, 0]):
        counts = np.bincount(sample // 64, minlength=8)  # 8 bins of 64 places
        chi2 = float(((counts - draws / 8) ** 2 / (draws / 8)).sum())
        assert chi2 < 24.3, counts  # the 99.9 % quantile with 7 dof
