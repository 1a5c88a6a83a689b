"""PPO on CartPole-v1 with the default ``PPOConfig()``, 5 seeds: learning curves and final return.

    python experiments/ppo_cartpole.py                  # 5 seeds x 5e5 env steps (~1 min, 2 cores)
    python experiments/ppo_cartpole.py --quick          # smoke run, writes to a temp dir
    python experiments/ppo_cartpole.py --seeds 0 1 2 --total-timesteps 250000 --out /tmp/ppo
    python experiments/ppo_cartpole.py --replot experiments/results/ppo_cartpole.json

Config: ``PPOConfig()`` (PureJaxRL's CartPole settings): 4 envs x 128 steps per update, 4 epochs x
4 minibatches, Adam lr 2.5e-4 annealed linearly to 0, gamma 0.99, GAE lambda 0.95, clip 0.2,
entropy 0.01, value 0.5, grad norm 0.5, actor and critic 2x64 tanh; 5e5 env steps per seed.
The seeds are vmapped in one jit on a ``data=1,model=1`` mesh; seed ``s`` starts from
``jax.random.key(s)`` (as ``python -m rljax train ppo --seed s``).

Writes ``experiments/results/ppo_cartpole.{md,json,png}``: the table (final return = per seed the
mean episode_return over the last 5% of updates, mean ± std over seeds; AUC return; steps/s;
compile s), the per-seed curves, and the plot (mean ± std band over seeds, thin lines per seed).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import curve_study_main  # noqa: E402
from rljax import PPOConfig  # noqa: E402
from rljax.presets import preset_config  # noqa: E402


def make_config(total_timesteps: int) -> PPOConfig:
    return preset_config("cartpole", total_timesteps=total_timesteps)  # --preset cartpole


def summary(c: PPOConfig) -> str:
    return (
        f"PPO {c.env}, PPOConfig() defaults ({c.num_envs} envs x {c.num_steps} steps, "
        f"{c.update_epochs} epochs x {c.num_minibatches} minibatches, lr {c.lr:g} annealed, "
        f"ent {c.ent_coef:g}, 2x64 {c.activation})"
    )


def main(argv=None):
    return curve_study_main(
        name="ppo_cartpole",
        doc=__doc__,
        title="PPO CartPole-v1",
        make_config=make_config,
        config_summary=summary,
        default_timesteps=500_000,
        quick_timesteps=20_480,
        threshold=475.0,
        argv=argv,
    )


if __name__ == "__main__":
    main()
