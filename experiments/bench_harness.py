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


def alternate(calls, repeats: int):
    """Time ``fn(fresh_input())`` for every ``(fn, fresh_input)`` of ``calls``, ``repeats`` rounds
    with the calls alternating inside each round, so that load drift on the machine hits all alike.

    Returns ``(seconds [call][repeat], last output per call)``."""
    times, outs = [[] for _ in calls], [None] * len(calls)
    for _ in range(repeats):
        for i, (fn, fresh_input) in enumerate(calls):
            _, t, outs[i] = timed(fn, fresh_input, 1)
            times[i] += t
    return times, outs


def pair_ratios(mine: dict, theirs: dict) -> list[float]:
    """Per alternating pair of repeats (``run_s_all``), ``mine``'s steps/s over ``theirs``': the
    ratios whose median is robust to a slow moment on a shared machine."""
    return [
        tb / theirs["env_steps"] / (ta / mine["env_steps"])
        for ta, tb in zip(mine["run_s_all"], theirs["run_s_all"], strict=True)
    ]


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


def write_report(out: Path, name: str, report: dict[str, Any]) -> dict[str, Any]:
    """Atomically write ``report`` plus the machine description as JSON; returns what it wrote."""
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
    return report


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


def completed_mean(last_return, completed) -> float:
    """Mean of each env's last episode return (last axis) over the envs that completed one, then
    over seeds (leading axes); a seed none of whose envs completed counts 0."""
    import numpy as np

    last_return, completed = np.asarray(last_return), np.asarray(completed)
    per_seed = np.sum(np.where(completed, last_return, 0.0), axis=-1) / np.maximum(
        np.sum(completed, axis=-1), 1
    )
    return float(np.mean(per_seed))


def port_final_return(metrics) -> float:
    """The PureJaxRL PPO port's training return at its last step, as rljax's ``episode_return``
    metric: ``returned_episode_returns`` leaves ``[(S,) updates, steps, envs]`` (0 until an env's
    first episode ends) -> ``completed_mean`` at the last step of the last update."""
    import numpy as np

    last = np.asarray(metrics["returned_episode_returns"][..., -1, -1, :])
    return completed_mean(last, last > 0)


def mean_std(values) -> tuple[float, float]:
    """Mean and sample std (ddof=1; 0 for one value)."""
    import numpy as np

    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std(ddof=1)) if len(values) > 1 else 0.0


def smooth(x, window: int):
    """``rljax.run.stats.smooth`` (trailing moving mean over ``window`` rows) applied to each
    column of ``x: [U, ...]``."""
    import numpy as np

    from rljax.run.stats import smooth as smooth_1d

    x = np.asarray(x, np.float64)
    flat = x.reshape(len(x), -1)
    out = np.stack([smooth_1d(c, window) for c in flat.T], axis=1) if flat.size else flat
    return out.reshape(x.shape)


