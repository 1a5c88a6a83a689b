"""After training, end to end: compression tables (CartPole, Breakout-MinAtar), a transfer study
(Breakout-MinAtar -> Asterix-MinAtar torso vs from scratch), and the README's GIF.

    python experiments/after_training.py                 # everything (~25 min on 2 cores)
    python experiments/after_training.py --quick         # tiny budgets, results in a temp dir

Every step is the public API the commands use: ``train`` (3 seeds vmapped in one run per
setting), ``rljax.tools.compress.compress_run`` (bf16, int8, pruning at 50/80/90 % with and
without fine-tuning), ``rljax.tools.compare.compare`` and ``rljax.tools.evaluate.evaluate_run``
(``--render``). Runs go to ``runs/after_training/`` (not committed); the tables, JSON and plots
to ``experiments/results/compression.*`` and ``transfer_minatar.*``, the GIF to
``docs/cartpole.gif``.

Transfer: Breakout-MinAtar and Asterix-MinAtar both observe 10x10x4; Breakout has 3 actions,
Asterix 5, so the torso transfers (every layer but the policy and value heads). The pretrained
source is the compression study's Breakout run (seed 0's parameters start every seed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "experiments" / "results"


def train_run(config, runs: Path, name: str, seeds: int, **run_fields):
    from rljax import RunConfig, train

    run_dir = runs / name
    if (run_dir / "summary.json").exists():
        print(f"[{name}] already trained", flush=True)
        return run_dir
    run = RunConfig.make(
        runs_dir=str(runs), run_name=name, num_seeds=seeds, eval_every=0, checkpoint_every=10**6,
        log_every=max(1, config.num_updates // 50), quiet=True, overwrite=True, **run_fields,
    )  # fmt: skip
    t0 = time.perf_counter()
    train(config, run)
    print(f"[{name}] trained in {time.perf_counter() - t0:.0f} s", flush=True)
    return run_dir


def compression(runs: Path, out: Path, quick: bool) -> dict:
    from rljax import PPOConfig
    from rljax.presets import preset_config
    from rljax.tools.compress import CompressArgs, compress_run, markdown

    budgets = {"CartPole-v1": 8_192 if quick else 500_000, "Breakout-MinAtar": 16_384 if quick
               else 1_000_000}  # fmt: skip
    configs = {
        "CartPole-v1": PPOConfig(total_timesteps=budgets["CartPole-v1"]),
        "Breakout-MinAtar": preset_config("minatar", total_timesteps=budgets["Breakout-MinAtar"]),
    }
    finetune = 8_192 if quick else 100_000
    tables = {}
    for env, config in configs.items():
        run_dir = train_run(config, runs, f"compress-{env}", seeds=3)
        args = CompressArgs(run_dir=str(run_dir), int8=True, bf16=True, prune=(0.5, 0.8, 0.9),
                            finetune=finetune, episodes=32)  # fmt: skip
        report = compress_run(args, say=lambda line: print(line, flush=True))
        report["train_env_steps_per_seed"] = config.num_updates * config.env_steps_per_update
        report["finetune_env_steps_per_seed"] = finetune
        tables[env] = report
    text = [
        "# Compressed policies: return, bytes, inference speed",
        "",
        "Written by `experiments/after_training.py` (`rljax compress RUN --int8 --bf16 --prune "
        "0.5 0.8 0.9 --finetune N`). PPO, 3 seeds vmapped in one run per environment; each "
        "variant evaluated greedily with training's evaluation key, 32 episodes per seed; IQM "
        "and its 95 % stratified bootstrap interval over the 3 x 32 returns. Pruning is global "
        "magnitude pruning of the torso's kernels (the heads stay whole); +ft: fine-tuned with "
        "the pruned weights held at 0. Bytes: kernels as stored (int8 with float32 per-channel "
        "scales; pruned: non-zero values plus a 1-bit mask), biases float32. Inference: greedy "
        "actions/s of a jitted batch of 1024 observations on 1 CPU device (2 shared cores).",
        "",
    ]
    for env, report in tables.items():
        text += [
            f"## {env}: {report['train_env_steps_per_seed']:,} training steps per seed, "
            f"fine-tuning {report['finetune_env_steps_per_seed']:,}",
            "",
            markdown(report).split("\n", 2)[2],
            "",
        ]
    (out / "compression.md").write_text("\n".join(text) + "\n")
    (out / "compression.json").write_text(json.dumps(tables, indent=2) + "\n")
    plot_compression(tables, out / "compression.png")
    return tables


def plot_compression(tables: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tables), figsize=(6 * len(tables), 4))
    for ax, (env, report) in zip(axes, tables.items(), strict=True):
        rows = report["rows"]
        base = rows[0]["bytes"]
        for i, r in enumerate(rows):
            low, high = r["iqm_ci"]
            ax.errorbar(r["bytes"] / base, r["iqm"], yerr=[[r["iqm"] - low], [high - r["iqm"]]],
                        fmt="o", color=f"C{i}", label=r["variant"], capsize=3)  # fmt: skip
        ax.set(xlabel="bytes vs float32", ylabel="IQM greedy return (95% CI)", title=env)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def transfer(runs: Path, out: Path, quick: bool) -> dict:
    from rljax.presets import preset_config
    from rljax.tools.compare import CompareArgs, compare

    steps = 16_384 if quick else 1_000_000
    config = preset_config("minatar", env="Asterix-MinAtar", total_timesteps=steps)
    source = runs / "compress-Breakout-MinAtar"
    scratch = train_run(config, runs, "asterix-scratch", seeds=3)
    tuned = train_run(config, runs, "asterix-from-breakout", seeds=3, init_from=str(source),
                      init_part="torso")  # fmt: skip
    report = compare(
        CompareArgs(
            patterns=(str(scratch), str(tuned)),
            names=("from scratch", "Breakout torso"),
            out=str(out / "transfer_minatar"),
        )  # fmt: skip
    )
    body = (out / "transfer_minatar" / "compare.md").read_text()
    (out / "transfer_minatar.md").write_text(
        "# Transfer: Breakout-MinAtar torso -> Asterix-MinAtar\n\n"
        f"Written by `experiments/after_training.py`. PPO (`--preset minatar`) on "
        f"Asterix-MinAtar, {config.num_updates * config.env_steps_per_update:,} env steps per "
        "seed, 3 seeds each: from scratch, and from the torso (every layer but the heads) of "
        "the Breakout-MinAtar run of `compression.md` (seed 0) with `--init-from "
        "--init-part torso`. `rljax compare` over the 3 seeds: training return over the last "
        "5 % of updates.\n\n" + body + "\n![transfer](transfer_minatar/compare.png)\n"
    )
    return report


def gif(runs: Path, path: Path) -> None:
    """One greedy CartPole episode of the compression study's run, halved in size."""
    from PIL import Image

    from rljax.tools.evaluate import EvalArgs, evaluate_run

    raw = Path(tempfile.mkdtemp()) / "raw.gif"
    evaluate_run(EvalArgs(run_dir=str(runs / "compress-CartPole-v1"), episodes=8,
                          render=str(raw)))  # fmt: skip
    frames = []
    with Image.open(raw) as im:
        for i in range(0, im.n_frames, 4):  # every 4th frame at 4x the frame time
            im.seek(i)
            frames.append(im.convert("P").resize((im.width // 2, im.height // 2)))
    frames[0].save(path, save_all=True, append_images=frames[1:], duration=200, loop=0,
                   optimize=True)  # fmt: skip
    print(f"wrote {path} ({path.stat().st_size:,} bytes, {len(frames)} frames)")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="tiny budgets, outputs to a temp dir")
    p.add_argument("--skip", nargs="*", default=[], choices=["compression", "transfer", "gif"])
    args = p.parse_args(argv)
    out = Path(tempfile.mkdtemp()) if args.quick else RESULTS
    runs = (out if args.quick else ROOT) / "runs" / "after_training"
    runs.mkdir(parents=True, exist_ok=True)
    if "compression" not in args.skip:
        compression(runs, out, args.quick)
    if "transfer" not in args.skip:
        transfer(runs, out, args.quick)
    if "gif" not in args.skip:
        gif(runs, (out if args.quick else ROOT / "docs") / "cartpole.gif")
    print(f"results in {out}")


if __name__ == "__main__":
    main()
