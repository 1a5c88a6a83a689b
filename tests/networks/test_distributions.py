"""Policy distributions against numpy references: the categorical; the diagonal Gaussian's
log-prob and entropy, the tanh-squashed log-prob with its log-det correction, and the action the
environment gets."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.envs import EnvSpec
from rljax.networks import distributions


def test_log_prob_and_entropy_match_numpy():
    logits = np.array([[0.1, -1.0, 2.0], [3.0, 0.0, 0.0]], np.float32)
    actions = np.array([2, 1])
    p = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
    np.testing.assert_allclose(
        distributions.log_prob(jnp.asarray(logits), jnp.asarray(actions)),
        np.log(p[np.arange(2), actions]),
        rtol=1e-6,
    )
    np.testing.assert_allclose(
        distributions.entropy(jnp.asarray(logits)), -(p * np.log(p)).sum(-1), rtol=1e-6
    )


def test_sampling_frequencies_follow_probabilities():
    logits = jnp.log(jnp.array([0.2, 0.5, 0.3]))
    samples = distributions.sample(jax.random.key(0), jnp.broadcast_to(logits, (20000, 3)))
    freq = np.bincount(np.asarray(samples), minlength=3) / 20000
    np.testing.assert_allclose(freq, [0.2, 0.5, 0.3], atol=0.015)  # ~4.5 sigma at n=20000


RNG = np.random.default_rng(0)
MEAN = RNG.normal(size=(5, 3)).astype(np.float32)
LOG_STD = RNG.normal(scale=0.5, size=(5, 3)).astype(np.float32)
RAW = (MEAN + 2.5 * RNG.normal(size=(5, 3))).astype(np.float32)  # some far outside [-1, 2]
LOW, HIGH = (-1.0, -2.0, 0.0), (1.0, 2.0, 3.0)


def numpy_gaussian_log_prob(mean, log_std, x):
    mean, std, x = (np.asarray(a, np.float64) for a in (mean, np.exp(log_std), x))
    density = np.exp(-((x - mean) ** 2) / (2 * std**2)) / (std * np.sqrt(2 * np.pi))
    return np.log(density).sum(-1)


def numpy_squashed_log_prob(mean, log_std, u, low, high, eps=1e-4):
    """Change of variables ``y = low + (tanh(u) + 1) (high - low) / 2``, with ``dy/du`` taken by
    central differences (independent of the closed form under test)."""
    u = np.asarray(u, np.float64)
    low, high = np.asarray(low), np.asarray(high)

    def y(v):
        return low + (np.tanh(v) + 1) * (high - low) / 2

    dy_du = (y(u + eps) - y(u - eps)) / (2 * eps)
    return numpy_gaussian_log_prob(mean, log_std, u) - np.log(dy_du).sum(-1)


def continuous_spec(low=LOW, high=HIGH):
    return EnvSpec("Box", 4, 0, (4,), True, len(low), tuple(low), tuple(high))


def test_gaussian_log_prob_and_entropy_match_numpy():
    dist = distributions.for_spec(continuous_spec())
    assert isinstance(dist, distributions.DiagGaussian) and dist.action_shape == (3,)
    got = dist.log_prob((MEAN, LOG_STD), RAW)
    np.testing.assert_allclose(got, numpy_gaussian_log_prob(MEAN, LOG_STD, RAW), rtol=1e-5)
    expected_entropy = (np.asarray(LOG_STD, np.float64) + 0.5 * np.log(2 * np.pi * np.e)).sum(-1)
    np.testing.assert_allclose(dist.entropy((MEAN, LOG_STD)), expected_entropy, rtol=1e-5)


def test_tanh_log_prob_has_the_log_det_correction():
    dist = distributions.for_spec(continuous_spec(), squash="tanh")
    raw = np.clip(RAW, -4, 4)  # where central differences of tanh are still accurate
    got = dist.log_prob((MEAN, LOG_STD), raw)
    expected = numpy_squashed_log_prob(MEAN, LOG_STD, raw, LOW, HIGH)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4)
    # The closed form stays finite where tanh(u) rounds to 1 in float32.
    far = dist.log_prob((MEAN, LOG_STD), jnp.full_like(MEAN, 30.0))
    assert np.isfinite(np.asarray(far)).all()


@pytest.mark.parametrize("squash", ["none", "tanh"])
def test_env_actions_are_within_bounds(squash):
    dist = distributions.for_spec(continuous_spec(), squash=squash)
    sampled = dist.sample(jax.random.key(0), (jnp.zeros((4096, 3)), jnp.full((4096, 3), 1.5)))
    env_action = np.asarray(dist.env_action(sampled))
    assert (env_action >= np.asarray(LOW)).all() and (env_action <= np.asarray(HIGH)).all()
    raw = np.asarray(sampled)
    assert ((raw < np.asarray(LOW)) | (raw > np.asarray(HIGH))).any()  # the raw sample is not
    if squash == "none":
        np.testing.assert_array_equal(env_action, np.clip(raw, LOW, HIGH))
    else:
        expected = np.asarray(LOW) + (np.tanh(raw) + 1) * (np.subtract(HIGH, LOW)) / 2
        np.testing.assert_allclose(env_action, expected, rtol=1e-5, atol=1e-5)


def test_sample_statistics_follow_mean_and_std():
    dist = distributions.for_spec(continuous_spec())
    mean, log_std = jnp.array([[0.5, -1.0, 2.0]]), jnp.log(jnp.array([[0.1, 1.0, 3.0]]))
    shape = (20000, 3)
    x = np.asarray(dist.sample(jax.random.key(1), (mean * jnp.ones(shape), log_std + 0 * mean)))
    np.testing.assert_allclose(x.mean(0), [0.5, -1.0, 2.0], atol=0.05)
    np.testing.assert_allclose(x.std(0), [0.1, 1.0, 3.0], rtol=0.03)


def test_discrete_spec_keeps_the_categorical():
    dist = distributions.for_spec(EnvSpec("CartPole-v1", 4, 2, (4,)))
    logits = jnp.log(jnp.array([[0.25, 0.75]]))
    assert not dist.continuous and dist.action_shape == ()
    assert int(dist.mode(logits)[0]) == 1 and int(dist.env_action(jnp.array([1]))[0]) == 1
    np.testing.assert_allclose(dist.log_prob(logits, jnp.array([0])), [math.log(0.25)], rtol=1e-6)
