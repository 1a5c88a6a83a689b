"""PPO throughput benchmark: rljax vs a rollout-only ceiling vs the PureJaxRL baseline.

Every row trains (or, for the ceiling, only acts) on the reference config, ``rljax.PPOConfig()``
defaults: CartPole-v1, 4 envs x 128 steps per update, 5e5 env steps per seed, separate 2x64 tanh
actor and critic, 4 epochs x 4 minibatches, lr 2.5e-4 linearly annealed.

Rows
  rljax            ``ShardedRun`` on mesh ``data=1,model=1`` (1 device), 1 / 8 / 64 vmapped seeds
  rljax            ``ShardedRun`` on mesh ``data=2,model=2`` (4 emulated CPU devices), same seeds
  rljax            ``--groups seeds``: mesh ``data=4`` with the seeds on ``data`` (each device
                   trains its own seeds; no gradient collectives); ``seeds2``: ``data=2`` (one
                   device per core here); ``data2``: ``data=2`` with each seed's batch split
                   over it (gradients all-reduced per minibatch). These groups also run the
                   1-device rljax and PureJaxRL rows in the same process, repeats alternating,
                   and compare with them. A CPU device runs its program on about one core, so
                   these rows use both cores and the 1-device rows (rljax and PureJaxRL alike)
                   about one. Each device trains its seeds in groups of
                   ``rljax.run.sharded.seeds_at_a_time`` (8 on CPU past 16 seeds a device)
  rollout ceiling  ``PPO.rollout`` (policy sampling + env stepping, no critic-on-final-obs, no GAE,
                   no SGD) scanned over ``num_updates`` and vmapped over seeds, on one device
  purejaxrl        ``experiments/baselines/purejaxrl_ppo.py``:
                   ``jax.jit(jax.vmap(make_train(cfg)))(keys)`` (1 seed: no vmap)
  purejaxrl-O2     the same compiled with rljax's CPU compiler options (LLVM -O2), on request

Columns
  run              the group (subprocess) the row was measured in; rows of one group alternate
  compile s        ahead-of-time ``lower().compile()`` wall time (rljax: init + chunk programs,
                   init compiling on a second thread while the chunk compiles), best of
                   ``--compile-repeats``: every repeat after the first clears JAX's caches and
                   compiles all implementations again, in reverse order each time, so neither
                   always pays for being first in the process; never included in steps/s
  steps/s          ``num_updates * batch_size * num_seeds / seconds`` of the compiled training call
                   only (state initialised, untimed, before every repeat; best of ``--repeats``,
                   the repeats of one seed count alternating between implementations so that
                   load drift on the machine hits all of them alike)
  vs purejaxrl     steps/s relative to the PureJaxRL row with the same number of seeds (1 device)
  final return     a training return (sampled actions, no greedy evaluation; a speed benchmark)
                   at the last update only: the return of each env's last completed episode,
                   averaged over envs that completed one, then over seeds (the rljax
                   ``episode_return`` metric; the same quantity is read from PureJaxRL's
                   ``returned_episode_returns`` and the ceiling's env stats)

Under the table, per seed count: rljax (1 device) over PureJaxRL, the ratio of the best runs and
the median ratio over the alternating pairs of runs, and the same two for compile time.

The number of emulated CPU devices must be fixed before JAX starts, so each group runs in its own
subprocess of this script: ``single`` (1 device: rljax 1-device mesh, ceiling, PureJaxRL) and
``mesh`` (4 devices). The parent prints a markdown table and writes JSON (rows plus jax version,
backend, device and CPU counts).

Run (full benchmark, takes a while on CPU):

    python experiments/bench_ppo.py
    python experiments/bench_ppo.py --total-timesteps 20480 --seeds 1 8 --repeats 1   # smoke run
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from experiments.bench_harness import (  # noqa: E402
    alternate,
    completed_mean,
    pair_ratios,
    port_final_return,
)

DEFAULT_OUT = REPO_ROOT / "experiments" / "results" / "bench_ppo.json"
SINGLE_MESH = "data=1,model=1"
MULTI_MESH = "data=2,model=2"
# group -> (mesh, mesh axis of the seeds); "single" runs on SINGLE_MESH
GROUP_MESHES = {
    "mesh": (MULTI_MESH, None),
    "seeds": ("data=4", "data"),
    "seeds2": ("data=2", "data"),
    "data2": ("data=2", None),
}
GROUP_DEVICES = {"single": 1, "mesh": 4, "seeds": 4, "seeds2": 2, "data2": 2}
RESULT_MARKER = "@@BENCH_PPO_RESULT@@ "
ROW_ORDER = {"rljax": 0, "rollout ceiling": 2, "purejaxrl": 3, "purejaxrl-O2": 4}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--total-timesteps", type=int, default=500_000, help="env steps per seed")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 8, 64], help="seed counts")
    p.add_argument(
        "--num-envs", type=int, default=4, help="environments per seed (both implementations)"
    )
    p.add_argument(
        "--implementations",
        nargs="+",
        choices=["rljax", "ceiling", "purejaxrl", "purejaxrl-O2"],
        default=["rljax", "ceiling", "purejaxrl"],
        help="rows of the single group (e.g. rljax alone for 1,024 seeds); purejaxrl-O2: the "
        "port compiled with rljax's CPU "
        "compiler options (LLVM -O2, rljax.run.compile_cache.CPU_OPTIONS)",
    )
    p.add_argument(
        "--alone",
        action="store_true",
        help="groups other than single run only their own rljax row, without the 1-device "
        "rljax and PureJaxRL rows beside it (1,024 seeds: those would take most of an hour)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per row (best is reported)")
    p.add_argument(
        "--compile-repeats",
        type=int,
        default=3,
        help="compiles per row, caches cleared between them (best is reported)",
    )
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    p.add_argument(
        "--groups",
        nargs="+",
        choices=sorted(GROUP_DEVICES),
        default=["single", "mesh"],
        help="subprocess groups to run (single: 1 device; mesh: 4 emulated devices, "
        "data=2,model=2; seeds: 4 emulated devices, data=4 with the seeds on data, no "
        "gradient collectives; seeds2: the same on 2 devices, data=2, one per core of this "
        "machine; a CPU device runs its program on about one core, so only the seeds groups "
        "use both; data2: data=2 with each seed's batch split over it)",
    )
    p.add_argument(
        "--worker-timeout",
        type=float,
        default=None,
        help="seconds before a group subprocess is killed (default: no limit)",
    )
    p.add_argument("--_worker", choices=sorted(GROUP_DEVICES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if min(args.repeats, args.compile_repeats, *args.seeds) < 1:
        p.error("--repeats, --compile-repeats and every --seeds value must be >= 1")
    return args


class Candidate(NamedTuple):
    """One implementation compiled for one seed count, ready to be timed."""

    implementation: str
    mesh: str
    compile_s: dict[str, float]  # seconds by program
    run: Callable[[Any], Any]  # input -> output (timed)
    fresh_input: Callable[[], Any]  # a new input before every repeat (untimed)
    final_return: Callable[[Any], float]  # output -> final return
    solved: Callable[[Any], float] | None = None  # output -> fraction of seeds at >= 475


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Worker (one subprocess per device group). JAX is imported only here, after the device count is
# configured.
# ------------------------------------------------------------------------------------------------
def worker(
    group: str,
    total_timesteps: int,
    seed_counts: list[int],
    repeats: int,
    num_envs: int = 4,
    implementations: tuple[str, ...] = ("rljax", "ceiling", "purejaxrl"),
    alone: bool = False,
    compile_repeats: int = 1,
) -> dict:
    import jax

    jax.config.update("jax_num_cpu_devices", GROUP_DEVICES[group])

    import jax.numpy as jnp
    import numpy as np

    from rljax import PPO, PPOConfig
    from rljax.parallel import Layout, make_mesh
    from rljax.parallel.rules import seeds_on
    from rljax.run.compile_cache import CPU_OPTIONS
    from rljax.run.sharded import ShardedRun

    cfg = PPOConfig(total_timesteps=total_timesteps, num_envs=num_envs)
    steps_per_seed = cfg.num_updates * cfg.batch_size
    key = jax.random.key(0)

    def row(impl, mesh, seeds, compiles, times, final_return, solved=None):
        """``compiles``: one ``{program: seconds}`` per compile repeat (the best is the row's)."""
        compile_detail = min(compiles, key=lambda d: sum(d.values()))
        best, compile_s = min(times), sum(compile_detail.values())
        steps = steps_per_seed * seeds
        r = {
            "implementation": impl,
            "mesh": mesh,
            "seeds": seeds,
            "compile_s": compile_s,
            "compile_detail_s": compile_detail,
            "compile_s_all": [sum(d.values()) for d in compiles],
            "run_s": best,
            "run_s_all": times,
            "env_steps": steps,
            "steps_per_s": steps / best,
            "final_return_mean": final_return,
            "solved_fraction": solved,
            "end_to_end_s": compile_s + best,
        }
        log(
            f"[{group}] {impl:<15} {mesh:<15} seeds={seeds:<3} compile {compile_s:7.2f}s  "
            f"run {best:8.2f}s  {steps / best:>12,.0f} steps/s  return {final_return:7.1f}"
        )
        return r

    def rljax_candidate(mesh_spec, seeds, seed_axis=None):
        mesh = make_mesh(mesh_spec)
        layout = Layout(mesh, seeds_on(seed_axis))
        replicas = layout.shards("replica")
        run = ShardedRun(
            PPO(cfg, replicas=replicas), layout, num_seeds=seeds, chunk_size=cfg.num_updates
        )
        run.compile(key)
        return Candidate(
            "rljax",
            mesh_spec + (f", seeds on {seed_axis}" if seed_axis else ""),
            dict(run.compile_seconds),
            run=lambda state: run.run_chunk(state, cfg.num_updates),
            fresh_input=lambda: run.init(key),
            final_return=lambda out: float(np.mean(np.asarray(out[1]["episode_return"][-1]))),
            solved=lambda out: float(np.mean(np.asarray(out[1]["episode_return"][-1]) >= 475)),
        )

    def ceiling_candidate(seeds):
        """``PPO.rollout`` scanned over ``num_updates`` (no GAE, no SGD), vmapped over seeds."""
        ppo = PPO(cfg)

        def init(k):
            if seeds == 1:
                return ppo.init(k)
            # lax.map as in ShardedRun: a vmapped orthogonal init (batched CPU QR) can deadlock.
            return jax.lax.map(ppo.init, jax.random.split(k, seeds))

        def act_only(state):
            def body(carry, _):
                env, k, checksum = carry
                k, rollout_key = jax.random.split(k)
                env, rollout = ppo.rollout(state.params, env, rollout_key)
                # Consume the rollout so the value head and log-probs are not dead code.
                checksum = checksum + rollout.value.sum() + rollout.log_prob.sum()
                return (env, k, checksum), None

            carry = (state.env, state.key, jnp.zeros((), jnp.float32))
            (env, _, checksum), _ = jax.lax.scan(body, carry, None, cfg.num_updates)
            return env.stats, checksum

        fn = act_only if seeds == 1 else jax.vmap(act_only)
        init_c = jax.jit(init).lower(key).compile()
        t0 = time.perf_counter()
        fn_c = jax.jit(fn).lower(jax.eval_shape(init, key)).compile()
        compile_s = time.perf_counter() - t0
        return Candidate(
            "rollout ceiling",
            SINGLE_MESH,
            {"rollout": compile_s},
            run=fn_c,
            fresh_input=lambda: init_c(key),
            final_return=lambda out: completed_mean(
                out[0].last_return, np.asarray(out[0].completed) > 0
            ),
        )

    def purejaxrl_candidate(seeds, options=None):
        from experiments.baselines.purejaxrl_ppo import DEFAULT_CONFIG, make_train

        train = make_train(
            {**DEFAULT_CONFIG, "TOTAL_TIMESTEPS": total_timesteps, "NUM_ENVS": num_envs}
        )
        if seeds == 1:
            keys = jax.random.key(42)
        else:
            train = jax.vmap(train)
            keys = jax.random.split(jax.random.key(42), seeds)
        t0 = time.perf_counter()
        train_c = jax.jit(train).lower(keys).compile(options)
        compile_s = time.perf_counter() - t0

        detail = {"train": compile_s}
        name = "purejaxrl" + ("-O2" if options else "")
        final = lambda out: port_final_return(out["metrics"])  # noqa: E731
        return Candidate(name, SINGLE_MESH, detail, train_c, lambda: keys, final)

    makers = {
        "rljax": functools.partial(rljax_candidate, SINGLE_MESH),
        "ceiling": ceiling_candidate,
        "purejaxrl": purejaxrl_candidate,
        "purejaxrl-O2": functools.partial(purejaxrl_candidate, options=CPU_OPTIONS),
    }
    rows: list[dict[str, Any]] = []
    for seeds in seed_counts:
        if group == "single":
            build = [
                functools.partial(make, seeds) for n, make in makers.items() if n in implementations
            ]
        else:
            mesh_spec, seed_axis = GROUP_MESHES[group]
            if seed_axis and seeds % GROUP_DEVICES[group]:
                log(f"[{group}] {seeds} seed(s) do not split over {mesh_spec}: skipped")
                continue
            build = [functools.partial(rljax_candidate, mesh_spec, seeds, seed_axis)]
            if group != "mesh" and not alone:  # beside it in this run: the 1-device rows
                wanted = [n for n in ("rljax", "purejaxrl", "purejaxrl-O2") if n in implementations]
                build += [functools.partial(makers[name], seeds) for name in wanted]
        candidates = [make() for make in build]
        compiles = [[c.compile_s] for c in candidates]
        for repeat in range(1, compile_repeats):
            jax.clear_caches()
            order = range(len(build)) if repeat % 2 == 0 else reversed(range(len(build)))
            for i in order:
                compiles[i].append(build[i]().compile_s)
        times, outs = alternate([(c.run, c.fresh_input) for c in candidates], repeats)
        for c, compiled, t, out in zip(candidates, compiles, times, outs, strict=True):
            final, ok = c.final_return(out), c.solved(out) if c.solved else None
            rows.append(
                {**row(c.implementation, c.mesh, seeds, compiled, t, final, ok), "group": group}
            )

    return {"group": group, "rows": rows, **jax_info(jax, cfg)}


def jax_info(jax, cfg) -> dict[str, Any]:
    import dataclasses

    return {
        "jax_version": jax.__version__,
        "backend": jax.default_backend(),
        "device_count": jax.device_count(),
        "devices": [str(d) for d in jax.devices()],
        "config": dataclasses.asdict(cfg),
        "num_updates": cfg.num_updates,
        "batch_size": cfg.batch_size,
    }


# ------------------------------------------------------------------------------------------------
# Parent: spawn workers, collect rows, print and save.
# ------------------------------------------------------------------------------------------------
def run_group(group: str, args: argparse.Namespace) -> dict:
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--_worker",
        group,
        "--total-timesteps",
        str(args.total_timesteps),
        "--repeats",
        str(args.repeats),
        "--num-envs",
        str(args.num_envs),
        "--compile-repeats",
        str(args.compile_repeats),
        "--implementations",
        *args.implementations,
        "--seeds",
        *map(str, args.seeds),
        *(["--alone"] if args.alone else []),
    ]
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    log(f"== group {group!r} ({GROUP_DEVICES[group]} device(s)) ==")
    try:
        proc = subprocess.run(
            cmd,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            check=False,
            timeout=args.worker_timeout,
        )
    except subprocess.TimeoutExpired as e:
        raise SystemExit(f"worker {group!r} timed out after {args.worker_timeout} s") from e
    results = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    if proc.returncode != 0 or not results:
        sys.stderr.write(proc.stdout)
        raise SystemExit(f"worker {group!r} failed (exit code {proc.returncode})")
    return json.loads(results[-1][len(RESULT_MARKER) :])


