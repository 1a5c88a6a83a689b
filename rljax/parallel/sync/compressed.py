"""``compressed``: int8 (two-stage quantised all-reduce, per-block scales, ``~A/4`` bytes) or
top-k sparse averaging (``8k (R-1)`` bytes), each with error feedback: what compression dropped
is added to the next step's gradient (``rljax.parallel.compression``)."""

import jax
import jax.numpy as jnp
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel import compression
from rljax.parallel.replicas import per_replica
from rljax.parallel.rules import axes_of, prepend_axis
from rljax.parallel.sync.base import Strategy, positive, register, tree_norm

COMPRESSIONS = ("int8", "topk")


def compression_groups(learner):
    """``(treedef, groups)``: leaf indices compressed together, one group per set of mesh axes
    the leaves are split over, so a group's flat vector holds the same kind of slice on every
    device (a leaf replicated over `model` gets the same blocks and top-k choice everywhere)."""
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    leaves, treedef = jax.tree.flatten(learner.param_specs, is_leaf=is_spec)
    # fsdp never splits anything here (validate_layout), so it must not split groups either:
    # the groups are then the same with and without a mesh.
    group_of = [frozenset(a for e in spec for a in axes_of(e) if a != "fsdp") for spec in leaves]
    return treedef, [[i for i, g in enumerate(group_of) if g == k] for k in dict.fromkeys(group_of)]


def compressed_mean(learner, grads, residual, config):
    """``[R@replica, ...]`` gradients (+ residuals) -> (mean estimate ``[...]``, residuals).

    Without error feedback ``residual`` is ``None`` and so is the returned one."""
    replicas = learner.replicas

    def compress(flat):
        if config.compression == "int8":
            return compression.int8_mean(flat, replicas, config.block_size)
        return compression.topk_mean(flat, replicas, config.topk_fraction)

    treedef, groups = compression_groups(learner)

    def grouped(grad, residual):
        grad_leaves = treedef.flatten_up_to(grad)
        res_leaves = treedef.flatten_up_to(residual) if residual is not None else None
        estimate, new_residual = [None] * len(grad_leaves), [None] * len(grad_leaves)
        for group in groups:
            flat, unravel = ravel_pytree([grad_leaves[i] for i in group])
            if res_leaves is not None:
                flat = flat + ravel_pytree([res_leaves[i] for i in group])[0]
            group_estimate, group_residual = compress(flat)
            pieces = zip(group, unravel(group_estimate), unravel(group_residual), strict=True)
            for i, e, r in pieces:
                estimate[i], new_residual[i] = e, r
        estimate = treedef.unflatten(estimate)
        if residual is None:
            return estimate
        return estimate, treedef.unflatten(new_residual)

    specs = learner.param_specs
    led = learner.led(specs)
    if residual is None:
        run = per_replica(lambda g: grouped(g, None), replicas, (led,), specs)
        return run(grads), None
    run = per_replica(grouped, replicas, (led, led), (specs, led))
    return run(grads, residual)


@register
class Compressed(Strategy):
    name = "compressed"
    # Quantisation blocks, top-k choices and error-feedback residuals are laid out over each
    # device's slice of the flattened gradient; slices split over fsdp as well are not built.
    composes_with_fsdp = False

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
        grad, residual = compressed_mean(learner, grads, state.get("residual"), self.config)
        metrics = {}
        if residual is not None:
            state["residual"] = residual
            metrics["residual_norm"] = tree_norm(residual) / jnp.sqrt(learner.replicas)
        metrics["grad_norm"] = tree_norm(grad)
        params, opt_state = apply(grad, opt_state, params)
        return params, opt_state, state, jnp.ones((), jnp.int32), metrics
