"""Every parallel layout side by side on 8 emulated CPU devices: the same deep residual-MLP
actor-critic, the same PPO budget on Breakout-MinAtar, 3 seeds each.

    python experiments/layouts.py            # the table; results/layouts.{md,json,png}
    python experiments/layouts.py --quick    # tiny sizes, 1 seed, results to a temp dir
    python experiments/layouts.py --replot   # rebuild .md/.png from the .json
    python experiments/layouts.py --add --layouts "actor-learner K=1 V-trace"   # one more row

Layouts: data parallel (data=8), tensor parallel (model=8), FSDP (fsdp=8), FSDP x TP
(fsdp=4,model=2), pipeline (data=2,stage=4, GPipe with 2 microbatches) and the actor-learner
layout (actors data=4 on devices 0-3, learner data=2,model=2 on 4-7) at K = 0, 1, 2, and K = 1
with ``off_policy="vtrace"``. Each run is
``train()`` with one seed (the actor-learner layout runs one seed per process; so does every row
here, for the same treatment); runs go one after another and the JSON is rewritten after each.

Columns: per-device memory (the largest sum of a device's shards of the final training state,
read from the arrays), bytes sent per device per update by mesh axis (``rljax.diagnostics``:
the compiled optimizer step's collectives x optimizer steps per update; the actor-learner rows
add ``reshard (total)``, the parameters sent to the actors plus the rollout sent to the learner
per update, over all devices), steps/s inside compiled chunks (emulated devices: relative
only), final return (mean training return over the last 10 % of updates, mean over seeds) and
AUC (mean training return over all updates), and for the actor-learner rows the mean and max
staleness.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402

from rljax.parallel import set_num_cpu_devices  # noqa: E402

set_num_cpu_devices(8)
# Seeds 1 and 2 of a layout reuse seed 0's compiled programs.
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "rljax-jax")),
)

import numpy as np  # noqa: E402

from experiments.bench_harness import log, machine_line, markdown_table, write_report  # noqa: E402

NAME = "layouts"
AL = {"actor_mesh": "data=4", "learner_mesh": "data=2,model=2"}
LAYOUTS: dict[str, dict] = {
    "data parallel": {"mesh": "data=8"},
    "tensor parallel": {"mesh": "model=8"},
    "FSDP": {"mesh": "fsdp=8"},
    "FSDP x TP": {"mesh": "fsdp=4,model=2"},
    "pipeline": {"mesh": "data=2,stage=4", "algo": {"pipeline_microbatches": 2}},
    "actor-learner K=0": {**AL, "max_staleness": 0},
    "actor-learner K=1": {**AL, "max_staleness": 1},
    "actor-learner K=2": {**AL, "max_staleness": 2},
    "actor-learner K=1 V-trace": {**AL, "max_staleness": 1, "algo": {"off_policy": "vtrace"}},
}
FULL = {"num_envs": 32, "num_steps": 64, "updates": 30, "width": 64, "depth": 4, "seeds": 3}
QUICK = {"num_envs": 8, "num_steps": 16, "updates": 6, "width": 16, "depth": 4, "seeds": 1}


def make_config(sizes: dict, extra: dict):
    from rljax.presets import preset_config

    steps = sizes["num_envs"] * sizes["num_steps"]
    return preset_config(
        "minatar",
        num_envs=sizes["num_envs"],
        num_steps=sizes["num_steps"],
        num_minibatches=4,
        total_timesteps=steps * sizes["updates"],
        network="residual",
        residual_width=sizes["width"],
        residual_depth=sizes["depth"],
        residual_expansion=2,
        **extra,
    )


def per_device_bytes(state) -> int:
    """The largest total of one device's shards of ``state`` (every leaf, every mesh)."""
    totals: dict = {}
    for leaf in jax.tree.leaves(state):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            leaf = jax.random.key_data(leaf)
        for shard in leaf.addressable_shards:
            totals[shard.device] = totals.get(shard.device, 0) + shard.data.nbytes
    return max(totals.values())


def communication_per_update(config, run, row: dict) -> dict[str, float]:
    """Bytes per device per update by mesh axis (see the module doc)."""
    from rljax.diagnostics import communication
    from rljax.diagnostics.communication import comm_bytes_per_update
    from rljax.run.actor_learner import is_actor_learner, prepare_actor_learner
    from rljax.run.sharded import prepare

    if is_actor_learner(run):
        (_, layout), algo = prepare_actor_learner(config, run)
    else:
        layout, algo = prepare(config, run)
    comm = communication(algo, layout)
    out = comm_bytes_per_update(comm, row["optimizer_steps"], row["syncs"])
    out = {k.removeprefix("comm_bytes_"): v for k, v in out.items() if v}
    if is_actor_learner(run):
        params = jax.eval_shape(algo.init_params, jax.random.key(0))
        param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
        obs = algo.env.spec.obs_dim * config.num_envs * config.num_steps * 4
        # rollout: obs and final obs, action, log-prob, value, reward, next value, flags
        rollout_bytes = 2 * obs + config.num_envs * config.num_steps * 4 * 7
        out["reshard"] = float(param_bytes + rollout_bytes)
    return out


