"""``rljax compress RUN_DIR --int8 --bf16 --prune 0.5,0.8,0.9``: smaller versions of a trained
policy, each evaluated against the float32 original.

Variants (of the kernels: every parameter named ``kernel``; biases, normalisation scales and the
Gaussian's ``log_std`` stay float32 in all of them):
  float32   the checkpoint's parameters
  bf16      kernels stored as bfloat16, upcast for the forward pass
  int8      weight-only: ``q = round(W / s)`` in [-127, 127] with one float32 scale
            ``s = max|W| / 127`` per output channel (the kernel's last axis); the forward pass
            uses ``q * s``
  prune-P   global magnitude pruning: the fraction P of the torso's kernel weights with the
            smallest magnitude (over all those kernels together) set to exactly 0. The output
            heads are not pruned: the policy head starts 100x smaller than the rest (gain 0.01)
            and a global threshold removes all of it first, which no fine-tuning can undo
  prune-P+ft  (--finetune N) the pruned policy trained N more env steps per seed with its
            pruned weights held at exactly 0

Each row reports the evaluated return (``Evaluation``: training's evaluation key for that update,
so the float32 row equals what the run logged; mean, IQM and its 95 % bootstrap interval over
seeds x episodes), the policy's bytes as stored (pruned: the non-zero values plus a 1-bit mask per
kernel weight) and greedy inference steps/s of a jitted batch of observations (the compressed
kernels are decoded inside the jitted function, as a deployment would). Writes
``RUN_DIR/compress.json`` and ``compress.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Annotated

import jax
import jax.numpy as jnp
import numpy as np
import tyro

from rljax.algos.base import flat_leaves, with_leaves
from rljax.errors import ConfigError

INFERENCE_BATCH = 1024


@dataclasses.dataclass(frozen=True)
class CompressArgs:
    """Compress a run's policy (int8, bfloat16, magnitude pruning) and evaluate every variant
    against the float32 original: return, bytes, inference steps/s."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory (runs/<name>)."""
    int8: bool = False
    """weight-only int8 with per-output-channel scales."""
    bf16: bool = False
    """kernels stored as bfloat16."""
    prune: tuple[float, ...] = ()
    """global magnitude pruning at these sparsities (fractions in (0, 1)), e.g. 0.5 0.8 0.9."""
    step: int | None = None
    """the checkpoint's update (default: the newest valid checkpoint)."""
    episodes: int = 32
    """evaluation episodes per seed."""
    finetune: int = 0
    """also fine-tune every pruned variant for this many environment steps per seed (the
    run's algorithm and settings, learning rate annealed over them) with the pruned weights held
    at exactly 0, and evaluate it as prune-P+ft."""


def is_kernel(path: str) -> bool:
    return path.rsplit("/", 1)[-1] == "kernel"


def is_prunable(path: str) -> bool:
    from rljax.tools.transfer import is_head

    return is_kernel(path) and not is_head(path)


# -- int8 ----------------------------------------------------------------------------------------
def quantize_int8(w) -> tuple[np.ndarray, np.ndarray]:
    """``w [..., out]`` -> ``(q int8 [..., out], scale float32 [out])``: per output channel,
    ``scale = max|w| / 127`` (1 where a channel is all zeros), ``q = round(w / scale)``."""
    w = np.asarray(w, np.float32)
    amax = np.abs(w).reshape(-1, w.shape[-1]).max(axis=0)
    scale = np.where(amax > 0, amax / 127.0, 1.0).astype(np.float32)
    q = np.clip(np.rint(w / scale), -127, 127).astype(np.int8)
    return q, scale


def dequantize_int8(q, scale):
    return q.astype(jnp.float32) * scale


# -- pruning ---------------------------------------------------------------------------------------
def check_sparsity(p: float) -> None:
    if not 0.0 < p < 1.0:
        raise ConfigError(f"--prune sparsities must be in (0, 1), got {p:g}")


