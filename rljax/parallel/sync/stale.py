"""``stale``: gradients averaged but applied ``staleness`` optimizer steps late, like a parameter
server whose workers push gradients computed on old parameters. Bytes: ``A``; staleness 0 is
``allreduce``. Until the queue is full there is nothing to apply: the optimizer waits too."""

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel.rules import prepend_axis
from rljax.parallel.sync.base import Strategy, register, tree_norm


@register
class Stale(Strategy):
    name = "stale"

    @classmethod
    def validate(cls, config):
        if config.staleness < 0:
            raise ConfigError(f"sync staleness must be >= 0, got {config.staleness}")

    def init(self, learner, params):
        tau = self.config.staleness
        if tau == 0:
            return {}
        queue = jax.tree.map(lambda x: jnp.zeros((tau, *x.shape), x.dtype), params)
        return {"queue": queue, "queued": jnp.zeros((), jnp.int32)}

    def specs(self, learner):
        if self.config.staleness == 0:
            return {}
        return {"queue": prepend_axis(learner.param_logical, None), "queued": PartitionSpec()}

    def step(self, learner, params, opt_state, state, grads, apply):
        grad = learner.mean(grads)
        metrics = {"grad_norm": tree_norm(grad)}
        synced = jnp.ones((), jnp.int32)
        tau = self.config.staleness
        if tau == 0:
            params, opt_state = apply(grad, opt_state, params)
            return params, opt_state, state, synced, metrics
        queue = state["queue"]
        oldest = jax.tree.map(lambda q: q[0], queue)
        state["queue"] = jax.tree.map(
            lambda q, g: jnp.concatenate([q[1:], g[None]], axis=0), queue, grad
        )
        ready = state["queued"] >= tau
        state["queued"] = jnp.minimum(state["queued"] + 1, tau)
        params, opt_state = jax.lax.cond(
            ready, apply, lambda g, o, p: (p, o), oldest, opt_state, params
        )
        return params, opt_state, state, synced, metrics
