"""Learning with bigger networks: PPO on Breakout-MinAtar with a CNN and residual MLPs against
the 2x64 MLP baseline, 3 seeds each, one step budget; and a width-scaling curve.

    python experiments/large_networks_breakout.py --setting all     # the study, 490k steps/seed
    python experiments/large_networks_breakout.py --setting cnn     # one setting
    python experiments/large_networks_breakout.py --measure         # steps/s -> 30-min budget
    python experiments/large_networks_breakout.py --quick           # smoke run, to a temp dir
    python experiments/large_networks_breakout.py --replot          # rebuild the combined table

Settings (all PPO with the ``minatar`` preset, PureJaxRL's MinAtar hyperparameters, only the
network differs): ``mlp`` the 2x64 relu actor and critic of ``experiments/ppo_breakout.py``;
``cnn`` one 3x3 convolution, 16 channels, stride 1, SAME padding, shared by policy and value,
then the same 2x64 actor and critic towers (``network=cnn``, rljax's default CNN); ``residual``
a SimBa-style residual MLP (``network=residual``: embedding to width 64, 2 pre-LayerNorm blocks
with hidden width 4 x 64, separate actor and critic towers); ``residual-32`` and
``residual-128`` the same at widths 32 and 128, which with ``residual`` make the width-scaling
curve (parameters against final return).

Each setting trains seeds 0, 1, 2 vmapped in one jit (``bench_harness.curve_study_main``: greedy
evaluation, 20 episodes per seed, after every chunk) and is saved as it finishes to
``experiments/results/large_networks_breakout/<setting>.{json,md,png}``; the combined
``experiments/results/large_networks_breakout.{md,json,png}`` is rebuilt from the saved JSONs
after every setting (and by ``--replot``), so an interrupted ``--setting all`` keeps the settings
that finished. ``--measure`` runs short runs (3 seeds x 65,536 steps) into
``.../large_networks_breakout/measure/``; the combined table turns their steps/s into the largest
budget per seed that fits ``--minutes`` (30) per setting, and uses them as its rows while no
full run exists. 1e7 steps per seed (the baseline's) did not fit: the default budget is the
largest that did (``DEFAULT_TIMESTEPS``), a complete shorter run (lr annealed to 0 over it).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments import bench_harness as bh  # noqa: E402

NAME = "large_networks_breakout"
RESULTS = bh.REPO_ROOT / "experiments" / "results"
SEEDS = [0, 1, 2]
REFERENCE_TIMESTEPS = 10_000_000  # PureJaxRL's MinAtar budget, the baseline's
# The largest budget per seed with which every setting fitted 30 min in `--measure` on 2026-12-03
# (2 cores shared, load average ~5; the cnn, at 1/16 of the mlp's steps/s, decides it).
DEFAULT_TIMESTEPS = 490_000
MEASURE_TIMESTEPS = 65_536  # 8 updates of 8,192 env steps: the steps/s settle after 3
QUICK_TIMESTEPS = 16_384
BUDGET_MINUTES = 30.0
FULL_RUN_EVALS = 21  # greedy evaluations in a full run: after each of 20 chunks (+ a remainder)

SETTINGS: dict[str, tuple[str, dict]] = {
    "mlp": ("MLP 2x64 relu (baseline)", {}),
    "cnn": (
        "CNN 3x3x16 (SAME) + 2x64 heads",
        {"network": "cnn", "cnn_channels": (16,), "cnn_kernel": 3, "cnn_head": "mlp"},
    ),
    "residual": (
        "residual MLP width 64, 2 blocks x4",
        {"network": "residual", "residual_width": 64, "residual_depth": 2},
    ),
    "residual-32": (
        "residual MLP width 32, 2 blocks x4",
        {"network": "residual", "residual_width": 32, "residual_depth": 2},
    ),
    "residual-128": (
        "residual MLP width 128, 2 blocks x4",
        {"network": "residual", "residual_width": 128, "residual_depth": 2},
    ),
}
WIDTH_CURVE = ("residual-32", "residual", "residual-128")
COLORS = {
    "mlp": "tab:blue",
    "cnn": "tab:orange",
    "residual": "tab:green",
    "residual-32": "tab:olive",
    "residual-128": "tab:purple",
}


def make_config(setting: str, total_timesteps: int):
    from rljax.presets import preset_config

    fields = {"residual_expansion": 4, **SETTINGS[setting][1]}
    return preset_config("minatar", total_timesteps=total_timesteps, **fields)


def parameter_count(config) -> int:
    """Trainable parameters of the config's actor-critic (shapes only, nothing computed)."""
    import jax
    import jax.numpy as jnp

    from rljax.envs import BatchedEnv
    from rljax.networks.zoo import actor_critic

    spec = BatchedEnv(config.env, 1).spec
    net = actor_critic(config, spec)
    shapes = jax.eval_shape(net.init, jax.random.key(0), jnp.zeros((1, spec.obs_dim), jnp.float32))
    return int(sum(math.prod(x.shape) for x in jax.tree.leaves(shapes)))


