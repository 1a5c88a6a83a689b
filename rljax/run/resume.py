"""Resuming a run: saved configs back to dataclasses, compatibility, and elastic restore.

What may change on resume: the fields declared ``metadata={"resumable": True}``
(``resumable_fields``): the algorithm's ``total_timesteps`` (PPO's learning-rate annealing and
PER's beta schedule follow the new total), and of ``RunConfig`` everything about logging,
checkpointing, evaluation and faults and the mesh (``mesh``, ``num_devices``). Everything else of
the algorithm config, the algorithm itself, ``num_seeds`` and ``seed_axis`` must match; a
mismatch is one error listing every differing field.

Elastic restore. Parameters, optimizer moments, environment states and observations, replay
buffers, RNG keys and counters are restored exactly onto any mesh whose data size divides the
environment batch. The number of data-parallel replicas is the data size, so when it changes:
per-replica state (``local_sgd``/``adaptive`` parameters and moments, ``compressed`` residuals) is
averaged over the old replicas and given to every new one (a synchronisation; averaging residuals
keeps their replica mean, which is what error feedback adds back); each replica then owns
``num_envs / data`` environments and replay rows, and the minibatch shuffles and replay sampling
draw per-replica random streams. So the run continues correctly but not bitwise like one that
stayed on the old data size. Changing only ``model`` changes nothing numerically.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel import Layout
from rljax.parallel.rules import prepend_axis, rules_with
from rljax.run.config import RunConfig, resumable_fields
from rljax.run.sharded import ShardedRun

# Fallback until the algorithm configs declare it (``metadata={"resumable": True}``).
RESUMABLE_ALGO_FIELDS = ("total_timesteps",)


def config_from_dict(cls, data: dict):
    """A (frozen) config dataclass from its ``dataclasses.asdict`` JSON form (nested configs and
    tuples restored; unknown keys rejected)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = set(data) - names
    if unknown:
        raise ConfigError(f"saved {cls.__name__} has unknown fields {sorted(unknown)}")
    values = {}
    for name, value in data.items():
        hint = hints[name]
        if dataclasses.is_dataclass(hint) and isinstance(value, dict):
            value = config_from_dict(hint, value)
        elif _is_tuple_hint(hint) and isinstance(value, list):
            value = tuple(value)
        values[name] = value
    return cls(**values)


def _is_tuple_hint(hint) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_is_tuple_hint(a) for a in typing.get_args(hint))
    return origin is tuple or hint is tuple


def read_run_config(run_dir: str | Path) -> dict:
    path = Path(run_dir) / "config.json"
    if not path.exists():
        raise ConfigError(f"cannot resume {str(run_dir)!r}: no {path} (not an rljax run directory)")
    return json.loads(path.read_text())


def _flatten(data: dict, prefix: str = "") -> dict:
    out = {}
    for name, value in data.items():
        if isinstance(value, dict):
            out.update(_flatten(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out


def _json(value):
    return json.loads(json.dumps(value))


def incompatibilities(saved: dict, algorithm: str, algo_config, run_config) -> list[str]:
    """Differing fields (``"algo.env: 'CartPole-v1' -> 'Acrobot-v1'"``) that forbid a resume."""
    if saved.get("algorithm") != algorithm:
        return [f"algorithm: {saved.get('algorithm')!r} -> {algorithm!r}"]
    free_algo = resumable_fields(type(algo_config)) | set(RESUMABLE_ALGO_FIELDS)
    free_run = {name.rsplit(".", 1)[-1] for name in resumable_fields(RunConfig)}
    saved_run = RunConfig.from_dict(saved.get("run", {}))  # nested or an older flat dict
    sections = (
        ("algo", _flatten(saved.get("algo", {})), _flatten(_json(dataclasses.asdict(algo_config))),
         free_algo),
        ("run", _json(saved_run.flat()), _json(run_config.flat()), free_run),
    )  # fmt: skip
    out = []
    for section, old_values, current, free in sections:
        for name in sorted(set(old_values) | set(current)):
            if name in free or name.split(".", 1)[0] in free:
                continue
            old, new = old_values.get(name, "<missing>"), current.get(name, "<missing>")
            if old != new:
                out.append(f"{section}.{name}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def check_compatible(saved: dict, algorithm: str, algo_config, run_config) -> None:
    problems = incompatibilities(saved, algorithm, algo_config, run_config)
    if problems:
        free = sorted(resumable_fields(type(algo_config)) | set(RESUMABLE_ALGO_FIELDS))
        raise ConfigError(
            "cannot resume: the run was saved with a different configuration ("
            + "; ".join(problems)
            + "). Only these may change on resume: algo."
            + ", algo.".join(free)
            + "; mesh, num_devices, logging, checkpoint, evaluation and fault settings"
        )


def _is_spec(x) -> bool:
    return isinstance(x, PartitionSpec)


def resize_replicas(state, logical_specs, replicas: int):
    """Per-replica leaves (logical axis ``"replica"``) averaged over the old replicas and
    broadcast to ``replicas``; integer leaves take replica 0's value. Other leaves unchanged."""

    def resize(x, spec):
        if "replica" not in tuple(spec):
            return x
        axis = tuple(spec).index("replica")
        if jnp.issubdtype(x.dtype, jnp.floating):
            one = jnp.mean(x, axis=axis, keepdims=True).astype(x.dtype)
        else:
            one = jax.lax.slice_in_dim(x, 0, 1, axis=axis)
        shape = list(x.shape)
        shape[axis] = replicas
        return jnp.broadcast_to(one, tuple(shape))

    return jax.tree.map(resize, state, logical_specs)


def abstract_state(sharded_run) -> Any:
    """``ShapeDtypeStruct`` with sharding of every leaf of ``sharded_run``'s state."""
    return sharded_run.abstract_state()


def restore_step(ckpt, step: int, sharded_run):
    """Checkpoint ``step`` placed on ``sharded_run``'s layout. When the replica count changed
    (see the module doc) the saved layout is read with the same algorithm rebuilt for the saved
    replica count, its ``replica`` axis unsharded, then resized."""
    algo = sharded_run.algo
    saved_replicas = ckpt.read_metadata(step).get("replicas", algo.replicas)
    if saved_replicas == algo.replicas:
        state, _ = ckpt.restore(step, sharded_run.abstract_state())
        return state
    old_algo = algo.rebuild(replicas=saved_replicas)
    layout = sharded_run.layout
    old_layout = Layout(layout.mesh, rules_with(layout.rules, replica=None))
    old_run = ShardedRun(old_algo, old_layout, sharded_run.num_seeds, sharded_run.chunk_size)
    old_state, _ = ckpt.restore(step, old_run.abstract_state())
    specs = old_algo.state_specs()
    if sharded_run.num_seeds > 1:
        specs = prepend_axis(specs, "seed")
    resize = jax.jit(
        lambda s: resize_replicas(s, specs, algo.replicas),
        out_shardings=sharded_run.state_shardings,
    )
    with layout.active():
        return resize(old_state)
