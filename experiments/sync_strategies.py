"""Gradient-synchronisation strategies compared: PPO and DQN on CartPole-v1, mesh data=4.

Every setting of ``rljax.parallel.sync`` below trains ``replicas=4`` data-parallel learners on
an emulated ``data=4,model=1`` CPU mesh, for each seed in turn: one ``ShardedRun`` per setting
is compiled once and re-initialised per seed (``run.init(jax.random.key(seed))``). Seeds are not
vmapped: vmap turns the ``lax.cond`` of local/adaptive sync into a select that would execute the
synchronising collectives on every step.

Configs
  ppo   ``PPOConfig()`` defaults (4 envs x 128 steps, 4 epochs x 4 minibatches = 16 optimizer
        steps per update, lr 2.5e-4 annealed), 5e5 env steps per seed
  dqn   ``DQNConfig(num_envs=8, batch_size=128, train_frequency=8)``: 8 envs for data=4 (the
        default 10 is not divisible by 4); ``train_frequency`` must divide ``num_envs`` or be a
        multiple of it, so 8 (one gradient step per vector step) replaces the default 10;
        ``epsilon_decay_steps`` is half the budget, as in the defaults (2.5e5 of 5e5). 2.5e5 env
        steps per seed (50 vector steps = 50 optimizer steps per update once learning started)

Settings: allreduce; local_sgd K=4, 16; adaptive threshold 0.003, 0.01 (max_period 32; the
drift ``max_r ||x_r - x_sync|| / ||x_sync||`` measured before the study was ~0.01 after 16 and
0.02-0.04 after 32 local optimizer steps early in training and smaller later, so 0.05 never fired
before max_period: 3.1 syncs per 100 steps, the max_period floor); compressed int8 (block 256)
and top-k 1% / 10%, with error feedback; stale tau=1, 4.

Columns
  final return   training return (the sampling / epsilon-greedy policy; this study runs no greedy
                 evaluation): per seed the mean ``episode_return`` of the last 5% of updates,
                 then the mean [95 % confidence interval over seeds (Student t), clipped to
                 CartPole's return range 0-500]
  AUC return     mean episode_return over all updates (area under the learning curve), mean over
                 seeds: separates settings that all end at CartPole's cap of 500
  steps/s        env steps (all seeds) / seconds of the timed chunk calls; compile excluded
  best seed      the fastest seed's steps/s (other work on the machine only ever slows a seed)
  compile s      ``ShardedRun.compile`` (init + chunk programs), once per setting
  bytes/update   bytes sent per device over ``data`` per update, from ``communication(algo,
                 mesh)`` and each update's measured ``optimizer_steps``/``syncs``
                 (``comm_bytes_per_update``); mean over updates that took an optimizer step
                 (DQN: after learning started)
  vs allreduce   bytes/update relative to the allreduce row of the same algorithm
  syncs/100      synchronising optimizer steps per 100 optimizer steps (all seeds)

    python experiments/sync_strategies.py                       # full study (~35 min, 2 cores)
    python experiments/sync_strategies.py --quick               # smoke run, writes to a temp dir
    python experiments/sync_strategies.py --algos ppo --seeds 0 1 --total-timesteps ppo=250000
    python experiments/sync_strategies.py --replot experiments/results/sync_strategies.json
"""

from __future__ import annotations

import jax

jax.config.update("jax_num_cpu_devices", 4)  # before anything touches a JAX backend

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import REPO_ROOT, ci_str, log, markdown_table  # noqa: E402
from rljax import DQN, PPO, DQNConfig, PPOConfig  # noqa: E402
from rljax.diagnostics import comm_bytes_per_update, communication  # noqa: E402
from rljax.parallel import make_mesh  # noqa: E402
from rljax.parallel.sync import SyncConfig  # noqa: E402
from rljax.run.sharded import ShardedRun  # noqa: E402
from rljax.run.stats import band, mean_ci, smooth  # noqa: E402

DEFAULT_OUT = REPO_ROOT / "experiments" / "results" / "sync_strategies"
MESH = "data=4,model=1"
REPLICAS = 4
FINAL_FRACTION = 0.05
DEFAULT_TIMESTEPS = {"ppo": 500_000, "dqn": 250_000}
QUICK_TIMESTEPS = {"ppo": 4_096, "dqn": 16_000}
# --quick runs one setting per strategy
QUICK_SETTINGS = ("allreduce", "local_sgd K=4", "adaptive thr=0.003", "int8 b=256 +EF", "stale 1")

