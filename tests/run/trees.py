"""States as host arrays for exact comparison (resume, actor-learner, compile-option tests)."""

import jax

from rljax.run.integrity import is_prng_key


def host_state(tree):
    """``tree`` on the host, every typed PRNG key leaf as its uint32 ``key_data``."""
    key_data = lambda x: jax.random.key_data(x) if is_prng_key(x) else x  # noqa: E731
    return jax.device_get(jax.tree.map(key_data, tree))
