"""GAE against a plain numpy loop, with terminations and truncations inside the window; the
next-state values it bootstraps from against the critic on every final observation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.algos.ppo import PPO, PPOConfig, gae


def numpy_gae(rewards, values, next_values, terminated, truncated, gamma, lam):
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t, b] else next_values[t, b]
            delta = rewards[t, b] + gamma * bootstrap - values[t, b]
            if terminated[t, b] or truncated[t, b]:
                running = delta
            else:
                running = delta + gamma * lam * running
            adv[t, b] = running
    return adv, adv + values


def test_gae_matches_numpy_with_terminations_and_truncations():
    rng = np.random.default_rng(0)
    T, B = 37, 3
    rewards = rng.normal(size=(T, B))
    values = rng.normal(size=(T, B))
    next_values = rng.normal(size=(T, B))
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    terminated[[3, 20], 0] = True
    truncated[[10, 30], 1] = True
    terminated[5, 2], truncated[6, 2] = True, True
    truncated[T - 1, 0] = True
    adv, ret = gae(
        *(jnp.asarray(x) for x in (rewards, values, next_values)),
        jnp.asarray(terminated),
        jnp.asarray(truncated),
        0.99,
        0.95,
    )
    ref_adv, ref_ret = numpy_gae(rewards, values, next_values, terminated, truncated, 0.99, 0.95)
    np.testing.assert_allclose(adv, ref_adv, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, ref_ret, rtol=1e-5, atol=1e-5)


def test_truncation_bootstraps_and_termination_does_not():
    one = jnp.ones((1, 1))
    zero = jnp.zeros((1, 1))
    false = jnp.zeros((1, 1), bool)
    true = jnp.ones((1, 1), bool)
    # r=1, V(s)=0, V(final)=10, gamma=0.5: truncation gives 1 + 0.5*10, termination gives 1.
    adv_trunc, _ = gae(one, zero, 10 * one, false, true, 0.5, 0.9)
    adv_term, _ = gae(one, zero, 10 * one, true, false, 0.5, 0.9)
    assert float(adv_trunc[0, 0]) == 6.0
    assert float(adv_term[0, 0]) == 1.0


@pytest.mark.parametrize("time_limit", [10, 5])  # >= T: one call on truncation steps; < T: all
def test_next_values_match_the_critic_on_every_final_observation(time_limit):
    ppo = PPO(PPOConfig(num_envs=8, num_steps=8))
    ppo.env.params = ppo.env.params.replace(max_steps_in_episode=time_limit)
    state = ppo.init(jax.random.key(0))
    rollout_fn = jax.jit(ppo.rollout)
    next_values_fn = jax.jit(ppo.next_values)
    every_final = jax.jit(jax.vmap(ppo.value, in_axes=(None, 0)))
    env, truncations = state.env, 0
    for i in range(4):
        env, rollout = rollout_fn(state.params, env, jax.random.key(i))
        tr = rollout.transition
        fast = next_values_fn(state.params, rollout, env.obs)
        reference = every_final(state.params, tr.final_obs)
        bootstrapped = ~np.asarray(tr.terminated)  # terminated steps are never bootstrapped
        np.testing.assert_allclose(
            np.asarray(fast)[bootstrapped], np.asarray(reference)[bootstrapped], rtol=1e-5
        )
        truncations += int(tr.truncated.sum())
    assert truncations > 0