def run_setting(setting: str, args, out_dir: Path) -> dict:
    """Train one setting (seeds vmapped) with ``curve_study_main``; add the setting, its
    parameter count and the machine load to its JSON."""
    label = SETTINGS[setting][0]
    argv = [
        "--seeds", *map(str, args.seeds),
        "--total-timesteps", str(args.total_timesteps),
        "--out", str(out_dir / setting),
        "--eval-episodes", str(args.eval_episodes),
    ]  # fmt: skip
    if args.quick:
        argv.append("--quick")

    def summary(c) -> str:
        return (
            f"PPO {c.env}, PureJaxRL MinAtar hyperparameters ({c.num_envs} envs x "
            f"{c.num_steps} steps, {c.update_epochs} epochs x {c.num_minibatches} minibatches, "
            f"lr {c.lr:g} annealed to 0); network: {label}"
        )

    report = bh.curve_study_main(
        name=NAME,
        doc=__doc__,
        title=f"PPO Breakout-MinAtar, {setting}: {label}",
        make_config=lambda t: make_config(setting, t),
        config_summary=summary,
        default_timesteps=args.total_timesteps,
        quick_timesteps=args.total_timesteps,
        return_range=(0.0, None),
        argv=argv,
    )
    report.update(
        setting=setting,
        label=label,
        parameters=parameter_count(make_config(setting, args.total_timesteps)),
        load_average=[round(x, 2) for x in os.getloadavg()],
    )
    bh.write_json_compact(out_dir / f"{setting}.json", NAME, report)
    return report


def load_reports(directory: Path) -> dict[str, dict]:
    """The per-setting JSONs in ``directory``, in ``SETTINGS`` order."""
    out = {}
    for setting in SETTINGS:
        path = directory / f"{setting}.json"
        if path.exists():
            out[setting] = json.loads(path.read_text())
    return out


def load_baseline(path: Path = RESULTS / "ppo_breakout.json") -> dict:
    """The 2x64 MLP baseline of ``experiments/ppo_breakout.py`` (training return over the last
    5 % of updates, mean and sample std over its seeds)."""
    if path.exists():
        row = json.loads(path.read_text())["row"]
        return {
            "return_mean": row["final_return_mean"],
            "return_std": row.get("final_return_std", 11.5),
            "num_seeds": row["num_seeds"],
            "env_steps": row["env_steps"],
            "steps_per_s": row.get("steps_per_s"),
        }
    return {"return_mean": 65.2, "return_std": 11.5, "num_seeds": 5, "env_steps": 9_994_240}