def run_layout(name: str, spec: dict, sizes: dict, runs_dir: Path) -> dict:
    from rljax import RunConfig, train

    extra = spec.get("algo", {})
    config = make_config(sizes, extra)
    flat = {k: v for k, v in spec.items() if k != "algo"}
    per_seed = []
    for seed in range(sizes["seeds"]):
        run = RunConfig.make(
            seed=seed, eval_every=0, log_every=10, checkpoint_every=10**6, quiet=True,
            runs_dir=str(runs_dir), run_name=f"{name.replace(' ', '_').replace('=', '')}-{seed}",
            overwrite=True, **flat,
        )  # fmt: skip
        t0 = time.perf_counter()
        result = train(config, run)
        rows = result.metrics
        returns = np.array([r["episode_return"] for r in rows], float)
        tail = max(1, math.ceil(0.1 * len(returns)))
        entry = {
            "seed": seed,
            "final_return": float(returns[-tail:].mean()),
            "auc": float(returns.mean()),
            "steps_per_s": result.compiled_steps_per_second,
            "wall_s": time.perf_counter() - t0,
            "compile_s": sum(result.compile_seconds.values()),
            "memory_per_device": per_device_bytes(result.state),
            "episode_return": returns.tolist(),
            "clip_fraction": float(np.mean([r["clip_fraction"] for r in rows])),
        }
        if "staleness" in rows[0]:
            staleness = np.array([float(r["staleness"]) for r in rows])
            entry.update(staleness_mean=staleness.mean(), staleness_max=staleness.max())
        per_seed.append(entry)
        log(f"{name} seed {seed}: return {entry['final_return']:.2f}, "
            f"{entry['steps_per_s']:,.0f} steps/s, {entry['wall_s']:.0f} s")  # fmt: skip
    row = {"layout": name, "spec": {k: v for k, v in spec.items()}, "per_seed": per_seed}
    for key in ("final_return", "auc", "steps_per_s", "memory_per_device", "staleness_mean",
                "staleness_max", "clip_fraction"):  # fmt: skip
        values = [s[key] for s in per_seed if key in s]
        if values:
            row[key] = float(np.mean(values))
    row["final_return_std"] = float(np.std([s["final_return"] for s in per_seed]))
    row["comm"] = communication_per_update(config, run, rows[-1])
    return row


def where(spec: dict) -> str:
    if "mesh" in spec:
        return spec["mesh"]
    return f"actors {spec['actor_mesh']} + learner {spec['learner_mesh']}"


NOTES = """What the table shows (emulated devices share {cpus} cores, so steps/s are relative):

{observations}
"""


def observations(rows: list[dict]) -> str:
    by = {r["layout"]: r for r in rows}
    out = []
    sync, k1, k2 = (by.get(f"actor-learner K={k}") for k in (0, 1, 2))
    if sync and k1:
        gain = k1["steps_per_s"] / sync["steps_per_s"]
        out.append(
            f"- Does asynchrony buy throughput here? A little: K=1 runs at {gain:.2f}x the "
            f"steps/s of K=0 on the same two meshes ({k1['steps_per_s']:,.0f} vs "
            f"{sync['steps_per_s']:,.0f})"
            + (f", K=2 at {k2['steps_per_s'] / sync['steps_per_s']:.2f}x" if k2 else "")
            + ". All 8 emulated devices share the machine's cores, so the actor and learner "
            "programs compete for the same CPUs instead of running side by side; the overlap "
            "hides dispatch and transfer gaps, not compute. On separate chips the rollout would "
            "run in the learner's shadow and the gain would approach (act + learn) / max(act, "
            "learn)."
        )
    if sync and k1:
        text = (
            f"- What it costs: final return {k1['final_return']:.2f} at K=1"
            + (f" and {k2['final_return']:.2f} at K=2" if k2 else "")
            + f" against {sync['final_return']:.2f} at K=0 (AUC {k1['auc']:.2f}"
            + (f", {k2['auc']:.2f}" if k2 else "")
            + f" vs {sync['auc']:.2f}). With the MinAtar preset's lr 5e-3 the policy moves a "
            "lot per update, so a rollout one version old already starts PPO's ratio away from "
            "1 and the clip discards more of its gradient: the clipped fraction of samples "
            f"(mean over updates and seeds) is {sync['clip_fraction']:.2f} at K=0, "
            f"{k1['clip_fraction']:.2f} at K=1"
            + (f", {k2['clip_fraction']:.2f} at K=2" if k2 else "")
            + ". Staleness reaches K after K updates."
        )
        vt = by.get("actor-learner K=1 V-trace")
        if vt:
            text += (
                f" V-trace's clipped correction recovers part of it: {vt['final_return']:.2f} "
                f"(AUC {vt['auc']:.2f}, clipped fraction {vt['clip_fraction']:.2f}) at K=1."
            )
        out.append(text)
    if by.get("data parallel"):
        fastest = max(rows, key=lambda r: r["steps_per_s"])
        smallest = min(rows, key=lambda r: r["memory_per_device"])
        out.append(
            f"- The fastest layout is {fastest['layout']} ({fastest['steps_per_s']:,.0f} "
            f"steps/s); the least memory per device is {smallest['layout']}'s "
            f"({smallest['memory_per_device'] / 1e3:,.0f} kB, parameters and moments split 8 "
            "ways). This network is small (width 64): splitting it buys memory and costs "
            "communication (tensor parallel sends the most per update)."
        )
        synchronous = [r["final_return"] for r in rows if r.get("staleness_max", 0) == 0]
        spread = max(r["final_return_std"] for r in rows)
        out.append(
            f"- The synchronous layouts (every row without staleness) end at final returns "
            f"{min(synchronous):.2f} to {max(synchronous):.2f}, seed standard deviations up to "
            f"{spread:.2f}: the same PPO, split differently (the replica count, hence the "
            "minibatch shuffles and float order, differs between meshes)."
        )
    return "\n".join(out)