SETTINGS: dict[str, SyncConfig] = {
    "allreduce": SyncConfig("allreduce"),
    "local_sgd K=4": SyncConfig("local_sgd", period=4),
    "local_sgd K=16": SyncConfig("local_sgd", period=16),
    "adaptive thr=0.003": SyncConfig("adaptive", threshold=0.003, max_period=32),
    "adaptive thr=0.01": SyncConfig("adaptive", threshold=0.01, max_period=32),
    "int8 b=256 +EF": SyncConfig("compressed", compression="int8", block_size=256),
    "top-k 1% +EF": SyncConfig("compressed", compression="topk", topk_fraction=0.01),
    "top-k 10% +EF": SyncConfig("compressed", compression="topk", topk_fraction=0.10),
    "stale 1": SyncConfig("stale", staleness=1),
    "stale 4": SyncConfig("stale", staleness=4),
}

# One colour family per strategy, line style within a family.
STYLES = {
    "allreduce": ("black", "-"),
    "local_sgd K=4": ("tab:blue", "-"),
    "local_sgd K=16": ("tab:blue", "--"),
    "adaptive thr=0.003": ("tab:green", "-"),
    "adaptive thr=0.01": ("tab:green", "--"),
    "int8 b=256 +EF": ("tab:red", "-"),
    "top-k 1% +EF": ("tab:orange", "--"),
    "top-k 10% +EF": ("tab:orange", "-"),
    "stale 1": ("tab:purple", "-"),
    "stale 4": ("tab:purple", "--"),
}

COLUMNS = [
    ("setting", "setting", ""),
    ("final training return [95 % CI]", "final_return_str", ""),
    ("AUC return", "mean_return", ".1f"),
    ("steps/s", "steps_per_s", ",.0f"),
    ("best seed steps/s", "steps_per_s_best", ",.0f"),
    ("compile s", "compile_s", ".1f"),
    ("bytes/update", "bytes_per_update", ",.0f"),
    ("vs allreduce", "bytes_vs_allreduce", ".3f"),
    ("syncs/100 steps", "syncs_per_100", ".1f"),
]


def parse_timesteps(items: list[str] | None, algos: list[str], quick: bool) -> dict[str, int]:
    """``["500000"]`` (every algo) or ``["ppo=500000", "dqn=250000"]`` -> ``{algo: steps}``."""
    budget = dict(QUICK_TIMESTEPS if quick else DEFAULT_TIMESTEPS)
    for item in items or []:
        if "=" in item:
            name, value = item.split("=", 1)
            if name not in DEFAULT_TIMESTEPS:
                raise SystemExit(f"--total-timesteps: unknown algorithm {name!r} in {item!r}")
            budget[name] = int(value)
        else:
            budget = dict.fromkeys(budget, int(item))
    return {a: budget[a] for a in algos}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--algos", nargs="+", choices=["ppo", "dqn"], default=["ppo", "dqn"])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument(
        "--total-timesteps",
        nargs="+",
        metavar="[ALGO=]N",
        help="env steps per seed: one N for every algorithm or ALGO=N items "
        f"(default {DEFAULT_TIMESTEPS})",
    )
    p.add_argument(
        "--settings", nargs="+", choices=list(SETTINGS), help="subset of settings (default all)"
    )
    p.add_argument("--quick", action="store_true", help="tiny budget smoke run (~1-2 min)")
    p.add_argument("--out", type=Path, help="output path stem: writes STEM.md/.json/.png")
    p.add_argument("--replot", type=Path, metavar="JSON", help="rewrite .md/.png from a JSON")
    args = p.parse_args(argv)
    args.timesteps = parse_timesteps(args.total_timesteps, args.algos, args.quick)
    if args.settings is None:
        args.settings = list(QUICK_SETTINGS if args.quick else SETTINGS)
    if args.out is None:
        quick_dir = Path(tempfile.gettempdir()) / "sync_strategies_quick"
        args.out = quick_dir / "sync_strategies" if args.quick else DEFAULT_OUT
    return args


# ------------------------------------------------------------------------------------------------
# Running
# ------------------------------------------------------------------------------------------------
def build(algo_name: str, total_timesteps: int, sync: SyncConfig):
    if algo_name == "ppo":
        cfg = PPOConfig(total_timesteps=total_timesteps, sync=sync)
        return cfg, PPO(cfg, replicas=REPLICAS), cfg.batch_size
    cfg = DQNConfig(
        num_envs=8,
        batch_size=128,
        train_frequency=8,
        epsilon_decay_steps=total_timesteps // 2,
        total_timesteps=total_timesteps,
        sync=sync,
    )
    return cfg, DQN(cfg, replicas=REPLICAS), cfg.env_steps_per_update