def fitting_budget(r: dict, minutes: float, num_seeds: int | None = None) -> dict:
    """From a run's steps/s (all seeds), compile, init and evaluation seconds: the largest env
    steps per seed whose run fits ``minutes``, with ``FULL_RUN_EVALS`` evaluations (each a fixed
    1000-step scan, so its cost does not grow with the budget); capped at 1e7."""
    row = r["row"]
    seeds = num_seeds or row["num_seeds"]
    evals = len((r.get("eval") or {}).get("updates") or []) or 1
    eval_s = (row.get("eval_s") or 0.0) / evals * FULL_RUN_EVALS
    overhead = row["compile_s"] + row.get("init_s", 0.0) + eval_s
    steps = max(0.0, minutes * 60 - overhead) * row["steps_per_s"] / seeds
    per_update = r["env_steps_per_update"]
    steps = min(REFERENCE_TIMESTEPS, int(steps // per_update) * per_update)
    return {"overhead_s": overhead, "eval_s_full": eval_s, "fits_steps": steps}


def round_budget(steps: int) -> int:
    """Down to two significant figures (``3,471,000`` -> ``3,400,000``)."""
    if steps <= 0:
        return 0
    unit = 10 ** max(0, int(math.log10(steps)) - 1)
    return steps // unit * unit


def combined_report(reports: dict, measured: dict, baseline: dict, minutes: float) -> dict:
    """Rows of the combined table (one per setting), the 30-minute budget plan from
    ``measured`` (short runs; ``reports`` where there are none) and the width curve."""
    rows = []
    for setting, r in reports.items():
        row = r["row"]
        rows.append(
            {
                "setting": setting,
                "network": r.get("label", SETTINGS.get(setting, ("?",))[0]),
                "parameters": r.get("parameters"),
                "env_steps": row["env_steps"],
                "num_seeds": row["num_seeds"],
                "eval_return_str": row.get("eval_return_str", "-"),
                "eval_return_mean": row.get("eval_return_mean"),
                "eval_return_ci95": row.get("eval_return_ci95"),
                "final_return_str": row["final_return_str"],
                "final_return_mean": row["final_return_mean"],
                "final_return_ci95": row["final_return_ci95"],
                "steps_per_s": row["steps_per_s"],
                "compile_s": row["compile_s"],
                "wall_s": r.get("wall_s"),
            }
        )
    plan = []
    for setting, r in (measured or reports).items():
        fit = fitting_budget(r, minutes, len(SEEDS))
        plan.append(
            {
                "setting": setting,
                "parameters": r.get("parameters"),
                "measured_env_steps": r["row"]["env_steps"],
                "steps_per_s": r["row"]["steps_per_s"],
                "load_average": r.get("load_average"),
                **fit,
            }
        )
    base = next((p["steps_per_s"] for p in plan if p["setting"] == "mlp"), None)
    for p in plan:  # time per env step relative to the MLP: less sensitive to the machine's load
        p["cost_vs_mlp"] = base / p["steps_per_s"] if base else None
    common = round_budget(min(p["fits_steps"] for p in plan)) if plan else None
    budgets = sorted({row["env_steps"] for row in rows})
    return {
        "title": "PPO Breakout-MinAtar with bigger networks",
        "seeds": SEEDS,
        "minutes_per_setting": minutes,
        "rows": rows,
        "budget_plan": plan,
        "budget_plan_source": "the `--measure` runs" if measured else "these runs",
        "recommended_timesteps": common,
        "budgets": budgets,
        "from_measurement": bool(rows) and all(r.get("measure") for r in reports.values()),
        "baseline": baseline,
        "width_curve": [r for r in rows if r["setting"] in WIDTH_CURVE],
        "machine": next(iter(reports.values()))["machine"] if reports else bh.machine_line(),
    }


COLUMNS = [
    ("setting", "setting", ""),
    ("network", "network", ""),
    ("parameters", "parameters", ",d"),
    ("env steps/seed", "env_steps", ",d"),
    ("greedy eval return [95 % CI]", "eval_return_str", ""),
    ("training return, last 5 % [95 % CI]", "final_return_str", ""),
    ("steps/s", "steps_per_s", ",.0f"),
    ("compile s", "compile_s", ".1f"),
]
PLAN_COLUMNS = [
    ("setting", "setting", ""),
    ("parameters", "parameters", ",d"),
    ("measured at (steps/seed)", "measured_env_steps", ",d"),
    ("steps/s (3 seeds)", "steps_per_s", ",.0f"),
    ("time/step vs mlp", "cost_vs_mlp", ".1f"),
    ("load avg (1/5/15 min)", "load_str", ""),
    ("compile+init+eval s", "overhead_s", ".0f"),
    (f"largest budget/seed in the time (cap {REFERENCE_TIMESTEPS:,})", "fits_steps", ",d"),
]


def combined_markdown(c: dict) -> str:
    b, minutes = c["baseline"], c["minutes_per_setting"]
    budgets = ", ".join(f"{x:,}" for x in c["budgets"]) or "none yet"
    same = c["budgets"] == [b["env_steps"]]
    lines = [
        f"# {c['title']}",
        "",
        "PPO, the `minatar` preset (PureJaxRL's MinAtar hyperparameters: 64 envs x 128 steps, "
        "4 epochs x 8 minibatches, lr 5e-3 annealed to 0 over the budget); only the network "
        f"differs. Seeds {c['seeds']} vmapped in one jit per setting; budget {budgets} env steps "
        f"per seed. {c['machine']}. Written by `experiments/{NAME}.py`; per setting (curves, "
        f"per-seed tables): `experiments/results/{NAME}/<setting>.md` (`--measure` runs: "
        f"`.../{NAME}/measure/<setting>.md`).",
        "",
    ]
    if c["from_measurement"]:
        lines += [
            "**First table: the short measurement runs** (`--measure`); the study at the budget "
            "below has not been run yet. Returns this early say little.",
            "",
        ]
    lines += [
        f"Reference: the 2x64 MLP baseline of `experiments/ppo_breakout.py` reached a training "
        f"return of {b['return_mean']:.1f} ± {b['return_std']:.1f} (mean ± std over "
        f"{b['num_seeds']} seeds, last 5 % of updates) at {b['env_steps']:,} env steps per seed"
        + ("." if same else " — **a different budget from this table's**, so compare with care."),
        "",
        "- greedy eval return (the headline): greedy policy after the last update, 20 episodes "
        "per seed, mean and 95 % CI over seeds x episodes. Training return: sampled actions, "
        "per seed the mean over the last 5 % of updates, mean and 95 % CI over seeds.",
        "- steps/s: env steps of all seeds per second of the compiled training chunks (compile "
        "and evaluation excluded); the 2 cores are shared with other jobs (load average in the "
        "budget table), so it is a lower bound of an idle machine's.",
        "",
        bh.markdown_table(c["rows"], COLUMNS) if c["rows"] else "(no finished settings yet)",
        "",
        f"## Budget: what fits {minutes:g} minutes per setting",
        "",
        f"From the steps/s of {c['budget_plan_source']} (3 seeds): per setting, (time - compile - "
        f"init - {FULL_RUN_EVALS} greedy evaluations) x steps/s / 3 seeds, down to whole updates, "
        "capped at 1e7. All settings share one budget, so the slowest decides it. The steps/s "
        "depend on the machine's load (other jobs share the 2 cores)" + idle_note(c),
        "",
    ]
    plan = [
        {**p, "load_str": "/".join(map(str, p.get("load_average") or [])) or "-"}
        for p in c["budget_plan"]
    ]
    lines.append(bh.markdown_table(plan, PLAN_COLUMNS) if plan else "(nothing measured)")
    if c["recommended_timesteps"] is not None:
        rec = c["recommended_timesteps"]
        note = (
            "1e7, the baseline's budget, fits every setting"
            if rec >= REFERENCE_TIMESTEPS
            else "1e7 does not fit every setting; this is the largest common budget that does, "
            "to two significant figures, a complete shorter run with the lr annealed over it"
        )
        lines += [
            "",
            f"**Recommended budget: {rec:,} env steps per seed** ({note}). Run: `python "
            f"experiments/{NAME}.py --setting all --total-timesteps {rec}`.",
        ]
    return "\n".join(lines) + "\n"


def idle_note(c: dict) -> str:
    """How much faster the baseline's run trained per seed than the mlp measured here."""
    b = c["baseline"]
    mlp = next((p for p in c["budget_plan"] if p["setting"] == "mlp"), None)
    if not (b.get("steps_per_s") and mlp):
        return "."
    then, now = b["steps_per_s"] / b["num_seeds"], mlp["steps_per_s"] / len(c["seeds"])
    return (
        f"; the baseline's run trained at {then:,.0f} steps/s per seed ({b['num_seeds']} seeds "
        f"vmapped), the mlp here at {now:,.0f}, so on a machine as quiet as then every budget "
        f"here grows about {then / now:.1f}x. Time/step vs mlp is the load-independent part."
    )


def combined_plot(c: dict, reports: dict, path: Path) -> None:
    """Left: training-return curves (mean and 95 % CI over seeds) per setting and the baseline's
    final return; right: parameters against final greedy eval and training return."""
    import numpy as np
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5))
    ax, bx = fig.subplots(1, 2)
    for setting, r in reports.items():
        returns = np.array([s["episode_return"] for s in r["per_seed"]], float).T  # [U, S]
        x = (np.arange(len(returns)) + 1) * r["env_steps_per_update"]
        window = bh.curve_window(len(returns))
        color = COLORS.get(setting)
        bh.plot_seed_curves(ax, x, returns, window, color, setting, seeds=False, low=0.0)
    b = c["baseline"]
    same = c["budgets"] == [b["env_steps"]]
    ax.axhline(
        b["return_mean"],
        color="gray",
        ls="--",
        lw=1,
        label=f"2x64 MLP baseline {b['return_mean']:.1f} at {b['env_steps'] / 1e6:.3g}M steps"
        + ("" if same else " (different budget)"),
    )
    ax.xaxis.set_major_formatter(
        lambda v, _: f"{v / 1e6:g}M" if v >= 1e6 or v == 0 else f"{v / 1e3:g}k"
    )
    ax.set_xlabel("env steps per seed")
    ax.set_ylabel("training episode return (moving mean, 1/50 of the run)")
    ax.set_title("training return, mean of 3 seeds, 95 % CI bands", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    for key, fmt, name in (
        ("eval_return", "o-", "greedy eval"),
        ("final_return", "s--", "training"),
    ):
        face = None if key == "eval_return" else "none"
        pts = [r for r in c["rows"] if r.get(f"{key}_mean") is not None]
        curve = [r for r in pts if r["setting"] in WIDTH_CURVE]
        if curve:
            bx.errorbar(
                [r["parameters"] for r in curve],
                [r[f"{key}_mean"] for r in curve],
                yerr=[np.nan_to_num(r[f"{key}_ci95"]) for r in curve],
                fmt=fmt,
                capsize=3,
                color=COLORS["residual"],
                mfc=face,
                label=f"residual widths 32/64/128, {name}",
            )
        for r in pts:
            if r["setting"] not in WIDTH_CURVE:
                bx.errorbar(
                    r["parameters"],
                    r[f"{key}_mean"],
                    yerr=np.nan_to_num(r[f"{key}_ci95"]),
                    fmt=fmt[0],
                    capsize=3,
                    color=COLORS.get(r["setting"]),
                    mfc=face,
                    label=f"{r['setting']}, {name}",
                )
    bx.axhline(b["return_mean"], color="gray", ls="--", lw=1, label="MLP baseline (1e7 steps)")
    bx.set_xscale("log")
    bx.set_xlabel("parameters (actor + critic)")
    bx.set_ylabel("final return, 95 % CI")
    bx.set_title(f"width scaling at {', '.join(f'{x:,}' for x in c['budgets'])} steps/seed")
    bx.grid(alpha=0.3)
    bx.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def build_combined(out_dir: Path, stem: Path, minutes: float) -> dict:
    """Rebuild ``stem.{md,json,png}`` from the per-setting JSONs in ``out_dir`` (the measurement
    runs in ``out_dir/measure`` while there are none)."""
    measured = load_reports(out_dir / "measure")
    reports = load_reports(out_dir)
    if not reports:
        reports = {k: {**r, "measure": True} for k, r in measured.items()}
    c = combined_report(reports, measured, load_baseline(), minutes)
    bh.write_json_compact(stem.with_suffix(".json"), NAME, c)
    text = combined_markdown(c)
    stem.with_suffix(".md").write_text(text)
    combined_plot(c, reports, stem.with_suffix(".png"))
    bh.log(f"wrote {stem}.md/.json/.png")
    return c


def parse_args(argv):
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--setting", nargs="+", default=["all"], choices=[*SETTINGS, "all"])
    p.add_argument("--total-timesteps", type=int, help=f"per seed (default {DEFAULT_TIMESTEPS:,})")
    p.add_argument("--seeds", type=int, nargs="+", default=SEEDS)
    p.add_argument("--eval-episodes", type=int, default=bh.EVAL_EPISODES)
    p.add_argument("--measure", action="store_true", help="short runs for steps/s, to measure/")
    p.add_argument("--quick", action="store_true", help="tiny smoke run, to a temp dir")
    p.add_argument("--replot", action="store_true", help="only rebuild the combined outputs")
    p.add_argument("--minutes", type=float, default=BUDGET_MINUTES, help="time per setting")
    p.add_argument("--results", type=Path, default=RESULTS, help="results folder")
    args = p.parse_args(argv)
    if args.quick:
        args.results = Path(tempfile.gettempdir()) / f"{NAME}_quick"
        args.eval_episodes = min(args.eval_episodes, 4)
    default = QUICK_TIMESTEPS if args.quick else MEASURE_TIMESTEPS if args.measure else None
    args.total_timesteps = args.total_timesteps or default or DEFAULT_TIMESTEPS
    args.settings = list(SETTINGS) if "all" in args.setting else args.setting
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    out_dir = args.results / NAME
    stem = args.results / NAME
    if not args.replot:
        run_dir = out_dir / "measure" if args.measure else out_dir
        for setting in args.settings:
            r = run_setting(setting, args, run_dir)
            bh.log(
                f"{setting}: {r['parameters']:,} parameters, {r['row']['steps_per_s']:,.0f} "
                f"steps/s, compile {r['row']['compile_s']:.1f} s"
            )
            build_combined(out_dir, stem, args.minutes)  # after each: a stop keeps the done ones
    c = build_combined(out_dir, stem, args.minutes)
    print(combined_markdown(c))
    return c


if __name__ == "__main__":
    main()
