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
