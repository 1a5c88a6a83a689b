import jax
import jax.numpy as jnp
import numpy as np

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
