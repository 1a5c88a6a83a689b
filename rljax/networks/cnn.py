"""Convolutional torsos for image observations (MinAtar's ``[10, 10, C]`` boards), tensor
parallel over the output channels, with the MLP or residual towers of ``mlp.py`` /
``residual.py`` as heads.

A torso is ``len(channels)`` convolutions (``kernel x kernel``, stride 1, ``SAME`` padding, ReLU),
then a flatten to ``[B, H * W * channels[-1]]``. ``SAME`` keeps the board size, so any depth and
kernel fit any board, and the edge rows and columns (Breakout's paddle row) are seen as often as
the centre. Layout, by logical names only: every convolution is column-split, kernel
``[kh, kw, in, out@mlp]``, bias ``[out@mlp]``, so each device computes a slice of the output
channels without communication; its activations are ``[B@batch, H, W, C@activation_mlp]``. The
spatial and input-channel axes are unnamed: the first input is the observation's own channel
count (arbitrary), and a later one is small (a 3x3x16x16 kernel has 2,304 parameters), so naming
it ``embed`` (sharded as FSDP) would only add a divisibility constraint. The next convolution and
the flatten gather their model-sharded input, one all-gather of ``[B, H, W, C]`` per layer; the
flattened features are replicated over ``model`` (``activation_embed``), which is what both
heads start from.

Observations arrive flattened, ``[B, H * W * C]`` (``BatchedEnv``); the torso reshapes them with
the environment's ``obs_shape``. Mixed precision as the other networks: ``compute_dtype=
"bfloat16"`` runs the convolutions and matmuls in bfloat16; parameters and outputs stay float32.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from rljax.networks.mlp import (
    ActorCritic,
    MLPTower,
    compute_dtype_of,
    head,
    output_axis,
    q_heads,
)
from rljax.networks.residual import ResidualTower
from rljax.parallel.rules import constrain

HEADS = ("mlp", "residual")


def conv(features: int, kernel: int, name: str, init: str, dtype) -> nn.Conv:
    """A column-split ``kernel x kernel`` convolution, stride 1, ``SAME`` padding; ``init`` as
    ``mlp.dense`` (orthogonal with gain sqrt(2), or LeCun normal)."""
    if init == "orthogonal":
        kernel_init = nn.initializers.orthogonal(np.sqrt(2))
    else:
        kernel_init = nn.initializers.lecun_normal()
    return nn.Conv(
        features,
        (kernel, kernel),
        padding="SAME",
        kernel_init=nn.with_logical_partitioning(kernel_init, (None, None, None, "mlp")),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("mlp",)),
        dtype=dtype,
        param_dtype=jnp.float32,
        name=name,
    )


class ConvTorso(nn.Module):
    """``obs: [B@batch, H*W*C]`` (or ``[B@batch, H, W, C]``) -> features
    ``[B@batch, H*W*channels[-1]]``, replicated over ``model``, in the compute dtype."""

    obs_shape: Sequence[int]  # (H, W, C)
    channels: Sequence[int] = (16,)
    kernel: int = 3
    initializer: str = "orthogonal"
    dtype: Any = None  # of the convolutions (None: float32)

    @nn.compact
    def __call__(self, obs):
        x = obs.reshape(obs.shape[0], *self.obs_shape)
        x = constrain(x, "batch", None, None, None)
        for i, features in enumerate(self.channels):
            x = conv(features, self.kernel, f"conv_{i}", self.initializer, self.dtype)(x)
            x = constrain(nn.relu(x), "batch", None, None, "activation_mlp")
        x = constrain(x, "batch", None, None, None)
        return constrain(x.reshape(x.shape[0], -1), "batch", "activation_embed")


def tower(kind: str, widths, residual, activation: str, init: str, dtype, name=None):
    """The tower after the torso, ``features: [B@batch, F]`` -> ``[B@batch, F']`` laid out on
    ``tower_axis(kind, widths)``: ``kind="mlp"``, an ``MLPTower(widths)``; ``"residual"``, a
    ``ResidualTower`` of ``residual = (width, depth, expansion)``."""
    if kind == "residual":
        width, depth, expansion = residual
        return ResidualTower(width, depth, expansion, activation, init, dtype, name=name)
    return MLPTower(widths, activation, init, dtype, name=name)


def tower_axis(kind: str, widths) -> str:
    """Logical axis of the features leaving ``tower(kind, widths, ...)``."""
    return "embed" if kind == "residual" else output_axis(len(widths))


class CNNActorCritic(ActorCritic):
    """A convolutional torso shared by the policy and the value (as the Atari and MinAtar PPO
    baselines), then separate actor and critic towers (``head_type``: MLP with ``actor_widths`` /
    ``critic_widths``, or residual with ``residual``) and their output layers.

    ``obs: [B@batch, H*W*C]`` -> ``(logits: [B@batch, A], value: [B@batch])``, both float32.
    """

    obs_shape: Sequence[int] = (10, 10, 4)
    channels: Sequence[int] = (16,)
    kernel: int = 3
    head_type: str = "mlp"  # the tower after the torso: "mlp" or "residual"
    residual: Sequence[int] = (256, 2, 4)

    def setup(self):
        dtype = compute_dtype_of(self.compute_dtype)
        self.torso = ConvTorso(self.obs_shape, self.channels, self.kernel, "orthogonal", dtype)
        kind, init = self.head_type, "orthogonal"
        self.actor = tower(kind, self.actor_widths, self.residual, self.activation, init, dtype)
        self.critic = tower(kind, self.critic_widths, self.residual, self.activation, init, dtype)
        actor_out = tower_axis(kind, self.actor_widths)
        critic_out = tower_axis(kind, self.critic_widths)
        self.policy_head = head(
            self.num_actions, actor_out, "actions", 0.01, "policy_head", dtype=dtype
        )
        self.value_head = head(1, critic_out, "value", 1.0, "value_head", dtype=dtype)

    def _features(self, obs):
        return self.torso(obs)


class CNNQNetwork(nn.Module):
    """Action values from a convolutional torso and one tower (``head_type``: MLP with
    ``widths``, or residual with ``residual``); dueling as ``QNetwork``.

    ``obs: [B@batch, H*W*C]`` -> ``q: [B@batch, A]`` float32."""

    num_actions: int
    obs_shape: Sequence[int] = (10, 10, 4)
    channels: Sequence[int] = (16,)
    kernel: int = 3
    head_type: str = "mlp"  # the tower after the torso: "mlp" or "residual"
    widths: Sequence[int] = (128,)
    residual: Sequence[int] = (256, 2, 4)
    activation: str = "relu"
    dueling: bool = False
    initializer: str = "lecun"
    compute_dtype: str = "float32"

    @nn.compact
    def __call__(self, obs):
        dtype = compute_dtype_of(self.compute_dtype)
        x = ConvTorso(
            self.obs_shape, self.channels, self.kernel, self.initializer, dtype, name="torso"
        )(obs)
        kind, init = self.head_type, self.initializer
        x = tower(kind, self.widths, self.residual, self.activation, init, dtype, name="tower")(x)
        in_axis = tower_axis(kind, self.widths)
        return q_heads(x, in_axis, self.num_actions, self.dueling, init, dtype)
