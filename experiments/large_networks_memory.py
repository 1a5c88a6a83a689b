"""Memory scaling of large residual-MLP PPO actor-critics over fsdp x model meshes, and a 100M+
parameter policy trained on fsdp=4,model=2 (8 emulated CPU devices).

    python experiments/large_networks_memory.py                 # table: 10M / 100M / 1B, 5 layouts
    python experiments/large_networks_memory.py --sizes 10M      # one size
    python experiments/large_networks_memory.py --train-100m     # also 5 PPO updates of ~105M
    python experiments/large_networks_memory.py --train-100m --reuse-table  # only the training
    python experiments/large_networks_memory.py --quick          # tiny sizes, temp dir

Every figure is per device, from the compiled programs (``rljax.run.plan``: the state's shards
under the run's shardings, XLA's ``memory_analysis()`` of the compiled init and update chunk);
nothing is allocated for the table (compiled, not run). Sizes: SimBa-style residual actor and
critic towers of depth 4, expansion 4, on CartPole-v1 (the network, not the environment, is what
is measured): width 400 (~10M), 1280 (~105M), 4000 (~1.02B). PPO: 64 envs x 16 steps, 4
minibatches, 1 epoch. Writes ``experiments/results/large_networks_memory.{md,json,png}``.

Bar (issue 14): the 1B training state per device on fsdp=4,model=2 is at most 1/8 of the 1-device
state plus 10 %.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from rljax.parallel import set_num_cpu_devices  # noqa: E402

set_num_cpu_devices(8)  # also one OpenBLAS thread per device: the orthogonal init's QRs

from experiments.bench_harness import log, machine_line, markdown_table, write_report  # noqa: E402
from rljax import PPOConfig, RunConfig, train  # noqa: E402
from rljax.parallel import Layout, make_mesh  # noqa: E402
from rljax.run import compile_cache  # noqa: E402
from rljax.run.plan import plan_of, program_bytes  # noqa: E402
from rljax.run.sharded import ShardedRun  # noqa: E402

SIZES = {"10M": 400, "100M": 1280, "1B": 4000}
QUICK_SIZES = {"tiny": 64, "small": 128}
LAYOUTS = ["data=1", "data=8", "fsdp=8", "fsdp=4,model=2", "data=2,fsdp=2,model=2"]
DEPTH = 4


def config_for(width: int, total_updates: int = 1) -> PPOConfig:
    return PPOConfig(
        env="CartPole-v1",
        network="residual",
        residual_width=width,
        residual_depth=DEPTH,
        residual_expansion=4,
        num_envs=64,
        num_steps=16,
        num_minibatches=4,
        update_epochs=1,
        total_timesteps=64 * 16 * total_updates,
    )


def measure(size: str, width: int, layout: str) -> dict:
    """Compile (not run) and read the plan of one size on one layout."""
    t0 = time.perf_counter()
    sharded = ShardedRun(config_for(width), Layout(make_mesh(layout)), chunk_size=1)
    sharded.compile(jax.random.key(0))
    p = plan_of(sharded, "ppo", RunConfig.make(mesh=layout))
    d = p.as_dict()
    b = d["bytes_per_device"]
    # The same init under XLA CPU's default scheduler, which rljax's init options replace
    # (compile_cache.INIT_OPTIONS): what a device needed before.
    with sharded.layout.active():
        default_init = jax.jit(
            sharded.algo.init,
            out_shardings=sharded.state_shardings,
            compiler_options=compile_cache.compiler_options(sharded.mesh),  # the update's
        )
        default_init = program_bytes(default_init.lower(jax.random.key(0)).compile())
    state = sum(b["state"].values())
    row = {
        "size": size,
        "width": width,
        "layout": layout,
        "devices": d["devices"],
        "param_count": d["param_count"],
        "params": b["state"].get("parameters", 0),
        "opt_state": b["state"].get("optimizer state", 0),
        "gradients": b["gradients"],
        "temporaries": b["temporaries"],
        "state": state,
        "needed": b["total"],
        "init": b["programs"]["init"]["total"],
        "update": b["programs"]["chunk"]["total"],
        "init_default_scheduler": default_init["total"],
        "needed_default_scheduler": max(default_init["total"], b["programs"]["chunk"]["total"]),
        "largest": f"{d['largest_array']['path']} {d['largest_array']['shape']}",
        "compile_s": time.perf_counter() - t0,
    }
    log(f"{size} {layout}: state {state / 2**20:,.1f} MiB/device, needed {b['total'] / 2**20:,.1f}")
    return row


def train_100m(out_dir: Path, width: int = 1280, updates: int = 5) -> dict:
    """``updates`` PPO updates of the ~105M-parameter actor-critic on fsdp=4,model=2."""
    config = config_for(width, updates)
    run = RunConfig.make(
        mesh="fsdp=4,model=2",
        runs_dir=str(out_dir),
        run_name="ppo100m",
        log_every=1,
        checkpoint_every=10**6,
        eval_every=0,
        quiet=True,
    )
    t0 = time.perf_counter()
    result = train(config, run)
    wall = time.perf_counter() - t0
    rows = result.metrics
    losses = [float(r["loss"]) for r in rows]
    config_json = json.loads((out_dir / "ppo100m" / "config.json").read_text())
    plan = config_json.get("memory_plan", {})
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "width": width,
        "param_count": plan.get("param_count"),
        "mesh": "fsdp=4,model=2",
        "updates": len(rows),
        "losses": losses,
        "finite": all(abs(x) < float("inf") and x == x for x in losses),
        "planned_bytes_per_device": plan.get("bytes_per_device", {}).get("total"),
        "process_peak_rss": rss,
        "process_peak_rss_per_device": rss / 8,
        "wall_s": wall,
        "compile_s": sum(result.compile_seconds.values()),
        "steps_per_second": result.steps_per_second,
        "compiled_steps_per_second": result.compiled_steps_per_second,
    }


def mib(n) -> str:
    return f"{n / 2**20:,.1f}"


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = list(dict.fromkeys(r["size"] for r in rows))
    fig, axes = plt.subplots(1, len(sizes), figsize=(5 * len(sizes), 4), squeeze=False)
    for ax, size in zip(axes[0], sizes, strict=True):
        sub = [r for r in rows if r["size"] == size]
        names = [r["layout"] for r in sub]
        bottom = [0.0] * len(sub)
        for part in ("params", "opt_state", "temporaries"):
            vals = [r[part] / 2**30 for r in sub]
            ax.bar(names, vals, bottom=bottom, label=part)
            bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
        ax.set_title(f"{size} parameters ({sub[0]['param_count']:,})")
        ax.set_ylabel("GiB per device")
        ax.tick_params(axis="x", rotation=30)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="*", default=list(SIZES))
    parser.add_argument("--layouts", nargs="*", default=LAYOUTS)
    parser.add_argument("--train-100m", action="store_true")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--reuse-table", action="store_true", help="keep the rows of the existing results JSON"
    )
    args = parser.parse_args(argv)
    sizes = QUICK_SIZES if args.quick else {s: SIZES[s] for s in args.sizes}
    out = Path(tempfile.mkdtemp()) if args.quick else Path(__file__).parent / "results"
    start = time.perf_counter()
    saved = out / "large_networks_memory.json"
    if args.reuse_table and saved.exists():
        rows = json.loads(saved.read_text())["rows"]
        sizes = dict.fromkeys(r["size"] for r in rows)
    else:
        rows = [measure(s, w, layout) for s, w in sizes.items() for layout in args.layouts]
    report: dict = {"machine": machine_line(), "rows": rows, "depth": DEPTH}
    bars = {}
    for size in sizes:
        one = next((r for r in rows if r["size"] == size and r["layout"] == "data=1"), None)
        fm = next((r for r in rows if r["size"] == size and r["layout"] == "fsdp=4,model=2"), None)
        if one and fm:
            ratio = fm["state"] / one["state"]
            bars[size] = {"ratio": ratio, "bar": 1 / 8 * 1.1, "holds": ratio <= 1 / 8 * 1.1}
    report["bar_state_fsdp4_model2_over_one_device"] = bars

    def emit() -> None:
        report["wall_s"] = time.perf_counter() - start
        columns = [
            ("size", "size", "{}"),
            ("parameters", "param_count", "{:,}"),
            ("layout", "layout", "{}"),
            ("params MiB", "params", "mib"),
            ("Adam MiB", "opt_state", "mib"),
            ("grads MiB", "gradients", "mib"),
            ("temporaries MiB", "temporaries", "mib"),
            ("state MiB", "state", "mib"),
            ("init MiB", "init", "mib"),
            ("update MiB", "update", "mib"),
            ("needed MiB", "needed", "mib"),
            ("init MiB, XLA's default scheduler", "init_default_scheduler", "mib"),
            ("needed MiB, XLA's default scheduler", "needed_default_scheduler", "mib"),
            ("compile s", "compile_s", "{:.1f}"),
        ]
        table_rows = [
            {k: (mib(r[k]) if fmt == "mib" else fmt.format(r[k])) for _, k, fmt in columns}
            for r in rows
        ]
        table = markdown_table(table_rows, [(h, k, "") for h, k, _ in columns])
        lines = [
            "# Memory per device of large residual-MLP PPO actor-critics",
            "",
            f"`python experiments/large_networks_memory.py {' '.join(argv or sys.argv[1:])}`"
            f" on {report['machine']}; compiled, not run (8 emulated CPU devices). Residual"
            f" towers depth {DEPTH}, expansion 4; PPO 64 envs x 16 steps, 4 minibatches. Figures"
            " per device"
            " from `rljax.run.plan` (state shards; XLA memory analysis of the compiled programs);"
            " gradients are inside the temporaries, not added. 'init' and 'update': arguments +"
            " outputs - aliased + temporaries + code of each program; 'needed': the bigger one."
            " The last two columns compile the same init under XLA CPU's default scheduler"
            " instead of the memory-optimized one rljax gives init programs"
            " (`rljax.run.compile_cache.INIT_OPTIONS`).",
            "",
            table,
            "",
        ]
        for size, b in bars.items():
            verdict = "holds" if b["holds"] else "FAILS"
            lines.append(
                f"- {size}: training state per device on fsdp=4,model=2 is {b['ratio']:.4f} of the "
                f"1-device state (bar: <= 1/8 + 10 % = {b['bar']:.4f}): {verdict}."
            )
        if "train_100m" in report:
            t = report["train_100m"]
            lines += [
                "",
                "## A 100M+ parameter policy trained",
                "",
                f"{t['updates']} PPO updates of a {t['param_count']:,}-parameter residual "
                "actor-critic"
                f" (width {t['width']}) on {t['mesh']} (8 emulated CPU devices): losses "
                f"{', '.join(f'{x:.4f}' for x in t['losses'])} (finite: {t['finite']}). Planned "
                f"bytes per device {mib(t['planned_bytes_per_device'] or 0)} MiB; the process's "
                "peak"
                f" RSS {mib(t['process_peak_rss'])} MiB for all 8 devices (CPU devices report no "
                f"per-device peak; {mib(t['process_peak_rss_per_device'])} MiB per device if"
                f" shared evenly). {t['steps_per_second']:.1f} env steps/s"
                f" ({t['compiled_steps_per_second']:.1f} inside the compiled updates),"
                f" {t['wall_s']:.0f} s wall for the whole `train()` call: {t['compile_s']:.0f} s of"
                " compiling, the sharded init (its orthogonal QRs run on every device), the"
                " updates and the final checkpoint.",
            ]
        write_report(out / "large_networks_memory.json", "large_networks_memory", report)
        (out / "large_networks_memory.md").write_text("\n".join(lines) + "\n")
        plot(rows, out / "large_networks_memory.png")
        print("\n".join(lines))

    emit()  # the table first: training may take long or be stopped
    if args.train_100m:
        with tempfile.TemporaryDirectory() as tmp:
            width = 128 if args.quick else SIZES["100M"]
            report["train_100m"] = train_100m(Path(tmp), width=width)
        emit()
    return 0


if __name__ == "__main__":
    sys.exit(main())
