"""PPO's configuration and its checks (``rljax.algos.ppo`` builds the algorithm from it)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from rljax.algos.base import INT32_MAX, check_divisible, resumable, sweepable
from rljax.errors import ConfigError
from rljax.networks.mlp import check_tensor_parallel, check_torso
from rljax.networks.zoo import NetworkSettings, check_network
from rljax.parallel.sync import SyncConfig, validate_sync


@dataclasses.dataclass(frozen=True)
class PPOConfig(NetworkSettings):
    """PPO hyperparameters (defaults: PureJaxRL's CartPole settings)."""

    env: str = "CartPole-v1"
    """gymnax environment, or brax/<name> (pip install 'rljax[brax]'); discrete actions get a
    categorical policy, continuous (Box) ones a diagonal Gaussian."""
    num_envs: int = 4
    """parallel environments (the batch, split over data-parallel replicas)."""
    num_steps: int = 128
    """rollout length per update."""
    total_timesteps: int = resumable(500_000)
    """environment steps per seed; rounded down to whole updates."""
    update_epochs: int = 4
    """passes over each rollout."""
    num_minibatches: int = 4
    """minibatches per epoch (each split over data-parallel replicas)."""
    lr: float = sweepable(2.5e-4)
    """Adam learning rate (eps 1e-5)."""
    anneal_lr: bool = True
    """linear decay of the learning rate to 0 over training."""
    gamma: float = sweepable(0.99)
    """discount."""
    gae_lambda: float = sweepable(0.95)
    """GAE trace decay (1: Monte Carlo returns, 0: one-step TD)."""
    clip_eps: float = sweepable(0.2)
    """PPO ratio clip (also the value-loss clip)."""
    clip_value_loss: bool = True
    """clip the value loss around the rollout's values, as the policy ratio."""
    ent_coef: float = sweepable(0.01)
    """entropy bonus weight."""
    vf_coef: float = sweepable(0.5)
    """value loss weight."""
    max_grad_norm: float = 0.5
    """global-norm gradient clipping; 0 disables it."""
    actor_widths: tuple[int, ...] = (64, 64)
    """actor hidden widths; even layers column-split, odd row-split (tensor parallel)."""
    critic_widths: tuple[int, ...] = (64, 64)
    """critic hidden widths."""
    torso_widths: tuple[int, ...] = ()
    """shared layers before both towers (an even number of layers)."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    """hidden-layer nonlinearity."""
    normalize_rewards: bool = False
    """divide the rewards the update learns from by the running standard deviation of each
    environment's discounted return (restarted at every episode end; kept in the training state
    and checkpoints), clipped to +-10. Logged returns and evaluation stay in raw rewards."""
    squash: Literal["none", "tanh"] = "none"
    """continuous actions: none (the Gaussian sample, clipped to the bounds at the environment)
    or tanh (squashed and rescaled to the bounds; log-prob with the log-det correction)."""
    sync: SyncConfig = SyncConfig()
    """gradient synchronisation across data-parallel replicas (rljax.parallel.sync)."""
    off_policy: Literal["none", "vtrace"] = "none"
    """correction for rollouts made with older parameters (actor-learner layout,
    --max-staleness): none (PPO's ratio against the behaviour log-probabilities), or vtrace
    (values and log-probabilities recomputed under the learner's parameters; advantages and
    value targets with V-trace's truncated importance weights, rho_bar = c_bar = 1)."""

    @property
    def env_steps_per_update(self) -> int:
        return self.batch_size

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


def check_config(config: PPOConfig, batch_shards: int = 1, mlp_shards: int = 1) -> None:
    """``ConfigError`` naming the first bad field of ``config`` and what it allows (the env name
    and the policy head are ``PPO.validate``'s own checks)."""
    positive = ("num_envs", "num_steps", "total_timesteps", "update_epochs", "num_minibatches")
    for name in positive:
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
    if not config.lr > 0:
        raise ConfigError(f"lr (learning rate) must be > 0, got {config.lr}")
    for name in ("gamma", "gae_lambda"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ConfigError(f"{name} must be in [0, 1], got {getattr(config, name)}")
    for name in ("clip_eps", "ent_coef", "vf_coef", "max_grad_norm"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(config, name)}")
    check_divisible(f"num_envs={config.num_envs}", config.num_envs, batch_shards)
    check_network(config, mlp_shards, "ppo", recurrent_ok=True)
    if config.recurrent != "none":
        from rljax.algos.recurrent import check_sequences

        check_sequences(config, batch_shards)
    elif config.batch_size % config.num_minibatches:
        raise ConfigError(
            f"num_minibatches={config.num_minibatches} does not divide the batch "
            f"num_envs*num_steps={config.batch_size}"
        )
    else:
        check_divisible(
            f"minibatch size {config.minibatch_size} (batch {config.batch_size} / "
            f"{config.num_minibatches} minibatches)",
            config.minibatch_size,
            batch_shards,
        )
    if config.num_updates < 1:
        raise ConfigError(
            f"total_timesteps={config.total_timesteps} is less than one update "
            f"(num_envs*num_steps={config.batch_size})"
        )
    steps = config.num_updates * config.update_epochs * config.num_minibatches
    if steps > INT32_MAX:  # the optimizer's int32 step count drives the LR annealing
        raise ConfigError(
            f"{steps:,} optimizer steps (updates*update_epochs*num_minibatches) do not fit the "
            f"int32 step counter (at most {INT32_MAX:,}); lower total_timesteps, update_epochs "
            "or num_minibatches, or raise num_envs*num_steps"
        )
    validate_sync(config.sync)
    if config.off_policy not in ("none", "vtrace"):
        raise ConfigError(f"off_policy must be 'none' or 'vtrace', got {config.off_policy!r}")
    if config.off_policy != "none" and config.recurrent != "none":
        raise ConfigError("off_policy='vtrace' is not available for recurrent PPO")
    if config.network == "mlp":
        check_torso(config.torso_widths)
        towers = {"torso": config.torso_widths, "actor": config.actor_widths}
        check_tensor_parallel({**towers, "critic": config.critic_widths}, mlp_shards)