def prune_masks(kernels: dict[str, np.ndarray], sparsity: float) -> dict[str, np.ndarray]:
    """Global magnitude pruning: ``{path: bool mask}`` keeping all but exactly
    ``floor(sparsity * n)`` of the ``n`` kernel weights, the smallest in magnitude removed
    (ties broken by position)."""
    check_sparsity(sparsity)
    paths = sorted(kernels)
    flat = np.concatenate([np.abs(np.asarray(kernels[p], np.float32)).ravel() for p in paths])
    removed = int(math.floor(sparsity * flat.size))
    keep = np.ones(flat.size, bool)
    keep[np.argsort(flat, kind="stable")[:removed]] = False
    masks, start = {}, 0
    for p in paths:
        size = np.size(kernels[p])
        masks[p] = keep[start : start + size].reshape(np.shape(kernels[p]))
        start += size
    return masks


# -- variants --------------------------------------------------------------------------------------
@dataclasses.dataclass
class Variant:
    name: str
    stored: dict  # path -> what is stored (arrays; int8 kernels as (q, scale))
    bytes: int
    decode: object  # stored -> float32 params by path (traceable)


def flat_params(params) -> dict[str, np.ndarray]:
    return {p: np.asarray(x) for p, x in flat_leaves(params).items()}


def variants(params, args: CompressArgs) -> list[Variant]:
    """The float32 original and the requested variants of one replica's ``params``."""
    flat = flat_params(params)
    nbytes = lambda x: int(np.asarray(x).nbytes)  # noqa: E731
    others = {p: x for p, x in flat.items() if not is_kernel(p)}
    other_bytes = sum(nbytes(x) for x in others.values())
    identity = lambda stored: dict(stored)  # noqa: E731
    out = [Variant("float32", flat, sum(nbytes(x) for x in flat.values()), identity)]
    kernels = {p: x for p, x in flat.items() if is_kernel(p)}
    if args.bf16:
        stored = {**others, **{p: jnp.asarray(x, jnp.bfloat16) for p, x in kernels.items()}}
        size = other_bytes + sum(np.size(x) * 2 for x in kernels.values())

        def upcast(stored):
            return {p: (x.astype(jnp.float32) if is_kernel(p) else x) for p, x in stored.items()}

        out.append(Variant("bf16", stored, size, upcast))
    if args.int8:
        quantized = {p: quantize_int8(x) for p, x in kernels.items()}
        size = other_bytes + sum(q.nbytes + s.nbytes for q, s in quantized.values())

        def dequantize(stored):
            return {p: (dequantize_int8(*x) if is_kernel(p) else x) for p, x in stored.items()}

        out.append(Variant("int8", {**others, **quantized}, size, dequantize))
    prunable = {p: x for p, x in kernels.items() if is_prunable(p)}
    for sparsity in args.prune:
        masks = prune_masks(prunable, sparsity)
        pruned = {p: np.where(masks[p], x, 0.0).astype(x.dtype) for p, x in prunable.items()}
        pruned = {**kernels, **pruned}
        heads = sum(nbytes(x) for p, x in kernels.items() if p not in masks)
        values = heads + sum(int(m.sum()) * 4 for m in masks.values())
        bits = sum(math.ceil(m.size / 8) for m in masks.values())
        out.append(
            Variant(f"prune-{sparsity:g}", {**others, **pruned}, other_bytes + values + bits,
                    identity)
        )  # fmt: skip
    return out


def kernel_sparsity(params) -> float:
    """The fraction of the prunable kernels' weights (outside the heads) that are 0."""
    kernels = [x for p, x in flat_params(params).items() if is_prunable(p)]
    return float(sum((np.asarray(k) == 0).sum() for k in kernels) / sum(k.size for k in kernels))


