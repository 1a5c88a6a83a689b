"""Running observation normalisation (``normalize_obs``): exact statistics in batches and over
data shards, PPO's and DQN's statistics are those of the observations they saw, checkpoints carry
them, evaluation leaves them alone, and PPO still learns CartPole with them."""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from rljax import PPO, PPOConfig, RunConfig, train
from rljax.algos import A2C, DQN, A2CConfig, DQNConfig
from rljax.algos.normalize import CLIP, init_stats, normalize, update
from rljax.parallel import Layout, make_mesh
from rljax.parallel.sync import SyncConfig
from rljax.run.checkpoint import Checkpointer
from rljax.run.evaluation import Evaluator
from rljax.run.resume import abstract_state
from rljax.run.sharded import ShardedRun

TINY = PPOConfig(
    num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2, normalize_obs=True
)
# Per-replica parameters (local SGD): the replicas act on the same, shared statistics. Reward
# scaling too: its checkpoint and resume are tested with the observation statistics'.
LOCAL = dataclasses.replace(TINY, sync=SyncConfig("local_sgd", period=2), normalize_rewards=True)


def batches(seed=0, sizes=(5, 1, 64)):
    """Observation batches with a large, feature-specific offset and scale."""
    rng = np.random.default_rng(seed)
    return [
        (rng.normal(size=(n, 3)) * [1.0, 30.0, 0.01] + [100.0, -5.0, 0.3]).astype(np.float32)
        for n in sizes
    ]


