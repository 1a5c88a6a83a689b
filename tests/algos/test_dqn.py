"""DQN: n-step targets and Double DQN against references, sharding, learning, bad input."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import DQN, ConfigError, DQNConfig, RunConfig
from rljax.algos.td import bootstrap_value, nstep_return
from rljax.parallel import make_mesh
from rljax.run.sharded import ShardedRun, prepare

# Learning starts after 2 updates; 6 updates in all.
TINY = DQNConfig(
    num_envs=4,
    steps_per_update=8,
    total_timesteps=4 * 8 * 6,
    buffer_size=64,
    batch_size=8,
    learning_starts=64,
    train_frequency=2,
    target_update_interval=16,
    q_widths=(16, 16),
)


def numpy_nstep(rewards, terminated, truncated, gamma):
    """Plain loops: the discounted rewards up to the first end, and the bootstrap factor."""
    n_rows, n = rewards.shape
    partial, discount, end = np.zeros(n_rows), np.zeros(n_rows), np.zeros(n_rows, int)
    for i in range(n_rows):
        total = 0.0
        for k in range(n):
            total += gamma**k * rewards[i, k]
            if terminated[i, k] or truncated[i, k] or k == n - 1:
                partial[i], end[i] = total, k
                discount[i] = 0.0 if terminated[i, k] else gamma ** (k + 1)
                break
    return partial, discount, end


def test_nstep_targets_match_numpy_with_ends_inside_the_window():
    rng = np.random.default_rng(0)
    rows, n = 64, 5
    rewards = rng.normal(size=(rows, n)).astype(np.float32)
    terminated = rng.random((rows, n)) < 0.15
    truncated = (rng.random((rows, n)) < 0.15) & ~terminated
    terminated[0], truncated[0] = False, False  # a full window: bootstrap gamma^n
    terminated[1, 2] = True  # termination inside: no bootstrap, later rewards dropped
    truncated[2, :] = False
    terminated[2, :] = False
    truncated[2, 1] = True  # truncation inside: bootstrap from final_obs at step 1
    partial, discount, end = nstep_return(
        jnp.asarray(rewards), jnp.asarray(terminated), jnp.asarray(truncated), 0.9
    )
    ref_partial, ref_discount, ref_end = numpy_nstep(rewards, terminated, truncated, 0.9)
    np.testing.assert_allclose(partial, ref_partial, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(discount, ref_discount, rtol=1e-6)
    np.testing.assert_array_equal(end, ref_end)
    assert float(discount[0]) == pytest.approx(0.9**5) and int(end[0]) == 4
    assert float(discount[2]) == pytest.approx(0.9**2) and int(end[2]) == 1
    assert terminated[:, : n - 1].any() and truncated.any()


def test_double_dqn_target_by_hand():
    target_q = jnp.array([[10.0, 20.0, 30.0], [5.0, 1.0, 0.0]])
    online_q = jnp.array([[1.0, 3.0, 2.0], [0.0, 0.0, 9.0]])
    # Vanilla: max of the target network. Double: the target's value of the online argmax.
    np.testing.assert_array_equal(bootstrap_value(target_q), [30.0, 5.0])
    np.testing.assert_array_equal(bootstrap_value(target_q, online_q), [20.0, 0.0])
    # One step, r = 1, gamma = 0.5, not terminated: 1 + 0.5 * 20.
    partial, discount, _ = nstep_return(
        jnp.ones((1, 1)), jnp.zeros((1, 1), bool), jnp.zeros((1, 1), bool), 0.5
    )
    assert float(partial[0] + discount[0] * bootstrap_value(target_q, online_q)[0]) == 11.0


def run_dqn(config, mesh_spec, updates, seed=0):
    mesh = make_mesh(mesh_spec)
    run = ShardedRun(DQN(config, replicas=mesh.shape["data"]), mesh, chunk_size=updates)
    state, metrics = run.run_chunk(run.init(jax.random.key(seed)), updates)
    return state, jax.device_get(metrics)


@pytest.fixture(scope="module")
def tiny_single():
    return run_dqn(TINY, "data=1,model=1", TINY.num_updates)


def test_tensor_parallel_dqn_equals_single_device(tiny_single):
    state, metrics = run_dqn(TINY, "data=1,model=2", TINY.num_updates)
    expected_state, expected_metrics = tiny_single
    assert metrics["optimizer_steps"].sum() > 0
    chex.assert_trees_all_close(
        jax.device_get(state.params), jax.device_get(expected_state.params), atol=1e-5, rtol=1e-5
    )
    chex.assert_trees_all_close(metrics, expected_metrics, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("prioritized", [False, True])
def test_buffer_and_parameters_are_sharded_on_the_mesh(prioritized):
    config = dataclasses.replace(
        TINY, prioritized=prioritized, n_step=3, double_dqn=True, dueling=True, loss="huber"
    )
    state, metrics = run_dqn(config, "data=2,model=2", config.num_updates)
    obs = state.buffer.data.obs
    assert obs.shape == (4, 16, 4) and tuple(obs.sharding.spec)[:1] == ("data",)
    assert {s.data.shape[0] for s in obs.addressable_shards} == {2}  # 2 env rows per data shard
    kernel = state.params["params"]["tower"]["dense_0"]["kernel"]
    assert tuple(kernel.sharding.spec) == (None, "model")
    assert int(state.buffer.count) == config.total_timesteps // config.num_envs
    assert metrics["optimizer_steps"][-1] > 0 and np.isfinite(metrics["loss"]).all()
    if prioritized:  # priorities were rewritten from TD errors
        assert not np.allclose(np.asarray(state.buffer.priority), 1.0)


def test_dqn_learns_cartpole():
    """The reference config (PureJaxRL's: 10 envs, 5e5 steps, ...), fixed seed: the mean return
    of the last 10 updates (5,000 env steps) is at least 400."""
    config = DQNConfig()
    _, metrics = run_dqn(config, "data=1,model=1", config.num_updates)
    final = metrics["episode_return"][-10:].mean()
    assert final >= 400, f"mean return over the last 10 updates: {final}"
    assert metrics["truncations"].sum() > 0  # reached the 500-step time limit


BAD_INPUT = [
    (dict(buffer_size=100), "data=1", "buffer_size=100 is smaller than batch_size=128"),
    (dict(batch_size=130, num_envs=8), "data=4", "batch_size=130 is not divisible by the 4"),
    (dict(learning_starts=600_000), "data=1", "learning_starts=600000 is not below total_time"),
    (dict(epsilon_start=1.5), "data=1", "epsilon_start must be in [0, 1], got 1.5"),
    (dict(epsilon_end=-0.1), "data=1", "epsilon_end must be in [0, 1], got -0.1"),
    (dict(buffer_size=10_005), "data=1", "buffer_size=10005 must be a positive multiple of"),
    (dict(train_frequency=3), "data=1", "train_frequency=3 must divide num_envs=10"),
]


@pytest.mark.parametrize("change, mesh, message", BAD_INPUT)
def test_bad_input_gives_one_clear_message(change, mesh, message):
    with pytest.raises(ConfigError) as info:
        prepare(dataclasses.replace(DQNConfig(), **change), RunConfig.make(mesh=mesh))
    assert message in str(info.value)
