"""One typed layout value: a mesh and the rules that map logical axes onto it."""

from __future__ import annotations

import contextlib
import dataclasses
import math

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel.rules import (
    RULES,
    Rules,
    as_rules,
    axes_of,
    effective_spec,
    to_mesh_spec,
    use_rules,
)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a run's arrays live: ``with layout.active():`` sets the mesh and the rules, so
    everything traced inside (networks, environments, learner) shards by logical names."""

    mesh: Mesh
    rules: Rules = RULES

    def __post_init__(self):
        object.__setattr__(self, "rules", as_rules(self.rules))

    @contextlib.contextmanager
    def active(self):
        with jax.set_mesh(self.mesh), use_rules(self.rules):
            yield

    def sharding(self, logical: PartitionSpec) -> NamedSharding:
        """Size-1 mesh axes are left out of the spec (``effective_spec``)."""
        return NamedSharding(
            self.mesh, effective_spec(to_mesh_spec(logical, self.rules), self.mesh)
        )

    def shardings(self, logical_specs):
        """A tree of logical ``PartitionSpec`` -> the same tree of ``NamedSharding``."""
        return jax.tree.map(
            self.sharding, logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )

    def shards(self, name: str) -> int:
        """How many pieces logical axis ``name`` is split into (1 when it is not split)."""
        return math.prod(int(self.mesh.shape[a]) for a in axes_of(dict(self.rules).get(name)))

    def check_divisible(self, logical_specs, shapes, what: str = "parameter") -> None:
        """Every axis of every leaf of ``shapes`` (arrays or ``ShapeDtypeStruct``) must split
        evenly over the mesh axes its logical name maps to; else one ``ConfigError`` naming the
        leaf, its axis and size, and the mesh axes."""
        is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
        flat_specs = jax.tree.leaves(logical_specs, is_leaf=is_spec)
        flat_shapes = jax.tree_util.tree_leaves_with_path(shapes)
        for spec, (path, leaf) in zip(flat_specs, flat_shapes, strict=True):
            mesh_spec = effective_spec(to_mesh_spec(spec, self.rules), self.mesh)
            for dim, (name, axes) in enumerate(zip(spec, mesh_spec, strict=False)):
                pieces = math.prod(self.mesh.shape[a] for a in axes_of(axes))
                if leaf.shape[dim] % pieces:
                    sizes = ",".join(f"{a}={self.mesh.shape[a]}" for a in axes_of(axes))
                    raise ConfigError(
                        f"{what} {jax.tree_util.keystr(path, simple=True, separator='/')} "
                        f"{tuple(leaf.shape)}: axis {dim} ({name}, size {leaf.shape[dim]}) is not "
                        f"divisible by {pieces}, the mesh axes {sizes} it is split over; choose "
                        f"network widths or channels that are multiples of {pieces}, or a mesh "
                        "with fewer pieces on those axes"
                    )

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())
