"""``rljax compare 'runs/ppo-*' 'runs/a2c-*' ...``: runs aggregated over seeds, rliable-style.

Each positional pattern is a group (a directory, or a glob of run directories). A group's scores
are one number per seed of each of its runs: the mean training ``episode_return`` over the last
5 % of updates (``--score train``), or the mean of the episodes in the run's ``eval.json``
(``--score eval``, after ``rljax eval``). Per group: mean, median, IQM and, with ``--target``,
the optimality gap, each with a 95 % stratified bootstrap interval (the runs of a group are the
strata; ``rljax.tools.stats``); the performance profile (fraction of scores above each
threshold, with bootstrap bands); and the learning curves (mean training return over seeds
against env steps, with a 95 % t-band). Writes ``compare.md``, ``compare.json`` and
``compare.png`` to ``--out``.
"""

from __future__ import annotations

import dataclasses
import glob
import json
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import tyro

from rljax.errors import ConfigError
from rljax.tools import stats

FINAL_FRACTION = 0.05


@dataclasses.dataclass(frozen=True)
class CompareArgs:
    """Compare groups of runs: IQM, mean, median (and optimality gap) with stratified bootstrap
    intervals, performance profiles and learning curves; writes compare.md/.json/.png."""

    patterns: Annotated[tuple[str, ...], tyro.conf.Positional]
    """one group per pattern: a run directory or a glob such as 'runs/ppo-*'."""
    names: tuple[str, ...] = ()
    """a display name per group (default: the patterns)."""
    score: Literal["train", "eval"] = "train"
    """train: each seed's mean training return over the last 5 % of updates; eval: each seed's
    mean return in the run's eval.json (run `rljax eval` first)."""
    target: float | None = None
    """a return counted as solved: adds the optimality gap (mean shortfall below it)."""
    out: str = "compare"
    """directory for compare.md, compare.json and compare.png."""
    reps: int = stats.REPS
    """bootstrap resamples."""


@dataclasses.dataclass
class RunScores:
    run_dir: Path
    scores: np.ndarray  # [S] one per seed
    steps: np.ndarray  # [N] env steps per seed at each logged update
    curves: np.ndarray  # [S, N] training return per seed


def read_run_scores(run_dir: Path, score: str) -> RunScores:
    """A run's per-seed scores and learning curves; ``ConfigError`` when it is not a run."""
    from rljax.run.run_log import read_metrics

    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        raise ConfigError(f"cannot compare {str(run_dir)!r}: no metrics.jsonl (not an rljax run)")
    rows = [r for r in read_metrics(metrics) if "episode_return" in r]
    if not rows:
        raise ConfigError(f"cannot compare {str(run_dir)!r}: its metrics.jsonl has no returns")
    per_seed = "episode_return_per_seed" in rows[0]
    curves = np.array(
        [r["episode_return_per_seed"] if per_seed else [r["episode_return"]] for r in rows],
        np.float64,
    ).T  # [S, N]
    steps = np.array([r["env_steps"] for r in rows], np.float64)
    if score == "train":
        tail = max(1, int(round(FINAL_FRACTION * curves.shape[1])))
        scores = np.nanmean(curves[:, -tail:], axis=1)
    else:
        path = run_dir / "eval.json"
        if not path.exists():
            raise ConfigError(
                f"cannot compare {str(run_dir)!r} by --score eval: no eval.json (run "
                f"`rljax eval {run_dir}` first)"
            )
        scores = np.asarray(json.loads(path.read_text())["returns"], np.float64).mean(axis=1)
    return RunScores(run_dir, scores, steps, curves)


def expand(pattern: str) -> list[Path]:
    matches = sorted(Path(p) for p in glob.glob(pattern) if Path(p).is_dir())
    if not matches:
        raise ConfigError(f"pattern {pattern!r} matches no run directory")
    return matches


def check_args(args: CompareArgs) -> None:
    if not args.patterns:
        raise ConfigError("give at least one run directory or pattern")
    if args.names and len(args.names) != len(args.patterns):
        raise ConfigError(
            f"--names gives {len(args.names)} name(s) for {len(args.patterns)} pattern(s)"
        )
    if args.reps < 100:
        raise ConfigError(f"--reps must be >= 100, got {args.reps}")


