"""``RunConfig``: where and how a run executes, in groups; flat flags on the command line.

    RunConfig.make(mesh="data=2,model=2", eval_every=0, quiet=True)   # flat names -> groups
    run.parallel.mesh, run.logging.log_every, run.checkpointing.resume, ...

Every leaf field is a flag under its own name (``--mesh``, ``--eval-every``, ``--resume``: the CLI
omits the group prefixes). Fields that may change when a run is resumed carry
``metadata={"resumable": True}``; ``resumable_fields`` reads that from any config dataclass.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any, Literal

from rljax.errors import ConfigError
from rljax.parallel.mesh import DEFAULT_MESH
from rljax.run.run_dir import check_run_name, check_seed, check_writable_dir

RESUMABLE = {"resumable": True}


def _resumable(default):
    return dataclasses.field(default=default, metadata=RESUMABLE)


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    """Devices and the mesh."""

    mesh: str = _resumable(DEFAULT_MESH)
    """device mesh over the axes data (batch, replicas), fsdp (batch, and parameters/moments
    split ZeRO-3 style) and model (tensor parallel), e.g. 'data=2,fsdp=2,model=2'; an axis left
    out has size 1; one may be -1 (all remaining devices)."""
    num_devices: int | None = _resumable(None)
    """emulate this many CPU devices (must be set before JAX starts)."""
    seed_axis: Literal["none", "data"] = "none"
    """'data' places the seeds on the data axis (each seed's envs then stay on one data shard)."""
    seed_group: int = _resumable(0)
    """seeds a device trains at a time: a device's seeds run group after group inside each
    compiled chunk, each group vmapped. 0: auto (CPU: 8, so that a group's arrays stay in cache;
    other backends: all of them at once). It never changes the results."""
    actor_mesh: str | None = None
    """actor-learner layout: the actors' mesh (rollouts), e.g. 'data=2'; with --learner-mesh,
    on disjoint devices (PPO only; instead of --mesh)."""
    learner_mesh: str | None = None
    """actor-learner layout: the learner's mesh (GAE and SGD), e.g. 'fsdp=2,model=3'."""
    max_staleness: int = 0
    """actor-learner layout: rollouts use parameters at most this many learner updates old
    (0: synchronous, equal to single-mesh PPO; >= 1: acting overlaps learning)."""
    compile_cache: str = _resumable("auto")
    """persistent XLA compilation cache: a directory, 'auto' (JAX_COMPILATION_CACHE_DIR when
    set, else ~/.cache/rljax/xla) or 'off'. The same program compiled again on this machine (a
    repeated run, a resume) is loaded instead; what it computes never changes."""
    memory_per_device: str | None = _resumable(None)
    """memory a device may use (16GB, 512MiB, 2e9): a run needing more stops before training
    (default: the device's own limit; none on CPU)."""


@dataclasses.dataclass(frozen=True)
class LoggingConfig:
    """Metrics, progress and where the run directory is."""

    log_every: int = _resumable(25)
    """updates per jitted chunk; progress and metrics are written between chunks."""
    run_name: str | None = _resumable(None)
    """run directory name under runs_dir (default: <algo>-<env>-<time>): letters, digits, '.',
    '_', '-', not starting with '.'."""
    runs_dir: str = _resumable("runs")
    """parent directory of run directories."""
    overwrite: bool = _resumable(False)
    """replace an existing run directory of the same name (without it a fresh run refuses to
    touch one); its contents are removed only after every check passed. Ignored with resume."""
    quiet: bool = _resumable(False)
    """print nothing (files are still written)."""
    measure_comm: bool = _resumable(False)
    """count the collectives of one compiled optimizer step; log bytes per update (one compile)."""
    tensorboard: bool = _resumable(False)
    """also write metrics as TensorBoard events to <run dir>/tensorboard (needs tensorboardX)."""
    wandb: bool = _resumable(False)
    """also log metrics to Weights & Biases, offline unless WANDB_MODE says otherwise (needs
    wandb; files under <run dir>/wandb, upload later with `wandb sync`)."""
    wandb_project: str = _resumable("rljax")
    """Weights & Biases project."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    """Orbax checkpoints and resuming."""

    checkpoint_every: int = _resumable(100)
    """updates between orbax checkpoints (at chunk ends; also at the end and on SIGTERM)."""
    checkpoint_min_seconds: float = _resumable(30.0)
    """a periodic checkpoint is skipped while the last save is younger than this (wall clock);
    0: every checkpoint_every updates. The end of the run and a stop request always save."""
    keep_checkpoints: int = _resumable(3)
    """newest checkpoints kept."""
    resume: str | None = _resumable(None)
    """run directory to continue from its newest valid checkpoint, e.g. runs/<name>."""
    init_from: str | None = _resumable(None)  # used by a fresh run only; a resume ignores it
    """start a new run from the parameters of another run's newest valid checkpoint (another
    mesh or environment; the copied parameters' shapes must match), e.g. runs/<name>."""
    init_part: Literal["all", "torso"] = _resumable("all")
    """with init_from: all parameters, or the torso (every parameter outside the output heads,
    which keep their fresh initialisation)."""


@dataclasses.dataclass(frozen=True)
class FaultConfig:
    """What a non-finite loss, gradient or parameter does."""

    on_nonfinite: Literal["stop", "rollback"] = _resumable("stop")
    """NaN/Inf loss, gradient or parameters: stop, or roll back to the last checkpoint."""
    max_rollbacks: int = _resumable(3)
    """rollbacks before a non-finite value stops the run."""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Greedy evaluation on separate environments."""

    eval_every: int = _resumable(100)
    """updates between greedy evaluations on separate environments (0: off)."""
    eval_episodes: int = _resumable(8)
    """evaluation environments (one episode each), sharded like the training batch."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Where and how a run executes (not part of the algorithm's maths)."""

    seed: int = _resumable(0)  # the key lives in the checkpoint; the seed only made the start
    """seed of the initial state (and of evaluation)."""
    num_seeds: int = 1
    """independent seeds vmapped inside one jit."""
    parallel: ParallelConfig = ParallelConfig()
    """devices and mesh."""
    logging: LoggingConfig = LoggingConfig()
    """metrics, progress, run directory."""
    checkpointing: CheckpointConfig = CheckpointConfig()
    """checkpoints and resume."""
    faults: FaultConfig = FaultConfig()
    """non-finite values."""
    evaluation: EvalConfig = EvalConfig()
    """greedy evaluation."""

    @classmethod
    def make(cls, **flat: Any) -> RunConfig:
        """``RunConfig.make(mesh="data=2", eval_every=0)``: flat field names routed to groups."""
        return cls().replace(**flat)

    def replace(self, **flat: Any) -> RunConfig:
        """A copy with flat fields (``mesh=...``) or whole groups (``parallel=...``) replaced."""
        groups = _groups()
        top: dict[str, Any] = {}
        nested: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            if name in groups or name in _TOP_LEVEL:
                top[name] = value
            elif name in _FLAT:
                nested.setdefault(_FLAT[name], {})[name] = value
            else:
                raise ConfigError(
                    f"RunConfig has no field {name!r}; fields: {', '.join(sorted(_all_names()))}"
                )
        for group, values in nested.items():
            top[group] = dataclasses.replace(top.get(group, getattr(self, group)), **values)
        return dataclasses.replace(self, **top)

    def flat(self) -> dict[str, Any]:
        """``{"seed": 0, "mesh": ..., "eval_every": ...}``: every leaf under its flag name."""
        out = {name: getattr(self, name) for name in _TOP_LEVEL}
        for group in _groups():
            out.update(
                {
                    f.name: getattr(getattr(self, group), f.name)
                    for f in dataclasses.fields(getattr(self, group))
                }
            )
        return out

    @classmethod
    def from_dict(cls, data: dict) -> RunConfig:
        """From ``dataclasses.asdict`` JSON, nested (this version) or flat (older runs' saved
        ``config.json``); fields that no longer exist (``debug_nonfinite_at``) are dropped."""
        groups = _groups()
        flat: dict[str, Any] = {}
        for name, value in data.items():
            if name in groups and isinstance(value, dict):
                flat.update(value)
            else:
                flat[name] = value
        known = _all_names()
        return cls.make(**{k: v for k, v in flat.items() if k in known})


def _groups() -> dict[str, type]:
    hints = typing.get_type_hints(RunConfig)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(RunConfig)
        if dataclasses.is_dataclass(hints[f.name])
    }


