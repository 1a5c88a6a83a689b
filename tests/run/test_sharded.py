"""ShardedRun's chunk program: the NaN/inf counts it returns for the loop's guard."""

import jax
import jax.numpy as jnp
import numpy as np

from rljax.run.integrity import describe_nonfinite, nonfinite_leaves


def test_chunk_counts_nonfinite_values_of_its_final_state(small_run):
    run, state, _ = small_run
    copy = jax.jit(lambda s: s, out_shardings=run.state_shardings)
    clean, _, counts = run.run_chunk_checked(copy(state), 1)
    assert not np.asarray(counts).any()
    assert len(counts) == len(run.floating_paths) > 0

    def poison(s):  # one NaN in the actor's first kernel: the update spreads it
        params = jax.tree.map(lambda x: x, s.params)
        leaf_path, leaf = jax.tree_util.tree_flatten_with_path(params)[0][0]
        bad = leaf.at[(0,) * leaf.ndim].set(jnp.nan)
        params = jax.tree_util.tree_map_with_path(lambda p, x: bad if p == leaf_path else x, params)
        return s.replace(params=params)

    poisoned = jax.jit(poison, out_shardings=run.state_shardings)(clean)
    after, _, counts = run.run_chunk_checked(poisoned, 1)
    described = describe_nonfinite(run.floating_paths, np.asarray(counts))
    assert described and sorted(described) == sorted(nonfinite_leaves(after))
    assert any("params" in entry for entry in described)


def test_seed_groups_train_each_seed_as_one_vmap_over_all_seeds_does():
    """8 seeds on data=2: groups of 2 (two per device, one after the other) against all 4 of a
    device's seeds at once: the same states and metrics, in the same seed order."""
    import chex

    from rljax import PPO, PPOConfig
    from rljax.parallel import Layout, make_mesh
    from rljax.parallel.rules import seeds_on
    from rljax.run.sharded import ShardedRun

    config = PPOConfig(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 2, num_minibatches=2)
    layout = Layout(make_mesh("data=2"), seeds_on("data"))
    outs = []
    for group in (4, 2):
        run = ShardedRun(PPO(config), layout, num_seeds=8, chunk_size=2, seed_group=group)
        assert run.seed_group == group
        state = run.init(jax.random.key(3))
        outs.append(jax.device_get(run.run_chunk(state, 2)))
    (whole_state, whole_metrics), (grouped_state, grouped_metrics) = outs
    assert whole_metrics["episode_return"].shape == (2, 8)
    chex.assert_trees_all_close(grouped_metrics, whole_metrics, rtol=1e-6, atol=1e-6)
    chex.assert_trees_all_close(
        jax.tree.map(np.asarray, grouped_state.params),
        jax.tree.map(np.asarray, whole_state.params),
        rtol=1e-6,
        atol=1e-6,
    )
    np.testing.assert_array_equal(
        jax.random.key_data(grouped_state.key), jax.random.key_data(whole_state.key)
    )


def test_the_automatic_seed_group_on_cpu():
    from rljax.parallel import make_mesh
    from rljax.run.sharded import seeds_at_a_time

    mesh = make_mesh("data=1")
    assert seeds_at_a_time(0, 1024, mesh) == 8  # groups of 8 keep a CPU core's cache
    assert seeds_at_a_time(0, 36, mesh) == 6
    assert seeds_at_a_time(0, 16, mesh) == 16  # few seeds: all at once
    assert seeds_at_a_time(0, 34, mesh) == 34  # no divisor in [4, 8]: all at once
    assert seeds_at_a_time(4, 1024, mesh) == 4  # asked for
