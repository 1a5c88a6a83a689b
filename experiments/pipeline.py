"""Pipeline parallelism of the residual actor-critic over the ``stage`` axis (8 emulated CPU
devices): per-device parameter memory, training steps/s, the bubble, and equality with the
unsplit network.

    python experiments/pipeline.py            # depth 8, width 256, stage = 1, 2, 4 (+ data x model)
    python experiments/pipeline.py --quick    # tiny sizes, results to a temp dir

For each mesh: the actor-critic's stacked tower blocks are placed with the run's shardings and
one training step (value_and_grad of a PPO-shaped loss, then SGD) is compiled and timed. Columns:
the tower blocks' parameter bytes on one device (read from the placed arrays), XLA's compiled
temporaries per device, steps/s, GPipe's bubble ``(S-1)/(M+S-1)`` and a measured one, and the max
|difference| of the outputs and gradients from the unsplit network (separate block parameters,
one device). Measured bubble: ``1 - t_stage / t_pipe``, with ``t_stage`` the time of one stage's
share of the work (``depth/S`` blocks, the whole batch, forward and backward) on one device and
``t_pipe`` the pipelined step; on emulated devices all stages share the machine's cores, so this
is an upper bound of what separate chips would show. Writes
experiments/results/pipeline.{md,json,png} (``--replot``: only the .png, from the .json).
"""

from __future__ import annotations

import argparse
import json
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

import flax.linen as nn  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from experiments.bench_harness import log, machine_line, markdown_table, write_report  # noqa: E402
from rljax.networks.residual import ResidualActorCritic  # noqa: E402
from rljax.parallel import Layout, make_mesh  # noqa: E402
from rljax.parallel.pipeline import bubble_fraction  # noqa: E402

OBS_DIM, ACTIONS = 64, 6
NOTES = """What the table shows:

- Memory: each device holds 1/S of the tower blocks' parameters (stage=2: half, stage=4: a
  quarter; with model=2 as well, a quarter on stage=2). XLA's temporaries per device fall with S
  too (each device keeps its own blocks' activations, per microbatch), and fall with more
  microbatches (smaller activations per tick).
- Equality: outputs and gradients equal the unsplit network (separate block parameters, one
  device) to float32 rounding on every mesh and every M.
- Speed: on emulated CPU devices pipelining is slower than one device, and the measured bubble
  is near 1. The S device programs share the machine's cores, so stages do not run at the same
  time; the bubble ticks still compute (on zeros, masked out), and each tick adds a loop step
  and a ppermute. The GPipe column is what separate chips would idle; the measured column is
  what this machine pays, not a property of the schedule. A GPU row set needs several chips.
"""


def loss(net, params, obs):
    logits, value = net.apply(params, obs)
    return jnp.mean(jax.nn.logsumexp(logits, -1)) + jnp.mean(value**2)


def train_step(net):
    def step(params, obs):
        value, grads = jax.value_and_grad(lambda p: loss(net, p, obs))(params)
        return jax.tree.map(lambda p, g: p - 1e-3 * g, params, grads), value

    return step


def timed(fn, *args, repeats: int) -> float:
    jax.block_until_ready(fn(*args))  # warm
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def unstacked(params, depth):
    towers = {}
    for name, tower in params["params"].items():
        rest = {k: v for k, v in tower.items() if k != "blocks"}
        for i in range(depth if "blocks" in tower else 0):
            rest[f"block_{i}"] = jax.tree.map(lambda x, i=i: x[i], tower["blocks"])
        towers[name] = rest
    return {"params": towers}


def block_bytes(params) -> int:
    """Bytes of the stacked blocks (both towers) on the first device."""
    device = jax.devices()[0]
    total = 0
    for tower in params["params"].values():
        for leaf in jax.tree.leaves(tower.get("blocks", {})):
            total += sum(s.data.nbytes for s in leaf.addressable_shards if s.device == device)
    return total