def run_setting(algo_name: str, setting: str, total_timesteps: int, seeds: list[int], mesh):
    cfg, algo, steps_per_update = build(algo_name, total_timesteps, SETTINGS[setting])
    num_updates = cfg.num_updates
    run = ShardedRun(algo, mesh, chunk_size=min(num_updates, 100))
    run.compile(jax.random.key(seeds[0]))
    compile_s = sum(run.compile_seconds.values())
    comm = communication(algo, mesh)
    last = max(1, round(FINAL_FRACTION * num_updates))
    per_seed = []
    for seed in seeds:
        state = jax.block_until_ready(run.init(jax.random.key(seed)))
        chunks, seconds, done = [], 0.0, 0
        while done < num_updates:
            count = min(run.chunk_size, num_updates - done)
            t0 = time.perf_counter()
            state, metrics = jax.block_until_ready(run.run_chunk(state, count))
            seconds += time.perf_counter() - t0
            chunks.append(jax.tree.map(lambda m, n=count: np.asarray(m[:n]), metrics))
            done += count
        m = {k: np.concatenate([c[k] for c in chunks]) for k in chunks[0]}
        returns = m["episode_return"].astype(np.float64)
        opt_steps, syncs = m["optimizer_steps"].astype(np.int64), m["syncs"].astype(np.int64)
        learning = opt_steps > 0
        bytes_per_update = [
            comm_bytes_per_update(comm, o, s)["comm_bytes_data"]
            for o, s in zip(opt_steps[learning], syncs[learning], strict=True)
        ]
        seed_row = {
            "seed": seed,
            "final_return": float(returns[-last:].mean()),
            "run_s": seconds,
            "steps_per_s": num_updates * steps_per_update / seconds,
            "optimizer_steps": int(opt_steps.sum()),
            "syncs": int(syncs.sum()),
            "bytes_per_update": float(np.mean(bytes_per_update)),
            "episode_return": np.round(returns, 2).tolist(),
            "syncs_per_update": syncs.tolist(),
            "optimizer_steps_per_update": opt_steps.tolist(),
        }
        if "divergence" in m:  # adaptive: mean drift over each update's optimizer steps
            seed_row["divergence"] = np.round(m["divergence"].astype(np.float64), 5).tolist()
        per_seed.append(seed_row)
        log(
            f"  {algo_name} {setting:<20} seed {seed}  {seed_row['steps_per_s']:>8,.0f} steps/s  "
            f"final return {seed_row['final_return']:6.1f}  syncs {seed_row['syncs']:>6}/"
            f"{seed_row['optimizer_steps']}"
        )
    finals = np.array([s["final_return"] for s in per_seed])
    total_opt = sum(s["optimizer_steps"] for s in per_seed)
    return {
        "algo": algo_name,
        "setting": setting,
        "sync": dataclasses.asdict(SETTINGS[setting]),
        "num_updates": num_updates,
        "env_steps_per_update": steps_per_update,
        "final_updates": last,
        "compile_s": compile_s,
        "compile_detail_s": run.compile_seconds,
        "communication": comm,
        "final_return_mean": float(finals.mean()),
        "final_return_std": float(finals.std(ddof=1)) if len(finals) > 1 else 0.0,
        "steps_per_s": sum(num_updates * steps_per_update for _ in per_seed)
        / sum(s["run_s"] for s in per_seed),
        "bytes_per_update": float(np.mean([s["bytes_per_update"] for s in per_seed])),
        "syncs_per_100": 100.0 * sum(s["syncs"] for s in per_seed) / max(total_opt, 1),
        "seeds": per_seed,
    }


# ------------------------------------------------------------------------------------------------
# Reporting
# ------------------------------------------------------------------------------------------------
def add_derived(rows: list[dict]) -> None:
    """Columns computed from the stored numbers (so that ``--replot`` recomputes them)."""
    for r in rows:
        r["steps_per_s_best"] = max(s["steps_per_s"] for s in r["seeds"])
        r["mean_return"] = float(np.mean([np.mean(s["episode_return"]) for s in r["seeds"]]))
        base = next((b for b in rows if b["algo"] == r["algo"] and b["setting"] == "allreduce"), 0)
        r["bytes_vs_allreduce"] = r["bytes_per_update"] / base["bytes_per_update"] if base else None
        mean, half = mean_ci([s["final_return"] for s in r["seeds"]])
        r["final_return_ci95"] = float(half)
        r["final_return_str"] = ci_str(mean, half, 0.0, 500.0)  # CartPole-v1's return range


