"""PPO CartPole-v1: a 3x3 learning-rate x entropy-coefficient sweep, 3 seeds each, in one jit.

    python experiments/sweep_lr_entropy.py              # 9 settings x 3 seeds x 5e5 env steps
    python experiments/sweep_lr_entropy.py --quick      # smoke run, writes to a temp dir
    python experiments/sweep_lr_entropy.py --lr 1e-4 1e-3 --ent-coef 0 0.05 --seeds 0 1
    python experiments/sweep_lr_entropy.py --replot experiments/results/sweep_lr_entropy.json

``rljax.run.sweep.sweep(PPOConfig(), {"lr": [...], "ent_coef": [...]}, seeds=[0, 1, 2])``: the 27
members (settings x seeds) are vmapped in one compiled chunk program on a ``data=1,model=1`` mesh;
member (setting, seed) starts from ``jax.random.key(seed)`` with the setting's lr and ent_coef
as traced hyperparameters, everything else ``PPOConfig()`` (4 envs x 128 steps, 4 epochs x 4
minibatches, lr annealed linearly to 0, 2x64 tanh). Grid: lr 2.5e-5 / 2.5e-4 (the default) /
2.5e-3, a decade either side; ent_coef 0 / 0.01 (the default) / 0.1.

Writes ``experiments/results/sweep_lr_entropy.{md,json,png}``: per setting the final training
return (per seed the mean episode_return over the last 5% of updates, then the mean and its 95 %
confidence interval over seeds, clipped to 0-500), the mean return over all updates (AUC), steps
to 475 on the smoothed training curve (first reached, and held to the end; median over seeds),
and a plot (heatmaps of final and AUC return, seed-mean learning curves). All returns are
training returns of the sampling policy: ``rljax.run.sweep`` returns no final states, so this
study has no greedy evaluation. The sweep's own run directory
(per-setting ``metrics.jsonl``, ``summary.md``, ``sweep.png``) goes to ``runs/sweep_lr_entropy``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import (  # noqa: E402
    REPO_ROOT,
    ci_str,
    code_version,
    curve_window,
    log,
    machine_line,
    smooth,
    steps_str,
    threshold_steps,
    write_json_compact,
)
from rljax import PPOConfig, RunConfig  # noqa: E402
from rljax.run.stats import band, mean_ci  # noqa: E402
from rljax.run.sweep import sweep  # noqa: E402

NAME = "sweep_lr_entropy"
DEFAULT_LR = [2.5e-5, 2.5e-4, 2.5e-3]
DEFAULT_ENT = [0.0, 0.01, 0.1]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--lr", type=float, nargs="+", default=DEFAULT_LR)
    p.add_argument("--ent-coef", type=float, nargs="+", default=DEFAULT_ENT)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--total-timesteps", type=int, help="env steps per member (default 500,000)")
    p.add_argument("--quick", action="store_true", help="tiny budget smoke run, to a temp dir")
    p.add_argument("--out", type=Path, help="output path stem: writes STEM.md/.json/.png")
    p.add_argument("--runs-dir", type=Path, help="parent of the sweep's run directory")
    p.add_argument("--replot", type=Path, metavar="JSON", help="rewrite .md/.png from a JSON")
    args = p.parse_args(argv)
    if args.total_timesteps is None:
        args.total_timesteps = 20_480 if args.quick else 500_000
    quick_dir = Path(tempfile.gettempdir()) / f"{NAME}_quick"
    if args.out is None:
        args.out = quick_dir / NAME if args.quick else REPO_ROOT / "experiments/results" / NAME
    if args.runs_dir is None:
        args.runs_dir = quick_dir / "runs" if args.quick else REPO_ROOT / "runs"
    return args


def grid_table(report: dict, values: np.ndarray, fmt: str) -> str:
    """``values: [len(lr), len(ent)]`` as a markdown grid, lr rows x ent_coef columns."""
    lines = [
        "| lr \\ ent_coef | " + " | ".join(f"{e:g}" for e in report["ent_coef"]) + " |",
        "|---|" + "--:|" * len(report["ent_coef"]),
    ]
    for i, lr in enumerate(report["lr"]):
        lines.append(f"| {lr:g} | " + " | ".join(format(v, fmt) for v in values[i]) + " |")
    return "\n".join(lines)


THRESHOLD = 475.0


def setting_table(report: dict) -> str:
    """Per setting: final training return [95 % CI], AUC, steps to THRESHOLD (smoothed)."""
    curves = np.array(report["episode_return"], np.float64)  # [settings, seeds, updates]
    env_steps = (np.arange(curves.shape[-1]) + 1) * report["env_steps_per_update"]
    window = curve_window(curves.shape[-1])
    n = len(report["seeds"])
    lines = [
        f"| lr | ent_coef | final training return [95 % CI] | AUC | reaches {THRESHOLD:g} "
        f"(smoothed) | stays >= {THRESHOLD:g} from (smoothed) |",
        "|--:|--:|---|--:|---|---|",
    ]
    for k, setting in enumerate(report["settings"]):
        mean, half = mean_ci(report["final_return"][k])
        th = threshold_steps(curves[k].T, env_steps, THRESHOLD, window)
        reached = sum(v is not None for v in th["reach"])
        held = sum(v is not None for v in th["held"])
        lines.append(
            f"| {setting['lr']:g} | {setting['ent_coef']:g} | {ci_str(mean, half, 0.0, 500.0)} | "
            f"{curves[k].mean():.1f} | {steps_str(th['reach_median'])} ({reached}/{n}) | "
            f"{steps_str(th['held_median'])} ({held}/{n}) |"
        )
    return "\n".join(lines)


def markdown(report: dict) -> str:
    n_lr, n_ent = len(report["lr"]), len(report["ent_coef"])
    auc = np.array(report["auc_return"]).mean(1).reshape(n_lr, n_ent)
    final = np.array(report["final_return"])
    lines = [
        "# PPO CartPole-v1: learning rate x entropy coefficient sweep",
        "",
        f"`rljax.run.sweep.sweep(PPOConfig(total_timesteps={report['total_timesteps']:,}), "
        f"{{'lr': {report['lr']}, 'ent_coef': {report['ent_coef']}}}, seeds={report['seeds']})`: "
        f"{len(report['settings'])} settings x {len(report['seeds'])} seeds = "
        f"{len(report['settings']) * len(report['seeds'])} members vmapped in one jit on mesh "
        f"`data=1,model=1`, {report['total_timesteps']:,} env steps each ({report['num_updates']} "
        f"updates x {report['env_steps_per_update']}); member (setting, seed) starts from "
        f"`jax.random.key(seed)`; all else `PPOConfig()` (lr annealed linearly to 0). "
        f"{report['machine']}; rljax {report.get('code_version', 'unknown')}; sweep wall time "
        f"{report['wall_s']:.0f} s (compile included), "
        f"{report['steps_per_s']:,.0f} env steps/s over all members (the sweep's figure: chunk "
        f"calls including the chunk program's compile). Written by `experiments/{NAME}.py`.",
        "",
        "All returns are **training returns** of the sampling policy (`rljax.run.sweep` returns "
        "no final states, so there is no greedy evaluation here). final return: per seed the "
        "mean training episode_return over the last 5% of updates (`rljax.run.sweep`'s "
        "definition), then the mean [95 % confidence interval of the mean over seeds, Student "
        f"t, clipped to CartPole's return range 0-500]. Steps to {THRESHOLD:g}: on each seed's "
        f"training return smoothed over {curve_window(report['num_updates'])} updates "
        "(`rljax.run.stats.steps_to_threshold` / `held_from`), the median over seeds (a seed "
        "that never gets there counts as later than the others; 'never' when most never do), "
        "with how many seeds got there.",
        "",
        setting_table(report),
        "",
        "Final training return, mean over seeds (lr rows x ent_coef columns):",
        "",
        grid_table(report, final.mean(1).reshape(n_lr, n_ent), ".1f"),
        "",
        "AUC return: mean training episode_return over all updates (area under the learning curve; "
        "separates settings that all end at the cap of 500), mean over seeds:",
        "",
        grid_table(report, auc, ".1f"),
    ]
    return "\n".join(lines) + "\n"


def plot(report: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    lrs, ents = report["lr"], report["ent_coef"]
    n_lr, n_ent = len(lrs), len(ents)
    final = np.array(report["final_return"])  # [settings, seeds]
    auc = np.array(report["auc_return"])
    fig = Figure(figsize=(17, 5.2))
    axes = fig.subplots(1, 3, gridspec_kw={"width_ratios": [1, 1, 1.5]})
    panels = (
        (axes[0], final, "final training return (last 5% of updates)"),
        (axes[1], auc, "AUC training return (mean over all updates)"),
    )
    for ax, values, title in panels:
        mean, half = mean_ci(values, axis=1)
        lower, upper = band(mean, half, 0.0, 500.0)
        mean, lower, upper = (v.reshape(n_lr, n_ent) for v in (mean, lower, upper))
        image = ax.imshow(mean, cmap="viridis", vmin=0, vmax=500, origin="lower", aspect="auto")
        for i in range(n_lr):
            for j in range(n_ent):
                dark = mean[i, j] > 300
                ax.text(
                    j,
                    i,
                    f"{mean[i, j]:.0f}\n[{lower[i, j]:.0f}, {upper[i, j]:.0f}]",
                    ha="center",
                    va="center",
                    fontsize=11,
                    color="black" if dark else "white",
                )
        ax.set_xticks(range(n_ent), [f"{e:g}" for e in ents])
        ax.set_yticks(range(n_lr), [f"{lr:g}" for lr in lrs])
        ax.set_xlabel("ent_coef")
        ax.set_ylabel("lr (annealed to 0)")
        n = len(report["seeds"])
        ax.set_title(f"{title}\nmean [95 % CI, clipped to 0-500] over {n} seeds", fontsize=10)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    ax = axes[2]
    curves = np.array(report["episode_return"])  # [settings, seeds, updates]
    window = curve_window(curves.shape[-1])
    steps = (np.arange(curves.shape[-1]) + 1) * report["env_steps_per_update"]
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown"]
    styles = [":", "--", "-", "-."]
    for k, setting in enumerate(report["settings"]):
        i, j = lrs.index(setting["lr"]), ents.index(setting["ent_coef"])
        mean = smooth(curves[k].T, window).mean(1)
        ax.plot(
            steps,
            mean,
            color=colors[i % len(colors)],
            ls=styles[j % len(styles)],
            lw=1.5,
            label=f"lr {setting['lr']:g}, ent {setting['ent_coef']:g}",
        )
    ax.set_xlabel("env steps per member")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e3:g}k")
    smoothing = f"moving mean over {window} updates" if window > 1 else "per update"
    ax.set_ylabel(f"training episode return, seed mean ({smoothing})")
    ax.set_ylim(0, 520)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=1, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)
    ax.set_title("learning curves (colour: lr, line style: ent_coef)", fontsize=10)
    fig.suptitle(
        f"PPO CartPole-v1, lr x ent_coef sweep, {len(report['seeds'])} seeds x "
        f"{report['total_timesteps']:,} env steps, one jit",
        fontsize=12,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    log(f"wrote {path}")


def write_outputs(report: dict, stem: Path) -> str:
    stem.parent.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    stem.with_suffix(".md").write_text(text)
    log(f"wrote {stem.with_suffix('.md')}")
    plot(report, stem.with_suffix(".png"))
    return text


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.replot:
        report = json.loads(args.replot.read_text())
        print(write_outputs(report, args.replot.with_suffix("")))
        return report
    config = PPOConfig(total_timesteps=args.total_timesteps)
    grid = {"lr": args.lr, "ent_coef": args.ent_coef}
    run = RunConfig.make(mesh="data=1,model=1", runs_dir=str(args.runs_dir), run_name=NAME)
    t0 = time.perf_counter()
    result = sweep(config, grid, seeds=args.seeds, run=run, progress=log)
    wall_s = time.perf_counter() - t0
    returns = result.returns.astype(np.float64)  # [updates, settings, seeds]
    report = {
        "title": "PPO CartPole-v1 lr x ent_coef sweep",
        "lr": [float(v) for v in args.lr],
        "ent_coef": [float(v) for v in args.ent_coef],
        "seeds": result.seeds,
        "settings": result.settings,
        "member_keys": "jax.random.key(seed) per member (rljax.run.sweep)",
        "total_timesteps": args.total_timesteps,
        "num_updates": config.num_updates,
        "env_steps_per_update": config.env_steps_per_update,
        "quick": args.quick,
        "machine": machine_line(),
        "code_version": code_version(),
        "wall_s": wall_s,
        "steps_per_s": result.steps_per_second,
        "run_dir": str(result.run_dir),
        "table": result.table,
        "final_return_definition": "rljax.run.sweep: per seed the mean training episode_return "
        "over the last 5% of updates; intervals: 95 % t-interval of the mean over seeds",
        "final_return": result.final_return.tolist(),  # [settings, seeds]
        "auc_return": returns.mean(0).tolist(),  # [settings, seeds]
        # [settings][seeds][updates]
        "episode_return": [
            [np.round(returns[:, k, s], 1).tolist() for s in range(returns.shape[2])]
            for k in range(returns.shape[1])
        ],
    }
    json_path = args.out.with_suffix(".json")
    write_json_compact(json_path, NAME, report)
    log(f"wrote {json_path}")
    print("\n" + write_outputs(report, args.out))
    return report


if __name__ == "__main__":
    main()