def write_outputs(out_dir: Path, report: dict) -> None:
    rows = report["rows"]
    for r in rows:
        r["where"] = where(r["spec"])
        r["memory_kb"] = r["memory_per_device"] / 1e3
        r["comm_text"] = ", ".join(
            f"{'reshard (total)' if a == 'reshard' else a} {b / 1e3:,.0f}k"
            for a, b in r["comm"].items()
        )
    columns = [
        ("layout", "layout", ""),
        ("mesh(es)", "where", ""),
        ("memory/device (kB)", "memory_kb", ",.0f"),
        ("bytes sent/device/update by axis", "comm_text", ""),
        ("steps/s", "steps_per_s", ",.0f"),
        ("final return", "final_return", ".2f"),
        ("± std", "final_return_std", ".2f"),
        ("AUC", "auc", ".2f"),
        ("staleness mean", "staleness_mean", ".2f"),
        ("staleness max", "staleness_max", ".0f"),
    ]
    table = markdown_table(rows, columns)
    text = (
        f"# Parallel layouts side by side\n\n{report['config_summary']}\n\n{table}\n\n"
        + NOTES.format(cpus=os.cpu_count(), observations=observations(rows))
        + f"\nMachine: {report['machine']}. Script: `experiments/layouts.py`.\n"
    )
    (out_dir / f"{NAME}.md").write_text(text)
    print(table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    names = [r["layout"] for r in rows]
    axes[0].barh(names, [r["steps_per_s"] for r in rows])
    axes[0].set_xlabel("env steps/s (compiled chunks, emulated)")
    axes[1].barh(names, [r["memory_kb"] for r in rows])
    axes[1].set_xlabel("training state per device (kB)")
    for r in rows:
        curves = np.array([s["episode_return"] for s in r["per_seed"]])
        axes[2].plot(curves.mean(0), label=r["layout"])
    axes[2].set_xlabel("update")
    axes[2].set_ylabel("training return (mean over seeds)")
    axes[2].legend(fontsize=7)
    for ax in axes[:2]:
        ax.invert_yaxis()
    fig.tight_layout()
    fig.savefig(out_dir / f"{NAME}.png", dpi=100)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, 1 seed, to a temp dir")
    p.add_argument("--replot", action="store_true", help="rebuild .md/.png from the .json")
    p.add_argument("--layouts", nargs="*", default=list(LAYOUTS), help="a subset, by name")
    p.add_argument("--add", action="store_true", help="keep the JSON's other layouts' rows")
    args = p.parse_args(argv)
    out_dir = Path(tempfile.mkdtemp()) if args.quick else Path(__file__).parent / "results"
    path = out_dir / f"{NAME}.json"
    if args.replot:
        write_outputs(out_dir, json.loads(path.read_text()))
        return
    sizes = QUICK if args.quick else FULL
    config = make_config(sizes, {})
    report = {
        "config_summary": (
            f"PPO {config.env}, MinAtar preset but {config.num_envs} envs x {config.num_steps} "
            f"steps, {config.num_minibatches} minibatches, {sizes['updates']} updates "
            f"({config.total_timesteps:,} env steps per seed); residual MLP width "
            f"{sizes['width']}, depth {sizes['depth']}, expansion 2; seeds 0-{sizes['seeds'] - 1}"
        ),
        "machine": machine_line(),
        "sizes": sizes,
        "rows": [],
    }
    if args.add and path.exists():
        kept = json.loads(path.read_text())["rows"]
        report["rows"] = [r for r in kept if r["layout"] not in args.layouts]
    runs_dir = Path(tempfile.mkdtemp(prefix="rljax-layouts-"))
    for name in args.layouts:
        report["rows"].append(run_layout(name, LAYOUTS[name], sizes, runs_dir))
        order = list(LAYOUTS)
        report["rows"].sort(key=lambda r: order.index(r["layout"]))
        write_report(path, NAME, report)  # incrementally: a stopped run keeps its rows
    write_outputs(out_dir, report)


if __name__ == "__main__":
    main()
