"""DQN on CartPole-v1 with the default ``DQNConfig()``, 5 seeds: learning curves and final return.

    python experiments/dqn_cartpole.py                  # 5 seeds x 5e5 env steps (a few min)
    python experiments/dqn_cartpole.py --quick          # smoke run, writes to a temp dir
    python experiments/dqn_cartpole.py --seeds 0 1 --total-timesteps 200000 --out /tmp/dqn
    python experiments/dqn_cartpole.py --replot experiments/results/dqn_cartpole.json

Config: ``DQNConfig()`` (PureJaxRL's ``dqn.py`` defaults): 10 envs, replay 10k, batch 128, Adam
lr 2.5e-4, epsilon 1.0 -> 0.05 over 2.5e5 env steps, learning starts at 1e4, one gradient step
every 10 env steps, hard target update every 500 env steps, gamma 0.99, MLP 120-84 relu; 5e5 env
steps per seed, 500 env steps per update (metrics row). The seeds are vmapped in one jit on a
``data=1,model=1`` mesh; seed ``s`` starts from ``jax.random.key(s)``.

The return is the training return (epsilon-greedy, epsilon 0.05 at the end), so it sits a little
below the greedy policy's. Writes ``experiments/results/dqn_cartpole.{md,json,png}`` (final
return = per seed the mean episode_return over the last 5% of updates, mean ± std over seeds).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.bench_harness import curve_study_main  # noqa: E402
from rljax import DQNConfig  # noqa: E402
from rljax.presets import preset_config  # noqa: E402


def make_config(total_timesteps: int) -> DQNConfig:
    return preset_config("dqn-cartpole", total_timesteps=total_timesteps)  # --preset dqn-cartpole


def summary(c: DQNConfig) -> str:
    return (
        f"DQN {c.env}, DQNConfig() defaults ({c.num_envs} envs, replay {c.buffer_size:,}, "
        f"batch {c.batch_size}, lr {c.lr:g}, epsilon {c.epsilon_start:g} -> {c.epsilon_end:g} "
        f"over {c.epsilon_decay_steps:,} steps, learning starts {c.learning_starts:,}, "
        f"train every {c.train_frequency} steps, target every {c.target_update_interval} steps, "
        f"MLP {'-'.join(map(str, c.q_widths))} {c.activation})"
    )


def main(argv=None):
    return curve_study_main(
        name="dqn_cartpole",
        doc=__doc__,
        title="DQN CartPole-v1",
        make_config=make_config,
        config_summary=summary,
        default_timesteps=500_000,
        quick_timesteps=20_000,
        threshold=475.0,
        argv=argv,
    )


if __name__ == "__main__":
    main()
