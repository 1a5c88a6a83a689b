"""``local_sgd``: replicas keep their own parameters and optimizer state and step on their own
gradients; every K-th optimizer step is synchronous: the gradient is averaged and applied by every
replica, then parameters (with ``average_opt_state``, moments too) are averaged. Bytes: ``2A / K``
(``(2A + O) / K`` with moments). K=1 is exactly ``allreduce``: replicas never diverge.

The synchronous step also averages the gradient because Adam and global-norm clipping are
nonlinear: averaging parameters after K=1 purely local steps would not be synchronous training."""

import jax
import jax.numpy as jnp

from rljax.parallel.replicas import per_replica, pmean_tree
from rljax.parallel.rules import to_mesh_specs
from rljax.parallel.sync.base import Strategy, positive, register, tree_norm


def average(learner, params, opt_state, with_opt_state: bool = False):
    """Per-replica ``params``/``opt_state`` ``[R@replica, ...]`` -> every replica holds their
    mean (floating optimizer leaves too when ``with_opt_state``)."""

    def fn(params, opt_state):
        if not with_opt_state:
            return pmean_tree(params), opt_state
        floating = lambda x: jnp.issubdtype(x.dtype, jnp.floating)  # noqa: E731
        moments = jax.tree.map(lambda x: x if floating(x) else None, opt_state)
        params, moments = pmean_tree((params, moments))  # one collective for both
        opt_state = jax.tree.map(
            lambda m, x: m if floating(x) else x, moments, opt_state, is_leaf=lambda m: m is None
        )
        return params, opt_state

    specs = (learner.led(learner.param_specs), learner.led(to_mesh_specs(learner.opt_logical)))
    return per_replica(fn, learner.replicas, specs, specs)(params, opt_state)


def local_copy(learner, params):
    """Per-replica ``params`` equal on every replica (right after ``average``) as one replicated
    copy: each device keeps its own. (Slicing replica 0 out of ``[R@data]`` would make the
    partitioner broadcast it from one shard.)"""
    specs = learner.param_specs
    return per_replica(lambda p: p, learner.replicas, (learner.led(specs),), specs)(params)


@register
class LocalSGD(Strategy):
    name = "local_sgd"
    per_replica = True

    @classmethod
    def validate(cls, config):
        positive(config, "period")

    def is_sync(self, learner, params, state, metrics) -> jax.Array:
        """Whether this step synchronises (``state["steps"]`` already counts it)."""
        return state["steps"] % self.config.period == 0

    def averages(self) -> bool:
        """Whether a synchronous step must average parameters (replicas may have diverged)."""
        return self.config.period > 1

    def after(self, learner, params, state, is_sync) -> dict:
        return state

    def step(self, learner, params, opt_state, state, grads, apply):
        metrics = {}
        is_sync = self.is_sync(learner, params, state, metrics)
        local_apply = learner.vmap(apply, in_axes=(0, 0, 0))
        shared_apply = learner.vmap(apply, in_axes=(None, 0, 0))
        average_opt = self.config.average_opt_state

        def synchronous(params, opt_state, grads):
            grad = learner.mean(grads)
            params, opt_state = shared_apply(grad, opt_state, params)
            if self.averages():
                params, opt_state = average(learner, params, opt_state, average_opt)
            return params, opt_state, tree_norm(grad)

        def local(params, opt_state, grads):
            params, opt_state = local_apply(grads, opt_state, params)
            return params, opt_state, jnp.mean(jax.vmap(tree_norm)(grads))

        params, opt_state, metrics["grad_norm"] = jax.lax.cond(
            is_sync, synchronous, local, params, opt_state, grads
        )
        state = self.after(learner, params, state, is_sync)
        return params, opt_state, state, is_sync.astype(jnp.int32), metrics