def describe_config(report: dict) -> dict[str, str]:
    budgets = report["total_timesteps"]
    return {
        "ppo": f"PPO CartPole-v1, PPOConfig() defaults, {budgets.get('ppo', 0):,} env steps per "
        "seed, 16 optimizer steps per update",
        "dqn": f"DQN CartPole-v1, DQNConfig(num_envs=8, batch_size=128, train_frequency=8, "
        f"epsilon_decay_steps={budgets.get('dqn', 0) // 2:,}), {budgets.get('dqn', 0):,} env "
        "steps per seed, 50 optimizer steps per update after learning_starts=10,000",
    }


def write_markdown(report: dict, path: Path) -> None:
    rows = report["rows"]
    add_derived(rows)
    seeds = report["seeds"]
    spread = max(
        max(s["steps_per_s"] for s in r["seeds"]) / min(s["steps_per_s"] for s in r["seeds"])
        for r in rows
    )
    lines = [
        "# Gradient-synchronisation strategies",
        "",
        f"Mesh `{MESH}` ({REPLICAS} emulated CPU devices, replicas=4) on {report['cpu_count']} "
        f"CPU cores shared with other work; jax {report['jax_version']}, Python "
        f"{report['python']}, {report['platform']}; seeds {seeds} run one after another on one "
        f"compiled program per setting; total wall time {report['wall_s'] / 60:.1f} min "
        f"({report['finished']}). Written by `experiments/sync_strategies.py`.",
        "",
        "final return: the training return (sampling / epsilon-greedy policy; no greedy "
        f"evaluation in this study), per seed the mean episode return of the last "
        f"{FINAL_FRACTION:.0%} of updates, then the mean [95 % confidence interval over seeds "
        "(Student t), clipped to the return's range 0-500]. AUC return: the mean over every "
        "update (area under the learning curve), mean over seeds. steps/s: env steps / seconds "
        "of the compiled chunk calls (compile excluded; 4 emulated devices on shared cores, so "
        "relative rather than absolute: per-seed speeds of one setting differed by up to "
        f"{spread:.1f}x here, hence the fastest seed too). bytes/update: bytes sent per device "
        "over `data` per update (ring convention of `rljax.diagnostics.hlo`, measured on the "
        "compiled optimizer step x the measured optimizer steps and syncs; DQN: updates after "
        "learning started). syncs/100 steps: synchronising optimizer steps per 100 optimizer "
        "steps.",
    ]
    configs = describe_config(report)
    for algo in report["algos"]:
        algo_rows = [r for r in rows if r["algo"] == algo]
        if not algo_rows:
            continue
        lines += ["", f"## {algo.upper()}", "", configs[algo], ""]
        lines.append(markdown_table(algo_rows, COLUMNS))
        base = next((r for r in algo_rows if r["setting"] == "allreduce"), None)
        on_sync = [r for r in algo_rows if r["communication"]["data"]["on_sync"]]
        if base is not None and on_sync:
            unit = base["communication"]["data"]["always"]
            costs = ", ".join(
                f"{r['setting']} {r['communication']['data']['on_sync'] / unit:.2f}"
                for r in on_sync
            )
            lines.append(
                f"\nBytes of one synchronising step in units of an allreduce step ({unit:,.0f} "
                f"bytes): {costs}."
            )
        for r in (r for r in algo_rows if r["sync"]["strategy"] == "adaptive"):
            rates = " / ".join(f"{100 * x:.1f}" for x in sync_rate_by_quarter(r))
            drift = np.concatenate(
                [
                    np.array(s["divergence"])[np.array(s["optimizer_steps_per_update"]) > 0]
                    for s in r["seeds"]
                ]
            )
            lines.append(
                f"\n{r['setting']}: syncs per 100 optimizer steps by quarter of training "
                f"{rates}; drift (mean over an update's optimizer steps) median "
                f"{np.median(drift):.4f}, 90th percentile {np.percentile(drift, 90):.4f}."
            )
    path.write_text("\n".join(lines) + "\n")
    log(f"wrote {path}")


