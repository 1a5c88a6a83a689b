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

``config.json`` keeps the run's original configuration (and ``provenance``: command line, start
time, rljax version, git commit) plus ``resumes``, one record per resume: time, command line, the
update it resumed from, ``changed`` (``{"algo.total_timesteps": {"old": ..., "new": ...}}``) and
``defaults`` (fields missing from the saved configuration, e.g. added to rljax since, and the
default value they took). The run's effective configuration (``read_run_config``) is the
original with every record's defaults and changes applied. A field missing from the saved
configuration takes its default; it blocks a resume only if the new value differs from it. A
field renamed since the run was saved (``RENAMED_FIELDS``) is read under its new name.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import types
import typing
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError, describe_os_error
from rljax.parallel import Layout
from rljax.parallel.rules import prepend_axis, rules_with
from rljax.run import compile_cache
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


CONFIG_NAME = "config.json"
_NOT_COMPARED = ("run.checkpointing.resume",)  # the resume itself


def _damaged(run_dir, path: Path, why: str, verb: str = "resume") -> ConfigError:
    return ConfigError(
        f"cannot {verb} {str(run_dir)!r}: {path} is damaged ({why}); nothing was changed. It "
        "holds the run's configuration: restore it from a backup or a copy of the run"
    )


def read_config_file(run_dir: str | Path, verb: str = "resume") -> dict:
    """``<run_dir>/config.json`` as written: the original configuration plus ``resumes``.
    ``ConfigError`` ("cannot <verb> <run_dir>: ...") naming the file when it is missing,
    unreadable or damaged."""
    path = Path(run_dir) / CONFIG_NAME
    if not Path(run_dir).is_dir():
        raise ConfigError(f"cannot {verb} {str(run_dir)!r}: no such run directory")
    if not path.exists():
        raise ConfigError(f"cannot {verb} {str(run_dir)!r}: no {path} (not an rljax run directory)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise _damaged(run_dir, path, "not UTF-8 text", verb) from None
    except OSError as error:
        raise ConfigError(
            f"cannot {verb} {str(run_dir)!r}: cannot read {path}: {describe_os_error(error)}"
        ) from None
    try:
        data = json.loads(text)
    except ValueError as error:
        raise _damaged(run_dir, path, f"not valid JSON: {error}", verb) from None
    if not isinstance(data, dict):
        raise _damaged(run_dir, path, f"a JSON {type(data).__name__}, not an object", verb)
    for section, kind in (("algorithm", str), ("algo", dict), ("run", dict)):
        if not isinstance(data.get(section), kind):
            raise _damaged(run_dir, path, f"no {section!r} section", verb)
    records = data.get("resumes", [])
    if not isinstance(records, list) or not all(
        isinstance(r, dict)
        and isinstance(r.get("changed", {}), dict)
        and isinstance(r.get("defaults", {}), dict)
        and all(isinstance(c, dict) and "new" in c for c in r.get("changed", {}).values())
        for r in records
    ):
        raise _damaged(run_dir, path, "its 'resumes' list is not a list of resume records", verb)
    return data


def _parent(tree: dict, dotted: str) -> tuple[dict, str]:
    """The dict holding ``dotted``'s last name (``{}`` where a parent is missing), and that name."""
    *parents, last = dotted.split(".")
    for part in parents:
        tree = tree.get(part)
        if not isinstance(tree, dict):
            return {}, last
    return tree, last


def _set_path(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        child = tree.get(part)
        if not isinstance(child, dict):
            child = tree[part] = {}
        tree = child
    tree[last] = value


# Config fields renamed since runs were first saved: old dotted name -> new dotted name.
RENAMED_FIELDS = {"algo.gru_width": "algo.recurrent_width"}


def effective_config(data: dict) -> dict:
    """The run's configuration now: ``data`` (``read_config_file``) with every resume record's
    defaults and changes applied in order, without ``resumes``, and every field of
    ``RENAMED_FIELDS`` under its new name."""
    out = copy.deepcopy({k: v for k, v in data.items() if k != "resumes"})
    for old, new in RENAMED_FIELDS.items():
        parent, name = _parent(out, old)
        if name in parent:
            _set_path(out, new, parent.pop(name))
    for record in data.get("resumes", []):
        for dotted, value in record.get("defaults", {}).items():
            _set_path(out, RENAMED_FIELDS.get(dotted, dotted), value)
        for dotted, change in record.get("changed", {}).items():
            _set_path(out, RENAMED_FIELDS.get(dotted, dotted), change["new"])
    return out


def read_run_config(run_dir: str | Path, verb: str = "resume") -> dict:
    """The effective configuration of the run in ``run_dir`` (``effective_config``)."""
    return effective_config(read_config_file(run_dir, verb))


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


def with_defaults(saved: dict, algo_cls) -> tuple[dict, dict]:
    """``({"algo": ..., "run": ...}, defaults)``: the saved sections with every field missing
    from them (added to the config classes since the run was saved) set to its default, nested
    as ``dataclasses.asdict`` writes them; ``defaults``: ``{"algo.kl_coef": 0.0, ...}``."""
    saved_algo, saved_run = saved.get("algo", {}), saved.get("run", {})
    algo = _json(dataclasses.asdict(config_from_dict(algo_cls, saved_algo)))
    run = _json(dataclasses.asdict(RunConfig.from_dict(saved_run)))
    defaults = {
        f"algo.{name}": value
        for name, value in _flatten(algo).items()
        if name not in _flatten(saved_algo)
    }
    saved_leaves = {name.rsplit(".", 1)[-1] for name in _flatten(saved_run)}  # nested or flat
    defaults.update(
        (f"run.{name}", value)
        for name, value in _flatten(run).items()
        if name.rsplit(".", 1)[-1] not in saved_leaves
    )
    return {"algo": algo, "run": run}, defaults


def incompatibilities(saved: dict, algorithm: str, algo_config, run_config) -> list[str]:
    """Differing fields (``"algo.env: 'CartPole-v1' -> 'Acrobot-v1'"``) that forbid a resume.
    ``saved``: the effective configuration (``read_run_config``); fields missing from it count
    as their defaults."""
    if saved.get("algorithm") != algorithm:
        return [f"algorithm: {saved.get('algorithm')!r} -> {algorithm!r}"]
    free_algo = resumable_fields(type(algo_config)) | set(RESUMABLE_ALGO_FIELDS)
    free_run = {name.rsplit(".", 1)[-1] for name in resumable_fields(RunConfig)}
    filled, _ = with_defaults(saved, type(algo_config))
    saved_run = RunConfig.from_dict(filled["run"])
    sections = (
        ("algo", _flatten(filled["algo"]), _flatten(_json(dataclasses.asdict(algo_config))),
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


def resume_record(data: dict, sections: dict, algo_cls, from_update: int) -> dict:
    """The record a resume appends to ``config.json``'s ``resumes``. ``data``: the file as
    written (``read_config_file``); ``sections``: what a fresh run would write now (``algo``,
    ``run``, ``mesh``, ...), JSON-ready. ``changed`` lists every field whose value differs from
    the effective configuration (dotted, ``algo``/``run`` leaf by leaf, other sections whole);
    ``defaults`` the fields that took their defaults."""
    from rljax.run.metadata import command_line, git_commit, rljax_version, utc_now

    effective = effective_config(data)
    filled, defaults = with_defaults(effective, algo_cls)
    old = {**_flatten({"algo": filled["algo"], "run": filled["run"]})}
    new = {**_flatten({"algo": _json(sections["algo"]), "run": _json(sections["run"])})}
    for name, value in sections.items():
        if name not in ("algo", "run"):
            old[name], new[name] = effective.get(name), _json(value)
    changed = {
        name: {"old": old.get(name), "new": value}
        for name, value in new.items()
        if name not in _NOT_COMPARED and old.get(name) != value
    }
    return {
        "time": utc_now(),
        "command_line": command_line(),
        "from_update": int(from_update),
        "changed": changed,
        "defaults": defaults,
        "rljax_version": rljax_version(),
        "git_commit": git_commit(),
    }


def describe_changes(record: dict) -> list[str]:
    """``["algo.total_timesteps: 1024 -> 2048", ...]`` of a resume record."""
    return [
        f"{name}: {json.dumps(c.get('old'))} -> {json.dumps(c['new'])}"
        for name, c in record.get("changed", {}).items()
    ]


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
    resize = compile_cache.jit_for(layout.mesh, "init")(  # it builds a state, as init does
        lambda s: resize_replicas(s, specs, algo.replicas),
        out_shardings=sharded_run.state_shardings,
    )
    with layout.active():
        return resize(old_state)
