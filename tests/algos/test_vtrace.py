"""V-trace advantages (truncated importance weights in GAE) against a numpy loop; with all
ratios 1 they are GAE; PPO with off_policy='vtrace' on its own rollouts equals plain PPO."""

import chex
import jax
import jax.numpy as jnp
import numpy as np

from rljax.algos.actor_critic import gae, vtrace_advantages
from rljax.algos.ppo import PPO, PPOConfig


def numpy_vtrace(rewards, values, next_values, terminated, truncated, log_rho, gamma, lam):
    T, B = rewards.shape
    rho = np.minimum(1.0, np.exp(log_rho))
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            bootstrap = 0.0 if terminated[t, b] else next_values[t, b]
            delta = rho[t, b] * (rewards[t, b] + gamma * bootstrap - values[t, b])
            if terminated[t, b] or truncated[t, b]:
                running = delta
            else:
                running = delta + gamma * lam * rho[t, b] * running  # c = lambda min(1, ratio)
            adv[t, b] = running
    return adv, adv + values


def inputs(seed=0, T=23, B=3):
    rng = np.random.default_rng(seed)
    terminated, truncated = np.zeros((T, B), bool), np.zeros((T, B), bool)
    terminated[[4, 15], 0], truncated[[9, 20], 1] = True, True
    terminated[5, 2], truncated[T - 1, 2] = True, True
    r, v, nv = (rng.normal(size=(T, B)) for _ in range(3))
    return r, v, nv, terminated, truncated, rng.normal(scale=0.7, size=(T, B))


def test_vtrace_matches_numpy_with_episode_ends():
    r, v, nv, term, trunc, log_rho = inputs()
    got = vtrace_advantages(*map(jnp.asarray, (r, v, nv, term, trunc, log_rho)), 0.97, 0.9)
    want = numpy_vtrace(r, v, nv, term, trunc, log_rho, 0.97, 0.9)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-5, atol=1e-5)


def test_vtrace_on_policy_is_gae():
    r, v, nv, term, trunc, _ = inputs(1)
    args = tuple(map(jnp.asarray, (r, v, nv, term, trunc)))
    on_policy = vtrace_advantages(*args, jnp.zeros(r.shape), 0.99, 0.95)
    chex.assert_trees_all_close(on_policy, gae(*args, 0.99, 0.95), rtol=1e-6, atol=1e-6)


def test_ppo_with_vtrace_on_its_own_rollouts_equals_ppo():
    config = PPOConfig(num_envs=4, num_steps=8, total_timesteps=64, num_minibatches=2,
                       update_epochs=1, actor_widths=(8,), critic_widths=(8,))  # fmt: skip
    states = []
    for off_policy in ("none", "vtrace"):
        ppo = PPO(PPOConfig(**{**config.__dict__, "off_policy": off_policy}))
        state, metrics = jax.jit(ppo.update)(ppo.init(jax.random.key(0)))
        states.append(state.params)
    np.testing.assert_allclose(float(metrics["importance_weight"]), 1.0, atol=1e-5)
    chex.assert_trees_all_close(*states, rtol=1e-4, atol=1e-6)