def measure(spec: str, args, boxed, obs, reference, microbatches: int) -> dict:
    net = ResidualActorCritic(**args.net, pipeline_microbatches=microbatches)
    layout = Layout(make_mesh(spec))
    stages = layout.mesh.shape["stage"]
    params = jax.device_put(nn.meta.unbox(boxed), layout.shardings(nn.get_partition_spec(boxed)))
    with layout.active():
        obs_s = jax.device_put(obs, layout.sharding(jax.P("batch")))
        step = jax.jit(train_step(net))
        compiled = step.lower(params, obs_s).compile()
        seconds = timed(step, params, obs_s, repeats=args.repeats)
        out = jax.jit(net.apply)(params, obs_s)
        grads = jax.jit(jax.grad(lambda p: loss(net, p, obs_s)))(params)
    ref_out, ref_grads = reference

    def diff(a, b):
        return max(jax.tree.leaves(jax.tree.map(lambda x, y: float(jnp.max(jnp.abs(x - y))), a, b)))

    def rel(a, b):  # per leaf, |difference| over the reference's largest |entry|
        def one(x, y):
            return float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(y)), 1e-30))

        return max(jax.tree.leaves(jax.tree.map(one, a, b)))

    t_stage = seconds
    if stages > 1:  # one stage's work alone: depth/S blocks, the whole batch, one device
        stage_net = ResidualActorCritic(**dict(args.net, depth=args.net["depth"] // stages))
        stage_params = nn.meta.unbox(stage_net.init(jax.random.key(0), obs[:1]))
        t_stage = timed(jax.jit(train_step(stage_net)), stage_params, obs, repeats=args.repeats)
    temp = compiled.memory_analysis().temp_size_in_bytes
    row = {
        "mesh": spec,
        "stages": stages,
        "microbatches": microbatches,
        "block_param_bytes_per_device": block_bytes(params),
        "temp_bytes_per_device": int(temp),
        "steps_per_s": 1.0 / seconds,
        "bubble_gpipe": bubble_fraction(stages, microbatches),
        "stage_alone_steps_per_s": 1.0 / t_stage,
        "bubble_measured": max(0.0, 1.0 - t_stage / seconds) if stages > 1 else 0.0,
        "max_abs_diff_out": diff(out, ref_out),
        "max_abs_diff_grad": diff(unstacked(grads, args.net["depth"]), ref_grads),
        "max_rel_diff_grad": rel(unstacked(grads, args.net["depth"]), ref_grads),
    }
    log(
        f"{spec:24s} blocks {row['block_param_bytes_per_device'] / 2**20:7.2f} MiB/device  "
        f"temp {temp / 2**20:7.2f} MiB  {row['steps_per_s']:7.2f} steps/s  bubble "
        f"{row['bubble_gpipe']:.2f} (measured {row['bubble_measured']:.2f})  "
        f"|d out| {row['max_abs_diff_out']:.1e} |d grad| {row['max_abs_diff_grad']:.1e} "
        f"(relative {row['max_rel_diff_grad']:.1e})"
    )
    return row


def plot(rows: list[dict], path: Path) -> None:
    """Per mesh: the blocks' parameter MiB per device, steps/s, and both bubbles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r['mesh']}\nM={r['microbatches']}" for r in rows]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].bar(x, [r["block_param_bytes_per_device"] / 2**20 for r in rows])
    axes[0].set_ylabel("tower blocks, MiB per device")
    axes[1].bar(x, [r["steps_per_s"] for r in rows], color="tab:green")
    axes[1].set_ylabel("training steps/s (emulated CPU devices)")
    axes[2].bar(x - 0.2, [r["bubble_gpipe"] for r in rows], 0.4, label="GPipe (S-1)/(M+S-1)")
    axes[2].bar(x + 0.2, [r["bubble_measured"] for r in rows], 0.4, label="measured")
    axes[2].set_ylabel("bubble fraction")
    axes[2].legend()
    for ax in axes:
        ax.set_xticks(x, labels, rotation=45, ha="right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, results to a temp dir")
    p.add_argument("--depth", type=int, default=8)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--microbatches", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--replot", action="store_true", help="only redraw the .png from the .json")
    args = p.parse_args(argv)
    if args.replot:
        results = Path(__file__).parent / "results"
        plot(json.loads((results / "pipeline.json").read_text())["rows"], results / "pipeline.png")
        return
    if args.quick:
        args.depth, args.width, args.batch, args.microbatches, args.repeats = 4, 16, 16, 4, 2
    # SiLU, not the default ReLU: smooth, so the gradients compare. With ReLU a pre-activation
    # within float32 rounding of 0 (one seen at 3e-7 in 8 x 256 x 1024) flips with the
    # microbatches' matmul blocking and moves that row's gradient by its whole contribution.
    args.net = dict(
        num_actions=ACTIONS, width=args.width, depth=args.depth, expansion=4, activation="silu"
    )
    out_dir = Path(tempfile.mkdtemp()) if args.quick else Path(__file__).parent / "results"
    m = args.microbatches
    meshes = [("stage=1", m), ("stage=2", m), ("stage=4", m), ("data=2,stage=2,model=2", m)]
    meshes += [("stage=4", m // 4), ("stage=4", m * 4)]  # the bubble against M
    if args.depth % 4:
        meshes = [(s, k) for s, k in meshes if "stage=4" not in s]

    obs = jax.random.normal(jax.random.key(1), (args.batch, OBS_DIM))
    net = ResidualActorCritic(**args.net, pipeline_microbatches=args.microbatches)
    boxed = net.init(jax.random.key(0), obs[:1])
    plain = ResidualActorCritic(**args.net)
    flat = unstacked(nn.meta.unbox(boxed), args.depth)
    reference = (plain.apply(flat, obs), jax.grad(lambda q: loss(plain, q, obs))(flat))
    params_total = sum(x.size for x in jax.tree.leaves(flat))
    log(f"residual actor-critic: width {args.width}, depth {args.depth}, {params_total:,} params")

    rows = []
    for spec, microbatches in meshes:
        rows.append(measure(spec, args, boxed, obs, reference, microbatches))
        report = {"config": {k: v for k, v in vars(args).items()}, "rows": rows}
        write_report(out_dir / "pipeline.json", "pipeline", report)
    columns = [
        ("mesh", "mesh", ""),
        ("stages S", "stages", "d"),
        ("microbatches M", "microbatches", "d"),
        ("tower blocks MiB/device", "blocks_mib", ".3f"),
        ("temporaries MiB/device", "temp_mib", ".2f"),
        ("train steps/s", "steps_per_s", ".2f"),
        ("bubble (S-1)/(M+S-1)", "bubble_gpipe", ".3f"),
        ("bubble measured", "bubble_measured", ".3f"),
        ("max abs diff out", "max_abs_diff_out", ".1e"),
        ("max abs diff grad", "max_abs_diff_grad", ".1e"),
        ("max rel diff grad", "max_rel_diff_grad", ".1e"),
    ]
    for r in rows:
        r["blocks_mib"] = r["block_param_bytes_per_device"] / 2**20
        r["temp_mib"] = r["temp_bytes_per_device"] / 2**20
    text = [
        "# Pipeline parallelism: the residual tower over the stage axis",
        "",
        f"`python experiments/pipeline.py {' '.join(sys.argv[1:])}`; {machine_line()}.",
        "",
        f"Residual actor-critic (two towers), width {args.width}, depth {args.depth}, expansion "
        f"4, SiLU, {params_total:,} parameters; batch {args.batch}, one training step (forward, "
        "backward, SGD) per measurement, median of "
        f"{args.repeats}.",
        "",
        markdown_table(rows, columns),
        "",
        NOTES,
    ]
    (out_dir / "pipeline.md").write_text("\n".join(text))
    plot(rows, out_dir / "pipeline.png")
    print("\n".join(text))


if __name__ == "__main__":
    main()
