"""Named presets: the experiments' tuned settings, applied before the flags."""

import pytest

import rljax.run.training
from rljax import DQNConfig, PPOConfig
from rljax.cli import main
from rljax.presets import PRESETS, preset_config


@pytest.fixture
def no_training(monkeypatch):
    seen = []
    monkeypatch.setattr(rljax.run.training, "train", lambda algo, run: seen.append((algo, run)))
    return seen


def test_preset_values_apply_and_flags_override_them(no_training):
    assert main(["train", "ppo", "--preset", "minatar"]) == 0
    assert main(["train", "ppo", "--lr", "1e-3", "--preset=minatar", "--num-envs", "32"]) == 0
    assert main(["train", "dqn", "--preset", "dqn-cartpole", "--total-timesteps", "2e4"]) == 0
    (minatar, _), (changed, _), (dqn, _) = no_training
    assert minatar == preset_config("minatar")
    assert (minatar.env, minatar.num_envs, minatar.lr, minatar.activation) == (
        "Breakout-MinAtar",
        64,
        5e-3,
        "relu",
    )
    assert (changed.lr, changed.num_envs, changed.num_minibatches) == (1e-3, 32, 8)
    assert dqn == DQNConfig(total_timesteps=20_000)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "ppo", "--preset", "atari"],
            "error: unknown preset 'atari'; presets for ppo: cartpole, minatar, pendulum\n",
        ),
        (
            ["train", "ppo", "--preset", "dqn-cartpole"],
            "error: preset 'dqn-cartpole' is for dqn, not ppo; presets for ppo: cartpole, "
            "minatar, pendulum\n",
        ),
        (
            ["train", "ppo", "--preset", "minatar", "--resume", "runs/x"],
            "error: --preset cannot be combined with --resume (the run keeps its settings)\n",
        ),
    ],
)
def test_unknown_or_mismatched_preset_is_one_error(no_training, capsys, args, message):
    assert main(args) == 2
    assert capsys.readouterr().err == message and no_training == []


def test_presets_command_lists_them_and_experiments_read_them(capsys):
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for name, preset in PRESETS.items():
        assert f"  {name}" in out and preset.algorithm in out
    from experiments import dqn_cartpole, ppo_breakout, ppo_cartpole

    assert ppo_breakout.make_config(81_920) == preset_config("minatar", total_timesteps=81_920)
    assert dqn_cartpole.make_config(500_000) == DQNConfig()
    assert ppo_cartpole.make_config(500_000) == PPOConfig()
    from experiments import ppo_continuous

    pendulum = preset_config("pendulum")
    assert ppo_continuous.make_config(1_000_000) == pendulum
    # The settings behind experiments/results/ppo_continuous.md (-200 after 1e6 steps).
    assert pendulum == PPOConfig(
        env="Pendulum-v1", num_envs=16, num_steps=64, total_timesteps=1_000_000, lr=1e-3,
        gamma=0.9, clip_value_loss=False, ent_coef=0.0,
    )  # fmt: skip
