"""An algorithm's communication per optimizer step, by mesh axis, measured once per process."""

from __future__ import annotations

import copy

import jax
from jax.sharding import Mesh

from rljax.diagnostics.hlo import collectives
from rljax.parallel import Layout

_MEASURED: dict[tuple, dict[str, dict[str, float]]] = {}


def _key(algo, layout: Layout) -> tuple:
    """What the compiled optimizer step depends on: algorithm, layout (mesh and rules), jax."""
    mesh = layout.mesh
    return (
        type(algo).__qualname__,
        repr(algo.config),
        algo.replicas,
        tuple(algo.swept),
        layout.rules,
        tuple(mesh.axis_names),
        tuple(mesh.devices.shape),
        tuple(int(d.id) for d in mesh.devices.flat),
        jax.__version__,
    )


def communication(algo, layout: Layout | Mesh) -> dict[str, dict[str, float]]:
    """Bytes per device of one compiled optimizer step of ``algo`` on a layout (or a mesh with
    the default rules), by mesh axis.

    ``{"data": {"always": b, "on_sync": c}, "model": {...}}``: ``always`` is sent every step,
    ``on_sync`` only on synchronising steps (the branch local/adaptive sync takes every K-th
    step); per update, ``optimizer_steps * always + syncs * on_sync``. Ops spanning several axes
    are keyed ``"data+model"``, ops whose axes are unknown ``"unknown"``. Counting convention and
    HLO parsing: ``rljax.diagnostics.hlo.collectives``.

    Costs one extra compile of ``algo.optimizer_step``; the result is memoised per process (by
    algorithm class, config, replicas, sharding rules, mesh axes, shape and devices, jax version),
    and each call returns a fresh copy.
    """
    if isinstance(layout, Mesh):
        layout = Layout(layout)
    key = _key(algo, layout)
    if key not in _MEASURED:
        _MEASURED[key] = _measure(algo, layout)
    return copy.deepcopy(_MEASURED[key])


def _measure(algo, layout: Layout) -> dict[str, dict[str, float]]:
    mesh = layout.mesh
    shardings = layout.shardings(algo.state_specs())
    with layout.active():
        abstract = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            jax.eval_shape(algo.init, jax.random.key(0)),
            shardings,
        )
        compiled = jax.jit(algo.optimizer_step).lower(abstract).compile()
    totals = {axis: {"always": 0.0, "on_sync": 0.0} for axis in mesh.axis_names}
    for op in collectives(compiled, mesh):
        axis = "+".join(op.axes) if op.axes else "unknown"
        entry = totals.setdefault(axis, {"always": 0.0, "on_sync": 0.0})
        entry["on_sync" if op.conditional else "always"] += op.sent_bytes * op.multiplicity
    return totals


def comm_bytes_per_update(comm: dict, optimizer_steps, syncs) -> dict[str, float]:
    """``communication(...)`` and one update's counts -> ``{"comm_bytes_<axis>": bytes}``."""
    return {
        f"comm_bytes_{axis}": float(optimizer_steps) * v["always"] + float(syncs) * v["on_sync"]
        for axis, v in comm.items()
    }


def describe(comm: dict) -> str:
    """``communication(...)`` as one line: ``"data 18,968, model 32,792"`` (bytes), with
    ``" (+N when syncing)"`` after an axis that sends more on synchronising steps."""
    parts = []
    for axis, v in comm.items():
        extra = f" (+{v['on_sync']:,.0f} when syncing)" if v["on_sync"] else ""
        parts.append(f"{axis} {v['always']:,.0f}{extra}")
    return ", ".join(parts)