def compress_run(args: CompressArgs, say=print) -> dict:
    """Build, evaluate and time every variant of ``args.run_dir``'s policy (see the module
    doc); the report, also written to ``RUN_DIR/compress.json`` and ``compress.md``."""
    from rljax.run.evaluation import Evaluation, obs_stats_of
    from rljax.run.run_log import write_text_atomic
    from rljax.tools.runs import load_run
    from rljax.tools.stats import summarise

    for p in args.prune:
        check_sparsity(p)
    if not (args.int8 or args.bf16 or args.prune):
        raise ConfigError("nothing to compress: pass --int8, --bf16 and/or --prune 0.5,0.8,...")
    if args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    if args.finetune < 0 or (args.finetune and not args.prune):
        raise ConfigError("--finetune takes a number of env steps >= 1, with --prune")
    loaded = load_run(args.run_dir, args.step, verb="compress")
    algo, state, seeds = loaded.algo, loaded.state, loaded.run.num_seeds
    evaluation = Evaluation(loaded.sharded, args.episodes, loaded.run.seed)
    evaluation.compile(jax.random.key(0))
    seed_of = lambda tree, i: jax.tree.map(lambda x: x[i], tree) if seeds > 1 else tree  # noqa: E731
    # One replica's parameters per seed (the acting ones), compressed per seed.
    originals = [jax.device_get(algo.acting_params(seed_of(state.params, i))) for i in range(seeds)]
    encoded = [variants(p, args) for p in originals]
    stats = seed_of(obs_stats_of(state), 0) if obs_stats_of(state) is not None else None
    obs = jax.random.normal(jax.random.key(1), (INFERENCE_BATCH, algo.env.spec.obs_dim))
    rows = []
    tuner = FineTuner(loaded, args.finetune) if args.finetune else None
    for variant in _with_finetuned(encoded[0], tuner):
        name = variant.name.removesuffix("+ft")
        decoded = []
        for p, vs in zip(originals, encoded, strict=True):
            (v,) = [v for v in vs if v.name == name]
            decoded.append(with_leaves(p, v.decode(v.stored)))
        if variant.name.endswith("+ft"):
            decoded = [tuner.tune(p, seed=i) for i, p in enumerate(decoded)]
        params = _as_layout(decoded, state.params, seeds)
        evaluation(state.replace(params=params), loaded.step)
        returns = np.asarray(evaluation.last_returns, np.float64).reshape(seeds, -1)
        summary = summarise(list(returns))
        rows.append(
            {
                "variant": variant.name,
                "bytes": variant.bytes,
                "kernel_sparsity": kernel_sparsity(decoded[0]),
                "mean": summary["mean"]["value"],
                "iqm": summary["iqm"]["value"],
                "iqm_ci": summary["iqm"]["ci"],
                "returns": returns.tolist(),
                "steps_per_s": inference_speed(algo, originals[0], variant, obs, stats),
            }
        )
        say(_row_line(rows[-1], rows[0]))
    report = {
        "run_dir": str(loaded.run_dir),
        "env": loaded.algo_config.env,
        "step": loaded.step,
        "seeds": seeds,
        "episodes_per_seed": args.episodes,
        "inference_batch": INFERENCE_BATCH,
        "rows": rows,
    }
    write_text_atomic(loaded.run_dir / "compress.json", json.dumps(report, indent=2) + "\n")
    write_text_atomic(loaded.run_dir / "compress.md", markdown(report) + "\n")
    say(f"wrote {loaded.run_dir / 'compress.json'} and compress.md")
    return report


def _with_finetuned(variants_: list[Variant], tuner) -> list[Variant]:
    """Each pruned variant followed by its fine-tuned copy (the same storage) when tuning."""
    out = []
    for v in variants_:
        out.append(v)
        if tuner is not None and v.name.startswith("prune-"):
            out.append(dataclasses.replace(v, name=v.name + "+ft"))
    return out


def keep_zeros():
    """An optax transformation that zeroes the update of every parameter that is exactly 0, so
    pruned weights stay pruned through fine-tuning (a weight reaching exactly 0 by chance would
    freeze too: measure zero)."""
    import optax

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("keep_zeros needs the parameters")
        return jax.tree.map(lambda u, p: jnp.where(p == 0, 0, u), updates, params), state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


