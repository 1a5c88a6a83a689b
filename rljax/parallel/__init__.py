"""Meshes, logical-axis rules, layouts, data-parallel replicas and the learner.

Mesh axis names appear only in this package."""

from rljax.parallel.layout import Layout
from rljax.parallel.mesh import (
    DEFAULT_MESH,
    MESH_AXES,
    MESH_AXIS_TYPES,
    make_mesh,
    mesh_spec_of,
    parse_mesh_spec,
    resolve_mesh_shape,
    set_num_cpu_devices,
)
from rljax.parallel.rules import (
    RULES,
    Rules,
    active_rules,
    constrain,
    constrain_batch,
    prepend_axis,
    rules_with,
    to_mesh_spec,
    to_mesh_specs,
    use_rules,
)

__all__ = [
    "DEFAULT_MESH",
    "Layout",
    "MESH_AXES",
    "MESH_AXIS_TYPES",
    "RULES",
    "Rules",
    "active_rules",
    "constrain",
    "constrain_batch",
    "make_mesh",
    "mesh_spec_of",
    "parse_mesh_spec",
    "prepend_axis",
    "resolve_mesh_shape",
    "rules_with",
    "set_num_cpu_devices",
    "to_mesh_spec",
    "to_mesh_specs",
    "use_rules",
]
