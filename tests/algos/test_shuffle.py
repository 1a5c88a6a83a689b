"""Minibatch shuffling: ``shuffle.permutation`` draws every order of ``range(n)`` equally often."""

import itertools

import jax
import numpy as np
import pytest

from rljax.algos import shuffle


@pytest.mark.parametrize("n", [1, 2, 7, 512, 513, 5000, 32768])  # 513 to 32768: two sort rounds
def test_it_is_a_permutation(n):
    orders = jax.vmap(shuffle.permutation, in_axes=(0, None))(
        jax.random.split(jax.random.key(n), 3), n
    )
    assert orders.dtype == np.int32 and orders.shape == (3, n)
    for order in np.asarray(orders):
        np.testing.assert_array_equal(np.sort(order), np.arange(n))
    if n > 2:
        assert len({tuple(o) for o in np.asarray(orders)}) == 3


def test_rounds_grow_with_n_until_jax_random_permutation_takes_over():
    assert [shuffle.rounds_for(n) for n in (2, 512, 513, 32768, 2**20, 2**20 + 1)] == [
        1, 1, 2, 2, 4, None,
    ]  # fmt: skip
    assert shuffle.rounds_for(4, key_bits=4) == 4 and shuffle.rounds_for(4, key_bits=3) is None
    keys = jax.random.split(jax.random.key(2), 2)
    fallback = jax.vmap(lambda k: shuffle.permutation(k, 4, key_bits=3))(keys)
    np.testing.assert_array_equal(fallback, jax.vmap(lambda k: jax.random.permutation(k, 4))(keys))


# key_bits 4: two random bits per key for four rows, so ties are common and four rounds resolve
# them; key_bits 5: three rounds.
@pytest.mark.parametrize("key_bits", [32, 5, 4])
def test_all_orders_are_equally_likely(key_bits):
    draws = 24_000
    keys = jax.random.split(jax.random.key(0), draws)
    permutation = jax.vmap(lambda k: shuffle.permutation(k, 4, key_bits=key_bits))
    orders = np.asarray(jax.jit(permutation)(keys))
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([index[tuple(o)] for o in orders], minlength=24)
    expected = draws / 24
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 49.7, (chi2, counts)  # the 99.9 % quantile of chi-square with 23 dof


@pytest.mark.parametrize("n", [512, 4096])  # one round's largest n; two rounds
def test_each_position_is_uniform(n):
    draws = 4000
    orders = np.asarray(
        jax.jit(jax.vmap(lambda k: shuffle.permutation(k, n)))(
            jax.random.split(jax.random.key(1), draws)
        )
    )
    # Where row 0 lands, and which row lands first: both uniform over the n places.
    for sample in ((orders == 0).argmax(axis=1), orders[:, 0]):
        counts = np.bincount(sample // (n // 8), minlength=8)  # 8 bins
        chi2 = float(((counts - draws / 8) ** 2 / (draws / 8)).sum())
        assert chi2 < 24.3, counts  # the 99.9 % quantile with 7 dof


def row_0_first(orders):
    return ((orders == 0).argmax(axis=1) < (orders == 1).argmax(axis=1)).mean()


def test_ties_in_later_rounds_keep_a_random_order():
    # Narrow keys for 64 rows (4 random bits a round, 4 rounds): in every round nearly every row
    # ties with another. Row 0 must still come before row 1 in half of the draws.
    keys = jax.random.split(jax.random.key(3), 20_000)
    orders = np.asarray(jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 64, key_bits=10)))(keys))
    assert abs(row_0_first(orders) - 0.5) < 0.015  # 4.2 standard errors


def test_one_round_of_narrow_keys_ties_and_its_coin_is_fair(monkeypatch):
    monkeypatch.setattr(shuffle, "rounds_for", lambda n, key_bits=32: 1)
    keys = jax.random.split(jax.random.key(4), 20_000)
    # 64 rows, 4 random bits: rows 0 and 1 tie in 1/16 of the draws, where the first round's
    # coin (index ^ c) decides; by index it would be 0.53.
    orders = np.asarray(jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 64, key_bits=10)))(keys))
    assert abs(row_0_first(orders) - 0.5) < 0.015
    # 4 rows, 2 random bits: so many ties that one round cannot be uniform, which shows the keys
    # are narrowed (with 30 random bits one round would pass the test above).
    orders = np.asarray(jax.jit(jax.vmap(lambda k: shuffle.permutation(k, 4, key_bits=4)))(keys))
    index = {p: i for i, p in enumerate(itertools.permutations(range(4)))}
    counts = np.bincount([index[tuple(o)] for o in orders], minlength=24)
    expected = len(keys) / 24
    assert float(((counts - expected) ** 2 / expected).sum()) > 100.0, counts


def test_key_bits_outside_1_to_32_are_refused():
    with pytest.raises(ValueError, match="key_bits"):
        shuffle.permutation(jax.random.key(0), 4, key_bits=33)
