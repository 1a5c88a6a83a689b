"""Which network an algorithm config asks for: the ``NetworkSettings`` fields every algorithm
config inherits, their checks, and the constructors PPO/A2C (``actor_critic``) and DQN
(``q_network``) call. A new network type is one branch in each constructor and one value of
``network``."""

from __future__ import annotations

import dataclasses
from typing import Literal

import flax.linen as nn

from rljax.envs import EnvSpec, image_obs_shape
from rljax.errors import ConfigError
from rljax.networks.cnn import HEADS, CNNActorCritic, CNNQNetwork
from rljax.networks.mlp import (
    ActorCritic,
    QNetwork,
    check_remat,
    check_tensor_parallel,
    compute_dtype_of,
    param_dtype_of,
)
from rljax.networks.recurrent import RecurrentActorCritic
from rljax.networks.residual import ResidualActorCritic, ResidualQNetwork
from rljax.parallel.pipeline import check_pipeline

NETWORKS = ("mlp", "residual", "cnn")
RECURRENT = ("none", "gru", "lstm")


@dataclasses.dataclass(frozen=True)
class NetworkSettings:
    """The network fields shared by the algorithm configs (PPO, A2C, DQN inherit them)."""

    network: Literal["mlp", "residual", "cnn"] = "mlp"
    """mlp: the tensor-parallel MLP (the *_widths fields); residual: a SimBa-style residual MLP
    (the residual_* fields); cnn: convolutions over image observations (the MinAtar
    environments; the cnn_* fields), then the cnn_head tower."""
    residual_width: int = 256
    """network=residual: width of the residual stream (the linear embedding's output)."""
    residual_depth: int = 2
    """network=residual: pre-LayerNorm residual feed-forward blocks per tower (>= 1)."""
    residual_expansion: int = 4
    """network=residual: a block's hidden width is residual_width * residual_expansion, split over
    the model axis."""
    pipeline_microbatches: int = 0
    """network=residual: 0 keeps each block's parameters apart; >= 1 stacks every tower's blocks
    ([residual_depth, ...], split over the mesh's stage axis) and, on a mesh with stage > 1, runs
    them as a GPipe pipeline of this many microbatches (it must divide each per-replica batch)."""
    cnn_channels: tuple[int, ...] = (16,)
    """network=cnn: output channels of each convolution (stride 1, SAME padding, ReLU), split over
    the model axis."""
    cnn_kernel: int = 3
    """network=cnn: the convolutions' kernel size (cnn_kernel x cnn_kernel)."""
    cnn_head: Literal["mlp", "residual"] = "mlp"
    """network=cnn: the tower after the convolutions: mlp (the *_widths fields; PPO and A2C share
    the convolutions between policy and value, torso_widths unused) or residual (the residual_*
    fields)."""
    compute_dtype: Literal["float32", "bfloat16"] = "float32"
    """dtype of the network's matmuls; parameters (see param_dtype), optimizer state, outputs and
    losses stay float32."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """dtype the parameters and Adam's two moments are stored in: bfloat16 halves their memory
    (Adam's arithmetic stays float32, stored back with stochastic rounding); outputs and losses
    stay float32. Either compute_dtype goes with either param_dtype (float32 compute upcasts the
    bfloat16 weights)."""
    remat: Literal["none", "block", "full"] = "none"
    """rematerialisation: block recomputes each residual block (network=mlp: each layer) in the
    backward pass from its saved input; full each tower from the observation. Less activation
    memory, one more forward's compute; the gradients are the same."""
    normalize_obs: bool = False
    """feed the network observations normalised by their running mean and variance (merged over
    data shards, kept in the training state and checkpoints, frozen in evaluation), clipped to
    +-10."""
    recurrent: Literal["none", "gru", "lstm"] = "none"
    """PPO only, network=mlp: gru (lstm) puts a Dense(recurrent_width) embedding and a GRU (LSTM)
    cell of recurrent_width before the actor and critic towers. The hidden state is reset at every
    episode end, lives in the training state (and checkpoints), and training runs BPTT over whole
    environment sequences of num_steps (num_minibatches splits environments, never time). The
    embedding and cell are replicated over the model axis (a split cell would all-gather its
    state at every time step), the towers after it tensor parallel."""
    recurrent_width: int = 128
    """recurrent=gru or lstm: width of the embedding and of the cell's hidden state (an LSTM's
    state also holds its cell memory: 2 x recurrent_width). Named gru_width until 2026-12-07; a
    run directory saved with that name resumes, evaluates and exports as before."""


def check_network(config, mlp_shards: int, algorithm: str = "", recurrent_ok: bool = False) -> None:
    """The network fields of an algorithm config: ``network``, ``compute_dtype``; for
    ``network="residual"``, ``residual_width/depth/expansion`` (the blocks' column-split hidden
    width ``width * expansion`` must divide by the ``model`` axis size ``mlp_shards``); for
    ``network="cnn"``, an image environment, the ``cnn_*`` fields and the head's fields;
    ``recurrent`` only where ``recurrent_ok`` (``algorithm`` names the caller in the message),
    with ``network="mlp"`` and ``recurrent_width >= 1``."""
    if config.network not in NETWORKS:
        raise ConfigError(f"network must be one of {list(NETWORKS)}, got {config.network!r}")
    check_recurrent(config, algorithm, recurrent_ok)
    compute_dtype_of(config.compute_dtype)
    param_dtype_of(getattr(config, "param_dtype", "float32"))
    check_remat(getattr(config, "remat", "none"))
    if config.network == "cnn":
        check_cnn(config, mlp_shards)
    if config.network == "residual" or (config.network, config.cnn_head) == ("cnn", "residual"):
        check_residual(config, mlp_shards)
    microbatches = getattr(config, "pipeline_microbatches", 0)
    if microbatches < 0 or (microbatches and config.network != "residual"):
        raise ConfigError(
            f"pipeline_microbatches={microbatches}: use 0 (no pipeline) or, with "
            f"network=residual (here {config.network!r}), a number of microbatches >= 1"
        )


def check_stages(config, stages: int, batch_shards: int) -> None:
    """A mesh with ``stages > 1`` pipeline stages: ``network="residual"`` with
    ``pipeline_microbatches >= 1`` dividing every per-replica batch (environments, minibatch),
    and ``residual_depth`` a multiple of ``stages``."""
    if stages == 1:
        return
    if config.network != "residual":
        raise ConfigError(
            f"a mesh with stage={stages} pipelines the residual tower's blocks; network="
            f"{config.network!r} has none: use network=residual or a mesh without stage"
        )
    microbatches = getattr(config, "pipeline_microbatches", 0)
    if microbatches < 1:
        raise ConfigError(
            f"a mesh with stage={stages} needs pipeline_microbatches >= 1 (the microbatches "
            "streamed through the stages), e.g. --pipeline-microbatches 4"
        )
    names = ("num_envs", "minibatch_size", "batch_size")
    batches = {n: getattr(config, n) // batch_shards for n in names if hasattr(config, n)}
    check_pipeline(config.residual_depth, microbatches, stages, batches)


def check_recurrent(config, algorithm: str, recurrent_ok: bool) -> None:
    recurrent = getattr(config, "recurrent", "none")
    if recurrent not in RECURRENT:
        raise ConfigError(f"recurrent must be one of {list(RECURRENT)}, got {recurrent!r}")
    if recurrent == "none":
        return
    if not recurrent_ok:
        raise ConfigError(
            f"recurrent={recurrent!r} is built for ppo only; {algorithm or 'this algorithm'} "
            "trains feed-forward networks (recurrent='none')"
        )
    if config.network != "mlp":
        raise ConfigError(
            f"recurrent={recurrent!r} goes with network='mlp' (the cell before the MLP towers), "
            f"got network={config.network!r}"
        )
    if config.recurrent_width < 1:
        raise ConfigError(f"recurrent_width must be >= 1, got {config.recurrent_width}")


def check_cnn(config, mlp_shards: int) -> None:
    """``network="cnn"``: image observations, positive ``cnn_kernel`` and ``cnn_channels``
    divisible by the ``model`` axis size, a known ``cnn_head`` and, for the MLP head, its
    widths."""
    image_obs_shape(config.env)
    channels = tuple(config.cnn_channels)
    if not channels or any(c < 1 for c in channels):
        raise ConfigError(f"cnn_channels must be one or more values >= 1, got {channels}")
    if config.cnn_kernel < 1:
        raise ConfigError(f"cnn_kernel must be >= 1, got {config.cnn_kernel}")
    for i, c in enumerate(channels):
        if c % mlp_shards:
            raise ConfigError(
                f"cnn_channels {channels}: conv_{i}'s {c} channels are not divisible by the "
                f"model axis size {mlp_shards} (output channels are split over `model`); choose "
                f"multiples of {mlp_shards}"
            )
    if config.cnn_head not in HEADS:
        raise ConfigError(f"cnn_head must be one of {list(HEADS)}, got {config.cnn_head!r}")
    unsupported = {"param_dtype": "float32", "remat": "none"}
    for name, only in unsupported.items():
        if getattr(config, name, only) != only:
            raise ConfigError(
                f"{name}={getattr(config, name)!r} is not built for network=cnn (only {only!r}); "
                f"use network=mlp or residual for {name}={getattr(config, name)!r}"
            )
    if config.cnn_head == "mlp":
        towers = ("actor", "critic", "q")
        widths = {
            t: getattr(config, f"{t}_widths") for t in towers if hasattr(config, f"{t}_widths")
        }
        check_tensor_parallel(widths, mlp_shards)


def check_residual(config, mlp_shards: int) -> None:
    """``residual_width/depth/expansion`` >= 1, and the blocks' hidden width divisible by the
    ``model`` axis size."""
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
    D]`` -> ``(logits [B@batch, A], value [B@batch])`` float32, and ``.value(obs)``; for a
    continuous action space (``spec.continuous``) ``(mean, log_std) [B@batch, A]`` in place of
    the logits (the image networks are discrete-only: the image environments are). With
    ``recurrent="gru"`` or ``"lstm"`` a ``RecurrentActorCritic``, whose steps also take and
    return the recurrent state ``[B@batch, S]`` (``S``: its ``state_size``)."""
    c = config
    network = getattr(c, "network", "mlp")
    common = dict(
        num_actions=spec.action_dim if spec.continuous else spec.num_actions,
        activation=c.activation,
        compute_dtype=getattr(c, "compute_dtype", "float32"),
    )
    if network == "cnn":
        return CNNActorCritic(
            actor_widths=c.actor_widths,
            critic_widths=c.critic_widths,
            **common,
            **cnn_fields(c, spec),
        )
    common.update(
        param_dtype=getattr(c, "param_dtype", "float32"),
        remat=getattr(c, "remat", "none"),
        continuous=spec.continuous,
    )
    if network == "residual":
        return ResidualActorCritic(**residual_fields(c), **common)
    if getattr(c, "recurrent", "none") != "none":
        return RecurrentActorCritic(
            width=c.recurrent_width,
            actor_widths=c.actor_widths,
            critic_widths=c.critic_widths,
            cell_type=c.recurrent,
            **common,
        )
    return ActorCritic(
        actor_widths=c.actor_widths,
        critic_widths=c.critic_widths,
        torso_widths=getattr(c, "torso_widths", ()),
        **common,
    )


def q_network(config, spec: EnvSpec) -> nn.Module:
    """The Q-network of a DQN config (``q_widths``, ``activation``, ``dueling`` and the
    ``NetworkSettings``): ``obs: [B@batch, D]`` -> ``q [B@batch, A]`` float32."""
    c = config
    common = dict(
        num_actions=spec.num_actions,
        activation=c.activation,
        dueling=c.dueling,
        compute_dtype=c.compute_dtype,
    )
    if c.network == "cnn":
        return CNNQNetwork(widths=c.q_widths, **common, **cnn_fields(c, spec))
    common.update(param_dtype=c.param_dtype, remat=c.remat)
    if c.network == "residual":
        return ResidualQNetwork(**residual_fields(c), **common)
    return QNetwork(widths=c.q_widths, **common)


def residual_fields(config) -> dict:
    """``width``/``depth``/``expansion`` of a config's ``residual_*`` settings."""
    return dict(
        width=config.residual_width,
        depth=config.residual_depth,
        expansion=config.residual_expansion,
        pipeline_microbatches=getattr(config, "pipeline_microbatches", 0),
    )


def cnn_fields(config, spec: EnvSpec) -> dict:
    """The ``CNNActorCritic`` / ``CNNQNetwork`` fields of a config's ``cnn_*`` and
    ``residual_*`` settings and the environment's image shape."""
    c = config
    return dict(
        obs_shape=spec.obs_shape or image_obs_shape(spec.name),
        channels=tuple(c.cnn_channels),
        kernel=c.cnn_kernel,
        head_type=c.cnn_head,
        residual=(c.residual_width, c.residual_depth, c.residual_expansion),
    )
