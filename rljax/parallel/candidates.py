"""Alternative meshes over a number of devices, for the memory planner's "a mesh that would fit".

    for mesh in candidates(8, rules):       # every (data, model, ...) shape using all 8 devices
        mesh.spec                           # 'data=2,model=4'
        mesh.shards("batch")                # pieces of a logical axis on that mesh
        mesh.dim_shards(P("batch", None))   # pieces of each dimension of an array

The shapes are every factorisation of the device count over ``MESH_AXES`` (whatever axes the
mesh module declares) but ``stage``, so the planner never names a mesh axis itself. ``stage``
stays 1: pipelining changes the network's parameter layout, which the config opts into.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

from jax.sharding import PartitionSpec

from rljax.parallel.mesh import MESH_AXES
from rljax.parallel.pipeline import STAGE_AXIS
from rljax.parallel.rules import Rules, as_rules


@dataclasses.dataclass(frozen=True)
class Candidate:
    """A mesh shape (``sizes``: ``((axis, size), ...)`` in ``MESH_AXES`` order) and the rules that
    map logical axes onto it."""

    sizes: tuple[tuple[str, int], ...]
    rules: Rules

    @property
    def spec(self) -> str:
        """``'data=2,model=2'``: the axes bigger than 1 (``data=1`` when there are none), in the
        form ``--mesh`` takes."""
        parts = [f"{axis}={size}" for axis, size in self.sizes if size > 1]
        return ",".join(parts) or f"{MESH_AXES[0]}=1"

    @property
    def devices(self) -> int:
        return math.prod(size for _, size in self.sizes)

    def _axis_size(self, mesh_axes) -> int:
        if mesh_axes is None:
            return 1
        names = (mesh_axes,) if isinstance(mesh_axes, str) else tuple(mesh_axes)
        sizes = dict(self.sizes)
        return math.prod(sizes.get(a, 1) for a in names)

    def shards(self, name: str) -> int:
        """How many pieces logical axis ``name`` is split into on this mesh."""
        return self._axis_size(dict(self.rules).get(name))

    def dim_shards(self, logical: PartitionSpec) -> tuple[int, ...]:
        """Pieces of each dimension of an array with logical spec ``logical`` (names or tuples
        of names per dimension, ``None`` unsplit)."""
        out = []
        for entry in tuple(logical):
            names = () if entry is None else (entry,) if isinstance(entry, str) else entry
            out.append(math.prod(self.shards(n) for n in names))
        return tuple(out)


def _factorisations(n: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every ordered ``k``-tuple of positive integers whose product is ``n``."""
    if k == 1:
        yield (n,)
        return
    for first in range(1, n + 1):
        if n % first == 0:
            for rest in _factorisations(n // first, k - 1):
                yield (first, *rest)


def candidates(num_devices: int, rules) -> list[Candidate]:
    """Every mesh shape over exactly ``num_devices`` devices (all axes of ``MESH_AXES``), with
    ``rules`` (a rules table or mapping)."""
    rules = as_rules(rules)
    axes = tuple(a for a in MESH_AXES if a != STAGE_AXIS)
    return [
        Candidate(tuple(zip(axes, shape, strict=True)), rules)
        for shape in _factorisations(max(int(num_devices), 1), len(axes))
    ]
