"""Resuming a run: saved configs back to dataclasses, compatibility, and elastic restore.

What may change on resume: ``total_timesteps`` (PPO's learning-rate annealing and PER's beta
schedule follow the new total), everything about logging and checkpointing (``log_every``,
``checkpoint_every``, ``keep_checkpoints``, ``quiet``, ``measure_comm``) and the mesh
(``mesh``, ``num_devices``). Everything else of the algorithm config, the algorithm itself,
``num_seeds`` and ``seed_axis`` must match; a mismatch is one error listing every differing field.

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

RESUMABLE_ALGO_FIELDS = ("total_timesteps",)
RESUMABLE_RUN_FIELDS = (
    "mesh",
    "num_devices",
    "log_every",
    "checkpoint_every",
    "keep_checkpoints",
    "quiet",
    "measure_comm",
    "resume",
    "run_name",
    "runs_dir",
    "on_nonfinite",
    "max_rollbacks",
    "debug_nonfinite_at",
    "seed",  # the key lives in the checkpoint; the seed only made the initial state
    "tensorboard",
    "wandb",
    "wandb_project",
    "eval_every",
    "eval_episodes",
)


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


def incompatibilities(saved: dict, algorithm: str, algo_config, run_config) -> list[str]:
    """Differing fields (``"algo.env: 'CartPole-v1' -> 'Acrobot-v1'"``) that forbid a resume."""
    out = []
    if saved.get("algorithm") != algorithm:
        out.append(f"algorithm: {saved.get('algorithm')!r} -> {algorithm!r}")
        return out
    current_algo = json.loads(json.dumps(dataclasses.asdict(algo_config)))
    current_run = json.loads(json.dumps(dataclasses.asdict(run_config)))
    for section, current, free in (
        ("algo", current_algo, RESUMABLE_ALGO_FIELDS),
        ("run", current_run, RESUMABLE_RUN_FIELDS),
    ):
        saved_section = saved.get(section, {})
        for name in sorted(set(saved_section) | set(current)):
            if name in free:
                continue
            old, new = saved_section.get(name, "<missing>"), current.get(name, "<missing>")
            if old != new:
                out.append(f"{section}.{name}: {json.dumps(old)} -> {json.dumps(new)}")
    return out


def check_compatible(saved: dict, algorithm: str, algo_config, run_config) -> None:
    problems = incompatibilities(saved, algorithm, algo_config, run_config)
    if problems:
        raise ConfigError(
            "cannot resume: the run was saved with a different configuration ("
            + "; ".join(problems)
            + "). Only these may change on resume: algo."
            + ", algo.".join(RESUMABLE_ALGO_FIELDS)
            + "; mesh, num_devices, logging and checkpoint settings"
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
    shapes = jax.eval_shape(sharded_run._init_from_seed_key, jax.random.key(0))
    return jax.tree.map(
        lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
        shapes,
        sharded_run.state_shardings,
    )
