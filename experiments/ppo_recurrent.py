"""PPO with a GRU (or LSTM) policy vs an MLP policy on partially observable CartPole
(CartPole-v1-po: the velocities masked, the observation is [x, theta]), 3 seeds each, the same
budget.

    python experiments/ppo_recurrent.py                   # GRU and MLP, 3 seeds x 2e6 steps
    python experiments/ppo_recurrent.py --policy lstm     # one policy (writes its own files)
    python experiments/ppo_recurrent.py --quick           # smoke run, writes to a temp dir
    python experiments/ppo_recurrent.py --combine         # ppo_recurrent.* from the two studies

Target (issue 16): the GRU policy reaches a mean training return of at least 400 (the last 5 %
of updates) within 2e6 env steps per seed; the MLP policy, on the same budget, is shown failing.

Config: PureJaxRL's ``ppo_rnn.py`` CartPole settings (a Dense(128) ReLU embedding, GRU 128,
one 128-wide ReLU layer per head, 4 epochs x 4 minibatches, lr annealed, gamma 0.99, GAE 0.95,
clip 0.2, entropy 0.01, value 0.5, grad norm 0.5) with two changes. The batch: 16 envs x 128
steps (PureJaxRL: 4 x 128). With 4 envs an update is 512 steps and each of the 4 minibatches is
one sequence; on two shared CPU cores a GRU update costs about the same time with 16 envs (the
cell's time loop, not the batch, sets it), so 2e6 steps take a quarter of the time. The
learning rate: 1e-3 (PureJaxRL: 2.5e-4). Measured with 2.5e-4 and these settings (3 seeds,
stopped at 501,760 steps per seed): training return 66.6 (seeds 71.1, 89.3, 39.4), against
199.0 at 100,352 steps with 1e-3. The MLP policy has the same settings with recurrent='none'
and two 128-wide ReLU layers per head (the embedding and the cell replaced by a layer). Each
study is ``bench_harness.curve_study_main`` (seeds vmapped in one jit on a ``data=1,model=1``
mesh, greedy evaluation after every chunk, the GRU's hidden state carried across steps),
written as ``ppo_recurrent_gru.*`` and ``ppo_recurrent_mlp.*``; ``ppo_recurrent.{md,json,png}``
puts them side by side, with ``ppo_recurrent_lstm.*`` when that study has run (``--policy lstm``:
the GRU's settings with an LSTM cell of the same width).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import (  # noqa: E402
    CURVE_COLUMNS,
    REPO_ROOT,
    curve_study_main,
    curve_study_outputs,
    curve_window,
    log,
    markdown_table,
    plot_seed_curves,
    write_json_compact,
)
from rljax import PPOConfig  # noqa: E402

NAME = "ppo_recurrent"
ENV = "CartPole-v1-po"
THRESHOLD = 400.0
RESULTS = REPO_ROOT / "experiments/results"
TITLES = {
    "gru": "PPO GRU, CartPole-v1-po (velocities masked)",
    "mlp": "PPO MLP, CartPole-v1-po (velocities masked)",
    "lstm": "PPO LSTM, CartPole-v1-po (velocities masked)",
}
DEFAULT_POLICIES = ["gru", "mlp"]


def make_config(total_timesteps: int, policy: str = "gru") -> PPOConfig:
    recurrent = policy in ("gru", "lstm")
    return PPOConfig(
        env=ENV,
        recurrent=policy if recurrent else "none",
        recurrent_width=128,
        num_envs=16,
        num_steps=128,
        total_timesteps=total_timesteps,
        update_epochs=4,
        num_minibatches=4,
        lr=1e-3,
        anneal_lr=True,
        gamma=0.99,
        gae_lambda=0.95,
        clip_eps=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        actor_widths=(128,) if recurrent else (128, 128),
        critic_widths=(128,) if recurrent else (128, 128),
        activation="relu",
    )


def summary(c: PPOConfig) -> str:
    net = (
        f"Dense({c.recurrent_width}) + {c.recurrent.upper()}({c.recurrent_width}) + "
        f"{c.actor_widths} heads"
        if c.recurrent != "none"
        else f"MLP {c.actor_widths} heads"
    )
    return (
        f"PPO {c.env}, {net}, {c.activation}, {c.num_envs} envs x {c.num_steps} steps, "
        f"{c.update_epochs} epochs x {c.num_minibatches} minibatches"
        + (" of whole sequences" if c.recurrent != "none" else "")
        + f", lr {c.lr:g} annealed, gamma {c.gamma:g}, ent {c.ent_coef:g}"
    )


def run_study(policy: str, argv: list[str]) -> dict:
    argv = list(argv)
    if "--seeds" not in argv:
        argv += ["--seeds", "0", "1", "2"]
    if "--out" not in argv and "--quick" not in argv:
        argv += ["--out", str(RESULTS / f"{NAME}_{policy}")]
    report = curve_study_main(
        name=f"{NAME}_{policy}",
        doc=__doc__,
        title=TITLES[policy],
        make_config=lambda steps: make_config(steps, policy),
        config_summary=summary,
        default_timesteps=2_000_000,
        quick_timesteps=16 * 128 * 4,
        threshold=THRESHOLD,
        return_range=(0.0, 500.0),
        argv=argv,
    )
    if "--quick" not in argv and "--replot" not in argv:
        name_script(report, RESULTS / f"{NAME}_{policy}")
    return report


def name_script(report: dict, stem: Path) -> None:
    """The study's files name this script (``curve_study_main`` names ``<name>.py``)."""
    report["script"] = f"experiments/{NAME}.py"
    write_json_compact(stem.with_suffix(".json"), stem.name, report)
    curve_study_outputs(report, stem)


