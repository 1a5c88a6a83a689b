"""Named settings: the tuned configurations of ``experiments/``, in one place.

    rljax train ppo --preset minatar                  # PureJaxRL's MinAtar PPO settings
    rljax train ppo --preset minatar --lr 1e-3        # flags override the preset
    preset_config("minatar", total_timesteps=81_920)  # from Python (the experiments do this)

A preset names an algorithm and the config fields it changes from that config's defaults;
``rljax presets`` lists them. Explicit flags are applied after the preset.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from rljax.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    algorithm: str
    description: str
    algo: dict[str, Any]
    """algorithm-config fields changed from the config's defaults."""


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "cartpole",
            "ppo",
            "PPO CartPole-v1 reference (PureJaxRL's CartPole settings; PPOConfig() defaults)",
            {"env": "CartPole-v1", "total_timesteps": 500_000},
        ),
        Preset(
            "minatar",
            "ppo",
            "PPO Breakout-MinAtar with PureJaxRL's MinAtar settings (64 envs x 128 steps, "
            "8 minibatches, lr 5e-3 annealed, 2x64 relu, 1e7 steps)",
            {
                "env": "Breakout-MinAtar",
                "num_envs": 64,
                "num_steps": 128,
                "total_timesteps": 10_000_000,
                "update_epochs": 4,
                "num_minibatches": 8,
                "lr": 5e-3,
                "anneal_lr": True,
                "gamma": 0.99,
                "gae_lambda": 0.95,
                "clip_eps": 0.2,
                "ent_coef": 0.01,
                "vf_coef": 0.5,
                "max_grad_norm": 0.5,
                "actor_widths": (64, 64),
                "critic_widths": (64, 64),
                "activation": "relu",
            },
        ),
        Preset(
            "pendulum",
            "ppo",
            "PPO Pendulum-v1, diagonal Gaussian (16 envs x 64 steps, 4 minibatches, lr 1e-3 "
            "annealed, gamma 0.9, no entropy bonus or value clipping, 1e6 steps; reaches about "
            "-200)",
            {
                "env": "Pendulum-v1",
                "num_envs": 16,
                "num_steps": 64,
                "total_timesteps": 1_000_000,
                "update_epochs": 4,
                "num_minibatches": 4,
                "lr": 1e-3,
                "anneal_lr": True,
                "gamma": 0.9,
                "gae_lambda": 0.95,
                "clip_eps": 0.2,
                "clip_value_loss": False,
                "ent_coef": 0.0,
                "vf_coef": 0.5,
                "max_grad_norm": 0.5,
                "actor_widths": (64, 64),
                "critic_widths": (64, 64),
                "activation": "tanh",
            },
        ),
        Preset(
            "dqn-cartpole",
            "dqn",
            "DQN CartPole-v1 reference (PureJaxRL's dqn.py; DQNConfig() defaults, 5e5 steps)",
            {"env": "CartPole-v1", "total_timesteps": 500_000},
        ),
    )
}


def names_for(algorithm: str) -> list[str]:
    return [p.name for p in PRESETS.values() if p.algorithm == algorithm]


def get_preset(name: str, algorithm: str | None = None) -> Preset:
    """The preset ``name`` (for ``algorithm`` when given); ``ConfigError`` listing the allowed
    names otherwise."""
    preset = PRESETS.get(name)
    if preset is None:
        allowed = names_for(algorithm) if algorithm else list(PRESETS)
        scope = f" for {algorithm}" if algorithm else ""
        raise ConfigError(
            f"unknown preset {name!r}; presets{scope}: {', '.join(allowed) or 'none'}"
        )
    if algorithm is not None and preset.algorithm != algorithm:
        raise ConfigError(
            f"preset {name!r} is for {preset.algorithm}, not {algorithm}; presets for "
            f"{algorithm}: {', '.join(names_for(algorithm)) or 'none'}"
        )
    return preset


def preset_config(name: str, **overrides: Any):
    """The preset's algorithm config, with ``overrides`` applied on top."""
    from rljax.run.sharded import config_type_of

    preset = get_preset(name)
    config = config_type_of(preset.algorithm)()
    return dataclasses.replace(config, **{**preset.algo, **overrides})


def describe() -> str:
    """One line per preset: name, algorithm, what it is (``rljax presets``)."""
    width = max(len(name) for name in PRESETS)
    return "\n".join(
        f"  {p.name:<{width}}  {p.algorithm:<4} {p.description}" for p in PRESETS.values()
    )
