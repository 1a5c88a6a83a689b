"""The real job against the bare compiled loop: ``rljax.train`` vs one compiled chunk, side by side.

    python experiments/host_loop.py                # PPO reference config, 3 alternating repeats
    python experiments/host_loop.py --quick        # 1e5 steps, 1 repeat

Rows, on one CPU device, ``PPOConfig()`` (CartPole-v1, 4 envs x 128 steps, 5e5 env steps):
  bare loop   ``ShardedRun`` with ``chunk_size = num_updates``: every update in one compiled call,
              state initialised (untimed) before; nothing on the host between updates
  train()     the whole job with default ``RunConfig``: chunks of ``log_every`` updates, the
              non-finite guard, metrics.jsonl, progress, async checkpoints every 100 updates
              and at most one per 30 s (``checkpoint_min_seconds``: on this 5 s run only the
              final one), greedy evaluation every 100 updates, the final evaluation
Columns: steps/s (train(): wall clock from the loop's start to its end, compile excluded as for
the bare loop; also the seconds inside compiled chunks), compile seconds, the host hooks'
seconds by hook, and train()'s ratio to the bare loop (best of the repeats each; the repeats
alternate so that load drift hits both alike). Writes experiments/results/host_loop.{md,json}.
"""

from __future__ import annotations

import argparse
import collections
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import (  # noqa: E402
    REPO_ROOT,
    log,
    machine_line,
    markdown_table,
    timed,
    write_report,
)


def timed_hooks(loop_mod, totals: collections.Counter, calls: collections.Counter):
    """Wrap every hook added to a ``Loop`` so that its host seconds add up under its name."""
    original = loop_mod.Loop.add_hook

    def add_hook(self, fn, *args, **kwargs):
        hook = original(self, fn, *args, **kwargs)
        inner = hook.fn
        name = getattr(inner, "__qualname__", None) or type(inner).__name__
        name = name.split(".<locals>")[0]

        def run(info, inner=inner, name=name):
            t0 = time.perf_counter()
            inner(info)
            totals[name] += time.perf_counter() - t0
            calls[name] += 1

        object.__setattr__(hook, "fn", run)
        return hook

    loop_mod.Loop.add_hook = add_hook


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument(
        "--log-every",
        type=int,
        nargs="+",
        default=[25, 100],
        help="train() rows, one per chunk size (RunConfig log_every; 25 is the default)",
    )
    p.add_argument("--out", type=Path, default=REPO_ROOT / "experiments/results/host_loop.json")
    args = p.parse_args(argv)

    import jax

    from rljax import PPOConfig, RunConfig, train
    from rljax.parallel import set_num_cpu_devices
    from rljax.run import loop as loop_mod
    from rljax.run.sharded import ShardedRun

    set_num_cpu_devices(1)
    config = PPOConfig(total_timesteps=100_000) if args.quick else PPOConfig()
    steps = config.num_updates * config.batch_size
    totals, calls = collections.Counter(), collections.Counter()
    timed_hooks(loop_mod, totals, calls)

    bare = ShardedRun(config, _one_device_layout(), chunk_size=config.num_updates)
    t0 = time.perf_counter()
    bare.compile(jax.random.key(0))
    bare_compile = time.perf_counter() - t0
    speeds = {"bare loop": []}
    for every in args.log_every:
        speeds[f"train() log_every={every}"] = []
        speeds[f"train() log_every={every}, inside chunks"] = []
    train_compile, hooks = [], []
    for repeat in range(args.repeats):
        seconds, _, _ = timed(
            lambda state: bare.run_chunk(state, config.num_updates),
            lambda repeat=repeat: bare.init(jax.random.key(repeat)),
            repeats=1,
        )
        speeds["bare loop"].append(steps / seconds)
        log(f"repeat {repeat}: bare loop {speeds['bare loop'][-1]:,.0f} steps/s")
        for every in args.log_every:
            totals.clear(), calls.clear()
            with tempfile.TemporaryDirectory() as tmp:
                run = RunConfig.make(runs_dir=tmp, run_name="x", quiet=True, log_every=every)
                result = train(config, run)
            speeds[f"train() log_every={every}"].append(result.steps_per_second)
            speeds[f"train() log_every={every}, inside chunks"].append(
                result.compiled_steps_per_second
            )
            train_compile.append(sum(result.compile_seconds.values()))
            hooks.append({k: (round(totals[k], 3), calls[k]) for k in totals})
            log(f"repeat {repeat}: train() log_every={every} {result.steps_per_second:,.0f} "
                f"steps/s ({result.compiled_steps_per_second:,.0f} inside chunks); "
                f"hooks {hooks[-1]}")  # fmt: skip

    best = {k: max(v) for k, v in speeds.items()}
    rows = [
        {
            "row": name,
            "best": best[name],
            "all": ", ".join(f"{v:,.0f}" for v in speeds[name]),
            "ratio": best[name] / best["bare loop"],
        }
        for name in speeds
    ]
    table = markdown_table(
        rows,
        [("row", "row", ""), ("best steps/s", "best", ",.0f"), ("all repeats", "all", ""),
         ("vs bare loop", "ratio", ".2f")],
    )  # fmt: skip
    last = hooks[-1]
    hook_lines = [f"- `{k}`: {s:.3f} s over {n} calls" for k, (s, n) in sorted(last.items())]
    lines = [
        "# Host loop against the bare compiled loop",
        "",
        f"`python experiments/host_loop.py {' '.join(argv or sys.argv[1:])}` on {machine_line()}.",
        f"PPO reference config, {steps:,} env steps, one CPU device, best of {args.repeats}"
        " alternating repeats. Compile time is apart: bare loop"
        f" {bare_compile:.1f} s, train() {min(train_compile):.1f} s (init, chunk and evaluation"
        " programs).",
        "",
        table,
        "",
        f"Host seconds per hook in the last train() repeat (log_every={args.log_every[-1]}):",
        "",
        *hook_lines,
        "",
    ]
    report = {
        "machine": machine_line(),
        "steps": steps,
        "speeds": speeds,
        "rows": rows,
        "hooks": hooks,
        "compile_s": {"bare": bare_compile, "train": train_compile},
    }
    write_report(args.out, "host_loop", report)
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


def _one_device_layout():
    from rljax.parallel import Layout, make_mesh

    return Layout(make_mesh("data=1,model=1"))


if __name__ == "__main__":
    sys.exit(main())