def test_update_in_batches_equals_numpy_over_all_the_data():
    data = batches()
    stats = init_stats(3)
    for batch in data:
        stats = jax.jit(update)(stats, jnp.asarray(batch))
    everything = np.concatenate(data).astype(np.float64)
    assert int(stats.count) == len(everything)
    np.testing.assert_allclose(stats.mean, everything.mean(0), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(stats.var, everything.var(0), rtol=1e-4)
    # Leading axes are all samples: a [T, B, D] rollout is T*B observations.
    stacked = update(init_stats(3), jnp.asarray(data[2]).reshape(4, 16, 3))
    chex.assert_trees_all_close(stacked, update(init_stats(3), jnp.asarray(data[2])), rtol=1e-6)


def test_normalize_standardises_clips_and_is_identity_before_any_data():
    data = batches(sizes=(256,))[0]
    stats = update(init_stats(3), jnp.asarray(data))
    x = np.asarray(normalize(stats, jnp.asarray(data)))
    assert x.dtype == np.float32
    np.testing.assert_allclose(x.mean(0), 0.0, atol=1e-4)
    np.testing.assert_allclose(x.std(0), 1.0, rtol=1e-3)
    far = normalize(stats, jnp.asarray([[1e6, -1e6, 0.3]]))
    np.testing.assert_array_equal(far[0, :2], [CLIP, -CLIP])
    np.testing.assert_allclose(normalize(init_stats(2), jnp.asarray([[0.5, -3.0]])), [[0.5, -3.0]])
    constant = update(init_stats(1), jnp.full((8, 1), 7.0))  # variance 0: EPSILON, no NaN
    assert float(normalize(constant, jnp.full((1, 1), 7.0))[0, 0]) == 0.0


def test_statistics_of_a_data_sharded_batch_equal_the_whole_batch_on_one_device():
    data = np.concatenate(batches(seed=1, sizes=(48,)))
    stats = update(init_stats(3), jnp.asarray(data[:8]))  # a non-trivial running part
    reference = jax.jit(update)(stats, jnp.asarray(data))
    layout = Layout(make_mesh("data=4"))
    sharded = jax.device_put(data, layout.sharding(PartitionSpec("batch")))
    assert len(sharded.sharding.device_set) == 4
    with layout.active():
        merged = jax.jit(update, out_shardings=layout.replicated())(stats, sharded)
    chex.assert_trees_all_close(merged, reference, rtol=1e-6, atol=1e-6)


# -- PPO ------------------------------------------------------------------------------------------
def test_ppo_statistics_are_those_of_every_observation_it_acted_on():
    ppo = PPO(TINY)
    assert ppo.state_specs().obs_stats.mean == PartitionSpec()  # replicated

    def one_update(state, _):
        # The rollout update() makes: same params, env, key split and frozen statistics.
        _, rollout_key, _ = jax.random.split(state.key, 3)
        _, rollout = ppo.rollout(state.params, state.env, rollout_key, state.obs_stats)
        return ppo.update(state)[0], rollout.transition.obs

    state, seen = jax.jit(lambda s: jax.lax.scan(one_update, s, length=3))(
        ppo.init(jax.random.key(0))
    )
    seen = np.asarray(seen, np.float64).reshape(-1, seen.shape[-1])
    assert int(state.obs_stats.count) == 3 * TINY.batch_size == len(seen)
    np.testing.assert_allclose(state.obs_stats.mean, seen.mean(0), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(state.obs_stats.var, seen.var(0), rtol=1e-3, atol=1e-7)


def test_ppo_without_normalize_obs_keeps_the_state_as_it_was():
    ppo = PPO(dataclasses.replace(TINY, normalize_obs=False))
    assert ppo.state_specs().obs_stats is None  # no leaves: checkpoints are what they were


def test_evaluation_needs_the_statistics_and_acts_on_normalised_observations():
    ppo = PPO(TINY)
    state = ppo.init(jax.random.key(0))
    with pytest.raises(ValueError, match="normalize_obs=True .* pass the state's obs_stats"):
        jax.jit(Evaluator(ppo, num_envs=2))(state.params, jax.random.key(1))
    obs = jnp.asarray(np.random.default_rng(2).normal(size=(32, 4)) * 3.0 + 1.0, jnp.float32)
    stats = update(state.obs_stats, obs)
    act = jax.jit(ppo.eval_action, static_argnums=3)
    action = act(state.params, obs, jax.random.key(1), True, stats)
    logits, _ = jax.jit(ppo.network.apply)(state.params, normalize(stats, obs))
    np.testing.assert_array_equal(action, jnp.argmax(logits, axis=-1))


@pytest.fixture(scope="module")
def normalized_run(tmp_path_factory):
    """4 PPO updates (local SGD) with normalize_obs on data=2, evaluated and checkpointed
    every 2."""
    runs = tmp_path_factory.mktemp("norm")
    options = dict(mesh="data=2", quiet=True, measure_comm=False, log_every=2)
    run = RunConfig.make(
        runs_dir=str(runs), run_name="n", checkpoint_every=2, checkpoint_min_seconds=0,
        eval_every=2, eval_episodes=2,
        **options,
    )  # fmt: skip
    return train(LOCAL, run), options


def test_evaluation_during_training_does_not_change_the_statistics(normalized_run):
    result, _ = normalized_run
    assert [r["eval_return"] > 0 for r in result.metrics if "eval_return" in r] == [True, True]
    # Only the training rollouts are merged, not the evaluation episodes' observations.
    assert int(result.state.obs_stats.count) == 4 * TINY.batch_size
    assert result.state.obs_stats.mean.shape == (4,)  # one copy, not one per replica


def test_statistics_are_checkpointed_and_restored_on_resume(normalized_run):
    result, options = normalized_run
    run_dir = result.run_dir
    sharded = ShardedRun(PPO(LOCAL, replicas=2), make_mesh("data=2"))
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        step, saved, _ = ckpt.restore_latest(abstract_state(sharded))
    assert step == 4
    for part in ("obs_stats", "reward_scaling"):
        chex.assert_trees_all_equal(
            jax.device_get(getattr(saved, part)), jax.device_get(getattr(result.state, part))
        )
    longer = dataclasses.replace(LOCAL, total_timesteps=LOCAL.total_timesteps + 2 * TINY.batch_size)
    resumed = train(longer, RunConfig.make(resume=str(run_dir), eval_every=0, **options))
    assert resumed.resumed_from == 4 and resumed.updates_done == 6
    assert int(resumed.state.obs_stats.count) == 6 * TINY.batch_size  # continued, not restarted
    assert int(resumed.state.reward_scaling.stats.count) == 6 * TINY.batch_size


def test_a2c_with_normalize_obs_counts_its_rollouts_and_stays_finite():
    a2c = A2C(A2CConfig(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 3, normalize_obs=True))
    state, metrics = jax.jit(lambda s: jax.lax.scan(lambda s, _: a2c.update(s), s, length=3))(
        a2c.init(jax.random.key(0))
    )
    assert np.isfinite(np.asarray(metrics["loss"])).all()
    assert int(state.obs_stats.count) == 3 * 4 * 8
    assert np.all(np.asarray(state.obs_stats.var) > 0) and np.isfinite(state.obs_stats.mean).all()


# -- DQN ------------------------------------------------------------------------------------------
def test_dqn_with_normalize_obs_learns_finite_from_raw_replay():
    config = DQNConfig(
        num_envs=4, total_timesteps=4 * 25 * 4, steps_per_update=25, buffer_size=400,
        batch_size=32, learning_starts=40, train_frequency=4, target_update_interval=40,
        normalize_obs=True,
    )  # fmt: skip
    dqn = DQN(config)
    update = jax.jit(dqn.update)
    state = dqn.init(jax.random.key(0))
    losses = []
    for _ in range(4):
        state, metrics = update(state)
        losses.append(float(metrics["loss"]))
    assert np.isfinite(losses).all() and losses[-1] > 0
    assert int(state.obs_stats.count) == int(state.env_steps) == 400
    # The buffer (not yet wrapped) holds the raw observations: the statistics are theirs.
    stored = np.asarray(state.buffer.data.obs, np.float64).reshape(-1, 4)
    np.testing.assert_allclose(state.obs_stats.mean, stored.mean(0), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state.obs_stats.var, stored.var(0), rtol=1e-3, atol=1e-6)


# -- learning -------------------------------------------------------------------------------------
def test_ppo_with_normalize_obs_learns_cartpole():
    """30 updates of 1024 steps (one compile, < 1 s a seed): the last 5 updates' returns, over
    four seeds, average >= 200 (measured: 430, 194, 352, 242; a random policy gets ~20)."""
    config = PPOConfig(num_envs=8, num_steps=128, total_timesteps=8 * 128 * 30, lr=2.5e-3)
    config = dataclasses.replace(config, normalize_obs=True)
    run = ShardedRun(PPO(config), make_mesh("data=1,model=1"), chunk_size=config.num_updates)
    finals = []
    for seed in range(4):
        state, metrics = run.run_chunk(run.init(jax.random.key(seed)), config.num_updates)
        finals.append(float(np.mean(metrics["episode_return"][-5:])))
        assert int(state.obs_stats.count) == config.num_updates * config.batch_size
    assert np.mean(finals) >= 200, f"last-5-update returns per seed: {finals}"
