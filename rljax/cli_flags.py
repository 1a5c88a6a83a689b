"""The flags of ``rljax train <algo>``, in help groups, and their conversion to configs.

Every leaf field of the algorithm config, of ``RunConfig`` and of ``DistributedConfig`` is one
flag under its own name (the names are unique across the three). ``command_type(name)`` builds a
tyro dataclass with one member per help group (algorithm, network, parallelism, run,
checkpoints, evaluation, logging, distributed); ``to_command`` / ``from_command`` map between it
and ``(algo config, RunConfig, DistributedConfig)``. Help texts are the fields' docstrings.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import textwrap
import typing
from typing import Annotated, Any

import tyro

from rljax import presets
from rljax.distributed import DistributedConfig
from rljax.networks.zoo import NetworkSettings
from rljax.run.config import RunConfig
from rljax.run.sharded import config_type_of

GROUPS = {
    "algorithm": "the algorithm's hyperparameters",
    "network": "network type, shapes and compute dtype",
    "parallelism": "devices, mesh and gradient synchronisation across data-parallel replicas",
    "run": "seeds, presets and what a non-finite value does",
    "checkpoints": "orbax checkpoints and resuming",
    "evaluation": "greedy evaluation on separate environments",
    "logging": "metrics, progress and the run directory",
    "distributed": "how this process joins a multi-process job (unset: from the environment)",
}
NETWORK_FIELDS = {
    "actor_widths",
    "critic_widths",
    "torso_widths",
    "q_widths",
    "activation",
    "dueling",
} | {f.name for f in dataclasses.fields(NetworkSettings)}
RUN_GROUPS = {
    "parallel": "parallelism",
    "logging": "logging",
    "checkpointing": "checkpoints",
    "faults": "run",
    "evaluation": "evaluation",
}
# DistributedConfig.num_cpu_devices is the same setting as --num-devices (which the CLI passes
# on to it): one flag for one thing.
HIDDEN = {("distributed", "num_cpu_devices")}
PRESET_HELP = "named settings applied before the flags (`rljax presets` lists them)."
DRY_RUN_HELP = "print the memory plan (as `rljax plan`) instead of training."


@dataclasses.dataclass(frozen=True)
class Flag:
    """One flag: ``path`` into (algo, run, distributed), e.g. ``("run", "parallel", "mesh")``."""

    name: str
    path: tuple[str, ...]
    group: str
    type: Any
    help: str


def field_docs(cls) -> dict[str, str]:
    """``{field: docstring}`` of a dataclass (the string literal after each field), whitespace
    collapsed; fields without one are missing."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass) or klass is object:
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body
        for node, after in zip(body, body[1:], strict=False):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _leaves(cls, path: tuple[str, ...], group_of) -> list[Flag]:
    hints = typing.get_type_hints(cls)
    docs = field_docs(cls)
    out = []
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if dataclasses.is_dataclass(kind):
            out += _leaves(kind, (*path, f.name), group_of)
        elif (*path, f.name) not in HIDDEN:
            out.append(
                Flag(f.name, (*path, f.name), group_of(path, f.name), kind, docs.get(f.name, ""))
            )
    return out


def _group_of(path: tuple[str, ...], name: str) -> str:
    root = path[0]
    if root == "algo":
        if len(path) > 1:  # the sync config
            return "parallelism"
        return "network" if name in NETWORK_FIELDS else "algorithm"
    if root == "run":
        return RUN_GROUPS[path[1]] if len(path) > 1 else "run"
    return "distributed"


@functools.cache
def flags_of(algorithm: str) -> tuple[Flag, ...]:
    """Every flag of ``rljax train <algorithm>``, in help order."""
    config_type = config_type_of(algorithm)
    flags = (
        _leaves(config_type, ("algo",), _group_of)
        + _leaves(RunConfig, ("run",), _group_of)
        + _leaves(DistributedConfig, ("distributed",), _group_of)
    )
    names = presets.names_for(algorithm)
    help_ = f"{PRESET_HELP[:-1]}; for {algorithm}: {', '.join(names) or 'none'}."
    flags.append(Flag("preset", ("preset",), "run", str | None, help_))
    flags.append(Flag("dry_run", ("dry_run",), "run", bool, DRY_RUN_HELP))
    names = [f.name for f in flags]
    assert len(names) == len(set(names)), "flag names must be unique"
    order = list(GROUPS)  # within parallelism: the mesh before the gradient sync
    return tuple(sorted(flags, key=lambda f: (order.index(f.group), f.path[0] != "run")))


