"""One typed layout value: a mesh and the rules that map logical axes onto it."""

from __future__ import annotations

import contextlib
import dataclasses

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.parallel.rules import RULES, Rules, as_rules, to_mesh_spec, use_rules


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
        return NamedSharding(self.mesh, to_mesh_spec(logical, self.rules))

    def shardings(self, logical_specs):
        """A tree of logical ``PartitionSpec`` -> the same tree of ``NamedSharding``."""
        return jax.tree.map(
            self.sharding, logical_specs, is_leaf=lambda x: isinstance(x, PartitionSpec)
        )

    def shards(self, name: str) -> int:
        """How many pieces logical axis ``name`` is split into (1 when it is not split)."""
        axis = dict(self.rules).get(name)
        return 1 if axis is None else int(self.mesh.shape[axis])

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, PartitionSpec())
