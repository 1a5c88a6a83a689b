"""Meshes, emulated devices and the logical-axis sharding rules."""

from rljax.parallel.mesh import (
    MESH_AXES,
    MESH_AXIS_TYPES,
    make_mesh,
    mesh_spec_of,
    parse_mesh_spec,
    resolve_mesh_shape,
    set_num_cpu_devices,
)
from rljax.parallel.sharding import (
    LOGICAL_RULES,
    constrain,
    constrain_batch,
    logical_specs_to_shardings,
    logical_to_mesh_spec,
    param_logical_specs,
    rules_with,
)

__all__ = [
    "LOGICAL_RULES",
    "MESH_AXES",
    "MESH_AXIS_TYPES",
    "constrain",
    "constrain_batch",
    "logical_specs_to_shardings",
    "logical_to_mesh_spec",
    "make_mesh",
    "mesh_spec_of",
    "param_logical_specs",
    "parse_mesh_spec",
    "resolve_mesh_shape",
    "rules_with",
    "set_num_cpu_devices",
]