def markdown_table(rows: list[dict]) -> str:
    """Rows as markdown; ``vs purejaxrl`` is steps/s over the PureJaxRL row with the same seeds;
    ``end to end s`` is compile plus the best timed run; ``seeds >= 475`` the fraction of seeds
    whose last update's training return is at least 475 (rljax rows)."""

    def same_run(implementation: str, mesh: str | None = None) -> dict:
        """(group, seeds) -> steps/s of that row, and seeds -> the same from any group."""
        found = {}
        for r in rows:
            if r["implementation"] == implementation and mesh in (None, r["mesh"]):
                found.setdefault(r["seeds"], r["steps_per_s"])
                found[(r.get("group"), r["seeds"])] = r["steps_per_s"]
        return found

    purejaxrl, rljax_one = same_run("purejaxrl"), same_run("rljax", SINGLE_MESH)
    lines = [
        "| run | implementation | mesh | seeds | compile s | steps/s | vs purejaxrl "
        "| end to end s | final training return (last update) | seeds >= 475 |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for r in rows:
        key = (r.get("group"), r["seeds"])
        parts = []
        base = purejaxrl.get(key, purejaxrl.get(r["seeds"]))
        if base:
            parts.append(f"{r['steps_per_s'] / base:.2f}x")
        one = rljax_one.get(key, rljax_one.get(r["seeds"]))
        if r["mesh"] != SINGLE_MESH and one:
            parts.append(f"{r['steps_per_s'] / one:.2f}x of rljax 1 device")
        ratio = "; ".join(parts) or "-"
        end = r.get("end_to_end_s", r["compile_s"] + r["run_s"])
        solved = r.get("solved_fraction")
        solved = "-" if solved is None else f"{100 * solved:.0f} %"
        lines.append(
            f"| {r.get('group', '-')} | {r['implementation']} | {r['mesh']} | {r['seeds']} "
            f"| {r['compile_s']:.2f} "
            f"| {r['steps_per_s']:,.0f} | {ratio} | {end:,.1f} | {r['final_return_mean']:.1f} "
            f"| {solved} |"
        )
    return "\n".join(lines)


def speedups(rows: list[dict]) -> str:
    """Per (group, seeds): rljax on one device over PureJaxRL, steps/s and compile time, as the
    ratio of the best runs and the median ratio of alternating pairs (robust to a slow moment on
    a shared machine)."""
    import statistics

    def one(implementation, mesh=None):
        return {
            (r.get("group"), r["seeds"]): r
            for r in rows
            if r["implementation"] == implementation and mesh in (None, r["mesh"])
        }

    mine, port = one("rljax", SINGLE_MESH), one("purejaxrl")
    lines = []
    for key in sorted(set(mine) & set(port), key=lambda k: (k[1], str(k[0]))):
        a, b = mine[key], port[key]
        speed = pair_ratios(a, b)
        line = (
            f"- {key[0]}, {key[1]} seed(s): rljax / purejaxrl steps/s "
            f"{a['steps_per_s'] / b['steps_per_s']:.2f}x (best runs), "
            f"{statistics.median(speed):.2f}x (median of {len(speed)} alternating pairs)"
        )
        if "compile_s_all" in a and "compile_s_all" in b:
            pairs = [x / y for x, y in zip(a["compile_s_all"], b["compile_s_all"], strict=True)]
            line += (
                f"; compile time {a['compile_s']:.2f} s vs {b['compile_s']:.2f} s "
                f"({a['compile_s'] / b['compile_s']:.2f}x best, {statistics.median(pairs):.2f}x "
                f"median of {len(pairs)})"
            )
        lines.append(line)
    return "\n".join(lines)


def sort_key(r: dict) -> tuple:
    order = ROW_ORDER[r["implementation"]] + (r["mesh"] != SINGLE_MESH)
    return r["seeds"], order, r["mesh"]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args._worker:
        result = worker(
            args._worker,
            args.total_timesteps,
            args.seeds,
            args.repeats,
            args.num_envs,
            tuple(args.implementations),
            args.alone,
            args.compile_repeats,
        )
        print(RESULT_MARKER + json.dumps(result), flush=True)
        return

    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    groups = {g: run_group(g, args) for g in args.groups}
    rows = sorted((r for g in groups.values() for r in g["rows"]), key=sort_key)
    first = next(iter(groups.values()))
    table = markdown_table(rows)
    ratios = speedups(rows)
    print(
        f"\nPPO {first['config']['env']}: {first['num_updates']} updates x "
        f"{first['batch_size']} env steps per seed; jax {first['jax_version']} "
        f"({first['backend']}), {os.cpu_count()} CPUs; best of {args.repeats}\n"
    )
    print(table)
    print(f"\n{ratios}")

    report = {
        "benchmark": "bench_ppo",
        "started": started,
        "argv": sys.argv[1:],
        "total_timesteps": args.total_timesteps,
        "seeds": args.seeds,
        "repeats": args.repeats,
        "jax_version": first["jax_version"],
        "backend": first["backend"],
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "groups": {g: {k: v for k, v in res.items() if k != "rows"} for g, res in groups.items()},
        "rows": rows,
        "compile_repeats": args.compile_repeats,
        "table_markdown": table,
        "speedups": ratios,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_name(args.out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2) + "\n")
    tmp.replace(args.out)
    md = args.out.with_suffix(".md")
    md.write_text(
        f"# PPO throughput: rljax vs PureJaxRL\n\n`python experiments/bench_ppo.py "
        f"{' '.join(sys.argv[1:])}` on {os.cpu_count()} CPUs, jax {first['jax_version']} "
        f"({first['backend']}), {started}. PPO {first['config']['env']}, "
        f"{first['config']['num_envs']} envs x {first['config']['num_steps']} steps, "
        f"{first['num_updates']} updates per seed; best of {args.repeats} alternating repeats, "
        f"compile time apart (best of {args.compile_repeats} compiles).\n\n{table}\n\n{ratios}\n"
    )
    print(f"\nwrote {args.out} and {md}")


if __name__ == "__main__":
    main()
