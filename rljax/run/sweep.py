"""Hyperparameter sweeps inside one jit: settings x seeds as vmapped members.

    grid = {"lr": [1e-4, 2.5e-4, 1e-3], "ent_coef": [0.0, 0.01]}
    result = sweep(PPOConfig(), grid, seeds=[0, 1, 2])
    print(result.table)                  # final return mean/std per setting

The grid's product of settings times the seeds gives ``S`` members, trained together by one
compiled chunk program (``ShardedRun`` with ``num_seeds = S``, run by the same ``Loop`` as
``train``, its members on the seed axis). Only float fields that the algorithm can hold in its
state as traced ``hparams`` can be swept (fields with ``metadata={"sweepable": True}``: PPO lr,
gamma, gae_lambda, clip_eps, ent_coef, vf_coef; DQN lr, gamma, tau); everything else changes
shapes or the program. Member ``(setting, seed)`` starts from ``jax.random.key(seed)``
with that setting's values, so it equals a single run with ``RunConfig(seed=seed)`` and the
config changed to the setting. ``RunConfig.make(seed_axis="data")`` places the members on the
data axis of the mesh (``S`` divisible by its size).

``sweep_groups`` (``rljax sweep``) runs one such program per combination of the values of the
other fields (shapes, programs), one after another, and writes a results table of all of them.

Written per setting: ``<run dir>/<setting>/metrics.jsonl`` (seed mean and per-seed returns per
update), plus ``summary.json``, ``summary.md`` and ``sweep.png`` in the run directory.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from rljax.errors import ConfigError
from rljax.run import compile_cache
from rljax.run.config import RunConfig
from rljax.run.loop import ChunkInfo, Loop
from rljax.run.run_log import RunLog, default_run_name
from rljax.run.sharded import (
    ShardedRun,
    algorithm_name,
    prepare,
    resolve_algorithm,
)


@dataclasses.dataclass
class SweepResult:
    settings: list[dict[str, float]]
    seeds: list[int]
    returns: np.ndarray  # [updates, settings, seeds]: training episode return per update
    final_return: np.ndarray  # [settings, seeds]: mean over the last 5% of updates
    run_dir: Path
    table: str
    steps_per_second: float


def settings_of(algorithm, grid: Mapping[str, Sequence[float]]) -> list[dict[str, float]]:
    """The grid's settings (product, in the given field order), validated; ``algorithm``: a
    config, instance or class as ``train`` takes."""
    algo_cls, algo_config = resolve_algorithm(algorithm)
    name = algorithm_name(algo_cls)
    sweepable = algo_cls.sweepable()
    if not grid:
        raise ConfigError(f"empty sweep grid; give values for some of {', '.join(sweepable)}")
    fields = {f.name for f in dataclasses.fields(algo_config)}
    for field, values in grid.items():
        if field not in fields:
            raise ConfigError(
                f"sweep field {field!r} is not a {type(algo_config).__name__} field; sweepable "
                f"float fields of {name}: {', '.join(sweepable)}"
            )
        if field not in sweepable:
            raise ConfigError(
                f"sweep field {field!r} cannot be swept in one jit (it is not a float "
                f"hyperparameter held in the training state); sweepable fields of {name}: "
                f"{', '.join(sweepable)}"
            )
        if isinstance(values, (str, bytes)) or len(values) == 0:
            raise ConfigError(f"sweep field {field!r} has no values; give a non-empty list")
        for value in values:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"sweep field {field!r}: value {value!r} is not a number")
    settings = [
        dict(zip(grid, (float(v) for v in combo), strict=True))
        for combo in itertools.product(*grid.values())
    ]
    for setting in settings:
        algo_cls.validate(dataclasses.replace(algo_config, **setting))
    return settings


def label(setting: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in setting.items())


def sweep(
    algorithm,
    grid: Mapping[str, Sequence[float]],
    seeds: Sequence[int] = (0,),
    run: RunConfig | None = None,
    progress=print,
) -> SweepResult:
    """Train every setting of ``grid`` x ``seeds`` in one compiled program; see the module doc."""
    run = run or RunConfig()
    settings = settings_of(algorithm, grid)
    algo_cls, algo_config = resolve_algorithm(algorithm)
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ConfigError("sweep needs at least one seed")
    members = [(i, seed) for i in range(len(settings)) for seed in seeds]
    run = run.replace(num_seeds=len(members))
    if len(members) < 2:
        raise ConfigError("a sweep needs at least 2 members (settings x seeds)")
    layout, algo = prepare(algorithm, run, swept=tuple(settings[0]))
    mesh = layout.mesh
    name = algorithm_name(algo_cls)
    default_name = default_run_name(f"{name}-sweep", algo_config.env)
    run_dir = Path(run.logging.runs_dir) / (run.logging.run_name or default_name)
    say = (lambda *a, **k: None) if run.logging.quiet else progress
    num_updates, per_update = algo_config.num_updates, algo_config.env_steps_per_update
    chunk = min(run.logging.log_every, num_updates)
    sharded = ShardedRun(algo, layout, len(members), chunk, run.parallel.seed_group)
    keys = jnp.stack([jax.random.key_data(jax.random.key(seed)) for _, seed in members])
    keys = jax.random.wrap_key_data(keys)
    hparams = {
        field: jnp.asarray([settings[i][field] for i, _ in members], jnp.float32)
        for field in settings[0]
    }
    say(
        f"rljax {name} sweep on {algo_config.env}: {len(settings)} settings x {len(seeds)} seeds "
        f"= {len(members)} members in one jit, mesh {dict(mesh.shape)}, {num_updates} updates"
    )
    compile_cache.use(run.parallel.compile_cache)
    sharded.compile(jax.random.key(0))  # compile time stays out of steps/s
    initial = sharded.init_members(keys, hparams)
    jax.block_until_ready(initial)
    chunks: list[dict[str, np.ndarray]] = []

    def collect(info: ChunkInfo) -> None:  # per-member metrics [updates, S], before seed means
        chunks.append(info.metrics)
        latest = np.asarray(info.metrics["episode_return"][-1])
        latest = latest.reshape(len(settings), len(seeds))
        best = int(np.argmax(latest.mean(1)))
        say(
            f"  update {info.update:>6}/{num_updates}  best {label(settings[best])}: "
            f"{latest[best].mean():.1f}"
        )

    loop = Loop(sharded, num_updates, per_update)
    loop.add_hook(collect, reads_state=False)
    loop.run(initial)
    metrics = jax.tree.map(lambda *m: np.concatenate(m), *chunks)  # [updates, S]
    returns = np.asarray(metrics["episode_return"]).reshape(num_updates, len(settings), len(seeds))
    tail = max(1, round(num_updates * 0.05))
    final = returns[-tail:].mean(0)  # [settings, seeds]: the experiments' definition
    _write(run_dir, settings, seeds, metrics, per_update, algo_config, run)
    table = _table(settings, final)
    _write_summary(run_dir, settings, seeds, final, returns, per_update, table)
    say(table)
    return SweepResult(settings, seeds, returns, final, run_dir, table, loop.steps_per_second())


def _write(run_dir, settings, seeds, metrics, per_update, algo_config, run) -> None:
    n_settings, n_seeds = len(settings), len(seeds)
    for i, setting in enumerate(settings):
        log = RunLog(run_dir / label(setting))
        log.write_config(
            algo=dataclasses.replace(algo_config, **setting), run=run, setting=setting, seeds=seeds
        )
        rows = []
        for u in range(len(metrics["episode_return"])):
            row = {"update": u + 1, "env_steps": (u + 1) * per_update}
            for key, values in metrics.items():
                per_seed = np.asarray(values[u]).reshape(n_settings, n_seeds)[i]
                row[key] = float(per_seed.mean())
                if key == "episode_return":
                    row["episode_return_per_seed"] = per_seed
            rows.append(row)
        log.append(rows)
        log.close()


def _table(settings, final) -> str:
    fields = list(settings[0])
    lines = [
        "| " + " | ".join(fields) + " | final return mean | std |",
        "|" + "--:|" * (len(fields) + 2),
    ]
    for setting, finals in zip(settings, final, strict=True):
        values = " | ".join(f"{setting[f]:g}" for f in fields)
        std = finals.std(ddof=1) if len(finals) > 1 else 0.0
        lines.append(f"| {values} | {finals.mean():.1f} | {std:.1f} |")
    return "\n".join(lines)


def _write_summary(run_dir, settings, seeds, final, returns, per_update, table) -> None:
    # A Figure without pyplot: no global backend switch (notebooks keep inline plots).
    from matplotlib.figure import Figure

    summary = {
        "settings": settings,
        "seeds": seeds,
        "final_return": final.tolist(),
        "final_return_definition": "mean episode return over the last 5% of updates, per seed; "
        "table: mean and sample std over seeds",
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (run_dir / "summary.md").write_text(table + "\n")
    steps = (np.arange(returns.shape[0]) + 1) * per_update
    fig = Figure(figsize=(7, 4.5))
    ax = fig.subplots()
    for i, setting in enumerate(settings):
        mean, std = returns[:, i].mean(1), returns[:, i].std(1)
        ax.plot(steps, mean, label=label(setting))
        ax.fill_between(steps, mean - std, mean + std, alpha=0.15)
    ax.set_xlabel("environment steps")
    ax.set_ylabel("episode return (mean ± std over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir / "sweep.png", dpi=100)


# -- the command line: several compiled groups in one command -------------------------------------
def sweep_groups(
    algorithm,
    lists: Mapping[str, Sequence],
    seeds: Sequence[int] = (0,),
    run: RunConfig | None = None,
    progress=print,
) -> list[SweepResult]:
    """``rljax sweep``: ``lists`` maps algorithm fields to values. Sweepable float fields form
    the grid of one compiled program; every other field (shapes, programs: ``num_envs``,
    ``activation``, ...) gives separate groups, compiled and run one after another. Writes one
    sweep directory: the group's files (``sweep``'s) directly for one group, else one
    subdirectory per group; and ``results.md`` / ``results.json`` (every group and setting).
    Every group is validated before the first compiles."""
    run = run or RunConfig()
    algo_cls, algo_config = resolve_algorithm(algorithm)
    sweepable = algo_cls.sweepable()
    grid = {k: [float(v) for v in vs] for k, vs in lists.items() if k in sweepable}
    axes = {k: list(vs) for k, vs in lists.items() if k not in grid}
    groups = [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
    name = algorithm_name(algo_cls)
    sweep_dir = Path(run.logging.runs_dir) / (
        run.logging.run_name or default_run_name(f"{name}-sweep", algo_config.env)
    )
    if sweep_dir.exists() and not run.logging.overwrite:
        raise ConfigError(
            f"sweep directory {str(sweep_dir)!r} exists; pick another --run-name, or --overwrite"
        )
    plans = []
    for group in groups:
        config = dataclasses.replace(algo_config, **group)
        members = grid or {sweepable[0]: [getattr(config, sweepable[0])]}
        settings_of(config, members)  # every group's values checked before anything compiles
        size = len(seeds) * len(list(itertools.product(*members.values())))
        if size < 2:
            raise ConfigError(
                "a sweep group needs at least 2 members (settings x seeds); add seeds "
                "(--seeds 0,1) or values of a float flag (e.g. --lr 1e-4,3e-4)"
            )
        if len(groups) > 1:
            group_run = run.replace(runs_dir=str(sweep_dir), run_name=_group_name(group))
        else:
            group_run = run.replace(runs_dir=str(sweep_dir.parent), run_name=sweep_dir.name)
        prepare(config, group_run.replace(num_seeds=size), swept=tuple(members))
        plans.append((group, config, members, group_run))
    results = []
    for i, (group, config, members, group_run) in enumerate(plans):
        if group and not run.logging.quiet:
            progress(f"group {i + 1}/{len(plans)}: {label(group) if group else ''}")
        results.append(sweep(config, members, seeds, group_run, progress))
    _write_results(sweep_dir, algo_config, plans, results, run.logging.quiet, progress)
    return results


def _group_name(group: dict) -> str:
    return "_".join(f"{k}-{v}" for k, v in group.items()).replace("/", "-")[:100]


def _write_results(sweep_dir, algo_config, plans, results, quiet, progress) -> None:
    rows = []
    for (group, *_), result in zip(plans, results, strict=True):
        for setting, finals in zip(result.settings, result.final_return, strict=True):
            rows.append(
                {
                    **group,
                    **setting,
                    "final_return_mean": float(finals.mean()),
                    "final_return_std": float(finals.std(ddof=1)) if len(finals) > 1 else 0.0,
                    "steps_per_second": result.steps_per_second,
                    "dir": str(result.run_dir / label(setting)),
                }
            )
    fields = [k for k in rows[0] if k not in ("final_return_mean", "final_return_std", "dir")]
    fields = [k for k in fields if k != "steps_per_second"]
    lines = [
        "| " + " | ".join(fields) + " | final return mean | std | steps/s |",
        "|" + "--:|" * (len(fields) + 3),
    ]
    for row in rows:
        values = " | ".join(
            f"{row[f]:g}" if isinstance(row[f], float) else str(row[f]) for f in fields
        )
        lines.append(
            f"| {values} | {row['final_return_mean']:.1f} | {row['final_return_std']:.1f} "
            f"| {row['steps_per_second']:,.0f} |"
        )
    table = "\n".join(lines)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    (sweep_dir / "results.md").write_text(table + "\n")
    report = {
        "seeds": results[0].seeds,
        "base_config": dataclasses.asdict(algo_config),
        "final_return_definition": "mean episode return over the last 5% of updates, per seed; "
        "mean and sample std over seeds",
        "rows": rows,
    }
    (sweep_dir / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    if not quiet and len(plans) > 1:
        progress(table)
    if not quiet:
        progress(f"results: {sweep_dir / 'results.md'}")
