"""Batched gymnax environments: flattened observations, truncation vs termination, stats."""

import jax
import jax.numpy as jnp
import numpy as np

from rljax.envs import BatchedEnv


def test_truncation_keeps_final_observation_and_is_not_termination():
    env = BatchedEnv("CartPole-v1", 2)
    env.params = env.params.replace(max_steps_in_episode=5)
    batch = env.reset(jax.random.key(0))
    step = jax.jit(env.step)
    for t in range(5):
        previous = batch
        batch, tr = step(jax.random.key(t), batch, jnp.array([0, 1]))  # 5 steps never terminate
    assert tr.truncated.all() and not tr.terminated.any()
    assert not np.allclose(tr.final_obs, batch.obs)  # batch.obs is the reset observation
    np.testing.assert_array_equal(batch.stats.last_length, [5, 5])
    np.testing.assert_array_equal(batch.stats.last_return, [5.0, 5.0])
    np.testing.assert_array_equal(batch.stats.running_length, [0, 0])
    assert previous.obs.shape == (2, 4)


def test_termination_is_not_counted_as_truncation():
    env = BatchedEnv("CartPole-v1", 3)
    batch = env.reset(jax.random.key(0))
    step = jax.jit(env.step)
    terminated = False
    for t in range(60):  # always pushing left topples the pole well before 500 steps
        batch, tr = step(jax.random.key(t), batch, jnp.zeros(3, jnp.int32))
        terminated |= bool(tr.terminated.any())
        assert not tr.truncated.any()
    assert terminated and batch.stats.completed.sum() > 0


def test_minatar_observations_are_flattened():
    env = BatchedEnv("Breakout-MinAtar", 2)
    assert env.spec.obs_dim == 10 * 10 * 4 and env.spec.num_actions >= 3
    batch = env.reset(jax.random.key(0))
    assert batch.obs.shape == (2, 400) and batch.obs.dtype == jnp.float32
