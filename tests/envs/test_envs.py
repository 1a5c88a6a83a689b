"""Batched gymnax environments: flattened observations, truncation vs termination, stats."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.envs import BatchedEnv
from rljax.envs.gymnax_envs import StepDraws


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


def _drawn_row(env: BatchedEnv, keys: jax.Array):
    """The ``step_keys`` row gymnax's own ``step(keys)`` would use: its ``key_step`` and the reset
    from its ``key_reset``."""
    step_keys, reset_keys = jax.vmap(jax.random.split, out_axes=1)(keys)
    obs, state = jax.vmap(env.env.reset_env, in_axes=(0, None))(reset_keys, env.params)
    return StepDraws(step_keys, obs.reshape(env.num_envs, -1).astype(jnp.float32), state)


@pytest.mark.parametrize("name", ["CartPole-v1", "CartPole-v1-po", "Breakout-MinAtar"])
def test_resets_drawn_ahead_step_exactly_as_gymnax(name):
    """A step with the reset drawn ahead (``step_keys`` rows) equals gymnax's ``step`` with the
    same keys, through episode ends, truncations and wrappers (to float rounding: XLA fuses the
    two programs differently)."""
    env = BatchedEnv(name, 8)
    env.params = env.params.replace(max_steps_in_episode=12)
    batch = env.reset(jax.random.key(0))
    ours, theirs = jax.jit(env.step), jax.jit(env.step)
    key = jax.random.key(1)
    terminated = truncated = 0
    for _ in range(40):
        key, step_key, act_key = jax.random.split(key, 3)
        keys = jax.random.split(step_key, env.num_envs)
        action = jax.random.randint(act_key, (env.num_envs,), 0, env.spec.num_actions)
        mine, tr = ours(_drawn_row(env, keys), batch, action)
        ref, tr_ref = theirs(keys, batch, action)
        chex.assert_trees_all_close((mine, tr), (ref, tr_ref), rtol=1e-6, atol=1e-6)
        terminated += int(tr.terminated.sum())
        truncated += int(tr.truncated.sum())
        batch = ref
    assert truncated > 0 and (terminated > 0 or name == "Breakout-MinAtar")


def test_step_keys_draw_resets_only_for_gymnax_auto_reset():
    draws = BatchedEnv("CartPole-v1", 4).step_keys(jax.random.key(0), 8)
    assert isinstance(draws, StepDraws)
    assert draws.keys.shape == (8, 4) and draws.reset_obs.shape == (8, 4, 4)
    keys = BatchedEnv("DeepSea-bsuite", 4).step_keys(jax.random.key(0), 8)  # overrides step
    assert keys.shape == (8, 4)
