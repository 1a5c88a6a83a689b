"""The one logical-axis rules table, and the functions that turn logical names into shardings.

Networks name the axes of every parameter (``("embed", "hidden")``); environment and rollout arrays
put ``"batch"`` on their leading axis. Only this module knows which mesh axis each name maps to, so
changing the parallelism layout means changing ``LOGICAL_RULES`` and nothing else.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Mapping

import flax.linen as nn
import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.errors import ConfigError

LogicalRules = Mapping[str, str | None]

LOGICAL_RULES: LogicalRules = {
    "batch": "data",  # environments / samples: data parallel
    "replica": "data",  # per-replica state of local/adaptive gradient sync (one replica per shard)
    "seed": None,  # vmapped independent seeds: replicated unless placed on `data`
    "hidden": "model",  # the tensor-parallel width of a column- then row-split MLP block
    "embed": None,  # replicated feature axes (observations, block outputs)
    "actions": None,  # policy logits
    "value": None,  # the critic's scalar output
}


def rules_with(**overrides: str | None) -> dict[str, str | None]:
    """A copy of ``LOGICAL_RULES`` with some names remapped, e.g. ``rules_with(seed="data")``."""
    unknown = set(overrides) - set(LOGICAL_RULES)
    if unknown:
        raise ConfigError(f"unknown logical axes {sorted(unknown)}; known: {sorted(LOGICAL_RULES)}")
    return {**LOGICAL_RULES, **overrides}


def logical_to_mesh_spec(
    logical: PartitionSpec, rules: LogicalRules = LOGICAL_RULES
) -> PartitionSpec:
    """``P("batch", "hidden")`` -> ``P("data", "model")`` under ``rules``."""
    mesh_axes = []
    for name in logical:
        if name is None:
            mesh_axes.append(None)
        elif name not in rules:
            raise ConfigError(f"logical axis {name!r} has no rule; known: {sorted(rules)}")
        else:
            mesh_axes.append(rules[name])
    used = [a for a in mesh_axes if a is not None]
    if len(used) != len(set(used)):
        raise ConfigError(f"logical spec {logical} maps two axes onto one mesh axis: {mesh_axes}")
    return PartitionSpec(*mesh_axes)


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


def logical_specs_to_shardings(specs, mesh: Mesh, rules: LogicalRules = LOGICAL_RULES):
    """A tree of logical ``PartitionSpec`` -> the same tree of ``NamedSharding`` on ``mesh``."""
    return jax.tree.map(
        lambda spec: NamedSharding(mesh, logical_to_mesh_spec(spec, rules)), specs, is_leaf=_is_spec
    )


def param_logical_specs(boxed_tree):
    """Logical specs of a tree whose parameters are ``nn.LogicallyPartitioned`` (others: ``P()``).

    Works on abstract trees from ``jax.eval_shape``; optimizer moments built from boxed parameters
    are boxed too, so one call covers parameters and optimizer state.
    """
    return nn.get_partition_spec(boxed_tree)


def prepend_axis(specs, name: str | None):
    """Add a leading logical axis (e.g. the vmapped seed axis) to every spec of a tree."""
    return jax.tree.map(lambda s: PartitionSpec(name, *s), specs, is_leaf=_is_spec)


def batch_spec_like(tree):
    """``P("batch")`` for every leaf: arrays whose leading axis is the environment batch."""
    return jax.tree.map(lambda _: PartitionSpec("batch"), tree)


# Mesh axes already spent by an enclosing ``vmap(..., spmd_axis_name=...)`` (the per-replica vmap
# of gradient sync): code traced inside must not name them again.
_TAKEN_AXES: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "rljax_taken_mesh_axes", default=frozenset()
)


@contextlib.contextmanager
def axes_taken(*mesh_axes: str | None):
    """While tracing inside ``vmap(spmd_axis_name=axis)``, ``constrain`` leaves ``axis`` out."""
    token = _TAKEN_AXES.set(_TAKEN_AXES.get() | {a for a in mesh_axes if a is not None})
    try:
        yield
    finally:
        _TAKEN_AXES.reset(token)


def constrain(x, *logical_axes: str | None, rules: LogicalRules = LOGICAL_RULES):
    """``with_sharding_constraint`` by logical names, against the mesh set by ``jax.set_mesh``.

    A no-op outside a mesh context, so pure functions stay usable without one. Mesh axes that are
    manual here (inside ``shard_map``) or taken by an enclosing spmd vmap are left out: the array
    is already the per-device (per-replica) piece along them.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = logical_to_mesh_spec(PartitionSpec(*logical_axes), rules)
    unavailable = set(mesh.manual_axes) | _TAKEN_AXES.get()
    if unavailable:
        spec = PartitionSpec(*(None if a in unavailable else a for a in spec))
        if all(a is None for a in spec):
            return x
    return jax.lax.with_sharding_constraint(x, spec)


def constrain_batch(tree, rules: LogicalRules = LOGICAL_RULES):
    """Constrain the leading axis of every leaf of ``tree`` to the ``batch`` rule."""
    return jax.tree.map(lambda x: constrain(x, "batch", rules=rules), tree)
