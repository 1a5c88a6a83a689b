"""The actor-learner layout: K = 0 equals single-mesh PPO (one device per role, and sharded);
staleness bounded by K and reached; parameters and rollouts resharded onto the target mesh."""

import chex
import jax
import numpy as np
import pytest
from jax.sharding import NamedSharding

from rljax import PPO, PPOConfig
from rljax.parallel import make_mesh
from rljax.parallel.actor_learner import reshard, split_layouts
from rljax.run.actor_learner import ActorLearnerRun
from rljax.run.sharded import ShardedRun

TINY = PPOConfig(
    num_envs=4, num_steps=8, total_timesteps=4 * 8 * 20, num_minibatches=2, update_epochs=2,
    actor_widths=(8, 8), critic_widths=(8, 8),
)  # fmt: skip
UPDATES = 3


def single_mesh_params(spec, replicas):
    run = ShardedRun(PPO(TINY, replicas=replicas), make_mesh(spec), chunk_size=UPDATES)
    state, metrics = run.run_chunk(run.init(jax.random.key(0)), UPDATES)
    return jax.device_get(state.params), jax.device_get(metrics)


def actor_learner(actor_spec, learner_spec, max_staleness, chunk=UPDATES):
    actor, learner = split_layouts(actor_spec, learner_spec)
    algo = PPO(TINY, replicas=learner.shards("replica"))
    return ActorLearnerRun(algo, actor, learner, max_staleness, chunk_size=chunk)


@pytest.mark.parametrize(
    "single, actor_spec, learner_spec, replicas",
    [("data=1", "data=1", "data=1", 1), ("data=2", "data=2", "data=2,model=2", 2)],
)
def test_synchronous_equals_single_mesh_ppo(single, actor_spec, learner_spec, replicas):
    expected, expected_metrics = single_mesh_params(single, replicas)
    run = actor_learner(actor_spec, learner_spec, 0)
    state, metrics, _ = run.run_chunk_checked(run.init(jax.random.key(0)), UPDATES)
    chex.assert_trees_all_close(jax.device_get(state.learner.params), expected, rtol=1e-5,
                                atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], rtol=1e-4, atol=1e-6)
    assert list(np.asarray(metrics["staleness"])) == [0] * UPDATES


@pytest.fixture(scope="module")
def stale_run():
    """K = 2 on actor data=2 (devices 0-1) and learner model=2 (2-3), 7 updates in 2 chunks."""
    run = actor_learner("data=2", "data=1,model=2", 2, chunk=4)
    state = run.init(jax.random.key(0))
    state, first, _ = run.run_chunk_checked(state, 4)
    state, second, counts = run.run_chunk_checked(state, 3)
    rows = {k: np.concatenate([np.asarray(first[k]), np.asarray(second[k])[:3]]) for k in first}
    return run, state, rows, np.asarray(counts)


def test_no_rollout_is_more_than_k_versions_old(stale_run):
    run, state, rows, counts = stale_run
    k, updates = run.max_staleness, np.arange(7)
    staleness = updates - rows["policy_version"]  # version = learner updates applied
    assert (staleness == rows["staleness"]).all()
    assert staleness.max() <= k and (staleness[k:] == k).all()  # K reached after warm-up
    np.testing.assert_array_equal(rows["policy_version"], np.maximum(updates - k, 0))
    assert rows["staleness_max"][0] == 2 and rows["staleness_mean"][4] == 2
    assert int(state.learner.update_step) == int(state.actor.update_step) == 7
    assert [int(v) for v in state.versions] == [5, 6]  # the next two rollouts' parameters
    assert not counts.any() and len(counts) == len(run.floating_paths)


def test_parameters_resharded_between_meshes_arrive_with_target_shardings(stale_run):
    run, state, _, _ = stale_run
    actor_mesh, learner_mesh = run.actor_layout.mesh, run.layout.mesh
    assert not set(actor_mesh.devices.flat) & set(learner_mesh.devices.flat)
    leaves = jax.tree.leaves(state.learner.params)
    moved = reshard(state.learner.params, run.params_shardings)
    split = 0
    for before, after, target in zip(
        leaves, jax.tree.leaves(moved), jax.tree.leaves(run.params_shardings), strict=True
    ):
        assert isinstance(after.sharding, NamedSharding) and after.sharding == target
        assert after.sharding.mesh == actor_mesh and before.sharding.mesh == learner_mesh
        np.testing.assert_array_equal(np.asarray(after), np.asarray(before))
        split += "model" in str(before.sharding.spec)  # tensor parallel on the learner only
    assert split > 0
    for queued in state.queue:  # the queued versions live on the actor mesh, as resharded
        targets = jax.tree.leaves(run.params_shardings)
        for leaf, target in zip(jax.tree.leaves(queued), targets, strict=True):
            assert leaf.sharding == target
    obs = state.actor.env.obs  # environments stay with the actors, batch over their data axis
    assert obs.sharding.mesh == actor_mesh and "data" in str(obs.sharding.spec)
