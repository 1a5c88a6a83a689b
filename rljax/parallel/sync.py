"""Gradient synchronisation across the ``data`` axis: five strategies behind one interface.

An algorithm computes one gradient per data-parallel replica, ``grads: [R@data, ...]``, and hands
it to ``GradientSync.step``, which decides what crosses the ``data`` axis and applies the optimizer.
Every collective is written out (``lax.pmean``, ``all_gather``, ``all_to_all`` under
``per_replica``); tensor-parallel parameters keep their ``model`` sharding throughout.

Strategies (bytes per device per optimizer step, ring convention of ``rljax.parallel.comm``,
with ``A = 2 (R-1)/R * parameter bytes`` and ``O`` the same for the optimizer moments):

* ``allreduce``: gradients averaged (``pmean``), one set of parameters. ``A``.
* ``local_sgd``: replicas keep their own parameters and optimizer state and step on their own
  gradients; every K-th step is synchronous: the gradient is averaged and applied by every
  replica, then parameters (and, with ``average_opt_state``, moments) are averaged.
  ``2A / K`` (``(2A + O) / K`` with moments). K=1 is exactly ``allreduce``: replicas never
  diverge, nothing is averaged.
* ``adaptive``: as ``local_sgd``, but a step is synchronous when the divergence
  ``max_r ||x_r - x_sync|| / ||x_sync||`` (each replica's relative L2 drift from the parameters of
  the last synchronisation; one scalar ``pmax``) exceeds ``threshold``, or after ``max_period``
  steps. The distance of a replica to the replicas' mean is at most twice this drift.
* ``compressed``: int8 (two-stage quantised all-reduce, per-block scales; ``~A/4``) or top-k
  sparse averaging (``8k (R-1)``), each with error feedback: what compression dropped is added to
  the next step's gradient (``rljax.parallel.compression``).
* ``stale``: gradients averaged but applied ``staleness`` steps late, like a parameter server
  whose workers push gradients computed on old parameters. ``A``; staleness 0 is ``allreduce``.

The figures are measured, not assumed, by ``rljax.parallel.comm`` on the compiled step.

Why local_sgd's synchronous step also averages the gradient: Adam and global-norm clipping are
nonlinear, so averaging parameters after K=1 purely local steps would not reproduce synchronous
training; applying the averaged gradient on the synchronous step makes K=1 exactly allreduce.

``K`` and ``max_period`` count optimizer steps (PPO: epochs x minibatches per update).
Batch statistics that a loss needs globally (PPO's advantage mean/std) are computed by the
algorithm before the per-replica gradients, a few bytes per step in every strategy.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel import compression
from rljax.parallel.replicas import REPLICA_AXIS, per_replica, replica_mesh_axis
from rljax.parallel.sharding import LogicalRules, axes_taken, logical_to_mesh_spec, prepend_axis

STRATEGIES = ("allreduce", "local_sgd", "adaptive", "compressed", "stale")


@dataclasses.dataclass(frozen=True)
class SyncConfig:
    """How gradients are synchronised across the ``data`` axis (see ``rljax.parallel.sync``)."""

    strategy: Literal["allreduce", "local_sgd", "adaptive", "compressed", "stale"] = "allreduce"
    """allreduce | local_sgd | adaptive | compressed | stale."""
    period: int = 4
    """local_sgd: optimizer steps per synchronisation (K); 1 equals allreduce."""
    threshold: float = 0.01
    """adaptive: synchronise when a replica's relative L2 drift from the last sync exceeds this."""
    max_period: int = 32
    """adaptive: synchronise at least every this many optimizer steps."""
    average_opt_state: bool = False
    """local_sgd/adaptive: average the optimizer moments too when synchronising (2x the bytes
    of Adam's parameters more per synchronisation)."""
    compression: Literal["int8", "topk"] = "int8"
    """compressed: int8 quantisation or top-k sparsification."""
    block_size: int = 256
    """compressed int8: values per f32 scale."""
    topk_fraction: float = 0.01
    """compressed topk: fraction of each replica's gradient entries sent."""
    error_feedback: bool = True
    """compressed: carry what compression dropped into the next step."""
    staleness: int = 1
    """stale: optimizer steps between computing a gradient and applying it (tau)."""


def validate_sync(config: SyncConfig) -> None:
    if config.strategy not in STRATEGIES:
        raise ConfigError(f"sync strategy {config.strategy!r} unknown; choose from {STRATEGIES}")
    for name in ("period", "max_period", "block_size"):
        if getattr(config, name) < 1:
            raise ConfigError(f"sync {name} must be >= 1, got {getattr(config, name)}")
    if config.threshold < 0:
        raise ConfigError(f"sync threshold must be >= 0, got {config.threshold}")
    if not 0.0 < config.topk_fraction <= 1.0:
        raise ConfigError(f"sync topk_fraction must be in (0, 1], got {config.topk_fraction}")
    if config.staleness < 0:
        raise ConfigError(f"sync staleness must be >= 0, got {config.staleness}")


