"""Cost of periodic evaluation: training steps/s with and without it, side by side.

    python experiments/eval_overhead.py            # PPO and DQN on CartPole-v1, 3 repeats

Each row is a whole ``rljax.train()`` run (host loop, checkpoints and all) on one CPU device,
once with ``eval_every=0`` and once with the default interval (``EvalConfig().eval_every``
updates, ``eval_episodes`` greedy episodes on separate environments); runs alternate so load drift
hits both alike, and the best of ``--repeats`` is compared. Writes
experiments/results/eval_overhead.md and .json.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import REPO_ROOT, log, markdown_table, write_report  # noqa: E402

COLUMNS = [
    ("algorithm", "algorithm", ""),
    ("eval every", "eval_every", ""),
    ("eval episodes", "eval_episodes", "d"),
    ("best steps/s", "best_steps_per_s", ",.0f"),
    ("all steps/s", "all", ""),
    ("overhead", "overhead", ""),
]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=REPO_ROOT / "experiments/results/eval_overhead.json")
    args = p.parse_args(argv)

    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    from rljax import DQNConfig, PPOConfig, RunConfig, train

    default = RunConfig().evaluation
    rows = []
    for name, config in (("ppo", PPOConfig()), ("dqn", DQNConfig())):
        speeds = {0: [], default.eval_every: []}
        for repeat in range(args.repeats):
            for every in speeds:
                with tempfile.TemporaryDirectory() as tmp:
                    run = RunConfig.make(runs_dir=tmp, run_name="x", quiet=True, eval_every=every)
                    result = train(config, run)
                speeds[every].append(result.steps_per_second)
                log(f"{name} eval_every={every} repeat {repeat}: {speeds[every][-1]:,.0f} steps/s")
        base = max(speeds[0])
        for every, values in speeds.items():
            rows.append(
                {
                    "algorithm": name,
                    "eval_every": f"{every} updates" if every else "off",
                    "eval_episodes": default.eval_episodes if every else 0,
                    "best_steps_per_s": max(values),
                    "all": ", ".join(f"{v:,.0f}" for v in values),
                    "overhead": f"{100 * (1 - max(values) / base):.1f} %" if every else "-",
                }
            )
    table = markdown_table(rows, COLUMNS)
    header = (
        f"Evaluation overhead, CartPole-v1, 1 CPU device, default eval interval "
        f"{default.eval_every} updates x {default.eval_episodes} episodes, best of {args.repeats}"
    )
    print(f"\n{header}\n\n{table}")
    args.out.with_suffix(".md").write_text(f"{header}\n\n{table}\n")
    write_report(args.out, "eval_overhead", {"rows": rows, "table": table})


if __name__ == "__main__":
    main()