def combine(reports: dict[str, dict], stem: Path) -> str:
    """``ppo_recurrent.{md,json,png}``: the studies' rows, per-seed figures and curves."""
    import numpy as np
    from matplotlib.figure import Figure

    rows = [reports[p]["row"] for p in reports]
    lines = [
        "# PPO on partially observable CartPole: " + " vs ".join(p.upper() for p in reports),
        "",
        f"CartPole-v1-po: CartPole-v1 with the cart and pole velocities removed from the "
        f"observation (`rljax.envs.wrappers`), so the policy sees [x, theta]. Target: the GRU "
        f"policy's training return (mean over the last 5 % of updates) >= {THRESHOLD:g} within "
        "2e6 env steps per seed; the MLP policy on the same budget for contrast. Written by "
        "`experiments/ppo_recurrent.py`; each study in full: "
        + ", ".join(f"`{NAME}_{p}.md`" for p in reports)
        + ".",
        "",
    ]
    for p, r in reports.items():
        lines.append(f"- **{p}**: {r['config_summary']}; {r['machine']}; rljax {r['code_version']}")
    lines += [
        "",
        markdown_table(rows, CURVE_COLUMNS),
        "",
        "Per seed (training return, last 5 %):",
        "",
    ]
    seed_rows = []
    for p, r in reports.items():
        for s in r["per_seed"]:
            seed_rows.append(
                {
                    "policy": p,
                    "seed": s["seed"],
                    "final": s["final_return"],
                    "eval": s.get("eval_return_str", "-"),
                    "reach": s.get("reach_str", "-"),
                    "held": s.get("held_str", "-"),
                }
            )
    lines.append(
        markdown_table(
            seed_rows,
            [
                ("policy", "policy", ""),
                ("seed", "seed", "d"),
                ("training return", "final", ".1f"),
                ("greedy eval return [95 % CI]", "eval", ""),
                (f"reaches {THRESHOLD:g} (smoothed)", "reach", ""),
                (f"stays >= {THRESHOLD:g} from", "held", ""),
            ],
        )
    )
    text = "\n".join(lines) + "\n"
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".md").write_text(text)
    write_json_compact(stem.with_suffix(".json"), NAME, {"studies": reports})
    fig = Figure(figsize=(8, 5))
    ax = fig.subplots()
    colors = {"gru": "tab:blue", "mlp": "tab:red", "lstm": "tab:green"}
    for p, r in reports.items():
        returns = np.array([s["episode_return"] for s in r["per_seed"]]).T
        steps = (np.arange(len(returns)) + 1) * r["env_steps_per_update"]
        label = f"{p}: training {r['row']['final_return_str']} ({len(r['seeds'])} seeds, 95 % CI)"
        plot_seed_curves(
            ax, steps, returns, curve_window(len(returns)), colors.get(p), label, low=0, high=500
        )
    ax.axhline(THRESHOLD, color="gray", ls="--", lw=1, label=f"{THRESHOLD:g}")
    ax.set_xlabel("env steps per seed")
    ax.xaxis.set_major_formatter(lambda x, _: f"{x / 1e6:g}M")
    ax.set_ylabel("training episode return (moving mean over 1/50 of the run)")
    ax.set_title(
        "PPO on CartPole-v1-po (velocities masked): " + " vs ".join(p.upper() for p in reports),
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)
    log(f"wrote {stem}.md/.json/.png")
    return text


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    policies = list(DEFAULT_POLICIES)
    if "--policy" in argv:
        i = argv.index("--policy")
        policies = [argv[i + 1]]
        del argv[i : i + 2]
    if any(p not in TITLES for p in policies):
        raise SystemExit(f"--policy must be one of {list(TITLES)}, got {policies}")
    if "--combine" in argv:
        policies = []
    reports = {p: run_study(p, argv) for p in policies}
    if "--quick" in argv:
        return reports
    stored = {p: RESULTS / f"{NAME}_{p}.json" for p in TITLES}
    if all(stored[p].exists() for p in DEFAULT_POLICIES):
        reports = {p: json.loads(path.read_text()) for p, path in stored.items() if path.exists()}
        print(combine(reports, RESULTS / NAME))
    return reports


if __name__ == "__main__":
    main()
