"""Final training returns of PPO at 256 envs, rljax against the PureJaxRL port, several seeds.

    python experiments/returns_256envs.py                 # seeds 0-3, 4.2M env steps each
    python experiments/returns_256envs.py --seeds 0 1 --total-timesteps 1048576

``bench_ppo --num-envs 256`` times one seed; this checks that the speed comes with the same
returns. Both train CartPole-v1 with PureJaxRL's config at 256 envs x 128 steps, one seed per
run (the port's vmapped init can deadlock in jaxlib's batched QR, so seeds are not vmapped), from
the same keys. The return is a training return at the last update: each env's last completed
episode, averaged over the envs that completed one (rljax's ``episode_return`` metric; the port's
``returned_episode_returns``). Writes experiments/results/returns_256envs.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.bench_harness import (  # noqa: E402
    log,
    machine_line,
    markdown_table,
    port_final_return,
    write_report,
)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    p.add_argument("--total-timesteps", type=int, default=4_194_304)
    p.add_argument(
        "--out", type=Path, default=REPO_ROOT / "experiments/results/returns_256envs.json"
    )
    args = p.parse_args(argv)

    import jax
    import numpy as np

    from experiments.baselines.purejaxrl_ppo import DEFAULT_CONFIG, make_train
    from rljax import PPO, PPOConfig
    from rljax.parallel import Layout, make_mesh, set_num_cpu_devices
    from rljax.run.sharded import ShardedRun

    set_num_cpu_devices(1)
    cfg = PPOConfig(total_timesteps=args.total_timesteps, num_envs=256)
    run = ShardedRun(
        PPO(cfg), Layout(make_mesh("data=1,model=1")), num_seeds=1, chunk_size=cfg.num_updates
    )
    run.compile(jax.random.key(0))
    port = make_train({**DEFAULT_CONFIG, "TOTAL_TIMESTEPS": args.total_timesteps, "NUM_ENVS": 256})
    port = jax.jit(port)

    rows = []
    for seed in args.seeds:
        _, metrics = run.run_chunk(run.init(jax.random.key(seed)), cfg.num_updates)
        mine = float(np.mean(np.asarray(metrics["episode_return"][-1])))
        theirs = port_final_return(port(jax.random.key(seed))["metrics"])
        rows.append({"seed": seed, "rljax": mine, "purejaxrl": theirs})
        log(f"seed {seed}: rljax {mine:.1f}, purejaxrl {theirs:.1f}")
    rows.append({
        "seed": "mean",
        "rljax": float(np.mean([r["rljax"] for r in rows])),
        "purejaxrl": float(np.mean([r["purejaxrl"] for r in rows])),
    })  # fmt: skip
    table = markdown_table(
        rows, [("seed", "seed", ""), ("rljax", "rljax", ".1f"), ("PureJaxRL", "purejaxrl", ".1f")]
    )
    lines = [
        "# PPO at 256 envs: final training returns, rljax vs PureJaxRL",
        "",
        f"`python experiments/returns_256envs.py {' '.join(argv or sys.argv[1:])}` on "
        f"{machine_line()}. CartPole-v1, 256 envs x 128 steps, {cfg.num_updates} updates "
        f"({args.total_timesteps:,} env steps) per seed; the training return at the last update.",
        "",
        table,
        "",
    ]
    write_report(
        args.out, "returns_256envs", {"rows": rows, "config": vars(args) | {"out": str(args.out)}}
    )
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
