"""A2C: learns CartPole, sharded equals single-device, truncation bootstraps, bad input."""

import dataclasses

import chex
import jax
import numpy as np
import pytest

from rljax import A2C, A2CConfig, ConfigError, RunConfig
from rljax.algos import ALGORITHMS, algorithm_for
from rljax.run.sharded import ShardedRun, prepare
from tests.algos.updates import jitted_updates

TINY = A2CConfig(num_envs=8, num_steps=8, total_timesteps=8 * 8 * 4, actor_widths=(16, 16))


def test_a2c_learns_cartpole():
    config = A2CConfig()  # the defaults: 32 envs x 8 steps, 1024 updates
    assert config.num_updates * config.env_steps_per_update <= 262_144
    _, metrics = jitted_updates(A2C(config), jax.random.key(0), config.num_updates)
    final_return = float(metrics["episode_return"][-20:].mean())
    assert final_return >= 400, f"mean return over the last 20 updates: {final_return}"
    assert int(metrics["truncations"].sum()) > 0  # reached the 500-step time limit
    assert np.isfinite(np.asarray(metrics["loss"])).all()


@pytest.mark.parametrize("strategy", ["allreduce", "local_sgd"])
def test_sharded_equals_single_device(mesh4, strategy):
    config = dataclasses.replace(TINY, sync=dataclasses.replace(TINY.sync, strategy=strategy))
    run = ShardedRun(A2C(config, replicas=2), mesh4, num_seeds=1, chunk_size=2)
    state, metrics = run.run_chunk(run.init(jax.random.key(0)), 2)
    kernel = state.params["params"]["critic"]["dense_0"]["kernel"]
    assert len({s.device for s in kernel.addressable_shards}) == 4  # spread over the mesh
    expected_state, expected = jitted_updates(A2C(config, replicas=2), jax.random.key(0), 2)
    chex.assert_trees_all_close(state.params, expected_state.params, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(
        jax.tree.map(lambda m: m[:2], metrics), expected, atol=1e-4, rtol=1e-4
    )


def test_swept_learning_rate_equals_constant():
    _, constant = jitted_updates(A2C(TINY), jax.random.key(1), 3)
    _, swept = jitted_updates(A2C(TINY, swept=("lr",)), jax.random.key(1), 3)
    chex.assert_trees_all_close(swept, constant, atol=1e-5, rtol=1e-5)


def numpy_targets(rewards, values, next_obs_values, final_values, terminated, truncated, g, lam):
    """Per-step loops: bootstrap 0 after a termination, ``V(final_obs)`` after a truncation,
    ``V(next obs)`` otherwise; the GAE trace is cut at every episode end."""
    T, B = rewards.shape
    adv = np.zeros((T, B))
    for b in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if terminated[t, b]:
                bootstrap = 0.0
            elif truncated[t, b]:
                bootstrap = final_values[t, b]
            else:
                bootstrap = next_obs_values[t, b]
            delta = rewards[t, b] + g * bootstrap - values[t, b]
            ended = terminated[t, b] or truncated[t, b]
            running = delta + (0.0 if ended else g * lam * running)
            adv[t, b] = running
    return adv, adv + values


def test_truncation_bootstraps_from_the_final_observation():
    config = dataclasses.replace(TINY, num_steps=16, gamma=0.9, gae_lambda=0.8)
    a2c = A2C(config)
    a2c.env.params = a2c.env.params.replace(max_steps_in_episode=12)  # truncations inside T
    state = jax.jit(a2c.init)(jax.random.key(0))
    rollout_fn, advantages_fn = jax.jit(a2c.rollout), jax.jit(a2c.advantages)
    value_fn = jax.jit(jax.vmap(a2c.value, in_axes=(None, 0)))
    env, seen = state.env, {"terminated": 0, "truncated": 0}
    for i in range(3):
        env, rollout = rollout_fn(state.params, env, jax.random.key(i))
        tr = jax.device_get(rollout.transition)
        advantages, returns = advantages_fn(state.params, rollout, {})
        # V of the observation acted on next (obs[t+1]; after an end that is the reset one).
        next_obs = np.concatenate([tr.obs[1:], np.asarray(env.obs)[None]])
        next_obs_values = np.asarray(value_fn(state.params, next_obs))
        final_values = np.asarray(value_fn(state.params, tr.final_obs))
        ref_adv, ref_ret = numpy_targets(
            tr.reward, np.asarray(rollout.value), next_obs_values, final_values,
            tr.terminated, tr.truncated, config.gamma, config.gae_lambda,
        )  # fmt: skip
        np.testing.assert_allclose(advantages, ref_adv, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(returns, ref_ret, rtol=1e-5, atol=1e-5)
        # The reset observation's value is not what a truncation bootstraps from.
        assert not np.allclose(final_values[tr.truncated], next_obs_values[tr.truncated])
        seen["terminated"] += int(tr.terminated.sum())
        seen["truncated"] += int(tr.truncated.sum())
    assert seen["terminated"] > 0 and seen["truncated"] > 0, seen


def test_registered_with_its_sweepable_fields():
    assert ALGORITHMS["a2c"] is A2C and algorithm_for(A2CConfig()) is A2C
    assert A2C.sweepable() == ("lr", "gamma", "gae_lambda", "ent_coef", "vf_coef")


@pytest.mark.parametrize(
    "change, mesh, message",
    [
        ({"num_envs": 6}, "data=4,model=1", "num_envs=6 is not divisible by the 4 data-parallel"),
        ({"gamma": 1.5}, "data=1,model=1", r"gamma must be in \[0, 1\], got 1.5"),
        ({"lr": 0.0}, "data=1,model=1", "lr .* must be > 0"),
        ({"total_timesteps": 100}, "data=1,model=1", "less than one update"),
        ({"critic_widths": (63, 64)}, "data=1,model=2", "critic/dense_0: width 63"),
        ({"env": "CartPole-v9"}, "data=1,model=1", "unknown environment 'CartPole-v9'"),
    ],
)
def test_bad_input_gives_one_clear_message(change, mesh, message):
    with pytest.raises(ConfigError, match=message):
        prepare(dataclasses.replace(A2CConfig(), **change), RunConfig.make(mesh=mesh))
