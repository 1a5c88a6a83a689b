"""Learning runs in one jit for the tests: ``num_updates`` updates from ``algo.init``."""

import jax


def jitted_updates(algo, key, num_updates):
    """``algo.init(key)`` and ``num_updates`` updates in one ``jax.lax.scan`` and one jit, on one
    device -> ``(state, metrics [num_updates, ...])``; keys ``[S]``: ``S`` vmapped seeds, leaves
    ``[S, ...]``."""

    def run(key):
        return jax.lax.scan(lambda s, _: algo.update(s), algo.init(key), length=num_updates)

    return jax.jit(jax.vmap(run) if key.shape else run)(key)
