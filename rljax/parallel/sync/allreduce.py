"""``allreduce``: the replicas' gradients averaged (one ``pmean``), one copy of the parameters.
Bytes per device per step: ``A = 2 (R-1)/R * parameter bytes``."""

import jax.numpy as jnp

from rljax.parallel.sync.base import Strategy, register, tree_norm


@register
class AllReduce(Strategy):
    name = "allreduce"

    def step(self, learner, params, opt_state, state, grads, apply):
        grad = learner.mean(grads)
        params, opt_state = apply(grad, opt_state, params)
        return params, opt_state, state, jnp.ones((), jnp.int32), {"grad_norm": tree_norm(grad)}
