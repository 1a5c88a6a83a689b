"""Shared plumbing of the benchmarks: one subprocess per device count, timing, table and JSON.

The number of emulated CPU devices is fixed when JAX starts, so a benchmark re-runs its own script
as a worker per device group (``--_worker GROUP``); the worker prints one JSON line after
``marker`` and the parent collects the rows.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def timed(fn, fresh_input, repeats: int):
    """Best-of-``repeats`` wall time of ``fn(fresh_input())`` (input built untimed each time).

    Returns ``(best_seconds, all_seconds, last_output)``."""
    import jax

    times, out = [], None
    for _ in range(repeats):
        arg = jax.block_until_ready(fresh_input())
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(arg))
        times.append(time.perf_counter() - t0)
    return min(times), times, out


def run_worker(script: Path, group: str, argv: list[str], marker: str, timeout=None) -> dict:
    """Run ``script --_worker group *argv`` and return the JSON it printed after ``marker``."""
    cmd = [sys.executable, str(script), "--_worker", group, *argv]
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    log(f"== group {group!r} ==")
    try:
        proc = subprocess.run(
            cmd, stdout=subprocess.PIPE, text=True, env=env, check=False, timeout=timeout
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"worker {group!r} timed out after {timeout} s") from e
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith(marker)]
    if proc.returncode != 0 or not results:
        sys.stderr.write(proc.stdout)
        raise SystemExit(f"worker {group!r} failed (exit code {proc.returncode})")
    return json.loads(results[-1][len(marker) :])


def markdown_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """``columns``: ``(header, row key, format spec)``; numeric columns are right-aligned."""
    header = "| " + " | ".join(h for h, _, _ in columns) + " |"
    align = "|" + "|".join("--:" if f else "---" for _, _, f in columns) + "|"
    lines = [header, align]
    for r in rows:
        cells = []
        for _, key, fmt in columns:
            value = r.get(key)
            cells.append("-" if value is None else format(value, fmt) if fmt else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_report(out: Path, name: str, report: dict[str, Any]) -> None:
    """Atomically write ``report`` plus the machine description as JSON."""
    import jax

    report = {
        "benchmark": name,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        **report,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(out)
    print(f"\nwrote {out}")


# ------------------------------------------------------------------------------------------------
# Learning-curve studies (experiments/ppo_cartpole.py, ppo_breakout.py, dqn_cartpole.py) and the
# pieces the sweep study shares with them: one config, several seeds vmapped in one jit on a
# 1-device mesh, a markdown table, a compact JSON and a plot.
# ------------------------------------------------------------------------------------------------
FINAL_FRACTION = 0.05
"""final return: per seed the mean ``episode_return`` over the last 5% of updates."""


def machine_line() -> str:
    """``"2 CPUs (os.cpu_count()), backend cpu, jax 0.10.2, Python 3.11.9, 2025-01-31 12:00"``."""
    import jax

    return (
        f"{os.cpu_count()} CPUs (os.cpu_count()), backend {jax.default_backend()}, jax "
        f"{jax.__version__}, Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M')}"
    )


def code_version() -> str:
    """The commit this tree is at, and which library files differ from it (read-only git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True
        ).stdout.strip()
        changed = subprocess.run(
            ["git", "status", "--porcelain", "--", "rljax"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        ).stdout.split("\n")
    except OSError:
        return "unknown"
    changed = [line[3:] for line in changed if line.strip()]
    return f"{head or 'unknown'}" + (f" + local changes to {', '.join(changed)}" if changed else "")


def final_returns(returns, fraction: float = FINAL_FRACTION):
    """``returns: [updates, seeds]`` -> ``[seeds]``: mean over the last ``fraction`` of updates."""
    import numpy as np

    returns = np.asarray(returns, np.float64)
    last = max(1, round(fraction * len(returns)))
    return returns[-last:].mean(0)


def mean_std(values) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for one value)."""
    import numpy as np

    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def smooth(x, window: int):
    """Trailing moving mean over ``window`` rows of ``x: [U, ...]`` (shorter at the start)."""
    import numpy as np

    x = np.asarray(x, np.float64)
    c = np.cumsum(np.concatenate([np.zeros((1, *x.shape[1:])), x]), axis=0)
    idx = np.arange(1, len(x) + 1)
    lo = np.maximum(idx - window, 0)
    width = (idx - lo).reshape(-1, *([1] * (x.ndim - 1)))
    return (c[idx] - c[lo]) / width


def first_step_at(returns, env_steps_per_update: int, threshold: float):
    """``returns: [U, S]`` -> per seed the env steps of the first update with return >=
    ``threshold`` (``None`` if never)."""
    import numpy as np

    out = []
    for column in np.asarray(returns).T:
        hits = np.flatnonzero(column >= threshold)
        out.append(int((hits[0] + 1) * env_steps_per_update) if len(hits) else None)
    return out


def write_json_compact(path: Path, name: str, report: dict[str, Any]) -> None:
    """Atomically write ``report`` plus the machine description as JSON, each flat list of
    numbers (a curve) on one line."""
    import re

    import jax

    meta = {
        "benchmark": name,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    text = json.dumps({**meta, **report}, indent=2)
    text = re.sub(
        r"\[\s*\n\s*([-+\d.eE,\s]*?)\s*\]",
        lambda m: "[" + " ".join(m.group(1).split()) + "]",
        text,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def train_seeds(algo_config, seeds: list[int], chunk_size: int | None = None, progress=log):
    """Train ``algo_config`` once per seed, the seeds vmapped in one jit on a ``data=1,model=1``
    mesh. Seed ``s`` starts from ``algo.init(jax.random.key(s))``, as ``rljax train`` with
    ``--seed s`` and as a ``rljax.run.sweep`` member with seed ``s`` do.

    Returns ``{"metrics": {name: [U, S] numpy}, "compile_s", "init_s", "run_s"}``: compile of the
    init and chunk programs (``ShardedRun.compile``), the seeds' init, and the chunk calls."""
    import jax
    import numpy as np

    from rljax.run import RunConfig, ShardedRun, prepare

    num_seeds = len(seeds)
    layout, algo = prepare(algo_config, RunConfig.make(mesh="data=1,model=1", num_seeds=num_seeds))
    num_updates = algo_config.num_updates
    chunk_size = chunk_size or min(num_updates, max(1, -(-num_updates // 20)))
    run = ShardedRun(algo, layout, num_seeds=num_seeds, chunk_size=chunk_size)
    run.compile(jax.random.key(seeds[0]))
    t0 = time.perf_counter()
    if num_seeds > 1:
        keys = jax.random.wrap_key_data(
            np.stack([np.asarray(jax.random.key_data(jax.random.key(s))) for s in seeds])
        )
        state = jax.block_until_ready(run.init_members(keys, {}))
    else:
        state = jax.block_until_ready(run.init(jax.random.key(seeds[0])))
    init_s = time.perf_counter() - t0
    per_update = algo_config.env_steps_per_update
    chunks, run_s, done = [], 0.0, 0
    while done < num_updates:
        count = min(chunk_size, num_updates - done)
        t0 = time.perf_counter()
        state, metrics = jax.block_until_ready(run.run_chunk(state, count))
        run_s += time.perf_counter() - t0
        done += count
        # [chunk, (S,)] -> [count, S]
        metrics = {k: np.asarray(v)[:count].reshape(count, num_seeds) for k, v in metrics.items()}
        chunks.append(metrics)
        ret = metrics["episode_return"][-1]
        progress(
            f"  update {done:>6}/{num_updates}  env steps {done * per_update:>11,}  "
            f"{done * per_update * num_seeds / run_s:>9,.0f} steps/s  return "
            f"{ret.mean():8.2f} (seeds {' '.join(f'{r:.1f}' for r in ret)})"
        )
    metrics = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    return {
        "metrics": metrics,
        "compile_s": sum(run.compile_seconds.values()),
        "compile_detail_s": run.compile_seconds,
        "init_s": init_s,
        "run_s": run_s,
    }


def plot_seed_curves(ax, env_steps, returns, window: int, color=None, label=None, seeds=True):
    """Mean ± sample std over seeds of the smoothed ``returns: [U, S]`` (and thin per-seed lines);
    returns the mean line."""
    import numpy as np

    curves = smooth(returns, window)
    mean = curves.mean(1)
    std = curves.std(1, ddof=1) if curves.shape[1] > 1 else np.zeros_like(mean)
    (line,) = ax.plot(env_steps, mean, color=color, lw=1.8, label=label)
    color = line.get_color()
    ax.fill_between(env_steps, mean - std, mean + std, color=color, alpha=0.18, lw=0)
    if seeds:
        for curve in curves.T:
            ax.plot(env_steps, curve, color=color, lw=0.6, alpha=0.35)
    return line


CURVE_COLUMNS = [
    ("study", "study", ""),
    ("seeds", "num_seeds", "d"),
    ("env steps/seed", "env_steps", ",d"),
    ("final return", "final_return_str", ""),
    ("AUC return", "auc_return", ".1f"),
    ("steps/s", "steps_per_s", ",.0f"),
    ("compile s", "compile_s", ".1f"),
    ("run s", "run_s", ".1f"),
]


def curve_study_args(doc: str, default_timesteps: int, quick_timesteps: int, name: str, argv):
    """The command line every learning-curve study shares."""
    import argparse
    import tempfile

    p = argparse.ArgumentParser(
        description=doc.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument(
        "--total-timesteps",
        type=int,
        help=f"env steps per seed (default {default_timesteps:,}; --quick {quick_timesteps:,})",
    )
    p.add_argument("--quick", action="store_true", help="tiny budget smoke run, to a temp dir")
    p.add_argument("--out", type=Path, help="output path stem: writes STEM.md/.json/.png")
    p.add_argument("--chunk", type=int, help="updates per compiled call (default: 1/20 of all)")
    p.add_argument("--replot", type=Path, metavar="JSON", help="rewrite .md/.png from a JSON")
    args = p.parse_args(argv)
    if args.total_timesteps is None:
        args.total_timesteps = quick_timesteps if args.quick else default_timesteps
    if args.out is None:
        quick_dir = Path(tempfile.gettempdir()) / f"{name}_quick"
        args.out = quick_dir / name if args.quick else REPO_ROOT / "experiments/results" / name
    return args


def curve_study_markdown(report: dict) -> str:
    """The ``.md`` of a learning-curve study (also what the script prints)."""
    import statistics

    row = report["row"]
    threshold = report.get("threshold")
    lines = [
        f"# {report['title']}",
        "",
        f"{report['config_summary']}; {row['num_seeds']} seeds {report['seeds']} x "
        f"{row['env_steps']:,} env steps ({report['num_updates']} updates x "
        f"{report['env_steps_per_update']:,}){report.get('budget_note', '')}. "
        f"{report['machine']}; rljax {report.get('code_version', 'unknown')}; wall time "
        f"{report['wall_s']:.0f} s. "
        f"Written by `{report['script']}`.",
        "",
        f"Seeds vmapped in one jit on mesh `data=1,model=1`; seed s starts from "
        f"`jax.random.key(s)`. final return: per seed the mean training episode_return (the mean "
        f"over environments of each one's last completed episode) over the last "
        f"{report['final_fraction']:.0%} of updates, then mean ± sample std over seeds. AUC "
        "return: mean episode_return over all updates (area under the learning curve), mean "
        "over seeds. steps/s: env steps of all seeds / seconds of the compiled chunk calls "
        "(compile excluded; the 2 cores are shared with other work). compile s: init and chunk "
        "programs.",
        "",
        markdown_table([row], CURVE_COLUMNS),
        "",
    ]
    columns = [("seed", "seed", "d"), ("final return", "final_return", ".1f")]
    columns += [("AUC return", "auc_return", ".1f"), ("max return", "max_return", ".1f")]
    if threshold is not None:
        columns.append((f"env steps to >= {threshold:g}", "steps_to_threshold", ",d"))
        reached = [
            s["steps_to_threshold"]
            for s in report["per_seed"]
            if s["steps_to_threshold"] is not None
        ]
        median = f" (median first env step {statistics.median(reached):,.0f})" if reached else ""
        lines += [
            f"{len(reached)}/{len(report['per_seed'])} seeds reached an update with return >= "
            f"{threshold:g}{median}.",
            "",
        ]
    lines += ["Per seed:", "", markdown_table(report["per_seed"], columns)]
    return "\n".join(lines) + "\n"


def curve_study_plot(report: dict, path: Path) -> None:
    import numpy as np
    from matplotlib.figure import Figure

    returns = np.array([s["episode_return"] for s in report["per_seed"]]).T  # [U, S]
    per_update = report["env_steps_per_update"]
    env_steps = (np.arange(len(returns)) + 1) * per_update
    window = max(1, len(returns) // 50)
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    plot_seed_curves(ax, env_steps, returns, window, color="tab:blue", label="mean over seeds")
    if report.get("threshold") is not None:
        ax.axhline(
            report["threshold"], color="gray", ls="--", lw=1, label=f"{report['threshold']:g}"
        )
    ax.set_xlabel("env steps per seed")
    ax.xaxis.set_major_formatter(
        lambda x, _: f"{x / 1e6:g}M" if env_steps[-1] >= 2e6 else f"{x / 1e3:g}k"
    )
    smoothing = f"moving mean over {window} updates" if window > 1 else "per update"
    ax.set_ylabel(f"training episode return ({smoothing})")
    ax.set_title(
        f"{report['title']}\nmean ± std over {len(report['seeds'])} seeds (thin: each seed); "
        f"final return {report['row']['final_return_str']}",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def curve_study_outputs(report: dict, stem: Path) -> str:
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = curve_study_markdown(report)
    stem.with_suffix(".md").write_text(text)
    log(f"wrote {stem.with_suffix('.md')}")
    curve_study_plot(report, stem.with_suffix(".png"))
    return text


def curve_study_main(
    *,
    name: str,
    doc: str,
    title: str,
    make_config,
    config_summary,
    default_timesteps: int,
    quick_timesteps: int,
    threshold: float | None = None,
    budget_note=None,
    argv=None,
) -> dict:
    """A learning-curve study end to end: parse the shared command line, train the seeds, write
    ``<out>.md/.json/.png`` and print the table. ``make_config(total_timesteps)`` -> algorithm
    config; ``config_summary(config)`` -> one line; ``budget_note(total_timesteps)`` -> text
    appended to the budget (e.g. why it is below the reference)."""
    import dataclasses

    import numpy as np

    args = curve_study_args(doc, default_timesteps, quick_timesteps, name, argv)
    if args.replot:
        report = json.loads(args.replot.read_text())
        print(curve_study_outputs(report, args.replot.with_suffix("")))
        return report
    config = make_config(args.total_timesteps)
    t_start = time.perf_counter()
    log(f"{title}: {len(args.seeds)} seeds x {config.num_updates} updates")
    result = train_seeds(config, args.seeds, args.chunk)
    wall_s = time.perf_counter() - t_start
    returns = result["metrics"]["episode_return"].astype(np.float64)  # [U, S]
    per_update = config.env_steps_per_update
    env_steps = config.num_updates * per_update
    finals = final_returns(returns)
    mean, std = mean_std(finals)
    reach = first_step_at(returns, per_update, threshold) if threshold is not None else None
    per_seed = [
        {
            "seed": seed,
            "final_return": float(finals[i]),
            "auc_return": float(returns[:, i].mean()),
            "max_return": float(returns[:, i].max()),
            "steps_to_threshold": None if reach is None else reach[i],
            "episode_return": np.round(returns[:, i], 2).tolist(),
        }
        for i, seed in enumerate(args.seeds)
    ]
    row = {
        "study": title,
        "num_seeds": len(args.seeds),
        "env_steps": env_steps,
        "final_return_mean": mean,
        "final_return_std": std,
        "final_return_str": f"{mean:.1f} ± {std:.1f}",
        "auc_return": float(returns.mean()),
        "steps_per_s": env_steps * len(args.seeds) / result["run_s"],
        "compile_s": result["compile_s"],
        "init_s": result["init_s"],
        "run_s": result["run_s"],
    }
    seed_mean = {
        k: np.round(v.astype(np.float64).mean(1), 5).tolist()
        for k, v in result["metrics"].items()
        if k in ("episode_length", "entropy", "approx_kl", "value_loss", "loss", "q_mean")
    }
    report = {
        "title": title,
        "script": f"experiments/{name}.py",
        "config": dataclasses.asdict(config),
        "config_summary": config_summary(config),
        "budget_note": budget_note(args.total_timesteps) if budget_note else "",
        "seeds": args.seeds,
        "seed_keys": "jax.random.key(seed) per seed, vmapped in one jit (ShardedRun.init_members)",
        "mesh": "data=1,model=1",
        "quick": args.quick,
        "num_updates": config.num_updates,
        "env_steps_per_update": per_update,
        "final_fraction": FINAL_FRACTION,
        "final_return_definition": (
            f"per seed the mean episode_return over the last {FINAL_FRACTION:.0%} of updates; "
            "mean and sample std (ddof=1) over seeds"
        ),
        "threshold": threshold,
        "machine": machine_line(),
        "code_version": code_version(),
        "wall_s": wall_s,
        "compile_detail_s": result["compile_detail_s"],
        "row": row,
        "per_seed": per_seed,
        "seed_mean_metrics": seed_mean,
    }
    json_path = args.out.with_suffix(".json")
    write_json_compact(json_path, name, report)
    log(f"wrote {json_path}")
    print("\n" + curve_study_outputs(report, args.out))
    return report
