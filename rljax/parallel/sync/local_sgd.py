"""``local_sgd``: replicas keep their own parameters and optimizer state and step on their own
gradients; every K-th optimizer step is synchronous: the gradient is averaged and applied by every
replica, then parameters (with ``average_opt_state``, moments too) are averaged. Bytes: ``2A / K``
(``(2A + O) / K`` with moments). K=1 is exactly ``allreduce``: replicas never diverge.

The synchronous step also averages the gradient because Adam and global-norm clipping are
nonlinear: averaging parameters after K=1 purely local steps would not be synchronous training."""

import jax
import jax.numpy as jnp

from rljax.parallel.sync.base import Strategy, positive, register, tree_norm


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
                params, opt_state = learner.average(params, opt_state, average_opt)
            return params, opt_state, tree_norm(grad)

        def local(params, opt_state, grads):
            params, opt_state = local_apply(grads, opt_state, params)
            return params, opt_state, jnp.mean(jax.vmap(tree_norm)(grads))

        params, opt_state, metrics["grad_norm"] = jax.lax.cond(
            is_sync, synchronous, local, params, opt_state, grads
        )
        state = self.after(learner, params, state, is_sync)
        return params, opt_state, state, is_sync.astype(jnp.int32), metrics