_TOP_LEVEL = ("seed", "num_seeds")
_FLAT = {f.name: group for group, cls in _groups().items() for f in dataclasses.fields(cls)}


def _all_names() -> set[str]:
    return set(_TOP_LEVEL) | set(_FLAT)


def resumable_fields(config_cls) -> frozenset[str]:
    """Dotted paths of the fields of ``config_cls`` (nested dataclasses walked) that carry
    ``metadata={"resumable": True}``; a resumable nested dataclass counts as a whole."""
    out: set[str] = set()
    hints = typing.get_type_hints(config_cls)
    for f in dataclasses.fields(config_cls):
        if f.metadata.get("resumable"):
            out.add(f.name)
        elif dataclasses.is_dataclass(hints.get(f.name)):
            out |= {f"{f.name}.{sub}" for sub in resumable_fields(hints[f.name])}
    return frozenset(out)


def sweepable_fields(config_cls) -> tuple[str, ...]:
    """Fields of ``config_cls`` with ``metadata={"sweepable": True}`` (floats held as traced
    hyperparameters by the algorithm), in declaration order."""
    return tuple(f.name for f in dataclasses.fields(config_cls) if f.metadata.get("sweepable"))


# Emulated CPU devices share this host's cores and memory; JAX builds them all at start-up with
# no output (100,000 grew memory by 55 MB/s until killed). 1024 is far above any useful mesh.
MAX_CPU_DEVICES = 1024


