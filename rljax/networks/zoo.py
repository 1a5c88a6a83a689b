"""Which network an algorithm config asks for: the ``NetworkSettings`` fields every algorithm
config inherits, their checks, and the constructors PPO/A2C (``actor_critic``) and DQN
(``q_network``) call. A new network type is one branch in each constructor and one value of
``network``."""

from __future__ import annotations

import dataclasses
from typing import Literal

import flax.linen as nn

from rljax.envs import EnvSpec
from rljax.errors import ConfigError
from rljax.networks.mlp import ActorCritic, QNetwork, compute_dtype_of
from rljax.networks.residual import ResidualActorCritic, ResidualQNetwork

NETWORKS = ("mlp", "residual")


@dataclasses.dataclass(frozen=True)
class NetworkSettings:
    """The network fields shared by the algorithm configs (PPO, A2C, DQN inherit them)."""

    network: Literal["mlp", "residual"] = "mlp"
    """mlp: the tensor-parallel MLP (the *_widths fields); residual: a SimBa-style residual MLP
    (the residual_* fields)."""
    residual_width: int = 256
    """network=residual: width of the residual stream (the linear embedding's output)."""
    residual_depth: int = 2
    """network=residual: pre-LayerNorm residual feed-forward blocks per tower (>= 1)."""
    residual_expansion: int = 4
    """network=residual: a block's hidden width is residual_width * residual_expansion, split over
    the model axis."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """dtype of the network's matmuls; parameters, optimizer state, outputs and losses stay
    float32."""
    normalize_obs: bool = False
    """feed the network observations normalised by their running mean and variance (merged over
    data shards, kept in the training state and checkpoints, frozen in evaluation), clipped to
    +-10."""


def check_network(config, mlp_shards: int) -> None:
    """The network fields of an algorithm config: ``network``, ``compute_dtype`` and, for
    ``network="residual"``, ``residual_width/depth/expansion`` (the blocks' column-split hidden
    width ``width * expansion`` must divide by the ``model`` axis size ``mlp_shards``)."""
    if config.network not in NETWORKS:
        raise ConfigError(f"network must be one of {list(NETWORKS)}, got {config.network!r}")
    compute_dtype_of(config.compute_dtype)
    if config.network != "residual":
        return
    for name in ("residual_width", "residual_depth", "residual_expansion"):
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
    hidden = config.residual_width * config.residual_expansion
    if hidden % mlp_shards:
        raise ConfigError(
            f"residual blocks' hidden width residual_width*residual_expansion = "
            f"{config.residual_width}*{config.residual_expansion} = {hidden} is not divisible by "
            f"the model axis size {mlp_shards} (it is column-split over `model`); choose a "
            f"product that is a multiple of {mlp_shards}"
        )


def actor_critic(config, spec: EnvSpec) -> nn.Module:
    """The actor-critic of a PPO/A2C config (fields ``actor_widths``, ``critic_widths``,
    ``activation``, optionally ``torso_widths``, and the ``NetworkSettings``): ``obs: [B@batch,
    D]`` -> ``(logits [B@batch, A], value [B@batch])`` float32, and ``.value(obs)``."""
    c = config
    network, dtype = getattr(c, "network", "mlp"), getattr(c, "compute_dtype", "float32")
    if network == "residual":
        return ResidualActorCritic(
            num_actions=spec.num_actions,
            width=c.residual_width,
            depth=c.residual_depth,
            expansion=c.residual_expansion,
            activation=c.activation,
            compute_dtype=dtype,
        )
    return ActorCritic(
        num_actions=spec.num_actions,
        actor_widths=c.actor_widths,
        critic_widths=c.critic_widths,
        torso_widths=getattr(c, "torso_widths", ()),
        activation=c.activation,
        compute_dtype=dtype,
    )


def q_network(config, spec: EnvSpec) -> nn.Module:
    """The Q-network of a DQN config (``q_widths``, ``activation``, ``dueling`` and the
    ``NetworkSettings``): ``obs: [B@batch, D]`` -> ``q [B@batch, A]`` float32."""
    c = config
    if c.network == "residual":
        return ResidualQNetwork(
            num_actions=spec.num_actions,
            width=c.residual_width,
            depth=c.residual_depth,
            expansion=c.residual_expansion,
            activation=c.activation,
            dueling=c.dueling,
            compute_dtype=c.compute_dtype,
        )
    return QNetwork(
        num_actions=spec.num_actions,
        widths=c.q_widths,
        activation=c.activation,
        dueling=c.dueling,
        compute_dtype=c.compute_dtype,
    )
