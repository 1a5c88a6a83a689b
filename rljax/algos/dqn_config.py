"""DQN's configuration and its checks (``rljax.algos.dqn`` builds the algorithm from it)."""

from __future__ import annotations

import dataclasses
from typing import Literal

from rljax.algos.base import check_divisible, resumable
from rljax.algos.base import sweepable as sweepable_field
from rljax.envs import check_discrete, check_env_name
from rljax.errors import ConfigError
from rljax.networks.mlp import check_tensor_parallel
from rljax.networks.zoo import NetworkSettings, check_network
from rljax.parallel.sync import SyncConfig, validate_sync


@dataclasses.dataclass(frozen=True)
class DQNConfig(NetworkSettings):
    """DQN hyperparameters (defaults: PureJaxRL's CartPole DQN)."""

    env: str = "CartPole-v1"
    """gymnax environment with discrete actions."""
    num_envs: int = 10
    """parallel environments (sharded along `data`, each shard with its own replay rows)."""
    total_timesteps: int = resumable(500_000)
    """environment steps per seed; rounded down to whole updates."""
    steps_per_update: int = 50
    """vector env steps per `update` call (one metrics row)."""
    buffer_size: int = 10_000
    """replay capacity in transitions (a multiple of num_envs)."""
    batch_size: int = 128
    """transitions per gradient step (sharded along `data`)."""
    learning_starts: int = 10_000
    """environment steps before the first gradient step."""
    train_frequency: int = 10
    """environment steps per gradient step (divides num_envs or is a multiple of it)."""
    target_update_interval: int = 500
    """environment steps between target-network updates."""
    tau: float = sweepable_field(1.0)
    """target update: 1 copies the online network (hard), < 1 is Polyak averaging."""
    gamma: float = sweepable_field(0.99)
    """discount."""
    n_step: int = 1
    """n-step returns (windows cut at episode ends)."""
    double_dqn: bool = False
    """select the next action with the online network, evaluate it with the target network."""
    dueling: bool = False
    """dueling head: Q = V + A - mean(A)."""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss: squared error, or Huber (smooth L1)."""
    lr: float = sweepable_field(2.5e-4)
    """Adam learning rate."""
    lr_decay: bool = False
    """linear decay of the learning rate to 0 over training."""
    max_grad_norm: float = 0.0
    """global-norm gradient clipping; 0 disables it."""
    epsilon_start: float = 1.0
    """exploration epsilon at the first environment step."""
    epsilon_end: float = 0.05
    """exploration epsilon after epsilon_decay_steps."""
    epsilon_decay_steps: int = 250_000
    """environment steps over which epsilon falls linearly from start to end (0: epsilon_end
    from the first step)."""
    prioritized: bool = False
    """proportional prioritized replay."""
    per_alpha: float = 0.6
    """prioritized replay: priority exponent (0: uniform sampling)."""
    per_beta: float = 0.4
    """initial importance-weight exponent, annealed linearly to 1 over training."""
    per_eps: float = 1e-6
    """added to |TD error| before the exponent, so no item's priority is 0 (must be > 0)."""
    q_widths: tuple[int, ...] = (120, 84)
    """Q-network hidden widths; even layers column-split, odd row-split over `model`."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"
    """hidden-layer nonlinearity."""
    sync: SyncConfig = SyncConfig()
    """gradient synchronisation across the data axis (rljax.parallel.sync)."""

    @property
    def env_steps_per_update(self) -> int:
        return self.num_envs * self.steps_per_update

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.env_steps_per_update

    @property
    def grad_steps_per_env_step(self) -> int:
        """Gradient steps after each vector step (0: one every ``train_frequency // num_envs``)."""
        return self.num_envs // self.train_frequency


def check_config(config: DQNConfig, batch_shards: int = 1, mlp_shards: int = 1) -> None:
    """``ConfigError`` naming the first bad field of ``config`` and what it allows."""
    c = config
    check_env_name(c.env)
    check_discrete(c.env, "dqn")
    for name in (
        "num_envs",
        "total_timesteps",
        "steps_per_update",
        "buffer_size",
        "batch_size",
        "train_frequency",
        "target_update_interval",
        "n_step",
    ):
        if getattr(c, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(c, name)}")
    for name in ("learning_starts", "epsilon_decay_steps", "max_grad_norm", "per_alpha"):
        if getattr(c, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(c, name)}")
    if not c.per_eps > 0:
        raise ConfigError(
            f"per_eps must be > 0 (a zero priority would never be sampled again), got {c.per_eps}"
        )
    if not c.lr > 0:
        raise ConfigError(f"lr (learning rate) must be > 0, got {c.lr}")
    for name in ("epsilon_start", "epsilon_end", "gamma", "per_beta"):
        if not 0.0 <= getattr(c, name) <= 1.0:
            raise ConfigError(f"{name} must be in [0, 1], got {getattr(c, name)}")
    if not 0.0 < c.tau <= 1.0:
        raise ConfigError(f"tau must be in (0, 1] (1 = hard target update), got {c.tau}")
    check_divisible(f"num_envs={c.num_envs}", c.num_envs, batch_shards)
    check_divisible(
        f"batch_size={c.batch_size}",
        c.batch_size,
        batch_shards,
        f" (each data shard samples batch_size / {batch_shards} from its own replay rows)",
    )
    if c.buffer_size % c.num_envs or c.buffer_size < c.num_envs:
        raise ConfigError(
            f"buffer_size={c.buffer_size} must be a positive multiple of num_envs={c.num_envs} "
            "(one ring per environment)"
        )
    if c.buffer_size < c.batch_size:
        raise ConfigError(
            f"buffer_size={c.buffer_size} is smaller than batch_size={c.batch_size}; the "
            "replay buffer must hold at least one batch"
        )
    if c.n_step > c.buffer_size // c.num_envs:
        raise ConfigError(
            f"n_step={c.n_step} exceeds the items kept per environment "
            f"(buffer_size / num_envs = {c.buffer_size // c.num_envs})"
        )
    if c.num_envs % c.train_frequency and c.train_frequency % c.num_envs:
        raise ConfigError(
            f"train_frequency={c.train_frequency} must divide num_envs={c.num_envs} or be a "
            "multiple of it (gradient steps happen between vector env steps)"
        )
    if c.num_updates < 1:
        raise ConfigError(
            f"total_timesteps={c.total_timesteps} is less than one update "
            f"(num_envs*steps_per_update={c.env_steps_per_update})"
        )
    if c.learning_starts >= c.total_timesteps:
        raise ConfigError(
            f"learning_starts={c.learning_starts} is not below total_timesteps="
            f"{c.total_timesteps}: the run would never learn"
        )
    # Every sampled window must lie in written steps: learning_starts fills n_step per row.
    if c.learning_starts < c.n_step * c.num_envs:
        raise ConfigError(
            f"learning_starts={c.learning_starts} must be >= n_step * num_envs = "
            f"{c.n_step * c.num_envs} so that whole n-step windows exist before sampling"
        )
    validate_sync(c.sync)
    check_network(c, mlp_shards, "dqn")
    if c.network == "mlp":
        check_tensor_parallel({"q": c.q_widths}, mlp_shards)
