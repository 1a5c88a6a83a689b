"""The learner boundary: an algorithm hands over a loss and a batch, the learner splits the batch
into data-parallel replicas, computes one gradient per replica and lets the sync strategy decide
what crosses the replica axis before the optimizer applies it.

    learner = Learner(optimizer, SyncConfig("local_sgd"), replicas=2, boxed_params=abstract)
    params, opt_state, sync = learner.init(params, opt_state)
    (loss, aux), grads = learner.grads(loss_fn, params, learner.split(batch))
    params, opt_state, sync, metrics = learner.step(params, opt_state, sync, grads)

``params``/``opt_state`` are one copy for replicated strategies and ``[R@replica, ...]`` for
per-replica ones (local_sgd, adaptive); ``acting_params`` gives one replica's either way.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec

from rljax.parallel.replicas import REPLICA_AXIS, per_replica, pmean_tree, replica_mesh_axis
from rljax.parallel.rules import (
    constrain,
    effective_spec,
    prepend_axis,
    spending,
    to_mesh_specs,
)
from rljax.parallel.sync import SyncConfig, strategy_for


class Learner:
    """Optimizer, replicas and a sync strategy for one set of parameters."""

    def __init__(
        self,
        optimizer: optax.GradientTransformation,
        sync: SyncConfig,
        replicas: int,
        boxed_params,
    ):
        """``boxed_params``: (abstract) parameters in logical-axis boxes, for the layouts."""
        self.optimizer = optimizer
        self.strategy = strategy_for(sync)
        self.replicas = replicas
        self.per_replica = self.strategy.per_replica
        self.param_logical = nn.get_partition_spec(boxed_params)
        self.opt_logical = nn.get_partition_spec(jax.eval_shape(optimizer.init, boxed_params))

    # -- layout -----------------------------------------------------------------------------------
    @property
    def param_specs(self):
        """Mesh specs of one replica's parameters under the active rules (size-1 and absent
        mesh axes left out when a mesh is active)."""
        specs = to_mesh_specs(self.param_logical)
        mesh = jax.sharding.get_abstract_mesh()
        if mesh.empty:
            return specs
        return jax.tree.map(
            lambda s: effective_spec(s, mesh), specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )

    def replicate(self, tree):
        """One replica's ``tree`` -> ``[R, ...]`` copies."""
        return jax.tree.map(lambda x: jnp.broadcast_to(x, (self.replicas, *x.shape)), tree)

    def init(self, params, opt_state) -> tuple[Any, Any, dict[str, Any]]:
        """One replica's ``params``/``opt_state`` -> ``(params, opt_state, sync_state)``."""
        state = self.strategy.init(self, params)
        state["syncs"] = jnp.zeros((), jnp.int32)
        state["steps"] = jnp.zeros((), jnp.int32)
        if self.per_replica:
            params, opt_state = self.replicate(params), self.replicate(opt_state)
        return params, opt_state, state

    def specs(self) -> tuple[Any, Any, dict[str, Any]]:
        """Logical specs of ``init``'s outputs (``"replica"`` is the per-replica leading axis)."""
        state = self.strategy.specs(self)
        state["syncs"] = state["steps"] = PartitionSpec()
        if self.per_replica:
            return (
                prepend_axis(self.param_logical, "replica"),
                prepend_axis(self.opt_logical, "replica"),
                state,
            )
        return self.param_logical, self.opt_logical, state

    def acting_params(self, params, replica: int = 0):
        """One replica's parameters (evaluation, export); replicated layouts as they are."""
        return jax.tree.map(lambda x: x[replica], params) if self.per_replica else params

    # -- per-replica computation ------------------------------------------------------------------
    def vmap(self, fn, in_axes):
        """``jax.vmap`` over the replica axis, sharded along its mesh axis when a mesh holds it."""
        axis = replica_mesh_axis(self.replicas)

        def traced(*args):
            with spending(axis):
                return fn(*args)

        return jax.vmap(traced, in_axes=in_axes, spmd_axis_name=axis)

    def apply(self, fn, params, *args):
        """``fn(params, *args)`` per replica: args ``[R * n, ...]`` -> outputs ``[R * n, ...]``.

        Replicated parameters: ``fn`` runs once on the whole batch; per-replica parameters:
        replica ``r`` applies its own parameters to rows ``[r n, (r+1) n)``."""
        if not self.per_replica:
            return fn(params, *args)
        split = jax.tree.map(lambda x: x.reshape(self.replicas, -1, *x.shape[1:]), args)
        out = self.vmap(fn, in_axes=(0,) * (1 + len(split)))(params, *split)
        return jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), out)

    def split(self, batch):
        """``[N@batch, ...]`` leaves -> ``[R@replica, N/R, ...]``: replica ``r`` takes the rows of
        its own data shard, so no sample moves between devices."""
        return jax.tree.map(
            lambda x: constrain(x.reshape(self.replicas, -1, *x.shape[1:]), "replica"), batch
        )

    def grads(self, loss_fn, params, batch):
        """Per-replica ``value_and_grad`` of ``loss_fn(params, batch) -> (loss, aux)``:
        ``batch`` leaves ``[R@replica, n, ...]`` -> ``((loss [R], aux [R]), grads [R@replica])``."""
        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        if self.replicas == 1 and not self.per_replica:
            # One replica: the plain gradient; a size-1 vmap costs ~5 % of PPO's speed on CPU.
            out = grad_fn(params, jax.tree.map(lambda x: x[0], batch))
            return jax.tree.map(lambda x: x[None], out)
        return self.vmap(grad_fn, in_axes=(0 if self.per_replica else None, 0))(params, batch)

    # -- the optimizer step -----------------------------------------------------------------------
    def step(self, params, opt_state, state: dict[str, Any], grads, scale=None):
        """One optimizer step from per-replica ``grads: [R@replica, ...]``.

        ``scale`` multiplies the optimizer's updates: the learning rate, when the optimizer is
        built with a unit rate so that the rate can be a traced value (hyperparameter sweeps).
        Returns ``(params, opt_state, state, metrics)``; metrics: ``grad_norm`` (of the applied
        gradient; replica mean for local steps), ``synced`` (1 when replicas synchronised) and
        the strategy's own."""

        def apply(grads, opt_state, params):
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            if scale is not None:
                updates = jax.tree.map(lambda u: (scale * u).astype(u.dtype), updates)
            return optax.apply_updates(params, updates), opt_state

        state = {**state, "steps": state["steps"] + 1}
        params, opt_state, state, synced, metrics = self.strategy.step(
            self, params, opt_state, state, grads, apply
        )
        state["syncs"] = state["syncs"] + synced
        return params, opt_state, state, {**metrics, "synced": synced}

    # -- collectives for strategies ---------------------------------------------------------------
    def led(self, specs):
        """Mesh specs of per-replica arrays ``[R@replica, ...]``."""
        return prepend_axis(specs, REPLICA_AXIS)

    def mean(self, grads):
        """``[R@replica, ...]`` -> replica mean ``[...]`` with one ``pmean`` (``pmean_tree``)."""
        if self.replicas == 1:
            return jax.tree.map(lambda g: g[0], grads)
        specs = self.param_specs
        return per_replica(pmean_tree, self.replicas, (self.led(specs),), specs)(grads)
