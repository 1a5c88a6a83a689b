"""Where PPO's time goes: rollout, GAE, SGD and the host, with achieved GFLOP/s against this
machine's matmul peak, measured in the same run.

    python experiments/profile_ppo.py                    # reference config, 1 and 64 seeds
    python experiments/profile_ppo.py --seeds 1 --trace /tmp/rljax-trace   # + a jax.profiler trace
    python experiments/profile_ppo.py --seeds 1 --num-envs 256             # a large batch

``PPOConfig()`` (CartPole-v1, 4 envs x 128 steps, 4 epochs x 4 minibatches, 2x64 tanh MLPs) on
one CPU device, ``S`` seeds vmapped as ``ShardedRun`` does. One update is cut into the phases
``PPO.update`` runs, each jitted on its own so that it can be timed:

  rollout   ``num_steps`` env steps acting with the policy (actor and critic forward), and the
            bootstrap values of the last and truncated observations
  GAE       advantages and returns over ``[T, B]``
  SGD       ``update_epochs`` x shuffled minibatches: forward, backward, Adam
  shuffle   of which the minibatch shuffles: ``update_epochs`` permutations of the batch's rows
            and the gathers that apply them (timed alone; not added to the phases' sum)
  update    the whole ``PPO.update`` in one program (what a chunk runs per update)

Columns: milliseconds per update (best of ``--repeats``, each the mean of ``--calls`` calls, the
repeats of all phases alternating), the share of the sum of phases, model FLOPs per update (2 x
inputs x outputs per dense layer per sample; backward = 2 x forward) and XLA's
``cost_analysis()`` FLOPs of the compiled phase (it counts a loop body once, not per iteration,
so it undercounts the scans), and achieved GFLOP/s (model FLOPs / time). The
matmul peak is float32 ``jnp.dot`` of n x n matrices, best of 10, in the same process. The host
row comes from ``experiments/results/host_loop.json`` (``train()`` against the bare loop), when
present. Writes experiments/results/profile_ppo.{md,json}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import (  # noqa: E402
    REPO_ROOT,
    log,
    machine_line,
    markdown_table,
    write_report,
)

PHASES = ("rollout", "GAE", "SGD")


def matmul_peak(sizes=(256, 1024, 2048)) -> dict[int, float]:
    """float32 GFLOP/s of ``jnp.dot`` on n x n matrices, best of 10 calls each."""
    import jax
    import jax.numpy as jnp

    peaks = {}
    for n in sizes:
        a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
        dot = jax.jit(jnp.dot)
        dot(a, a).block_until_ready()
        call = lambda dot=dot, a=a: dot(a, a).block_until_ready()  # noqa: E731
        best = min(_seconds(call) for _ in range(10))
        peaks[n] = 2 * n**3 / best / 1e9
    return peaks


def _seconds(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def dense_flops(params) -> int:
    """Forward FLOPs per sample of every dense kernel ``[(S,) in, out]`` in ``params``: 2 in out
    (summed over the seeds' copies ``S``)."""
    import math

    import jax

    leaves = jax.tree_util.tree_leaves_with_path(params)
    kernels = [x for path, x in leaves if "kernel" in jax.tree_util.keystr(path)]
    return sum(2 * math.prod(x.shape) for x in kernels)


def phases(algo):
    """The per-seed phase functions of one ``PPO.update``, in its order."""
    import jax
    import jax.numpy as jnp

    from rljax.algos.ppo import PPOBatch, gae

    c = algo.config

    def rollout(state):
        _, rollout_key, epoch_key = jax.random.split(state.key, 3)
        env, ro = algo.rollout(state.params, state.env, rollout_key, state.obs_stats)
        _, ro, last_obs = algo.observed_rollout(state.obs_stats, env, ro)
        return ro, algo.next_values(state.params, ro, last_obs), epoch_key

    def advantages(state, ro, next_values):
        hp, tr = algo.resolve(state.hparams), ro.transition
        return gae(tr.reward, ro.value, next_values, tr.terminated, tr.truncated, hp.gamma,
                   hp.gae_lambda)  # fmt: skip

    def training_batch(state, ro, adv, returns):  # as PPO.learn builds it
        tr = ro.transition
        samples = PPOBatch(tr.obs, ro.action, ro.log_prob, ro.value, adv, returns)
        return algo.training_batch(state, samples, ro)

    def shuffles(state, ro, adv, returns, epoch_key):
        batch = training_batch(state, ro, adv, returns)
        keys = jax.random.split(epoch_key, c.update_epochs)
        return jax.lax.map(lambda key: algo.minibatches(key, batch), keys)

    def sgd(state, ro, adv, returns, epoch_key):
        batch = training_batch(state, ro, adv, returns)
        carry, metrics = jax.lax.scan(
            lambda carry, k: algo.epoch(carry, k, batch, state.hparams),
            (state.params, state.opt_state, state.sync),
            jax.random.split(epoch_key, c.update_epochs),
        )
        return carry, jnp.mean(metrics["loss"])

    return rollout, advantages, sgd, shuffles


def profile(seeds: int, repeats: int, calls: int, trace: str | None, num_envs: int = 4) -> dict:
    import jax

    from rljax import PPO, PPOConfig
    from rljax.parallel import Layout, make_mesh
    from rljax.run.sharded import ShardedRun

    config = PPOConfig(num_envs=num_envs)
    algo = PPO(config)
    layout = Layout(make_mesh("data=1,model=1"))
    run = ShardedRun(algo, layout, num_seeds=seeds, chunk_size=1)
    rollout, advantages, sgd, shuffles = phases(algo)
    batched = (lambda f: jax.vmap(f)) if seeds > 1 else (lambda f: f)
    fns = {
        "rollout": jax.jit(batched(rollout)),
        "GAE": jax.jit(batched(advantages)),
        "SGD": jax.jit(batched(sgd)),
        "shuffle": jax.jit(batched(shuffles)),
        "update": jax.jit(batched(algo.update)),
    }
    with layout.active():
        state = run.init(jax.random.key(0))
        ro, next_values, epoch_key = fns["rollout"](state)
        adv, returns = fns["GAE"](state, ro, next_values)
        args = {
            "rollout": (state,),
            "GAE": (state, ro, next_values),
            "SGD": (state, ro, adv, returns, epoch_key),
            "shuffle": (state, ro, adv, returns, epoch_key),
            "update": (state,),
        }
        compiled, xla_flops = {}, {}
        for name, fn in fns.items():
            compiled[name] = fn.lower(*args[name]).compile()
            cost = compiled[name].cost_analysis()
            cost = cost[0] if isinstance(cost, list) else cost
            xla_flops[name] = float(cost.get("flops", float("nan"))) if cost else float("nan")
        times = {name: [] for name in fns}
        for _ in range(repeats):  # alternating: drift hits every phase alike
            for name, fn in compiled.items():
                jax.block_until_ready(fn(*args[name]))
                t0 = time.perf_counter()
                for _ in range(calls):
                    out = fn(*args[name])
                jax.block_until_ready(out)
                times[name].append((time.perf_counter() - t0) / calls)
        if trace:
            with jax.profiler.trace(trace):
                for _ in range(3):
                    jax.block_until_ready(compiled["update"](state))

    per_sample = dense_flops(state.params) // seeds  # actor + critic forward, one sample
    steps = config.num_steps * config.num_envs
    sgd_samples = config.update_epochs * config.batch_size
    model_flops = {
        "rollout": seeds * (steps + 2 * config.num_envs) * per_sample,
        "GAE": 0,
        "SGD": seeds * sgd_samples * 3 * per_sample,
        "shuffle": 0,
    }
    model_flops["update"] = sum(model_flops[k] for k in PHASES)
    return {
        "seeds": seeds,
        "env_steps_per_update": steps * seeds,
        "num_envs": num_envs,
        "ms": {k: 1e3 * min(v) for k, v in times.items()},
        "ms_all": {k: [round(1e3 * t, 3) for t in v] for k, v in times.items()},
        "model_flops": model_flops,
        "xla_flops": xla_flops,
        "forward_flops_per_sample": per_sample,
    }


def host_figures() -> dict | None:
    path = REPO_ROOT / "experiments/results/host_loop.json"
    if not path.exists():
        return None
    report = json.loads(path.read_text())
    rows = {r["row"]: r["best"] for r in report.get("rows", [])}
    if "bare loop" not in rows or "train()" not in rows:
        return None
    return {"bare": rows["bare loop"], "train": rows["train()"], "finished": report["finished"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 64])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--calls", type=int, default=10)
    p.add_argument("--num-envs", type=int, default=4, help="environments per seed")
    p.add_argument("--trace", default=None, help="write a jax.profiler trace here (1st setting)")
    p.add_argument("--out", type=Path, default=REPO_ROOT / "experiments/results/profile_ppo.json")
    args = p.parse_args(argv)

    from rljax.parallel import set_num_cpu_devices

    set_num_cpu_devices(1)
    peaks = matmul_peak()
    peak = max(peaks.values())
    log("matmul peak GFLOP/s: " + ", ".join(f"n={n}: {g:.0f}" for n, g in peaks.items()))
    results = []
    for i, seeds in enumerate(args.seeds):
        trace = args.trace if i == 0 else None
        results.append(profile(seeds, args.repeats, args.calls, trace, args.num_envs))
        log(f"{seeds} seed(s): " + json.dumps(results[-1]["ms"]))
    host = host_figures()

    sections = []
    for r in results:
        total = sum(r["ms"][k] for k in PHASES)
        rows = []
        labels = {"shuffle": "of which minibatch shuffles", "update": "whole update (one program)"}
        for name in (*PHASES, "shuffle", "update"):
            ms, flops = r["ms"][name], r["model_flops"][name]
            rows.append({
                "phase": labels.get(name, name),
                "ms": ms,
                "share": f"{100 * ms / total:.0f} %" if name != "update" else "",
                "mflop": flops / 1e6,
                "xla": r["xla_flops"][name] / 1e6,
                "gflops": flops / (ms / 1e3) / 1e9 if flops else 0.0,
                "peak": f"{100 * flops / (ms / 1e3) / 1e9 / peak:.1f} %" if flops else "",
            })  # fmt: skip
        steps_s = r["env_steps_per_update"] / (r["ms"]["update"] / 1e3)
        table = markdown_table(
            rows,
            [("phase", "phase", ""), ("ms / update", "ms", ".2f"), ("share", "share", ""),
             ("model MFLOP", "mflop", ",.1f"), ("XLA cost MFLOP", "xla", ",.1f"),
             ("GFLOP/s", "gflops", ".2f"), ("of peak", "peak", "")],
        )  # fmt: skip
        sections += [
            f"## {r['seeds']} seed(s): {r['env_steps_per_update']:,} env steps per update, "
            f"{steps_s:,.0f} steps/s in one program",
            "",
            table,
            "",
        ]
    lines = [
        "# Where PPO's time goes",
        "",
        f"`python experiments/profile_ppo.py {' '.join(argv or sys.argv[1:])}` on "
        f"{machine_line()}. PPO reference config ({results[0]['num_envs']} envs) on one CPU"
        " device; each phase jitted alone,"
        f" best of {args.repeats} alternating repeats of {args.calls} calls. Model FLOPs: 2 x"
        " inputs x outputs per dense layer per sample, backward 2 x forward. Matmul peak in this"
        " run (float32 `jnp.dot`, n x n): "
        + ", ".join(f"n={n}: {g:.0f} GFLOP/s" for n, g in peaks.items())
        + ".",
        "",
        *sections,
    ]
    if host:
        share = 1 - host["train"] / host["bare"]
        lines += [
            f"**Host**: from `host_loop.json` ({host['finished']}): `train()` ran at "
            f"{host['train']:,.0f} steps/s against the bare compiled loop's {host['bare']:,.0f}, "
            f"so hooks, checkpoints, evaluation and logging took {100 * share:.0f} % of the wall "
            "clock.",
            "",
        ]
    report = {
        "machine": machine_line(),
        "matmul_peak_gflops": peaks,
        "results": results,
        "host": host,
    }
    write_report(args.out, "profile_ppo", report)
    md = args.out.with_suffix(".md")
    md.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
