"""``adaptive``: as ``local_sgd``, but a step is synchronous when the divergence
``max_r ||x_r - x_sync|| / ||x_sync||`` (each replica's relative L2 drift from the parameters of
the last synchronisation) exceeds ``threshold``, or after ``max_period`` steps. The distance of a
replica to the replicas' mean is at most twice this drift."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel.sync.base import positive, register, tree_norm
from rljax.parallel.sync.local_sgd import LocalSGD, local_copy


def divergence(params, anchor) -> jax.Array:
    """``max_r ||x_r - x_sync|| / ||x_sync||`` for per-replica ``params: [R@replica, ...]``."""
    drift = jax.vmap(lambda p: tree_norm(jax.tree.map(jnp.subtract, p, anchor)))(params)
    return jnp.max(drift) / jnp.maximum(tree_norm(anchor), 1e-12)


@register
class Adaptive(LocalSGD):
    name = "adaptive"

    @classmethod
    def validate(cls, config):
        positive(config, "max_period")
        if config.threshold < 0:
            raise ConfigError(f"sync threshold must be >= 0, got {config.threshold}")

    def init(self, learner, params):
        return {"anchor": params, "since_sync": jnp.zeros((), jnp.int32)}

    def specs(self, learner):
        return {"anchor": learner.param_logical, "since_sync": PartitionSpec()}

    def is_sync(self, learner, params, state, metrics):
        metrics["divergence"] = divergence(params, state["anchor"])
        c = self.config
        return (metrics["divergence"] > c.threshold) | (state["since_sync"] + 1 >= c.max_period)

    def averages(self) -> bool:
        return True

    def after(self, learner, params, state, is_sync):
        # Each device keeps its own copy of the just-averaged parameters: nothing moves.
        state["anchor"] = jax.lax.cond(
            is_sync, lambda: local_copy(learner, params), lambda: state["anchor"]
        )
        state["since_sync"] = jnp.where(is_sync, 0, state["since_sync"] + 1)
        return state
