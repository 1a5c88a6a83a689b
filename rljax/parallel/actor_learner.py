"""The actor-learner layout's meshes: disjoint device sets, one ``Layout`` each, and resharding
between them (``docs/architecture.md``, "Actor-learner layout").

    actor, learner = split_layouts("data=2", "fsdp=2,model=3", rules)   # devices 0-1 and 2-7
    params_on_actors = reshard(params, actor.shardings(specs))           # device to device
"""

from __future__ import annotations

import math

import jax

from rljax.errors import ConfigError
from rljax.parallel.layout import Layout
from rljax.parallel.mesh import make_mesh, parse_mesh_spec
from rljax.parallel.rules import RULES, Rules


def mesh_sizes(actor_mesh: str, learner_mesh: str, num_devices: int) -> tuple[int, int]:
    """Devices of each mesh; ``ConfigError`` for a ``-1`` axis (sizes are explicit here) or
    when together they need more than ``num_devices``."""
    sizes = []
    for flag, spec in (("--actor-mesh", actor_mesh), ("--learner-mesh", learner_mesh)):
        shape = parse_mesh_spec(spec)
        if -1 in shape.values():
            raise ConfigError(f"{flag} {spec!r}: give every axis size (-1 is not allowed here)")
        sizes.append(math.prod(shape.values()))
    n_actor, n_learner = sizes
    if n_actor + n_learner > num_devices:
        raise ConfigError(
            f"actor mesh {actor_mesh!r} ({n_actor} devices) and learner mesh {learner_mesh!r} "
            f"({n_learner} devices) need {n_actor + n_learner} devices, but only {num_devices} "
            "are available; the two meshes use disjoint devices (set --num-devices, or use "
            "smaller meshes)"
        )
    return n_actor, n_learner


def split_layouts(
    actor_mesh: str, learner_mesh: str, rules: Rules = RULES, devices=None
) -> tuple[Layout, Layout]:
    """``(actor layout, learner layout)``: the actor mesh over the first devices, the learner
    mesh over the next ones (disjoint), both with the same ``rules``."""
    devices = list(jax.devices() if devices is None else devices)
    n_actor, n_learner = mesh_sizes(actor_mesh, learner_mesh, len(devices))
    actor = make_mesh(actor_mesh, devices[:n_actor])
    learner = make_mesh(learner_mesh, devices[n_actor : n_actor + n_learner])
    return Layout(actor, rules), Layout(learner, rules)


def reshard(tree, shardings):
    """``tree`` placed with ``shardings`` (a matching tree of ``NamedSharding``, possibly on
    another mesh): device-to-device copies, dispatched asynchronously, never through the host."""
    return jax.device_put(tree, shardings)
