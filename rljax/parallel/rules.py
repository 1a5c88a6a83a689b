"""The one logical-axis rules table, applied as a context, and the lookups that use it.

Networks, environments and algorithms name array axes logically (``"batch"``, ``"mlp"``); only the
rules map those names to mesh axes. ``use_rules(rules)`` is Flax's ``nn.logical_axis_rules``:
whatever traces inside it (``constrain``, ``to_mesh_spec``) resolves names through it.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Mapping

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError

MeshAxes = str | tuple[str, ...] | None  # what a logical name maps to: one mesh axis, several, none
Rules = tuple[tuple[str, MeshAxes], ...]

# Parameter axes and activation axes have distinct names (as MaxText's `embed` and
# `activation_embed`), so parameters are sharded (FSDP) by the rules alone: `embed`, the axis that
# tensor parallelism leaves free, goes to `fsdp` (ZeRO-3: XLA all-gathers each layer's weights
# where they are used and reduce-scatters their gradients), while the stream activations
# (`activation_embed`) stay whole and the batch is split over `fsdp` as well as `data`.
RULES: Rules = (
    ("batch", ("data", "fsdp")),  # environments, samples, replay rows: data parallel
    ("replica", "data"),  # per-replica learner state (local/adaptive sync): one replica per shard
    ("seed", None),  # vmapped independent seeds / sweep members
    ("embed", "fsdp"),  # parameter: feature axis entering / leaving a tensor-parallel block
    ("mlp", "model"),  # parameter: the tensor-parallel width of a column- then row-split block
    ("layers", "stage"),  # parameter: stacked residual blocks, consecutive ones per pipeline stage
    ("actions", None),  # parameter: policy / Q head outputs
    ("value", None),  # parameter: the critic's scalar output
    ("recurrent", None),  # parameter: a recurrent cell's width, replicated (docs/architecture.md)
    ("activation_embed", None),
    ("activation_mlp", "model"),
    ("activation_actions", None),
    ("activation_recurrent", None),  # a recurrent cell's hidden state
)


def axes_of(mapped: MeshAxes) -> tuple[str, ...]:
    """``None`` / ``"data"`` / ``("data", "fsdp")`` -> the mesh axes as a tuple."""
    if mapped is None:
        return ()
    return (mapped,) if isinstance(mapped, str) else tuple(mapped)


def _joined(axes: tuple[str, ...]) -> MeshAxes:
    return None if not axes else axes[0] if len(axes) == 1 else axes


def without(mapped: MeshAxes, drop) -> MeshAxes:
    """``mapped`` with the mesh axes in ``drop`` removed (``None`` when none remain)."""
    return _joined(tuple(a for a in axes_of(mapped) if a not in drop))


def rules_with(rules: Rules | None = None, **overrides: MeshAxes) -> Rules:
    """``rules`` (default: ``RULES``) with some names remapped, e.g. ``rules_with(seed="data")``."""
    rules = RULES if rules is None else tuple(rules)
    known = dict(rules)
    unknown = set(overrides) - set(known)
    if unknown:
        raise ConfigError(f"unknown logical axes {sorted(unknown)}; known: {sorted(known)}")
    return tuple((name, overrides.get(name, axis)) for name, axis in rules)


def seeds_on(mesh_axis: str | None, rules: Rules | None = None) -> Rules:
    """Seeds (sweep members) placed on ``mesh_axis`` take it from the environment batch and the
    replicas; ``None``/``"none"``: ``rules`` unchanged (seeds replicated)."""
    rules = RULES if rules is None else tuple(rules)
    if mesh_axis in (None, "none"):
        return rules
    table = dict(rules)
    return rules_with(
        rules,
        seed=mesh_axis,
        batch=without(table["batch"], {mesh_axis}),
        replica=without(table["replica"], {mesh_axis}),
    )


def as_rules(rules: Rules | Mapping[str, str | None]) -> Rules:
    return tuple(rules.items()) if isinstance(rules, Mapping) else tuple(rules)


def use_rules(rules: Rules | Mapping[str, str | None]):
    """Context in which logical names resolve through ``rules`` (Flax's logical_axis_rules)."""
    return nn.logical_axis_rules(as_rules(rules))


def active_rules() -> Rules:
    """The rules of the innermost ``use_rules``, or ``RULES`` outside any."""
    return tuple(nn.get_logical_axis_rules()) or RULES


@contextlib.contextmanager
def spending(*mesh_axes: str | None):
    """Rules for code traced inside ``vmap(spmd_axis_name=axis)`` or a manual ``shard_map``:
    names mapped to a spent mesh axis become unsharded (that axis is already split off)."""
    spent = {a for a in mesh_axes if a is not None}
    rules = active_rules()
    with use_rules(tuple((n, without(a, spent)) for n, a in rules)):
        yield


def to_mesh_spec(logical: Iterable[str | None], rules: Rules | None = None) -> PartitionSpec:
    """``P("batch", "mlp")`` -> ``P("data", "model")`` under ``rules`` (default: the active ones).

    Unknown names and two names on one mesh axis are errors, not silent replication."""
    rules = active_rules() if rules is None else as_rules(rules)
    table = dict(rules)
    names = tuple(logical)
    missing = [n for n in names if n is not None and n not in table]
    if missing:
        raise ConfigError(f"logical axes {missing} have no rule; known: {sorted(table)}")
    axes = [None if n is None else table[n] for n in names]
    used = [a for mapped in axes for a in axes_of(mapped)]
    if len(used) != len(set(used)):
        raise ConfigError(f"logical spec {names} maps two axes onto one mesh axis: {axes}")
    return PartitionSpec(*axes)


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


def to_mesh_specs(tree, rules: Rules | None = None):
    """A tree of logical ``PartitionSpec`` -> the same tree of mesh ``PartitionSpec``."""
    return jax.tree.map(lambda s: to_mesh_spec(s, rules), tree, is_leaf=_is_spec)


def prepend_axis(specs, name: str | None):
    """Add a leading logical axis (e.g. the vmapped seed axis) to every spec of a tree."""
    return jax.tree.map(lambda s: PartitionSpec(name, *s), specs, is_leaf=_is_spec)


def batch_spec_like(tree):
    """``P("batch")`` for every leaf: arrays whose leading axis is the environment batch."""
    return jax.tree.map(lambda _: PartitionSpec("batch"), tree)


def effective(mapped: MeshAxes, mesh) -> MeshAxes:
    """The mesh axes of ``mapped`` that split something on ``mesh``: size-1 axes, axes the mesh
    lacks and manual axes (inside ``shard_map``) dropped, so an axis left out of a mesh spec costs
    nothing and specs read as before it existed."""
    if mesh is None or mesh.empty:
        return None
    manual = set(getattr(mesh, "manual_axes", ()))
    return _joined(
        tuple(
            a
            for a in axes_of(mapped)
            if a in mesh.axis_names and mesh.shape[a] > 1 and a not in manual
        )
    )


def effective_spec(spec: PartitionSpec, mesh) -> PartitionSpec:
    """``effective`` of every entry of a mesh ``PartitionSpec``."""
    return PartitionSpec(*(effective(a, mesh) for a in spec))


def mesh_axis(name: str) -> tuple[MeshAxes, int]:
    """The mesh axis (or axes) that logical ``name`` is split over here, and the number of
    pieces; ``(None, 1)`` when it is not split (no mesh, no rule, size-1 axes, or axes this code
    is already inside of)."""
    mesh = jax.sharding.get_abstract_mesh()
    axes = effective(dict(active_rules()).get(name), mesh)
    if axes is None:
        return None, 1
    return axes, math.prod(mesh.shape[a] for a in axes_of(axes))


def constrain(x, *logical_axes: str | None):
    """``with_sharding_constraint`` by logical names, through the active rules and mesh.

    A no-op outside a mesh, so pure functions stay usable without one. Mesh axes that are manual
    here (inside ``shard_map``) are left out: the array is already the per-device piece.
    """
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    spec = effective_spec(to_mesh_spec(logical_axes), mesh)
    if mesh.manual_axes and all(a is None for a in spec):
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def constrain_batch(tree):
    """Constrain the leading axis of every leaf of ``tree`` to the ``batch`` rule."""
    return jax.tree.map(lambda x: constrain(x, "batch"), tree)