def _tree_norm(tree) -> jax.Array:
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in jax.tree.leaves(tree)))


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


class GradientSync:
    """Owns the optimizer and the parameter layout of one learner.

    Replicated strategies keep ``params``/``opt_state`` as one copy (``[...]``, sharded only by the
    rules, e.g. ``model``); ``local_sgd``/``adaptive`` keep one per replica, ``[R@data, ...]``.
    """

    def __init__(
        self,
        config: SyncConfig,
        optimizer: optax.GradientTransformation,
        replicas: int,
        boxed_params,
        rules: LogicalRules,
    ):
        """``boxed_params``: (abstract) parameters with logical-axis boxes, for the layouts."""
        self.config = config
        self.optimizer = optimizer
        self.replicas = replicas
        self.rules = dict(rules)
        self.per_replica = config.strategy in ("local_sgd", "adaptive")
        self.param_logical = nn.get_partition_spec(boxed_params)
        self.opt_logical = nn.get_partition_spec(jax.eval_shape(optimizer.init, boxed_params))
        to_mesh = lambda tree: jax.tree.map(  # noqa: E731
            lambda s: logical_to_mesh_spec(s, self.rules), tree, is_leaf=_is_spec
        )
        self.param_specs = to_mesh(self.param_logical)
        self.opt_specs = to_mesh(self.opt_logical)

    # -- layout -------------------------------------------------------------------------------
    def _replicate(self, tree):
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (self.replicas, *x.shape)), tree)

    def init(self, params, opt_state) -> tuple[Any, Any, dict[str, Any]]:
        """One replica's ``params``/``opt_state`` -> ``(params, opt_state, sync_state)``."""
        c, state = self.config, {}
        if c.strategy == "adaptive":
            state["anchor"] = params
            state["since_sync"] = jnp.zeros((), jnp.int32)
        if c.strategy == "compressed" and c.error_feedback:
            state["residual"] = self._replicate(jax.tree.map(jnp.zeros_like, params))
        if c.strategy == "stale" and c.staleness > 0:
            state["queue"] = jax.tree.map(
                lambda x: jnp.zeros((c.staleness, *x.shape), x.dtype), params
            )
            state["queued"] = jnp.zeros((), jnp.int32)
        state["syncs"] = jnp.zeros((), jnp.int32)
        state["steps"] = jnp.zeros((), jnp.int32)
        if self.per_replica:
            params, opt_state = self._replicate(params), self._replicate(opt_state)
        return params, opt_state, state

    def logical_specs(self) -> tuple[Any, Any, dict[str, Any]]:
        """Logical specs of ``init``'s outputs (``"replica"`` is the per-replica leading axis)."""
        c, state = self.config, {}
        if c.strategy == "adaptive":
            state["anchor"] = self.param_logical
            state["since_sync"] = PartitionSpec()
        if c.strategy == "compressed" and c.error_feedback:
            state["residual"] = prepend_axis(self.param_logical, "replica")
        if c.strategy == "stale" and c.staleness > 0:
            state["queue"] = prepend_axis(self.param_logical, None)
            state["queued"] = PartitionSpec()
        state["syncs"] = state["steps"] = PartitionSpec()
        if self.per_replica:
            return (
                prepend_axis(self.param_logical, "replica"),
                prepend_axis(self.opt_logical, "replica"),
                state,
            )
        return self.param_logical, self.opt_logical, state

    def acting_params(self, params, replica: int = 0):
        """One replica's parameters (evaluation); replicated layouts are returned as they are."""
        return jax.tree.map(lambda x: x[replica], params) if self.per_replica else params

    def map_replicas(self, fn, params, *per_replica_args):
        """``fn(params, *args)`` per replica: args ``[R * n, ...]`` -> outputs ``[R * n, ...]``.

        With replicated parameters ``fn`` runs once on the whole batch; with per-replica
        parameters replica ``r`` applies its own parameters to rows ``[r n, (r+1) n)``.
        """
        if not self.per_replica:
            return fn(params, *per_replica_args)
        split = jax.tree.map(lambda x: x.reshape(self.replicas, -1, *x.shape[1:]), per_replica_args)
        out = self.vmap(fn, in_axes=(0,) * (1 + len(split)))(params, *split)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    def vmap(self, fn, in_axes):
        """``jax.vmap`` over the replica axis, sharded along ``data`` when a mesh holds it."""
        axis = replica_mesh_axis(self.replicas)

        def traced(*args):
            with axes_taken(axis):
                return fn(*args)

        return jax.vmap(traced, in_axes=in_axes, spmd_axis_name=axis)

    def grads(self, loss_fn, params, batch):
        """Per-replica ``value_and_grad``: ``batch`` leaves ``[R@data, n, ...]`` ->
        ``((loss [R], aux [R]), grads [R@data, ...])``."""
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if self.replicas == 1 and not self.per_replica:
            # One replica: the plain gradient; a size-1 vmap costs ~5 % of PPO's speed on CPU.
            out = grad_fn(params, jax.tree.map(lambda x: x[0], batch))
            return jax.tree.map(lambda x: x[None], out)
        return self.vmap(grad_fn, in_axes=(0 if self.per_replica else None, 0))(params, batch)

    # -- collectives --------------------------------------------------------------------------
    def _led(self, specs):
        return prepend_axis(specs, REPLICA_AXIS)

    def _mean(self, grads):
        """``[R@data, ...]`` -> replica mean ``[...]`` with one ``pmean`` over ``data``."""
        if self.replicas == 1:  # nothing to average
            return jax.tree.map(lambda g: g[0], grads)
        fn = lambda g: jax.lax.pmean(g, REPLICA_AXIS)  # noqa: E731
        return per_replica(fn, self.replicas, (self._led(self.param_specs),), self.param_specs)(
            grads
        )

    def _average(self, params, opt_state):
        """Per-replica ``params``/``opt_state`` -> every replica holds their mean (``pmean``)."""
        average_opt = self.config.average_opt_state

        def fn(params, opt_state):
            params = jax.lax.pmean(params, REPLICA_AXIS)
            if average_opt:
                opt_state = jax.tree.map(
                    lambda x: jax.lax.pmean(x, REPLICA_AXIS)
                    if jnp.issubdtype(x.dtype, jnp.floating)
                    else x,
                    opt_state,
                )
            return params, opt_state

        specs = (self._led(self.param_specs), self._led(self.opt_specs))
        return per_replica(fn, self.replicas, specs, specs)(params, opt_state)

    def compression_groups(self):
        """``(treedef, groups)``: leaf indices compressed together, one group per set of mesh
        axes the leaves are split over. A group's flat vector then holds the same kind of slice
        on every device, so a leaf replicated over `model` gets the same blocks and top-k choice
        on every model device."""
        leaves, treedef = jax.tree.flatten(self.param_specs, is_leaf=_is_spec)
        group_of = [frozenset(a for a in spec if a is not None) for spec in leaves]
        return treedef, [
            [i for i, g in enumerate(group_of) if g == k] for k in dict.fromkeys(group_of)
        ]

    def _local_copy(self, params):
        """Per-replica ``params`` that are equal on every replica (right after ``_average``) as
        one replicated copy: each device keeps its own, nothing is communicated. (Slicing
        replica 0 out of ``[R@data]`` would make the partitioner broadcast it from one shard.)"""
        specs = (self._led(self.param_specs),)
        return per_replica(lambda p: p, self.replicas, specs, self.param_specs)(params)

    def _compressed_mean(self, grads, residual):
        """``[R@data, ...]`` gradients (+ residuals) -> (mean estimate ``[...]``, new residuals).

        Without error feedback ``residual`` is ``None`` and so is the returned one."""
        c, replicas = self.config, self.replicas

        def compress(flat):
            if c.compression == "int8":
                return compression.int8_mean(flat, replicas, c.block_size)
            return compression.topk_mean(flat, replicas, c.topk_fraction)

        treedef, groups = self.compression_groups()

        def grouped(grad, residual):
            grad_leaves = treedef.flatten_up_to(grad)
            res_leaves = treedef.flatten_up_to(residual) if residual is not None else None
            estimate, new_residual = [None] * len(grad_leaves), [None] * len(grad_leaves)
            for group in groups:
                flat, unravel = ravel_pytree([grad_leaves[i] for i in group])
                if res_leaves is not None:
                    flat = flat + ravel_pytree([res_leaves[i] for i in group])[0]
                group_estimate, group_residual = compress(flat)
                for i, e, r in zip(
                    group, unravel(group_estimate), unravel(group_residual), strict=True
                ):
                    estimate[i], new_residual[i] = e, r
            estimate = treedef.unflatten(estimate)
            if residual is None:
                return estimate
            return estimate, treedef.unflatten(new_residual)

        led = self._led(self.param_specs)
        if residual is None:
            run = per_replica(lambda g: grouped(g, None), replicas, (led,), self.param_specs)
            return run(grads), None
        run = per_replica(grouped, replicas, (led, led), (self.param_specs, led))
        return run(grads, residual)

    # -- the optimizer step -------------------------------------------------------------------
    def _apply(self, grads, opt_state, params, scale):
        updates, opt_state = self.optimizer.update(grads, opt_state, params)
        if scale is not None:
            updates = jax.tree.map(lambda u: (scale * u).astype(u.dtype), updates)
        return optax.apply_updates(params, updates), opt_state

    def step(self, params, opt_state, state: dict[str, Any], grads, scale=None):
        """One optimizer step from per-replica ``grads: [R@data, ...]``.

        ``scale`` multiplies the optimizer's updates: the learning rate, when the optimizer is
        built with a unit rate so that the rate can be a traced value (hyperparameter sweeps).
        Returns ``(params, opt_state, state, metrics)``; metrics: ``grad_norm`` (of the applied
        gradient; replica mean for local steps) and ``synced`` (1 when replicas synchronised).
        """
        c = self.config
        state = dict(state)
        state["steps"] = state["steps"] + 1
        metrics = {}
        if c.strategy in ("allreduce", "stale"):
            grad = self._mean(grads)
            metrics["grad_norm"] = _tree_norm(grad)
            if c.strategy == "stale" and c.staleness > 0:
                grad, ready, state = self._delay(grad, state)
                # Until the queue is full there is nothing to apply: the optimizer waits too.
                params, opt_state = jax.lax.cond(
                    ready, self._apply, lambda g, o, p, s: (p, o), grad, opt_state, params, scale
                )
            else:
                params, opt_state = self._apply(grad, opt_state, params, scale)
            synced = jnp.ones((), jnp.int32)
        elif c.strategy == "compressed":
            grad, residual = self._compressed_mean(grads, state.get("residual"))
            if residual is not None:
                state["residual"] = residual
                metrics["residual_norm"] = _tree_norm(residual) / jnp.sqrt(self.replicas)
            metrics["grad_norm"] = _tree_norm(grad)
            params, opt_state = self._apply(grad, opt_state, params, scale)
            synced = jnp.ones((), jnp.int32)
        else:
            params, opt_state, state, synced, metrics = self._local_step(
                params, opt_state, state, grads, scale
            )
        state["syncs"] = state["syncs"] + synced
        metrics["synced"] = synced
        return params, opt_state, state, metrics

    def _delay(self, grad, state):
        """Push this step's gradient, pop the one from ``staleness`` steps ago.

        Returns ``(oldest, ready, state)``; ``ready`` is false while the queue is filling."""
        queue = state["queue"]
        oldest = jax.tree.map(lambda q: q[0], queue)
        state["queue"] = jax.tree.map(
            lambda q, g: jnp.concatenate([q[1:], g[None]], axis=0), queue, grad
        )
        ready = state["queued"] >= self.config.staleness
        state["queued"] = jnp.minimum(state["queued"] + 1, self.config.staleness)
        return oldest, ready, state

    def divergence(self, params, anchor) -> jax.Array:
        """``max_r ||x_r - x_sync|| / ||x_sync||`` for per-replica ``params: [R@data, ...]``."""
        drift = jax.vmap(lambda p: _tree_norm(jax.tree.map(jnp.subtract, p, anchor)))(params)
        return jnp.max(drift) / jnp.maximum(_tree_norm(anchor), 1e-12)

    def _local_step(self, params, opt_state, state, grads, scale):
        c = self.config
        local_apply = self.vmap(lambda g, o, p: self._apply(g, o, p, scale), in_axes=(0, 0, 0))
        shared_apply = self.vmap(lambda g, o, p: self._apply(g, o, p, scale), in_axes=(None, 0, 0))
        metrics = {}
        if c.strategy == "local_sgd":
            is_sync = state["steps"] % c.period == 0
        else:
            divergence = self.divergence(params, state["anchor"])
            metrics["divergence"] = divergence
            is_sync = (divergence > c.threshold) | (state["since_sync"] + 1 >= c.max_period)

        def synchronous(params, opt_state, grads):
            grad = self._mean(grads)
            params, opt_state = shared_apply(grad, opt_state, params)
            if c.period > 1 or c.strategy == "adaptive":  # with K=1 replicas never diverge
                params, opt_state = self._average(params, opt_state)
            return params, opt_state, _tree_norm(grad)

        def local(params, opt_state, grads):
            params, opt_state = local_apply(grads, opt_state, params)
            return params, opt_state, jnp.mean(jax.vmap(_tree_norm)(grads))

        params, opt_state, metrics["grad_norm"] = jax.lax.cond(
            is_sync, synchronous, local, params, opt_state, grads
        )
        if c.strategy == "adaptive":
            state["anchor"] = jax.lax.cond(
                is_sync, lambda: self._local_copy(params), lambda: state["anchor"]
            )
            state["since_sync"] = jnp.where(is_sync, 0, state["since_sync"] + 1)
        return params, opt_state, state, is_sync.astype(jnp.int32), metrics