def check_num_devices(n: int | None, flag: str = "num_devices") -> None:
    """``n`` emulated CPU devices must be in ``[1, MAX_CPU_DEVICES]`` (``None``: not set);
    checked before JAX creates any device."""
    if n is None:
        return
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_CPU_DEVICES:
        raise ConfigError(
            f"{flag}={n!r} emulated CPU devices: allowed are 1 to {MAX_CPU_DEVICES} (they share "
            "this host's cores and memory)"
        )


def validate_run(run: RunConfig, layout) -> None:
    """Every ``ConfigError`` of ``run`` on a ``Layout``, before anything is written or
    compiled."""
    from rljax.run import compile_cache  # noqa: PLC0415 (rljax.run imports this module)
    from rljax.run.memory import parse_bytes  # noqa: PLC0415

    values = run.flat()
    check_seed(run.seed)
    compile_cache.check(run.parallel.compile_cache)
    if run.parallel.memory_per_device is not None:
        parse_bytes(run.parallel.memory_per_device)
    if not run.checkpointing.resume:  # a resume writes into its own directory only
        if run.logging.run_name is not None:
            check_run_name(run.logging.run_name)
        check_writable_dir(run.logging.runs_dir, "runs_dir")
    for name in ("num_seeds", "log_every", "checkpoint_every", "keep_checkpoints"):
        if values[name] < 1:
            raise ConfigError(f"{name} must be >= 1, got {values[name]}")
    if not run.checkpointing.checkpoint_min_seconds >= 0:
        raise ConfigError(
            "checkpoint_min_seconds must be >= 0 (0: save every checkpoint_every updates), got "
            f"{run.checkpointing.checkpoint_min_seconds}"
        )
    if run.faults.max_rollbacks < 0:
        raise ConfigError(f"max_rollbacks must be >= 0, got {run.faults.max_rollbacks}")
    ev = run.evaluation
    if ev.eval_every < 0:
        raise ConfigError(f"eval_every must be >= 0 (0: no evaluation), got {ev.eval_every}")
    shards = layout.shards("batch")
    if ev.eval_every and (ev.eval_episodes < 1 or ev.eval_episodes % shards):
        raise ConfigError(
            f"eval_episodes={ev.eval_episodes} must be a positive multiple of the {shards} "
            "data-parallel shards (evaluation environments are sharded like the training batch)"
        )
    optional = {"tensorboard": "tensorboardX", "wandb": "wandb"}  # flag = the rljax extra
    for flag, module in optional.items():
        if values[flag]:
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(
                    f"--{flag} needs {module}: pip install 'rljax[{flag}]' "
                    f"(or pip install {module})"
                ) from None
    seed_shards = layout.shards("seed")
    if run.num_seeds % seed_shards:
        raise ConfigError(
            f"seed_axis={run.parallel.seed_axis!r} needs num_seeds ({run.num_seeds}) divisible "
            f"by the {run.parallel.seed_axis} axis size {seed_shards}"
        )
    check_seed_group(run.parallel.seed_group, run.num_seeds // seed_shards)


def check_seed_group(seed_group: int, seeds_per_device: int) -> None:
    """``seed_group`` is 0 (auto) or divides the seeds each device trains."""
    if seed_group < 0 or (seed_group and seeds_per_device % seed_group):
        raise ConfigError(
            f"seed_group={seed_group} must be 0 (auto) or divide the {seeds_per_device} seeds "
            "each device trains (num_seeds / the seed axis size)"
        )
