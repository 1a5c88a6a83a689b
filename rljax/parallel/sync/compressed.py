"""``compressed``: int8 (two-stage quantised all-reduce, per-block scales, ``~A/4`` bytes) or
top-k sparse averaging (``8k (R-1)`` bytes), each with error feedback: what compression dropped
is added to the next step's gradient (``rljax.parallel.compression``)."""

import jax
import jax.numpy as jnp

from rljax.errors import ConfigError
from rljax.parallel.rules import prepend_axis
from rljax.parallel.sync.base import Strategy, positive, register, tree_norm

COMPRESSIONS = ("int8", "topk")


@register
class Compressed(Strategy):
    name = "compressed"

    @classmethod
    def validate(cls, config):
        if config.compression not in COMPRESSIONS:
            raise ConfigError(
                f"sync compression {config.compression!r} unknown; choose from {COMPRESSIONS}"
            )
        positive(config, "block_size")
        if not 0.0 < config.topk_fraction <= 1.0:
            raise ConfigError(f"sync topk_fraction must be in (0, 1], got {config.topk_fraction}")

    def init(self, learner, params):
        if not self.config.error_feedback:
            return {}
        return {"residual": learner.replicate(jax.tree.map(jnp.zeros_like, params))}

    def specs(self, learner):
        if not self.config.error_feedback:
            return {}
        return {"residual": prepend_axis(learner.param_logical, "replica")}

    def step(self, learner, params, opt_state, state, grads, apply):
        grad, residual = learner.compressed_mean(grads, state.get("residual"), self.config)
        metrics = {}
        if residual is not None:
            state["residual"] = residual
            metrics["residual_norm"] = tree_norm(residual) / jnp.sqrt(learner.replicas)
        metrics["grad_norm"] = tree_norm(grad)
        params, opt_state = apply(grad, opt_state, params)
        return params, opt_state, state, jnp.ones((), jnp.int32), metrics
