"""Reward scaling (``normalize_rewards``): the discounted-return statistics match a numpy
reference, carry over between rollouts, are the same on a data-sharded mesh as on one device, and
PPO learns with them."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec

from rljax import PPO, PPOConfig
from rljax.algos import A2C, A2CConfig
from rljax.algos.normalize import CLIP, EPSILON, init_reward_scaling, scale_rewards
from rljax.parallel import make_mesh
from rljax.run.sharded import ShardedRun

TINY = PPOConfig(
    num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2, normalize_rewards=True
)


def numpy_scaling(rewards, dones, gamma, returns=None, history=()):
    """Stable-Baselines3's VecNormalize, step by step: G = gamma G + r, G = 0 after a done step;
    the variance is over every G so far (float64)."""
    g = np.zeros(rewards.shape[1]) if returns is None else returns.copy()
    seen = list(history)
    for r, d in zip(rewards, dones, strict=True):
        g = gamma * g + r
        seen.append(g.copy())
        g = np.where(d, 0.0, g)
    return g, np.array(seen)


def test_scaled_rewards_match_a_numpy_reference_and_carry_over_rollouts():
    rng = np.random.default_rng(0)
    rewards = rng.normal(2.0, 3.0, size=(2, 12, 5)).astype(np.float32)
    dones = rng.random((2, 12, 5)) < 0.15
    scaling, scale = init_reward_scaling(5), jax.jit(scale_rewards, static_argnums=4)
    g, history = None, ()
    for rollout in range(2):  # two rollouts: the returns continue across the boundary
        scaling, scaled = scale(scaling, rewards[rollout], dones[rollout], 0.9, CLIP)
        g, history = numpy_scaling(rewards[rollout], dones[rollout], 0.9, g, history)
        std = np.sqrt(history.reshape(-1).var() + EPSILON)
        np.testing.assert_allclose(scaling.returns, g, rtol=1e-5, atol=1e-5)
        assert int(scaling.stats.count) == history.size
        np.testing.assert_allclose(scaling.stats.var[0], history.var(), rtol=1e-4)
        np.testing.assert_allclose(scaled, rewards[rollout] / std, rtol=1e-4, atol=1e-6)
    # Only the scale changes (signs kept); outliers are clipped.
    _, big = scale(init_reward_scaling(2), jnp.asarray([[0.0, 0.0], [1e4, -1e4]]),
                   jnp.zeros((2, 2), bool), 0.0, 1.0)  # fmt: skip
    np.testing.assert_array_equal(big[1], [1.0, -1.0])


def test_reward_scaling_lives_in_the_state_sharded_along_the_batch():
    ppo = PPO(TINY)
    specs = ppo.state_specs().reward_scaling
    assert specs.returns == PartitionSpec("batch") and specs.stats.var == PartitionSpec()
    unscaled = PPO(dataclasses.replace(TINY, normalize_rewards=False))
    assert unscaled.state_specs().reward_scaling is None


def test_data_sharded_equals_one_device(mesh4):
    """data=2,model=2 against the same 2 replicas emulated on one device: the statistics (merged
    over both data shards) and the parameters learnt from the scaled rewards."""
    config = dataclasses.replace(TINY, num_envs=8)
    runs = [
        ShardedRun(PPO(config, replicas=2), mesh, chunk_size=2)
        for mesh in (mesh4, make_mesh("data=1,model=1"))
    ]
    (sharded, _), (single, _) = [run.run_chunk(run.init(jax.random.key(3)), 2) for run in runs]
    assert len(sharded.reward_scaling.returns.sharding.device_set) == 4
    assert int(single.reward_scaling.stats.count) == 2 * config.batch_size
    chex.assert_trees_all_close(
        jax.device_get(sharded.reward_scaling), jax.device_get(single.reward_scaling), rtol=1e-5
    )
    chex.assert_trees_all_close(
        jax.device_get(sharded.params), jax.device_get(single.params), rtol=1e-4, atol=1e-5
    )


def test_a2c_scales_its_rewards_too():
    a2c = A2C(A2CConfig(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 3, normalize_rewards=True))
    state, metrics = jax.jit(lambda s: jax.lax.scan(lambda s, _: a2c.update(s), s, length=3))(
        a2c.init(jax.random.key(0))
    )
    assert np.isfinite(np.asarray(metrics["loss"])).all()
    assert int(state.reward_scaling.stats.count) == 3 * 4 * 8


def test_ppo_with_normalize_rewards_learns_cartpole():
    """30 updates of 1024 steps, four seeds: the last 5 updates' returns average >= 250
    (measured: 467, 393, 409, 274). CartPole's rewards are all 1, so the scaled reward shrinks as
    the discounted returns spread out; PPO still learns."""
    config = PPOConfig(num_envs=8, num_steps=128, total_timesteps=8 * 128 * 30, lr=2.5e-3)
    config = dataclasses.replace(config, normalize_rewards=True)
    run = ShardedRun(PPO(config), make_mesh("data=1,model=1"), chunk_size=config.num_updates)
    finals = []
    for seed in range(4):
        state, metrics = run.run_chunk(run.init(jax.random.key(seed)), config.num_updates)
        finals.append(float(np.mean(metrics["episode_return"][-5:])))
    assert np.mean(finals) >= 250, f"last-5-update returns per seed: {finals}"
