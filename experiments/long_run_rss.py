"""Memory over a long run: resident set size (RSS) of ``train`` PPO CartPole-v1 against updates.

    python experiments/long_run_rss.py                      # 2e7 env steps (~39k updates)
    python experiments/long_run_rss.py --timesteps 2e6      # a shorter check
    python experiments/long_run_rss.py --saves 400          # Checkpointer.save alone, RSS per save

The run is an ordinary ``rljax.train`` with the CLI's defaults (``PPOConfig()``, one device,
``log_every`` 25, ``checkpoint_every`` 100, ``eval_every`` 100, metrics.jsonl and checkpoints in a
temporary directory), plus a hook that reads this process's RSS (``/proc/self/statm``) every
``--sample-every`` updates. The slope (KB per 1,000 updates) is a least-squares line over the
samples after the first ``--warmup`` fraction of the run (compilation, first allocations).
``--drop-rows`` also empties ``loop.rows`` (the rows ``train`` keeps in memory for its result)
at every sample: what is left is the growth from everything else.
Writes experiments/results/long_run_rss.{md,json,png} (``--out`` for another stem).

``--saves N`` measures the checkpoint save path alone: ``Checkpointer(keep=3)`` (async) saves a
small state N times, RSS is read after every 25th save (once it is durable), and the slope is
KB per save; results go to the terminal and ``<out>_saves.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import REPO_ROOT, log, write_report  # noqa: E402

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Resident set size of this process."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def slope_per(xs, ys, start_fraction: float) -> float:
    """Least-squares slope of ``ys`` against ``xs`` over the points after ``start_fraction``."""
    import numpy as np

    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    keep = xs >= xs[0] + start_fraction * (xs[-1] - xs[0])
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(xs[keep], ys[keep], 1)[0])


def measure_train(timesteps: int, sample_every: int, warmup: float, drop_rows=False) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", 1)
    from rljax import PPOConfig, RunConfig, train
    from rljax.run.loop import Hook

    samples = []  # (update, env steps, rss bytes, seconds)
    start = time.perf_counter()

    def sample(info) -> None:
        if drop_rows:
            info.loop.rows.clear()
        samples.append((info.update, info.update * info.loop.env_steps_per_update, rss_bytes(),
                        time.perf_counter() - start))  # fmt: skip
        if len(samples) % 20 == 0:
            log(f"update {info.update}/{info.num_updates}: RSS {samples[-1][2] / 2**20:.1f} MiB")

    config = PPOConfig(total_timesteps=timesteps)
    with tempfile.TemporaryDirectory() as tmp:
        run = RunConfig.make(runs_dir=tmp, run_name="rss", quiet=True)
        result = train(config, run, hooks=[Hook(sample, every=sample_every)])
    updates = [s[0] for s in samples]
    rss = [s[2] for s in samples]
    slope = slope_per(updates, rss, warmup) * 1000 / 1024  # KB per 1,000 updates
    return {
        "timesteps": timesteps,
        "num_updates": config.num_updates,
        "env_steps_per_update": config.env_steps_per_update,
        "sample_every": sample_every,
        "drop_rows": drop_rows,
        "warmup_fraction": warmup,
        "checkpoint_every": run.checkpointing.checkpoint_every,
        "log_every": run.logging.log_every,
        "steps_per_second": result.steps_per_second,
        "wall_seconds": time.perf_counter() - start,
        "rss_first_mib": rss[0] / 2**20,
        "rss_last_mib": rss[-1] / 2**20,
        "rss_max_mib": max(rss) / 2**20,
        "slope_kb_per_1000_updates": slope,
        "slope_last_half_kb_per_1000_updates": slope_per(updates, rss, 0.5) * 1000 / 1024,
        "samples": [
            {"update": u, "env_steps": e, "rss_bytes": r, "seconds": round(t, 2)}
            for u, e, r, t in samples
        ],
    }


def measure_saves(count: int, warmup: int = 50) -> dict:
    import jax
    import jax.numpy as jnp

    from rljax.run.checkpoint import Checkpointer

    state = {"w": jnp.ones((64, 64)), "b": jnp.zeros(64), "key": jax.random.key(0)}
    samples = []
    with tempfile.TemporaryDirectory() as tmp, Checkpointer(Path(tmp) / "ck", keep=3) as ckpt:
        for step in range(1, count + 1):
            ckpt.save(step, state, {"step": step})
            ckpt.poll()
            if step % 25 == 0:
                ckpt.wait()
                gc.collect()
                samples.append((step, rss_bytes()))
    steps, rss = [s[0] for s in samples], [s[1] for s in samples]
    fraction = warmup / max(count, 1)
    return {
        "saves": count,
        "rss_first_mib": rss[0] / 2**20,
        "rss_last_mib": rss[-1] / 2**20,
        "slope_kb_per_save": slope_per(steps, rss, fraction) / 1024,
        "samples": [{"save": s, "rss_bytes": r} for s, r in samples],
    }


def markdown(report: dict) -> str:
    return "\n".join(
        [
            "# RSS over a long PPO CartPole-v1 run",
            "",
            f"`python experiments/long_run_rss.py --timesteps {report['timesteps']:g}`: "
            f"{report['num_updates']:,} updates x {report['env_steps_per_update']} env steps, "
            f"checkpoint every {report['checkpoint_every']} updates, a row every "
            f"{report['log_every']}; RSS sampled every {report['sample_every']} updates"
            + (
                " (`--drop-rows`: rows kept in memory emptied at each sample)."
                if report["drop_rows"]
                else "."
            ),
            "",
            "| RSS first | RSS last | RSS max | slope after the first "
            f"{report['warmup_fraction']:.0%} | slope, last half | steps/s | wall |",
            "|---|---|---|---|---|---|---|",
            f"| {report['rss_first_mib']:.1f} MiB | {report['rss_last_mib']:.1f} MiB | "
            f"{report['rss_max_mib']:.1f} MiB | "
            f"{report['slope_kb_per_1000_updates']:.1f} KB / 1,000 updates | "
            f"{report['slope_last_half_kb_per_1000_updates']:.1f} KB / 1,000 updates | "
            f"{report['steps_per_second']:,.0f} | {report['wall_seconds']:.0f} s |",
            "",
            "![RSS against updates](long_run_rss.png)",
            "",
        ]
    )


def plot(report: dict, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.5))
    ax = fig.add_subplot()
    updates = [s["update"] for s in report["samples"]]
    ax.plot(updates, [s["rss_bytes"] / 2**20 for s in report["samples"]], lw=1)
    ax.set_xlabel("update")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(
        f"PPO CartPole-v1, {report['timesteps']:.2g} env steps: "
        f"{report['slope_kb_per_1000_updates']:.1f} KB / 1,000 updates"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--timesteps", type=float, default=2e7)
    p.add_argument("--sample-every", type=int, default=100, help="updates between RSS samples")
    p.add_argument("--warmup", type=float, default=0.1, help="fraction left out of the slope")
    p.add_argument("--drop-rows", action="store_true", help="empty loop.rows at each sample")
    p.add_argument("--saves", type=int, default=0, help="measure N checkpoint saves instead")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "experiments/results/long_run_rss")
    args = p.parse_args(argv)
    if args.saves:
        report = measure_saves(args.saves)
        log(
            f"{args.saves} saves: RSS {report['rss_first_mib']:.1f} -> "
            f"{report['rss_last_mib']:.1f} MiB, {report['slope_kb_per_save']:.1f} KB per save"
        )
        write_report(args.out.with_name(args.out.name + "_saves.json"), "checkpoint_saves", report)
        return
    report = measure_train(int(args.timesteps), args.sample_every, args.warmup, args.drop_rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    plot(report, args.out.with_suffix(".png"))
    args.out.with_suffix(".md").write_text(markdown(report))
    write_report(args.out.with_suffix(".json"), "long_run_rss", report)
    log(
        f"RSS {report['rss_first_mib']:.1f} -> {report['rss_last_mib']:.1f} MiB, "
        f"{report['slope_kb_per_1000_updates']:.1f} KB per 1,000 updates"
    )


if __name__ == "__main__":
    main()