def sync_rate_by_quarter(row: dict) -> list[float]:
    """Syncs per optimizer step in each quarter of the updates (all seeds)."""
    syncs = np.sum([s["syncs_per_update"] for s in row["seeds"]], axis=0)
    steps = np.sum([s["optimizer_steps_per_update"] for s in row["seeds"]], axis=0)
    parts = np.array_split(np.arange(len(syncs)), 4)
    return [float(syncs[p].sum()) / max(int(steps[p].sum()), 1) for p in parts]


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    algos = [a for a in report["algos"] if any(r["algo"] == a for r in report["rows"])]
    fig, axes = plt.subplots(1, len(algos), figsize=(7.5 * len(algos), 5.8), squeeze=False)
    handles = {}
    for ax, algo in zip(axes[0], algos, strict=True):
        rows = [r for r in report["rows"] if r["algo"] == algo]
        window = max(1, rows[0]["num_updates"] // 25)
        for r in rows:
            curves = np.array([smooth(np.array(s["episode_return"]), window) for s in r["seeds"]])
            steps = (np.arange(curves.shape[1]) + 1) * r["env_steps_per_update"]
            mean, half = mean_ci(curves, axis=0)
            lower, upper = band(mean, half, 0.0, 500.0)  # CartPole-v1's return range
            color, style = STYLES.get(r["setting"], (None, "-"))
            (line,) = ax.plot(steps, mean, color=color, linestyle=style, lw=1.4)
            ax.fill_between(steps, lower, upper, color=line.get_color(), alpha=0.08, lw=0)
            handles[r["setting"]] = line
        budget = report["total_timesteps"][algo]
        ax.set_title(f"{algo.upper()} CartPole-v1, {budget:,} steps, {len(report['seeds'])} seeds")
        ax.set_xlabel("env steps per seed")
        ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1000:g}k")
        ax.set_ylabel(f"training episode return (moving mean over {window} updates)")
        ax.set_ylim(0, 520)
        ax.grid(alpha=0.3)
    order = [s for s in SETTINGS if s in handles]
    fig.legend(
        [handles[s] for s in order],
        order,
        loc="lower center",
        ncol=min(5, len(order)),
        frameon=False,
        fontsize=10,
    )
    fig.suptitle(
        f"Gradient sync strategies, mesh {MESH}: training return (sampling / epsilon-greedy "
        "policy), mean over seeds, bands: 95 % CI of the mean clipped to [0, 500]"
    )
    fig.tight_layout(rect=(0, 0.1 if len(order) > 5 else 0.06, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    log(f"wrote {path}")


def write_json(path: Path, report: dict) -> None:
    """Atomically write ``report`` plus the machine description of ``bench_harness.write_report``
    (keys already in ``report`` are kept), every flat list of numbers (the curves) on one line."""
    meta = {
        "benchmark": "sync_strategies",
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv[1:],
        "jax_version": jax.__version__,
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    text = json.dumps({**meta, **report}, indent=2)
    text = re.sub(
        r"\[\s*\n\s*([-+\d.eE,\s]*?)\s*\]", lambda m: "[" + " ".join(m.group(1).split()) + "]", text
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text + "\n")
    tmp.replace(path)


def write_outputs(report: dict, stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_markdown(report, stem.with_suffix(".md"))
    plot(report, stem.with_suffix(".png"))


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.replot:
        report = json.loads(args.replot.read_text())
        write_outputs(report, args.replot.with_suffix(""))
        return
    mesh = make_mesh(MESH)
    report = {
        "mesh": MESH,
        "algos": args.algos,
        "seeds": args.seeds,
        "total_timesteps": args.timesteps,
        "settings": args.settings,
        "quick": args.quick,
        "devices": [str(d) for d in jax.devices()],
        "rows": [],
    }
    t_start = time.perf_counter()
    json_path = args.out.with_suffix(".json")
    for algo in args.algos:
        for setting in args.settings:
            log(f"== {algo} {setting} ==")
            row = run_setting(algo, setting, args.timesteps[algo], args.seeds, mesh)
            report["rows"].append(row)
            report["wall_s"] = time.perf_counter() - t_start
            write_json(json_path, report)  # partial results survive a crash
    report["wall_s"] = time.perf_counter() - t_start
    add_derived(report["rows"])
    write_json(json_path, report)
    log(f"wrote {json_path}")
    report = json.loads(json_path.read_text())
    write_outputs(report, args.out)
    for algo in args.algos:
        rows = [r for r in report["rows"] if r["algo"] == algo]
        print(f"\n{describe_config(report)[algo]}\n\n{markdown_table(rows, COLUMNS)}")
    print(f"\ntotal wall time {report['wall_s'] / 60:.1f} min")


if __name__ == "__main__":
    main()
