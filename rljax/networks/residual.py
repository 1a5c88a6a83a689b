"""SimBa-style residual MLPs (Lee et al., 2024), tensor parallel like ``mlp.py``.

A tower is a linear embedding of the observation to ``width``, ``depth`` pre-LayerNorm residual
feed-forward blocks ``x + Dense(act(Dense(LayerNorm(x))))`` (hidden width
``width * expansion``), and a final LayerNorm. Layout over ``model``, by logical names only: the
residual stream ``[B@data, width]`` is ``activation_embed`` (replicated over ``model``); each
block's first Dense is column-split (``[embed, mlp]``), its second row-split (``[mlp, embed]``),
so a block costs one all-reduce of the stream, as two MLP layers do. ``rules_with(embed=...)``
shards the stream-width axis of every parameter (FSDP-style) without touching the network.

Mixed precision: with ``compute_dtype="bfloat16"`` the Dense matmuls run in bfloat16 while the
parameters, the residual stream, the LayerNorms and every output (logits, values, Q-values) stay
float32.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax.numpy as jnp
import numpy as np

from rljax.networks.mlp import ACTIVATIONS, compute_dtype_of, dense, head, q_heads
from rljax.parallel.rules import constrain


def layer_norm(name: str) -> nn.LayerNorm:
    """A float32 LayerNorm over the stream (``[embed]`` scale and bias)."""
    return nn.LayerNorm(
        dtype=jnp.float32,
        param_dtype=jnp.float32,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("embed",)),
        name=name,
    )


class ResidualBlock(nn.Module):
    """``x: [B@data, width]`` float32 -> ``x + Dense(act(Dense(LayerNorm(x))))``, same shape."""

    width: int
    expansion: int = 4
    activation: str = "relu"
    initializer: str = "orthogonal"
    dtype: Any = None  # of the matmuls (None: float32)

    @nn.compact
    def __call__(self, x):
        hidden = self.width * self.expansion
        h = layer_norm("norm")(x)
        h = dense(
            hidden, ("embed", "mlp"), ("mlp",), np.sqrt(2), "dense_0", self.initializer, self.dtype
        )(h)
        h = constrain(ACTIVATIONS[self.activation](h), "batch", "activation_mlp")
        h = dense(
            self.width, ("mlp", "embed"), ("embed",), 1.0, "dense_1", self.initializer, self.dtype
        )(h)
        return constrain(x + h.astype(jnp.float32), "batch", "activation_embed")


class ResidualTower(nn.Module):
    """``obs: [B@data, D]`` -> features ``[B@data, width]`` float32 (replicated over ``model``)."""

    width: int = 256
    depth: int = 2
    expansion: int = 4
    activation: str = "relu"
    initializer: str = "orthogonal"
    dtype: Any = None

    @nn.compact
    def __call__(self, obs):
        x = constrain(obs.reshape(obs.shape[0], -1), "batch", "activation_embed")
        # The observation's own axis has no logical name (it is small and its size arbitrary).
        x = dense(
            self.width, (None, "embed"), ("embed",), 1.0, "embed", self.initializer, self.dtype
        )(x)
        x = constrain(x.astype(jnp.float32), "batch", "activation_embed")
        for i in range(self.depth):
            x = ResidualBlock(
                self.width,
                self.expansion,
                self.activation,
                self.initializer,
                self.dtype,
                name=f"block_{i}",
            )(x)
        return layer_norm("final_norm")(x)


class ResidualActorCritic(nn.Module):
    """Residual actor and critic: ``obs: [B@data, D]`` -> ``(logits [B@data, A], value [B@data])``,
    both float32.

    Separate actor and critic towers, as SimBa: no shared torso whose features the policy and
    value losses pull in different directions.
    """

    num_actions: int
    width: int = 256
    depth: int = 2
    expansion: int = 4
    activation: str = "relu"
    compute_dtype: str = "float32"

    def setup(self):
        dtype = compute_dtype_of(self.compute_dtype)
        shape = (self.width, self.depth, self.expansion, self.activation, "orthogonal", dtype)
        self.actor = ResidualTower(*shape)
        self.critic = ResidualTower(*shape)
        self.policy_head = head(
            self.num_actions, "embed", "actions", 0.01, "policy_head", dtype=dtype
        )
        self.value_head = head(1, "embed", "value", 1.0, "value_head", dtype=dtype)

    def __call__(self, obs):
        return self._logits(obs), self.value(obs)

    def _logits(self, obs):
        logits = self.policy_head(self.actor(obs)).astype(jnp.float32)
        return constrain(logits, "batch", "activation_actions")

    def value(self, obs):
        """Critic only: ``obs: [B@data, D]`` -> ``[B@data]`` float32."""
        value = self.value_head(self.critic(obs))[:, 0].astype(jnp.float32)
        return constrain(value, "batch")


class ResidualQNetwork(nn.Module):
    """Action values from one residual tower: ``obs: [B@data, D]`` -> ``q: [B@data, A]`` float32;
    dueling as ``QNetwork``."""

    num_actions: int
    width: int = 256
    depth: int = 2
    expansion: int = 4
    activation: str = "relu"
    dueling: bool = False
    initializer: str = "lecun"
    compute_dtype: str = "float32"

    @nn.compact
    def __call__(self, obs):
        dtype = compute_dtype_of(self.compute_dtype)
        x = ResidualTower(
            self.width,
            self.depth,
            self.expansion,
            self.activation,
            self.initializer,
            dtype,
            name="tower",
        )(obs)
        return q_heads(x, "embed", self.num_actions, self.dueling, self.initializer, dtype)
