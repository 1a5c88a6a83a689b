"""DQN throughput and return benchmark: rljax vs the PureJaxRL DQN port, side by side.

Reference config (``rljax.DQNConfig()`` defaults = PureJaxRL's ``dqn.py`` defaults): CartPole-v1,
10 envs, replay 10k, batch 128, lr 2.5e-4, epsilon 1.0 -> 0.05 over 2.5e5 steps, learning starts
at 1e4, one gradient step every 10 env steps, hard target update every 500 env steps, gamma 0.99,
MLP 120-84 relu, 5e5 env steps per seed.

Rows
  rljax       ``ShardedRun`` on ``data=1,model=1`` (1 device), and on ``data=2,model=2`` (4
              emulated CPU devices: replay and environments split over 2 data shards, Q-network
              over 2 model shards)
  purejaxrl   ``experiments/baselines/purejaxrl_dqn.py``, ``jax.jit(make_train(cfg))(key)``

Columns: compile seconds (ahead of time, never in steps/s); env steps/s of the compiled training
call only (best of ``--repeats``); the final return (mean over envs of each env's last completed
episode at the end of training, as both code bases report it: a training return, epsilon 0.05);
the first env step at which the training return smoothed over 2% of the run (10k env steps by
default; ``rljax.run.stats.steps_to_threshold``) reached 475, and the first from which it stayed
at or above 475 to the end (``held_from``); wall seconds to the former (steps / steps per
second). One update that touches 500 does not count. Each seed's repeats alternate between
rljax and the port in one process, so load drift on the machine hits both alike; below the table,
per seed, the ratio of the best runs and the median ratio of the alternating pairs.

    python experiments/bench_dqn.py                      # full benchmark (a few minutes)
    python experiments/bench_dqn.py --total-timesteps 50000 --repeats 1 --groups single  # smoke
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import (  # noqa: E402
    REPO_ROOT,
    alternate,
    log,
    markdown_table,
    pair_ratios,
    run_worker,
    write_report,
)

DEFAULT_OUT = REPO_ROOT / "experiments" / "results" / "bench_dqn.json"
GROUPS = {"single": ("data=1,model=1", 1), "mesh": ("data=2,model=2", 4)}
MARKER = "@@BENCH_DQN_RESULT@@ "
COLUMNS = [
    ("implementation", "implementation", ""),
    ("mesh", "mesh", ""),
    ("seed", "seed", "d"),
    ("compile s", "compile_s", ".2f"),
    ("env steps/s", "steps_per_s", ",.0f"),
    ("final return", "final_return", ".1f"),
    ("steps to 475 (smoothed)", "steps_to_475", ",.0f"),
    ("held >= 475 from", "held_475_from", ",.0f"),
    ("s to 475", "seconds_to_475", ".1f"),
]
THRESHOLD = 475.0


class Candidate(NamedTuple):
    """One implementation compiled, ready to be timed per seed."""

    implementation: str
    mesh: str
    compile_s: float
    env_steps: int  # per run
    run: Callable[[Any], Any]  # input -> output (timed)
    fresh_input: Callable[[int], Any]  # seed -> a new input (untimed)
    curve: Callable[[Any], tuple[Any, Any]]  # output -> (returns, env steps)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--total-timesteps", type=int, default=500_000)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="one run per seed")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per seed (best reported)")
    p.add_argument("--groups", nargs="+", choices=sorted(GROUPS), default=["single", "mesh"])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--_worker", choices=sorted(GROUPS), help=argparse.SUPPRESS)
    return p.parse_args(argv)


def worker(group: str, args: argparse.Namespace) -> dict:
    import jax

    mesh_spec, devices = GROUPS[group]
    jax.config.update("jax_num_cpu_devices", devices)
    import numpy as np

    from rljax import DQN, DQNConfig
    from rljax.parallel import make_mesh
    from rljax.run.sharded import ShardedRun

    cfg = DQNConfig(total_timesteps=args.total_timesteps)
    steps = cfg.num_updates * cfg.env_steps_per_update
    mesh = make_mesh(mesh_spec)
    run = ShardedRun(DQN(cfg, replicas=mesh.shape["data"]), mesh, chunk_size=cfg.num_updates)
    run.compile(jax.random.key(0))
    compile_s = sum(run.compile_seconds.values())

    def curve(out):
        returns = np.asarray(out[1]["episode_return"])
        return returns, (np.arange(len(returns)) + 1) * cfg.env_steps_per_update

    candidates = [
        Candidate(
            "rljax",
            mesh_spec,
            compile_s,
            steps,
            run=lambda state: run.run_chunk(state, cfg.num_updates),
            fresh_input=lambda seed: run.init(jax.random.key(seed)),
            curve=curve,
        )
    ]
    if group == "single":  # the port beside it, in the same process
        candidates.append(purejaxrl_candidate(args))
    # Every seed's repeats alternate between implementations, so a slow moment of a shared
    # machine hits both alike.
    rows = []
    for seed in args.seeds:
        calls = [(c.run, functools.partial(c.fresh_input, seed)) for c in candidates]
        times, outs = alternate(calls, args.repeats)
        for c, t, out in zip(candidates, times, outs, strict=True):
            returns, env_steps = c.curve(out)
            rows.append(
                row(
                    c.implementation,
                    c.mesh,
                    seed,
                    c.compile_s,
                    c.env_steps,
                    min(t),
                    t,
                    returns,
                    env_steps,
                )
            )
    return {"rows": rows}


def purejaxrl_candidate(args) -> Candidate:
    import time

    import jax
    import numpy as np

    from experiments.baselines.purejaxrl_dqn import DEFAULT_CONFIG, make_train

    pj_cfg = {**DEFAULT_CONFIG, "TOTAL_TIMESTEPS": args.total_timesteps, "FIX_DUMMY_RNG": True}
    t0 = time.perf_counter()
    train = jax.jit(make_train(pj_cfg)).lower(jax.random.key(0)).compile()
    compile_s = time.perf_counter() - t0
    pj_steps = int(pj_cfg["TOTAL_TIMESTEPS"] // pj_cfg["NUM_ENVS"]) * pj_cfg["NUM_ENVS"]

    def curve(out):
        return np.asarray(out["metrics"]["returns"]), np.asarray(out["metrics"]["timesteps"])

    return Candidate("purejaxrl", "1 device", compile_s, pj_steps, train, jax.random.key, curve)


def row(impl, mesh, seed, compile_s, steps, best, times, returns, env_steps):
    from rljax.run.stats import held_from, steps_to_threshold

    window = max(1, len(returns) // 50)  # 2% of the run, whatever the metric's spacing
    reach = steps_to_threshold(env_steps, returns, THRESHOLD, window)
    held = held_from(env_steps, returns, THRESHOLD, window)
    r = {
        "implementation": impl,
        "mesh": mesh,
        "seed": seed,
        "compile_s": compile_s,
        "run_s": best,
        "run_s_all": times,
        "env_steps": steps,
        "steps_per_s": steps / best,
        "final_return": float(returns[-1]),
        "smoothing_window": window,
        "steps_to_475": reach,
        "held_475_from": held,
        "seconds_to_475": None if reach is None else reach / (steps / best),
    }
    log(
        f"{impl:<10} {mesh:<15} seed {seed}  compile {compile_s:5.2f}s  "
        f"{r['steps_per_s']:>9,.0f} steps/s  final return {r['final_return']:6.1f}  "
        f"475 (smoothed) at {reach}, held from {held}"
    )
    return r


def main(argv=None) -> None:
    args = parse_args(argv)
    if args._worker:
        print(MARKER + json.dumps(worker(args._worker, args)), flush=True)
        return
    passthrough = [
        "--total-timesteps",
        str(args.total_timesteps),
        "--repeats",
        str(args.repeats),
        "--seeds",
        *map(str, args.seeds),
    ]
    rows = []
    for group in args.groups:
        rows += run_worker(Path(__file__).resolve(), group, passthrough, MARKER)["rows"]
    table = markdown_table(rows, COLUMNS)
    ratios = speedups(rows)
    print(f"\nDQN CartPole-v1, {args.total_timesteps:,} env steps per seed\n\n{table}\n\n{ratios}")
    report = {
        "total_timesteps": args.total_timesteps,
        "rows": rows,
        "table": table,
        "speedups": ratios,
    }
    written = write_report(args.out, "bench_dqn", report)
    md = args.out.with_suffix(".md")
    md.write_text(markdown_report(written))
    print(f"wrote {md}")


def speedups(rows: list[dict]) -> str:
    """Per seed, rljax (1 device) over the port in steps/s: the ratio of the best runs, and the
    median of the ratios of alternating pairs (robust to a slow moment on a shared machine)."""
    import statistics

    lines = []
    for seed in sorted({r["seed"] for r in rows}):
        mine = [r for r in rows if r["seed"] == seed and r["mesh"] == GROUPS["single"][0]]
        port = [r for r in rows if r["seed"] == seed and r["implementation"] == "purejaxrl"]
        if not (mine and port):
            continue
        a, b = mine[0], port[0]
        pairs = pair_ratios(a, b)
        lines.append(
            f"- seed {seed}: rljax / purejaxrl steps/s {a['steps_per_s'] / b['steps_per_s']:.2f}x "
            f"(best runs), {statistics.median(pairs):.2f}x (median of {len(pairs)} "
            "alternating pairs)"
        )
    return "\n".join(lines)


def markdown_report(report: dict) -> str:
    """The ``.md`` beside the JSON: the command, the setting and the table."""
    return (
        f"# DQN throughput: rljax vs PureJaxRL\n\n`python experiments/bench_dqn.py "
        f"{' '.join(report['argv'])}`; CartPole-v1, {report['total_timesteps']:,} env steps per "
        "seed, the reference config (see the script's docstring). Each seed's repeats "
        "alternate between the implementations (best of them). "
        f"Compile time apart.\n\n{report['table']}\n\n{report.get('speedups', '')}\n"
    ) + (f"\nFinished {report['finished']}.\n" if "finished" in report else "")


if __name__ == "__main__":
    main()