def curve_window(num_updates: int) -> int:
    """Smoothing window (updates) of the learning-curve studies: 1/50 of the run, at least 1."""
    return max(1, num_updates // 50)


def threshold_steps(returns, env_steps, threshold: float, window: int) -> dict:
    """Per seed and for the seed-mean curve, on the curve smoothed over ``window`` updates
    (``rljax.run.stats``): ``reach`` = first env step the smoothed curve is >= ``threshold``,
    ``held`` = first env step from which it stays >= ``threshold`` to the end (None: never /
    ends below). ``returns: [U, S]``, ``env_steps: [U]``."""
    import math
    import statistics

    import numpy as np

    from rljax.run.stats import held_from, steps_to_threshold

    returns = np.asarray(returns, np.float64)
    reach = [steps_to_threshold(env_steps, c, threshold, window) for c in returns.T]
    held = [held_from(env_steps, c, threshold, window) for c in returns.T]

    def median(values):
        # a seed that never gets there counts as later than every seed that does
        if not values or sum(v is None for v in values) * 2 >= len(values):
            return None
        return float(statistics.median([math.inf if v is None else v for v in values]))

    mean_curve = returns.mean(1)
    return {
        "window": window,
        "reach": reach,
        "held": held,
        "reach_median": median(reach),
        "held_median": median(held),
        "mean_curve_reach": steps_to_threshold(env_steps, mean_curve, threshold, window),
        "mean_curve_held": held_from(env_steps, mean_curve, threshold, window),
    }


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


EVAL_SALT = 0xE7A1  # as rljax.run.evaluation: evaluation keys never reuse training keys


def greedy_evaluator(run, seeds: list[int], episodes: int):
    """``evaluate(state, update) -> [S, episodes]`` returns of the greedy policy (PPO: argmax of
    the logits; DQN: argmax Q) of each seed, one fresh environment per episode run to its end
    (``rljax.run.evaluation.Evaluator``). The keys depend only on the seed, the update and the
    episode index, never on the training keys; evaluation is timed apart from training."""
    import jax
    import numpy as np

    from rljax.run.evaluation import Evaluator, obs_stats_of

    evaluator = Evaluator(run.algo, 1)  # one env per episode, vmapped: per-episode returns

    def episodes_of(params, stats, keys):  # keys [E] -> [E]; stats: None or frozen obs_stats
        return jax.vmap(lambda k: evaluator(params, k, stats)["eval_return"])(keys)

    fn = jax.jit(jax.vmap(episodes_of) if len(seeds) > 1 else episodes_of)

    def evaluate(state, update: int):
        keys = [
            jax.random.split(
                jax.random.fold_in(jax.random.fold_in(jax.random.key(s), EVAL_SALT), update),
                episodes,
            )
            for s in seeds
        ]
        keys = jax.numpy.stack(keys) if len(seeds) > 1 else keys[0]
        with run.layout.active():
            stats = obs_stats_of(state)
            out = np.asarray(jax.device_get(fn(state.params, stats, keys)), np.float64)
        return out.reshape(len(seeds), episodes)

    return evaluate


def train_seeds(
    algo_config,
    seeds: list[int],
    chunk_size: int | None = None,
    progress=log,
    eval_episodes: int = 0,
):
    """Train ``algo_config`` once per seed, the seeds vmapped in one jit on a ``data=1,model=1``
    mesh. Seed ``s`` starts from ``algo.init(jax.random.key(s))``, as ``rljax train`` with
    ``--seed s`` and as a ``rljax.run.sweep`` member with seed ``s`` do.

    Returns ``{"metrics": {name: [U, S] numpy}, "compile_s", "init_s", "run_s"}``: compile of the
    init and chunk programs (``ShardedRun.compile``), the seeds' init, and the chunk calls. With
    ``eval_episodes``, also ``"eval": {"updates": [K], "returns": [K, S, E]}`` (greedy
    evaluation after every chunk, the last after the final update) and ``"eval_s"``."""
    import jax
    import numpy as np

    from rljax.run import RunConfig, ShardedRun, prepare

    num_seeds = len(seeds)
    layout, algo = prepare(algo_config, RunConfig.make(mesh="data=1,model=1", num_seeds=num_seeds))
    num_updates = algo_config.num_updates
    chunk_size = chunk_size or min(num_updates, max(1, -(-num_updates // 20)))
    run = ShardedRun(algo, layout, num_seeds=num_seeds, chunk_size=chunk_size)
    run.compile(jax.random.key(seeds[0]))
    evaluate = greedy_evaluator(run, seeds, eval_episodes) if eval_episodes else None
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
    chunks, run_s, eval_s, done = [], 0.0, 0.0, 0
    eval_updates, eval_returns = [], []
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
        greedy = ""
        if evaluate is not None:
            t0 = time.perf_counter()
            eval_returns.append(evaluate(state, done))
            eval_s += time.perf_counter() - t0
            eval_updates.append(done)
            greedy = f"  greedy {eval_returns[-1].mean():8.2f}"
        progress(
            f"  update {done:>6}/{num_updates}  env steps {done * per_update:>11,}  "
            f"{done * per_update * num_seeds / run_s:>9,.0f} steps/s  return "
            f"{ret.mean():8.2f} (seeds {' '.join(f'{r:.1f}' for r in ret)}){greedy}"
        )
    metrics = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
    out = {
        "metrics": metrics,
        "compile_s": sum(run.compile_seconds.values()),
        "compile_detail_s": run.compile_seconds,
        "init_s": init_s,
        "run_s": run_s,
    }
    if evaluate is not None:
        out["eval"] = {"updates": eval_updates, "returns": np.stack(eval_returns)}
        out["eval_s"] = eval_s
    return out


def plot_seed_curves(
    ax, env_steps, returns, window: int, color=None, label=None, seeds=True, low=None, high=None
):
    """Mean over seeds of the smoothed ``returns: [U, S]`` with its 95 % confidence interval
    (``rljax.run.stats.mean_ci`` over seeds, clipped to ``[low, high]``, the return's range), and
    thin per-seed lines; returns the mean line."""
    import numpy as np

    from rljax.run.stats import band, mean_ci

    curves = smooth(returns, window)
    mean, half = mean_ci(curves, axis=1)
    lower, upper = band(mean, half, low, high)
    (line,) = ax.plot(env_steps, mean, color=color, lw=1.8, label=label)
    color = line.get_color()
    if np.isfinite(half).any():
        ax.fill_between(env_steps, lower, upper, color=color, alpha=0.18, lw=0)
    if seeds:
        for curve in curves.T:
            ax.plot(env_steps, curve, color=color, lw=0.6, alpha=0.35)
    return line


def ci_str(mean: float, half: float, low=None, high=None, digits: int = 1) -> str:
    """``"494.9 [473.0, 500.0]"``: the mean and its 95 % interval clipped to ``[low, high]``
    (the return's range); just the mean where there is no interval (one sample)."""
    import math

    from rljax.run.stats import band

    if not math.isfinite(half):
        return f"{mean:.{digits}f}"
    lo, hi = band(mean, half, low, high)
    return f"{mean:.{digits}f} [{float(lo):.{digits}f}, {float(hi):.{digits}f}]"


def steps_str(value) -> str:
    return "never" if value is None else f"{value / 1e3:,.1f}k"


CURVE_COLUMNS = [
    ("study", "study", ""),
    ("seeds", "num_seeds", "d"),
    ("env steps/seed", "env_steps", ",d"),
    ("greedy eval return [95 % CI]", "eval_return_str", ""),
    ("training return [95 % CI]", "final_return_str", ""),
    ("AUC training return", "auc_return", ".1f"),
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
    p.add_argument(
        "--eval-episodes",
        type=int,
        default=EVAL_EPISODES,
        help=f"greedy evaluation episodes per seed after every chunk (default {EVAL_EPISODES})",
    )
    p.add_argument("--replot", type=Path, metavar="JSON", help="rewrite .md/.png from a JSON")
    args = p.parse_args(argv)
    if args.total_timesteps is None:
        args.total_timesteps = quick_timesteps if args.quick else default_timesteps
    if args.out is None:
        quick_dir = Path(tempfile.gettempdir()) / f"{name}_quick"
        args.out = quick_dir / name if args.quick else REPO_ROOT / "experiments/results" / name
    return args


EVAL_EPISODES = 20


def curve_study_markdown(report: dict) -> str:
    """The ``.md`` of a learning-curve study (also what the script prints)."""
    row = report["row"]
    threshold = report.get("threshold")
    ev = report.get("eval")
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
        "Seeds vmapped in one jit on mesh `data=1,model=1`; seed s starts from "
        "`jax.random.key(s)`. Intervals `mean [low, high]` are 95 % confidence intervals of the "
        "mean (Student t), not spreads, clipped to the return's range.",
        "",
    ]
    if ev:
        lines += [
            f"- **greedy eval return** (the headline): the greedy policy (PPO: argmax of the "
            "logits, or the Gaussian's mean clipped to the bounds; DQN: argmax Q, no "
            f"exploration) after the last update, {ev['episodes']} fresh "
            f"episodes per seed, each to its end; mean and 95 % CI over all "
            f"{row['num_seeds']} seeds x {ev['episodes']} episodes (this treats a seed's "
            "episodes as independent samples, so it understates seed-to-seed variation: the "
            "per-seed table shows that; the interval over the seeds' means is "
            f"{row['eval_return_over_seeds_str']}). Lowest final episode: "
            f"{row['eval_min']:.1f}"
            + (
                f"; {row['eval_at_max']} of {row['num_seeds'] * ev['episodes']} episodes at the "
                f"maximum return {report['return_range'][1]:g}."
                if row.get("eval_at_max") is not None
                else "."
            ),
        ]
    else:
        lines += [
            "- **no greedy evaluation**: this result was recorded before the study evaluated the "
            "greedy policy and is replotted from its JSON; re-running the script adds it.",
        ]
    lines += [
        f"- **training return**: the policy that is training (PPO: sampled actions; DQN: "
        f"epsilon-greedy), per seed the mean training episode_return (the mean over environments "
        f"of each one's last completed episode) over the last {report['final_fraction']:.0%} of "
        "updates; mean and 95 % CI over seeds. AUC: mean training episode_return over all "
        "updates, mean over seeds.",
        "- steps/s: env steps of all seeds / seconds of the compiled chunk calls (compile and "
        "evaluation excluded; the 2 cores are shared with other work). compile s: init and chunk "
        "programs.",
        "",
        markdown_table([row], CURVE_COLUMNS),
        "",
    ]
    th = report.get("threshold_steps")
    if threshold is not None and th:
        n = len(report["per_seed"])
        reached = sum(v is not None for v in th["reach"])
        held = sum(v is not None for v in th["held"])
        lines += [
            f"Steps to {threshold:g}, on the training return smoothed over {th['window']} updates "
            f"({th['window'] * report['env_steps_per_update']:,} env steps; "
            "`rljax.run.stats.steps_to_threshold` / `held_from`): the smoothed curve of "
            f"{reached}/{n} seeds reaches {threshold:g} (median over seeds: "
            f"{steps_str(th['reach_median'])} env steps) and that of {held}/{n} stays at or above "
            f"it to the end (median: from {steps_str(th['held_median'])}). The seed-mean curve, "
            f"smoothed the same way, reaches {threshold:g} at "
            f"{steps_str(th['mean_curve_reach'])} and stays there from "
            f"{steps_str(th['mean_curve_held'])}. A seed that never gets there counts as later "
            "than all others in a median."
            + (
                f" The greedy evaluation (mean over seeds x episodes, after every chunk, no "
                f"smoothing) first reaches {threshold:g} at {steps_str(th['eval_reach'])} and "
                f"stays there from {steps_str(th['eval_held'])}."
                if "eval_reach" in th
                else ""
            ),
            "",
        ]
    columns = [("seed", "seed", "d")]
    if ev:
        columns.append(("greedy eval return [95 % CI over episodes]", "eval_return_str", ""))
    columns += [("training return", "final_return", ".1f"), ("AUC", "auc_return", ".1f")]
    if threshold is not None and th:
        columns += [
            (f"reaches {threshold:g} (smoothed)", "reach_str", ""),
            (f"stays >= {threshold:g} from (smoothed)", "held_str", ""),
        ]
    lines += ["Per seed:", "", markdown_table(report["per_seed"], columns)]
    return "\n".join(lines) + "\n"


def curve_study_plot(report: dict, path: Path) -> None:
    import numpy as np
    from matplotlib.figure import Figure

    from rljax.run.stats import band, mean_ci

    returns = np.array([s["episode_return"] for s in report["per_seed"]]).T  # [U, S]
    per_update = report["env_steps_per_update"]
    env_steps = (np.arange(len(returns)) + 1) * per_update
    window = curve_window(len(returns))
    low, high = report.get("return_range") or (None, None)
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    n = len(report["seeds"])
    exploring = "epsilon_start" in report.get("config", {})
    behaviour = "epsilon-greedy policy" if exploring else "sampled actions"
    plot_seed_curves(
        ax,
        env_steps,
        returns,
        window,
        color="tab:blue",
        label=f"training return ({behaviour}), mean of {n} seeds, 95 % CI",
        low=low,
        high=high,
    )
    ev = report.get("eval")
    if ev:
        samples = np.array(ev["returns"]).reshape(len(ev["updates"]), -1)  # [K, S*E]
        mean, half = mean_ci(samples, axis=1)
        lower, upper = band(mean, half, low, high)
        x = np.array(ev["updates"]) * per_update
        ax.plot(
            x,
            mean,
            "o-",
            color="tab:orange",
            ms=3,
            lw=1.2,
            label=f"greedy eval return, {n} seeds x {ev['episodes']} episodes, 95 % CI",
        )
        ax.fill_between(x, lower, upper, color="tab:orange", alpha=0.2, lw=0)
    if report.get("threshold") is not None:
        ax.axhline(
            report["threshold"], color="gray", ls="--", lw=1, label=f"{report['threshold']:g}"
        )
    ax.set_xlabel("env steps per seed")
    ax.xaxis.set_major_formatter(
        lambda x, _: f"{x / 1e6:g}M" if env_steps[-1] >= 2e6 else f"{x / 1e3:g}k"
    )
    smoothing = f"training: moving mean over {window} updates" if window > 1 else "per update"
    ax.set_ylabel(f"episode return ({smoothing})")
    head = f"greedy eval {report['row']['eval_return_str']}; " if ev else ""
    ax.set_title(
        f"{report['title']}: {head}training {report['row']['final_return_str']}\n"
        f"bands: 95 % CI of the mean (clipped to the return's range); thin: each seed",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
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


def summarise_curves(report: dict) -> None:
    """The derived figures of a study, from its stored curves (so that ``--replot`` recomputes
    them): headline row strings, per-seed threshold steps and greedy evaluation."""
    import numpy as np

    from rljax.run.stats import mean_ci

    per_seed, row = report["per_seed"], report["row"]
    low, high = report.get("return_range") or (None, None)
    returns = np.array([s["episode_return"] for s in per_seed], np.float64).T  # [U, S]
    finals = final_returns(returns, report["final_fraction"])
    mean, half = mean_ci(finals)
    row["final_return_mean"], row["final_return_ci95"] = float(mean), float(half)
    row["final_return_str"] = ci_str(mean, half, low, high)
    for i, s in enumerate(per_seed):
        s["final_return"] = float(finals[i])
    threshold = report.get("threshold")
    if threshold is not None:
        env_steps = (np.arange(len(returns)) + 1) * report["env_steps_per_update"]
        th = threshold_steps(returns, env_steps, threshold, curve_window(len(returns)))
        report["threshold_steps"] = th
        for i, s in enumerate(per_seed):
            s["steps_to_threshold"], s["held_from"] = th["reach"][i], th["held"][i]
            s["reach_str"], s["held_str"] = steps_str(th["reach"][i]), steps_str(th["held"][i])
    ev = report.get("eval")
    if ev and threshold is not None:
        from rljax.run.stats import held_from, steps_to_threshold

        x = np.array(ev["updates"]) * report["env_steps_per_update"]
        curve = np.array(ev["returns"], np.float64).mean(axis=(1, 2))  # [K]
        th["eval_reach"] = steps_to_threshold(x, curve, threshold, window=1)
        th["eval_held"] = held_from(x, curve, threshold, window=1)
    if ev:
        final = np.array(ev["returns"][-1], np.float64)  # [S, E]
        row["eval_min"] = float(final.min())
        row["eval_at_max"] = int((final >= high).sum()) if high is not None else None
        mean, half = mean_ci(final.reshape(-1))
        row["eval_return_mean"], row["eval_return_ci95"] = float(mean), float(half)
        row["eval_return_str"] = ci_str(mean, half, low, high)
        seed_mean, seed_half = mean_ci(final, axis=1)
        mean, half = mean_ci(seed_mean)
        row["eval_return_over_seeds_str"] = ci_str(mean, half, low, high)
        for i, s in enumerate(per_seed):
            s["eval_return"] = float(seed_mean[i])
            s["eval_return_str"] = ci_str(seed_mean[i], seed_half[i], low, high)


def before_first_episode(returns, episodes):
    """``returns``/``episodes``: ``[U, S]``. Until a seed's first episode ends the return metric
    reads 0, which is not a return (Pendulum's are all negative: 0 would 'reach' any threshold);
    those updates take the first finished episodes' return. A no-op when episodes end in the
    first update (CartPole)."""
    import numpy as np

    returns = np.array(returns, np.float64)
    for i in range(returns.shape[1]):
        finished = np.flatnonzero(np.asarray(episodes)[:, i] > 0)
        if len(finished) and finished[0] > 0:
            returns[: finished[0], i] = returns[finished[0], i]
    return returns


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
    return_range: tuple[float | None, float | None] = (None, None),
    budget_note=None,
    argv=None,
) -> dict:
    """A learning-curve study end to end: parse the shared command line, train the seeds with
    greedy evaluation after every chunk, write ``<out>.md/.json/.png`` and print the table.
    ``make_config(total_timesteps)`` -> algorithm config; ``config_summary(config)`` -> one
    line; ``return_range`` -> the bounds of an episode's return (bands are clipped to it);
    ``budget_note(total_timesteps)`` -> text appended to the budget (e.g. why it is below the
    reference)."""
    import dataclasses

    import numpy as np

    args = curve_study_args(doc, default_timesteps, quick_timesteps, name, argv)
    if args.replot:
        report = json.loads(args.replot.read_text())
        report.setdefault("return_range", list(return_range))
        summarise_curves(report)
        write_json_compact(args.replot, name, report)  # derived figures only; its metadata kept
        print(curve_study_outputs(report, args.replot.with_suffix("")))
        return report
    config = make_config(args.total_timesteps)
    t_start = time.perf_counter()
    log(f"{title}: {len(args.seeds)} seeds x {config.num_updates} updates")
    result = train_seeds(config, args.seeds, args.chunk, eval_episodes=args.eval_episodes)
    wall_s = time.perf_counter() - t_start
    returns = result["metrics"]["episode_return"].astype(np.float64)  # [U, S]
    returns = before_first_episode(returns, result["metrics"]["episodes"])
    per_update = config.env_steps_per_update
    env_steps = config.num_updates * per_update
    per_seed = [
        {
            "seed": seed,
            "auc_return": float(returns[:, i].mean()),
            "max_return": float(returns[:, i].max()),
            "episode_return": np.round(returns[:, i], 2).tolist(),
        }
        for i, seed in enumerate(args.seeds)
    ]
    row = {
        "study": title,
        "num_seeds": len(args.seeds),
        "env_steps": env_steps,
        "eval_return_str": "-",
        "auc_return": float(returns.mean()),
        "steps_per_s": env_steps * len(args.seeds) / result["run_s"],
        "compile_s": result["compile_s"],
        "init_s": result["init_s"],
        "run_s": result["run_s"],
        "eval_s": result.get("eval_s"),
    }
    seed_mean = {
        k: np.round(v.astype(np.float64).mean(1), 5).tolist()
        for k, v in result["metrics"].items()
        if k in ("episode_length", "entropy", "approx_kl", "value_loss", "loss", "q_mean")
    }
    ev = result.get("eval")
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
            f"training return: per seed the mean episode_return over the last "
            f"{FINAL_FRACTION:.0%} of updates; mean and 95 % t-interval of the mean over seeds"
        ),
        "eval_definition": (
            "greedy policy, one fresh environment per episode run to its end, after every chunk "
            "and after the last update; returns [evaluations][seeds][episodes]; headline: the "
            "last evaluation, mean and 95 % t-interval over seeds x episodes"
        ),
        "threshold": threshold,
        "return_range": list(return_range),
        "machine": machine_line(),
        "code_version": code_version(),
        "wall_s": wall_s,
        "compile_detail_s": result["compile_detail_s"],
        "row": row,
        "eval": None
        if ev is None
        else {
            "episodes": args.eval_episodes,
            "updates": ev["updates"],
            "returns": np.round(ev["returns"], 2).tolist(),
        },
        "per_seed": per_seed,
        "seed_mean_metrics": seed_mean,
    }
    summarise_curves(report)
    json_path = args.out.with_suffix(".json")
    write_json_compact(json_path, name, report)
    log(f"wrote {json_path}")
    print("\n" + curve_study_outputs(report, args.out))
    return report
