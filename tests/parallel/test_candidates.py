"""Alternative meshes over a device count (the memory planner's suggestions)."""

import math

from jax.sharding import PartitionSpec as P

from rljax.parallel import MESH_AXES, RULES, parse_mesh_spec
from rljax.parallel.candidates import candidates


def test_every_mesh_shape_over_the_devices_once_with_the_rules_shard_counts():
    meshes = candidates(8, RULES)
    shapes = [tuple(size for _, size in m.sizes) for m in meshes]
    assert len(set(shapes)) == len(shapes) and all(math.prod(s) == 8 for s in shapes)
    assert len(shapes) == {2: 4, 3: 10}.get(len(MESH_AXES), len(shapes))  # ordered factorings
    for mesh in meshes:  # specs are what --mesh takes, on the same number of devices
        assert math.prod(parse_mesh_spec(mesh.spec).values()) == mesh.devices == 8
        assert mesh.dim_shards(P("batch", None)) == (mesh.shards("batch"), 1)
        assert mesh.dim_shards(P(("batch", "mlp"))) == (mesh.shards("batch") * mesh.shards("mlp"),)
    assert {m.shards("batch") for m in meshes} == {1, 2, 4, 8}
    assert all(m.shards("seed") == 1 for m in meshes)  # seeds replicated by default
    assert candidates(1, RULES)[0].spec == f"{MESH_AXES[0]}=1"