def compare(args: CompareArgs, say=print) -> dict:
    """Aggregate every group (see the module doc); the report, also written to ``args.out``."""
    from rljax.run.run_log import write_text_atomic

    check_args(args)
    names = list(args.names or args.patterns)
    groups = {
        name: [read_run_scores(d, args.score) for d in expand(pattern)]
        for name, pattern in zip(names, args.patterns, strict=True)
    }
    statistics = dict(stats.STATISTICS)
    if args.target is not None:
        statistics["optimality_gap"] = lambda x: stats.optimality_gap(x, args.target)
    everything = np.concatenate([r.scores for g in groups.values() for r in g])
    taus = np.linspace(np.nanmin(everything), np.nanmax(everything), 41)
    report = {"score": args.score, "target": args.target, "groups": {}, "taus": taus.tolist()}
    for name, runs in groups.items():
        strata = [r.scores for r in runs]
        scores = np.concatenate(strata)
        entry = {"runs": [str(r.run_dir) for r in runs], "n": int(scores.size)}
        for stat_name, fn in statistics.items():
            low, high = stats.bootstrap_ci(fn, strata, args.reps)
            entry[stat_name] = {"value": fn(scores), "ci": [low, high]}
        entry["profile"] = stats.performance_profile(scores, taus).tolist()
        low, high = stats.bootstrap_ci(
            lambda x: stats.performance_profile(x, taus), strata, args.reps
        )
        entry["profile_ci"] = np.stack([low, high], axis=1).tolist()
        entry["scores"] = scores.tolist()
        report["groups"][name] = entry
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table = markdown(report)
    write_text_atomic(out / "compare.json", json.dumps(report, indent=2) + "\n")
    write_text_atomic(out / "compare.md", table + "\n")
    plot(report, groups, out / "compare.png")
    say(table)
    say(f"wrote {out / 'compare.md'}, compare.json and compare.png")
    return report


def markdown(report: dict) -> str:
    names = [k for k in ("iqm", "mean", "median", "optimality_gap") if k in next(
        iter(report["groups"].values()))]  # fmt: skip
    header = "| group | scores | " + " | ".join(f"{n} [95% CI]" for n in names) + " |"
    lines = [
        f"Scores: {report['score']} return per seed; stratified bootstrap intervals.",
        "",
        header,
        "|---|--:|" + "--:|" * len(names),
    ]
    for group, entry in report["groups"].items():
        cells = [
            f"{entry[n]['value']:.1f} [{entry[n]['ci'][0]:.1f}, {entry[n]['ci'][1]:.1f}]"
            for n in names
        ]
        lines.append(f"| {group} | {entry['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(report: dict, groups: dict, path: Path) -> None:
    """Learning curves (mean over every seed of a group's runs, 95 % t-band), the performance
    profiles with bootstrap bands, and the IQM intervals."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from rljax.run.stats import band, mean_ci

    fig, (curves_ax, profile_ax, iqm_ax) = plt.subplots(1, 3, figsize=(15, 4.2))
    for i, (name, runs) in enumerate(groups.items()):
        color = f"C{i}"
        grid = runs[0].steps
        per_seed = np.concatenate(
            [np.stack([np.interp(grid, r.steps, c) for c in r.curves]) for r in runs]
        )
        mean, half = mean_ci(per_seed, axis=0)
        low, high = band(mean, half)
        curves_ax.plot(grid, mean, color=color, label=name)
        curves_ax.fill_between(grid, low, high, color=color, alpha=0.2)
        entry = report["groups"][name]
        taus = np.asarray(report["taus"])
        profile_ax.plot(taus, entry["profile"], color=color, label=name)
        ci = np.asarray(entry["profile_ci"])
        profile_ax.fill_between(taus, ci[:, 0], ci[:, 1], color=color, alpha=0.2)
        low, high = entry["iqm"]["ci"]
        iqm_ax.plot([low, high], [i, i], color=color, linewidth=6, alpha=0.5)
        iqm_ax.plot([entry["iqm"]["value"]], [i], "|", color="black", markersize=14)
    curves_ax.set(xlabel="env steps per seed", ylabel="training return", title="learning curves")
    profile_ax.set(
        xlabel="return threshold", ylabel="fraction of seeds above", title="performance profile"
    )
    iqm_ax.set(xlabel=f"IQM of the {report['score']} return", title="IQM (95% CI)")
    iqm_ax.set_yticks(range(len(groups)), list(groups))
    curves_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