@functools.cache
def command_type(algorithm: str) -> type:
    """The tyro dataclass of ``rljax train <algorithm>``: one member per help group."""
    defaults = _values(algorithm, config_type_of(algorithm)(), RunConfig(), DistributedConfig())
    members = []
    for group, description in GROUPS.items():
        fields = [
            (
                f.name,
                Annotated[f.type, tyro.conf.arg(help=f.help)],
                dataclasses.field(default=defaults[f.name]),
            )
            for f in flags_of(algorithm)
            if f.group == group
        ]
        group_cls = dataclasses.make_dataclass(group.capitalize(), fields, frozen=True)
        members.append(
            (
                group,
                Annotated[group_cls, tyro.conf.arg(help=description)],
                dataclasses.field(default=group_cls()),
            )
        )
    cls = dataclasses.make_dataclass(f"{algorithm.capitalize()}Command", members, frozen=True)
    summary = (config_type_of(algorithm).__doc__ or "").strip().splitlines()
    cls.__doc__ = f"Train {algorithm}" + (f": {summary[0]}" if summary else ".")
    return cls


def _get(root, path: tuple[str, ...]):
    for name in path:
        root = getattr(root, name)
    return root


def _values(algorithm: str, algo, run, distributed, preset: str | None = None) -> dict[str, Any]:
    roots = {"algo": algo, "run": run, "distributed": distributed}
    out = {}
    for f in flags_of(algorithm):
        if f.path == ("preset",):
            out[f.name] = preset
        elif f.path == ("dry_run",):
            out[f.name] = False
        else:
            out[f.name] = _get(roots[f.path[0]], f.path[1:])
    return out


def to_command(algorithm: str, algo, run, distributed=None, preset: str | None = None):
    """The command instance holding these configs (the defaults tyro shows and starts from)."""
    cls = command_type(algorithm)
    values = _values(algorithm, algo, run, distributed or DistributedConfig(), preset)
    groups = {}
    for f in dataclasses.fields(cls):
        group_cls = typing.get_args(f.type)[0] if typing.get_args(f.type) else f.type
        names = [g.name for g in dataclasses.fields(group_cls)]
        groups[f.name] = group_cls(**{n: values[n] for n in names})
    return cls(**groups)


def _rebuild(base, items: dict[tuple[str, ...], Any]):
    """``base`` (a dataclass) with the leaves at ``items``' paths replaced."""
    top = {p[0]: v for p, v in items.items() if len(p) == 1}
    nested: dict[str, dict] = {}
    for p, v in items.items():
        if len(p) > 1:
            nested.setdefault(p[0], {})[p[1:]] = v
    for name, sub in nested.items():
        top[name] = _rebuild(getattr(base, name), sub)
    return dataclasses.replace(base, **top)


def from_command(algorithm: str, command) -> tuple[Any, RunConfig, DistributedConfig]:
    """``(algo config, RunConfig, DistributedConfig)`` of a parsed command; ``--num-devices``
    also emulates the CPU devices before a multi-process job starts."""
    parts: dict[str, dict] = {"algo": {}, "run": {}, "distributed": {}}
    for f in flags_of(algorithm):
        if f.path[0] in parts:
            parts[f.path[0]][f.path[1:]] = getattr(getattr(command, f.group), f.name)
    algo = _rebuild(config_type_of(algorithm)(), parts["algo"])
    run = _rebuild(RunConfig(), parts["run"])
    distributed = _rebuild(DistributedConfig(), parts["distributed"])
    if run.parallel.num_devices is not None:
        distributed = dataclasses.replace(distributed, num_cpu_devices=run.parallel.num_devices)
    return algo, run, distributed


def preset_of(command) -> str | None:
    return command.run.preset


def dry_run_of(command) -> bool:
    return bool(command.run.dry_run)
