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
float32. ``param_dtype="bfloat16"`` stores every parameter (LayerNorms included) in bfloat16;
the stream, LayerNorms and outputs are still computed in float32.

Rematerialisation (``remat``): ``"block"`` wraps each ``ResidualBlock`` in ``nn.remat``, so the
backward pass keeps only each block's input ``[B, width]`` and recomputes its LayerNorm and its
``[B, width * expansion]`` hidden activation; ``"full"`` wraps each tower, keeping only the
observation. Gradients are unchanged; the backward pass does one more forward's matmuls.

Pipelining (``pipeline_microbatches >= 1``): the blocks' parameters are stacked under
``blocks`` (leaves ``[depth@layers, ...]``) and run by ``rljax.parallel.pipeline``: sequentially
without a ``stage`` mesh axis, as a GPipe pipeline of that many microbatches with one.
"""

from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax.networks.mlp import (
    ACTIVATIONS,
    check_remat,
    compute_dtype_of,
    dense,
    head,
    param_dtype_of,
    policy_head,
    policy_output,
    q_heads,
    remat_if,
)
from rljax.parallel.pipeline import LAYERS, pipeline
from rljax.parallel.rules import constrain


def layer_norm(name: str, param_dtype: Any = jnp.float32) -> nn.LayerNorm:
    """A float32 LayerNorm over the stream (``[embed]`` scale and bias in ``param_dtype``)."""
    return nn.LayerNorm(
        dtype=jnp.float32,
        param_dtype=param_dtype,
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
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        hidden, init, dtypes = self.width * self.expansion, self.initializer, self.dtypes
        h = layer_norm("norm", self.param_dtype)(x)
        h = dense(hidden, ("embed", "mlp"), ("mlp",), np.sqrt(2), "dense_0", init, *dtypes)(h)
        h = constrain(ACTIVATIONS[self.activation](h), "batch", "activation_mlp")
        h = dense(self.width, ("mlp", "embed"), ("embed",), 1.0, "dense_1", init, *dtypes)(h)
        return constrain(x + h.astype(jnp.float32), "batch", "activation_embed")

    @property
    def dtypes(self):
        return self.dtype, self.param_dtype


class ResidualTower(nn.Module):
    """``obs: [B@data, D]`` -> features ``[B@data, width]`` float32 (replicated over ``model``)."""

    width: int = 256
    depth: int = 2
    expansion: int = 4
    activation: str = "relu"
    initializer: str = "orthogonal"
    dtype: Any = None
    param_dtype: Any = jnp.float32
    remat_blocks: bool = False  # rematerialise each block from its input
    pipeline_microbatches: int = 0  # >= 1: stacked blocks, pipelined over the stage axis

    @nn.compact
    def __call__(self, obs):
        x = constrain(obs.reshape(obs.shape[0], -1), "batch", "activation_embed")
        dtypes = self.dtype, self.param_dtype
        # The observation's own axis has no logical name (it is small and its size arbitrary).
        x = dense(self.width, (None, "embed"), ("embed",), 1.0, "embed", self.initializer, *dtypes)(
            x
        )
        x = constrain(x.astype(jnp.float32), "batch", "activation_embed")
        if self.pipeline_microbatches:
            x = self.stacked_blocks(x)
            return layer_norm("final_norm", self.param_dtype)(x)
        block = remat_if(ResidualBlock, self.remat_blocks)
        for i in range(self.depth):
            x = block(
                self.width,
                self.expansion,
                self.activation,
                self.initializer,
                *dtypes,
                name=f"block_{i}",
            )(x)
        return layer_norm("final_norm", self.param_dtype)(x)

    def stacked_blocks(self, x):
        """``x: [B@batch, width]`` through the ``depth`` blocks stacked under ``blocks``."""
        fields = (self.width, self.expansion, self.activation, self.initializer, self.dtype)
        fields = (*fields, self.param_dtype)
        if self.is_initializing():
            # A scan, not a vmap: a vmapped orthogonal init is a batched LAPACK QR, whose CPU
            # kernel in jaxlib 0.10 can deadlock in its thread pool (seen on 2 cores).
            stacked = nn.scan(
                lambda block, h, _: (block(h), None),
                variable_axes={"params": 0},
                split_rngs={"params": True},
                length=self.depth,
                metadata_params={nn.PARTITION_NAME: LAYERS},
            )
            stacked(ResidualBlock(*fields, name="blocks"), x, None)
        block = ResidualBlock(*fields, parent=None)
        layer = lambda p, h: block.apply({"params": p}, h)  # noqa: E731
        layer = jax.checkpoint(layer) if self.remat_blocks else layer
        params = nn.meta.unbox(self.variables["params"]["blocks"])
        # Upcast for the pipeline: XLA:CPU (jaxlib 0.10) fails a check compiling the GPipe
        # program's bfloat16 parameter gradients. The blocks upcast them anyway (float32 norms,
        # float32 or bfloat16 matmuls, whose bfloat16 cast of a float32 copy is exact).
        params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        return pipeline(layer, params, x, self.pipeline_microbatches)


class ResidualActorCritic(nn.Module):
    """Residual actor and critic: ``obs: [B@data, D]`` -> ``(logits [B@data, A], value [B@data])``,
    both float32; with ``continuous``, ``(mean, log_std)`` (``GaussianHead``) in place of the
    logits.

    Separate actor and critic towers, as SimBa: no shared torso whose features the policy and
    value losses pull in different directions.
    """

    num_actions: int
    width: int = 256
    depth: int = 2
    expansion: int = 4
    activation: str = "relu"
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # none | block | full
    continuous: bool = False  # a Gaussian policy head instead of logits
    pipeline_microbatches: int = 0  # >= 1: stacked blocks, pipelined over the stage axis

    def setup(self):
        dtype, pdtype = compute_dtype_of(self.compute_dtype), param_dtype_of(self.param_dtype)
        shape = (self.width, self.depth, self.expansion, self.activation, "orthogonal", dtype)
        tower = remat_if(ResidualTower, check_remat(self.remat) == "full")
        shape = (*shape, pdtype, self.remat == "block", self.pipeline_microbatches)
        self.actor = tower(*shape)
        self.critic = tower(*shape)
        self.policy_head = policy_head(self.num_actions, self.continuous, "embed", dtype, pdtype)
        self.value_head = head(1, "embed", "value", 1.0, "value_head", dtype=dtype, pdtype=pdtype)

    def __call__(self, obs):
        return self._logits(obs), self.value(obs)

    def _logits(self, obs):
        return policy_output(self.policy_head(self.actor(obs)))

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
    param_dtype: str = "float32"
    remat: str = "none"  # none | block | full
    pipeline_microbatches: int = 0  # >= 1: stacked blocks, pipelined over the stage axis

    @nn.compact
    def __call__(self, obs):
        dtype, pdtype = compute_dtype_of(self.compute_dtype), param_dtype_of(self.param_dtype)
        x = remat_if(ResidualTower, check_remat(self.remat) == "full")(
            self.width,
            self.depth,
            self.expansion,
            self.activation,
            self.initializer,
            dtype,
            pdtype,
            self.remat == "block",
            self.pipeline_microbatches,
            name="tower",
        )(obs)
        init = self.initializer
        return q_heads(x, "embed", self.num_actions, self.dueling, init, dtype, pdtype)
