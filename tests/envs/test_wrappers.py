"""Environment wrappers: the partially observable CartPole keeps [x, theta] of CartPole-v1's
observation, in ``reset``, ``step`` and ``info["final_observation"]``, and keeps the truncation
rule (a truncated step's final observation is masked, and is not the reset observation)."""

import jax
import jax.numpy as jnp
import numpy as np

from rljax.envs import DISCRETE_ENVS, BatchedEnv
from rljax.envs.wrappers import WRAPPED_ENVS, make


def test_po_cartpole_is_cartpole_without_velocities():
    assert "CartPole-v1-po" in DISCRETE_ENVS and "CartPole-v1-po" in WRAPPED_ENVS
    full, masked = BatchedEnv("CartPole-v1", 3), BatchedEnv("CartPole-v1-po", 3)
    assert masked.spec.obs_dim == 2 and masked.spec.obs_shape == (2,)
    assert masked.spec.num_actions == full.spec.num_actions == 2
    assert masked.time_limit == full.time_limit == 500
    key = jax.random.key(0)
    a, b = full.reset(key), masked.reset(key)
    np.testing.assert_array_equal(b.obs, a.obs[:, [0, 2]])
    step_full, step_masked = jax.jit(full.step), jax.jit(masked.step)
    ended = False
    for t in range(40):  # pushing left topples the pole: terminations and resets happen
        action = jnp.zeros(3, jnp.int32)
        a, tr_a = step_full(jax.random.key(t), a, action)
        b, tr_b = step_masked(jax.random.key(t), b, action)
        np.testing.assert_array_equal(b.obs, a.obs[:, [0, 2]])
        np.testing.assert_array_equal(tr_b.final_obs, tr_a.final_obs[:, [0, 2]])
        np.testing.assert_array_equal(tr_b.terminated, tr_a.terminated)
        np.testing.assert_array_equal(tr_b.reward, tr_a.reward)
        ended |= bool(tr_b.terminated.any())
    assert ended


def test_po_cartpole_truncation_keeps_the_masked_final_observation():
    env = BatchedEnv("CartPole-v1-po", 2)
    env.params = env.params.replace(max_steps_in_episode=5)
    batch = env.reset(jax.random.key(0))
    step = jax.jit(env.step)
    for t in range(5):
        batch, tr = step(jax.random.key(t), batch, jnp.array([0, 1]))
    assert tr.truncated.all() and not tr.terminated.any()
    assert tr.final_obs.shape == (2, 2)
    assert not np.allclose(tr.final_obs, batch.obs)  # batch.obs is the next episode's first


def test_make_builds_gymnax_names_and_wrapped_names():
    env, params = make("CartPole-v1-po")
    assert env.observation_space(params).shape == (2,)
    assert env.action_space(params).n == 2
    env, params = make("CartPole-v1")
    assert env.observation_space(params).shape == (4,)
