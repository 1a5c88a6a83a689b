"""``rljax eval RUN_DIR``: a run's checkpoint evaluated again, on any mesh.

The checkpoint (the newest valid one, or ``--step N``) is restored onto ``--mesh`` and its policy
plays ``--episodes`` fresh environments to their first episode's end (greedy, or ``--sample``d
actions), with the key training's own evaluation uses after that update (``Evaluation``): with the
run's ``eval_episodes`` the returns equal those the run logged at that update. ``--seed`` picks
another key. The returns are summarised as mean, median and IQM with 95 % stratified bootstrap
intervals (seeds are the strata; ``rljax.tools.stats``), printed and written to
``RUN_DIR/eval.json``. ``--render out.gif`` also renders one greedy episode of the first seed.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated

import numpy as np
import tyro

from rljax.errors import ConfigError

EVAL_FILE = "eval.json"


@dataclasses.dataclass(frozen=True)
class EvalArgs:
    """Evaluate a run's checkpoint again: mean, median and IQM of the episode returns with 95 %
    bootstrap intervals, written to RUN_DIR/eval.json."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory (runs/<name>)."""
    step: int | None = None
    """the checkpoint's update (default: the newest valid checkpoint)."""
    episodes: int = 32
    """episodes per seed (each on its own environment, played to its end)."""
    sample: bool = False
    """sample actions from the policy instead of taking its mode (greedy)."""
    seed: int | None = None
    """key of the evaluation (default: the run's seed, which gives training's own evaluation
    key for that update)."""
    mesh: str = "data=1,model=1"
    """mesh to load the checkpoint onto (any the devices allow)."""
    num_devices: int | None = None
    """emulated CPU devices for --mesh (CPU only)."""
    render: str | None = None
    """also render one greedy episode to this .gif (environments gymnax can draw)."""


def check_args(args: EvalArgs) -> None:
    if args.episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {args.episodes}")
    if args.step is not None and args.step < 0:
        raise ConfigError(f"--step must be >= 0, got {args.step}")
    if args.render is not None and not args.render.lower().endswith(".gif"):
        raise ConfigError(f"--render writes a .gif, got {args.render!r}")


def evaluate_run(args: EvalArgs, say=print) -> dict:
    """Evaluate ``args.run_dir`` (see the module doc); the report written to ``eval.json``."""
    import jax

    from rljax.run.evaluation import Evaluation
    from rljax.run.run_log import write_text_atomic
    from rljax.tools import render as render_lib
    from rljax.tools.runs import load_run
    from rljax.tools.stats import summarise

    check_args(args)
    if args.render is not None:
        from rljax.tools.runs import read_run

        _, algo_config, _ = read_run(args.run_dir, "evaluate")
        render_lib.check_renderable(algo_config.env)
    loaded = load_run(args.run_dir, args.step, args.mesh, args.num_devices, verb="evaluate")
    seed = loaded.run.seed if args.seed is None else args.seed
    evaluation = Evaluation(loaded.sharded, args.episodes, seed, greedy=not args.sample)
    evaluation.compile(jax.random.key(0))
    row = evaluation(loaded.state, loaded.step)
    returns = np.asarray(evaluation.last_returns, np.float64).reshape(loaded.run.num_seeds, -1)
    stats = summarise(list(returns))
    report = {
        "run_dir": str(loaded.run_dir),
        "algorithm": loaded.algorithm,
        "env": loaded.algo_config.env,
        "step": loaded.step,
        "env_steps_per_seed": loaded.step * loaded.algo_config.env_steps_per_update,
        "policy": "sampled" if args.sample else "greedy",
        "seed": seed,
        "mesh": args.mesh,
        "seeds": loaded.run.num_seeds,
        "episodes_per_seed": args.episodes,
        "mean_length": row["eval_length"],
        "finished_fraction": row["eval_finished"],
        **stats,
        "returns": returns.tolist(),
    }
    if args.render is not None:
        report["render"] = render_lib.render_episode(loaded, args.render, seed)
    write_text_atomic(loaded.run_dir / EVAL_FILE, json.dumps(report, indent=2) + "\n")
    say(describe(report))
    return report


def describe(report: dict) -> str:
    n = report["seeds"] * report["episodes_per_seed"]
    lines = [
        f"{report['algorithm']} {report['env']} at update {report['step']} "
        f"({report['env_steps_per_seed']:,} env steps per seed), {report['policy']} policy, "
        f"{n} episodes ({report['seeds']} seed(s) x {report['episodes_per_seed']}):"
    ]
    for name in ("mean", "median", "iqm"):
        value, (low, high) = report[name]["value"], report[name]["ci"]
        lines.append(f"  {name:<6} {value:10.2f}   95% CI [{low:.2f}, {high:.2f}]")
    lines.append(f"  mean episode length {report['mean_length']:.1f}")
    if report.get("render"):
        lines.append(f"  rendered one episode to {report['render']['path']}")
    lines.append(f"wrote {Path(report['run_dir']) / EVAL_FILE}")
    return "\n".join(lines)
