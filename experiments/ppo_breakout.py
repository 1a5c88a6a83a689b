"""PPO on Breakout-MinAtar with PureJaxRL's MinAtar hyperparameters, 5 seeds: learning curves.

    python experiments/ppo_breakout.py                  # 5 seeds x 1e7 env steps (~13 min, 2 cores)
    python experiments/ppo_breakout.py --quick          # smoke run, writes to a temp dir
    python experiments/ppo_breakout.py --total-timesteps 3000000    # shorter (lr annealed over it)
    python experiments/ppo_breakout.py --replot experiments/results/ppo_breakout.json

Config: PureJaxRL's MinAtar PPO settings (``examples/brax_minatar.ipynb`` of luchris429/purejaxrl,
"briefly tuned to do well on Gymnax's MinAtar environments"): 64 envs x 128 steps per update,
4 epochs x 8 minibatches (1,024 samples each), Adam lr 5e-3 annealed linearly to 0 over the run,
gamma 0.99, GAE lambda 0.95, clip 0.2 (also the value clip), entropy 0.01, value 0.5, grad norm
0.5, actor and critic 2x64 relu, flattened 10x10x4 observations, 1e7 env steps per seed as in
PureJaxRL (5 seeds vmapped: ~65-70k env steps/s on the 2 shared CPU cores). A smaller
``--total-timesteps`` is a complete shorter run (the lr anneals to 0 over whatever budget is
given), not a truncated 1e7 one; the table says so. Difference to PureJaxRL: rljax bootstraps
time-limit truncations (Breakout-MinAtar's 1000-step limit) from the critic, PureJaxRL treats
them as terminal.

The seeds are vmapped in one jit on a ``data=1,model=1`` mesh; seed ``s`` starts from
``jax.random.key(s)``. Writes ``experiments/results/ppo_breakout.{md,json,png}`` (final return =
per seed the mean episode_return over the last 5% of updates, mean ± std over seeds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import curve_study_main  # noqa: E402
from rljax import PPOConfig  # noqa: E402
from rljax.presets import preset_config  # noqa: E402

REFERENCE_TIMESTEPS = 10_000_000  # PureJaxRL's MinAtar budget


def make_config(total_timesteps: int) -> PPOConfig:
    return preset_config("minatar", total_timesteps=total_timesteps)  # rljax --preset minatar


def summary(c: PPOConfig) -> str:
    return (
        f"PPO {c.env}, PureJaxRL MinAtar hyperparameters ({c.num_envs} envs x {c.num_steps} "
        f"steps, {c.update_epochs} epochs x {c.num_minibatches} minibatches, lr {c.lr:g} annealed "
        f"to 0, ent {c.ent_coef:g}, clip {c.clip_eps:g}, grad norm {c.max_grad_norm:g}, "
        f"2x64 {c.activation})"
    )


def budget_note(total_timesteps: int) -> str:
    if total_timesteps >= REFERENCE_TIMESTEPS:
        return ""
    return f"; reduced from PureJaxRL's {REFERENCE_TIMESTEPS:,}, lr annealed to 0 over this budget"


def main(argv=None):
    return curve_study_main(
        name="ppo_breakout",
        doc=__doc__,
        title="PPO Breakout-MinAtar",
        make_config=make_config,
        config_summary=summary,
        default_timesteps=REFERENCE_TIMESTEPS,
        quick_timesteps=81_920,
        budget_note=budget_note,
        argv=argv,
    )


if __name__ == "__main__":
    main()