class FineTuner:
    """Fine-tuning with pruned weights held at 0: the run's algorithm, config and layout, for
    ``env_steps`` per seed, one compile for every variant and seed."""

    def __init__(self, loaded, env_steps: int):
        from rljax.run.sharded import ShardedRun

        base = type(loaded.algo)

        class PrunedFineTuning(base):
            def build_optimizer(self):
                import optax

                return optax.chain(super().build_optimizer(), keep_zeros())

        per_update = loaded.algo_config.env_steps_per_update
        if env_steps < per_update:
            raise ConfigError(f"--finetune {env_steps}: one update is {per_update} env steps")
        config = dataclasses.replace(loaded.algo_config, total_timesteps=env_steps)
        self.algo = PrunedFineTuning(config, replicas=loaded.algo.replicas)
        self.updates = config.num_updates
        self.run = ShardedRun(self.algo, loaded.sharded.layout, 1, chunk_size=self.updates)
        self.seed = loaded.run.seed

    def tune(self, params, seed: int):
        """One replica's (pruned) ``params`` fine-tuned; returns one replica's parameters."""
        flat = flat_params(params)
        state = self.run.init(jax.random.fold_in(jax.random.key(self.seed), 0xF7 + seed), flat)
        state, _ = self.run.run_chunk(state, self.updates)
        return jax.device_get(self.algo.acting_params(state.params))


def _as_layout(decoded: list, like, seeds: int):
    """Per-seed one-replica parameters in the layout (and shardings) of the state's ``like``:
    stacked over seeds, broadcast over replicas where the sync strategy keeps one per replica."""
    one = jax.tree.map(lambda *x: jnp.stack(x), *decoded) if seeds > 1 else decoded[0]

    def place(x, target):
        x = jnp.asarray(x, target.dtype)
        if x.ndim < target.ndim:  # per-replica parameters: [(S,) R, ...]
            axis = 1 if seeds > 1 else 0
            x = jnp.broadcast_to(jnp.expand_dims(x, axis), target.shape)
        return jax.device_put(x, target.sharding)

    return jax.tree.map(place, one, like)


def inference_speed(algo, params, variant: Variant, obs, obs_stats, repeats: int = 20) -> float:
    """Greedy actions per second of a jitted batch, decoding the stored variant inside."""
    template = jax.device_get(params)
    extra = {} if obs_stats is None else {"obs_stats": obs_stats}

    memory = algo.eval_memory(obs.shape[0])  # a recurrent policy: one step from the start
    if memory is not None:
        extra["memory"] = memory

    @jax.jit
    def act(stored, obs):
        p = with_leaves(template, variant.decode(stored))
        return algo.eval_action(p, obs, jax.random.key(0), True, **extra)

    stored = jax.device_put(variant.stored)
    jax.block_until_ready(act(stored, obs))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(repeats):
            out = act(stored, obs)
        jax.block_until_ready(out)
        best = min(best, time.perf_counter() - t0)
    return repeats * obs.shape[0] / best


def _row_line(row: dict, original: dict) -> str:
    low, high = row["iqm_ci"]
    return (
        f"  {row['variant']:<12} IQM {row['iqm']:9.2f} [{low:.2f}, {high:.2f}]  "
        f"{row['bytes']:>9,} bytes ({row['bytes'] / original['bytes']:.2f}x)  "
        f"{row['steps_per_s']:>12,.0f} steps/s  torso sparsity {row['kernel_sparsity']:.2f}"
    )


def markdown(report: dict) -> str:
    lines = [
        f"# Compressed policies: {report['env']}, update {report['step']}",
        "",
        f"{report['seeds']} seed(s) x {report['episodes_per_seed']} greedy episodes; inference: "
        f"a jitted batch of {report['inference_batch']} observations.",
        "",
        "| variant | IQM return [95% CI] | mean return | bytes | vs float32 | torso sparsity "
        "| inference steps/s |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    base = report["rows"][0]["bytes"]
    for r in report["rows"]:
        low, high = r["iqm_ci"]
        lines.append(
            f"| {r['variant']} | {r['iqm']:.1f} [{low:.1f}, {high:.1f}] | {r['mean']:.1f} "
            f"| {r['bytes']:,} | {r['bytes'] / base:.2f}x | {r['kernel_sparsity']:.2f} "
            f"| {r['steps_per_s']:,.0f} |"
        )
    return "\n".join(lines)
