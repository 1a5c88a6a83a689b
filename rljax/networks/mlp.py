"""Tensor-parallel MLPs and the PPO actor-critic.

Megatron layout over the ``model`` mesh axis: even layers split their kernel by columns
(``[embed, hidden@model]``: each device computes a slice of the outputs, no communication), odd
layers by rows (``[hidden@model, embed]``: each device holds a slice of the inputs and the partial
products are summed by one all-reduce). So every two-layer block costs one all-reduce of
``[batch, width]`` activations. A head after an odd number of layers sees model-sharded features
and is row-split as well.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax.errors import ConfigError
from rljax.parallel.rules import constrain

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu}
# compute_dtype -> Flax ``dtype=`` of the matmuls (None: inferred, float32). Parameters stay
# float32 (``param_dtype``) either way.
COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}


def compute_dtype_of(name: str) -> Any:
    """``"float32"`` / ``"bfloat16"`` -> the ``dtype=`` of Flax layers."""
    if name not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {name!r}")
    return COMPUTE_DTYPES[name]


def dense(features, kernel_axes, bias_axes, scale, name, init="orthogonal", dtype=None):
    """``init``: "orthogonal" with gain ``scale`` (PPO practice) or "lecun" (LeCun normal, Flax
    ``nn.Dense``'s default, what DQN implementations use; ``scale`` ignored). ``dtype``: of the
    matmul (None: float32); the parameters are float32."""
    if init == "orthogonal":
        kernel = nn.initializers.orthogonal(scale)
    else:
        kernel = nn.initializers.lecun_normal()
    return nn.Dense(
        features,
        kernel_init=nn.with_logical_partitioning(kernel, kernel_axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), bias_axes),
        dtype=dtype,
        param_dtype=jnp.float32,
        name=name,
    )


def layer_axes(index: int) -> tuple[tuple[str, str], tuple[str]]:
    """Logical (kernel, bias) axes of hidden layer ``index``: column-split even, row-split odd."""
    if index % 2 == 0:
        return ("embed", "mlp"), ("mlp",)
    return ("mlp", "embed"), ("embed",)


def output_axis(num_layers: int) -> str:
    """Logical parameter axis of the features leaving ``num_layers`` hidden layers."""
    return "mlp" if num_layers % 2 else "embed"


def activation_axis(param_axis: str) -> str:
    """The activation name of features laid out like parameter axis ``param_axis``."""
    return f"activation_{param_axis}"


class MLPTower(nn.Module):
    """``x: [B@data, D]`` -> ``[B@data, widths[-1]]`` (model-sharded if ``len(widths)`` is odd)."""

    widths: Sequence[int]
    activation: str = "tanh"
    initializer: str = "orthogonal"
    dtype: Any = None  # of the matmuls and activations (None: float32)
    # Logical name of the first kernel's input axis: None when the tower reads the observation,
    # whose size is arbitrary (it is not split over fsdp like the hidden `embed` axes).
    input_axis: str | None = "embed"

    @nn.compact
    def __call__(self, x):
        act = ACTIVATIONS[self.activation]
        for i, width in enumerate(self.widths):
            kernel_axes, bias_axes = layer_axes(i)
            if i == 0:
                kernel_axes = (self.input_axis, kernel_axes[1])
            layer = dense(
                width,
                kernel_axes,
                bias_axes,
                np.sqrt(2),
                f"dense_{i}",
                self.initializer,
                self.dtype,
            )
            x = act(layer(x))
            x = constrain(x, "batch", activation_axis(bias_axes[0]))
        return x


def head(
    features: int,
    in_axis: str,
    out_axis: str,
    scale: float,
    name: str,
    init="orthogonal",
    dtype=None,
):
    """An output layer; callers cast its output to float32 (logits, values and Q-values are
    float32 whatever the compute dtype)."""
    return dense(features, (in_axis, out_axis), (out_axis,), scale, name, init, dtype)


class ActorCritic(nn.Module):
    """Separate actor and critic towers over an optional shared torso.

    ``obs: [B@data, D]`` -> ``(logits: [B@data, A], value: [B@data])``, both float32.
    """

    num_actions: int
    actor_widths: Sequence[int] = (64, 64)
    critic_widths: Sequence[int] = (64, 64)
    torso_widths: Sequence[int] = ()
    activation: str = "tanh"
    compute_dtype: str = "float32"  # of the matmuls; parameters and outputs stay float32

    def setup(self):
        dtype = compute_dtype_of(self.compute_dtype)
        self.torso = MLPTower(self.torso_widths, self.activation, dtype=dtype, input_axis=None)
        tower_input = "embed" if len(self.torso_widths) else None
        self.actor = MLPTower(
            self.actor_widths, self.activation, dtype=dtype, input_axis=tower_input
        )
        self.critic = MLPTower(
            self.critic_widths, self.activation, dtype=dtype, input_axis=tower_input
        )
        # The towers restart the column/row alternation, so the torso must end replicated.
        actor_out = output_axis(len(self.actor_widths))
        critic_out = output_axis(len(self.critic_widths))
        self.policy_head = head(
            self.num_actions, actor_out, "actions", 0.01, "policy_head", dtype=dtype
        )
        self.value_head = head(1, critic_out, "value", 1.0, "value_head", dtype=dtype)

    def _features(self, obs):
        x = constrain(obs.reshape(obs.shape[0], -1), "batch", "activation_embed")
        return self.torso(x)

    def __call__(self, obs):
        x = self._features(obs)
        return self._logits(x), self._value(x)

    def _logits(self, x):
        logits = self.policy_head(self.actor(x)).astype(jnp.float32)
        return constrain(logits, "batch", "activation_actions")

    def _value(self, x):
        return constrain(self.value_head(self.critic(x))[:, 0].astype(jnp.float32), "batch")

    def value(self, obs):
        """Critic only: ``obs: [B@data, D]`` -> ``[B@data]``."""
        return self._value(self._features(obs))


class QNetwork(nn.Module):
    """Action values from one tensor-parallel tower; optionally dueling.

    ``obs: [B@data, D]`` -> ``q: [B@data, A]`` float32. Dueling: ``Q = V + A - mean_a A`` from a
    value and an advantage head on the same tower.
    """

    num_actions: int
    widths: Sequence[int] = (120, 84)
    activation: str = "relu"
    dueling: bool = False
    initializer: str = "lecun"
    compute_dtype: str = "float32"  # of the matmuls; parameters and Q-values stay float32

    @nn.compact
    def __call__(self, obs):
        dtype = compute_dtype_of(self.compute_dtype)
        x = constrain(obs.reshape(obs.shape[0], -1), "batch", "activation_embed")
        x = MLPTower(
            self.widths, self.activation, self.initializer, dtype, input_axis=None, name="tower"
        )(x)
        in_axis = output_axis(len(self.widths))
        return q_heads(x, in_axis, self.num_actions, self.dueling, self.initializer, dtype)


def q_heads(x, in_axis: str, num_actions: int, dueling: bool, init: str, dtype):
    """Q-values ``[B@data, A]`` float32 from features ``x`` laid out on ``in_axis`` (call inside a
    compact module): one advantage head, plus a value head when dueling."""
    advantage = head(num_actions, in_axis, "actions", 1.0, "q_head", init, dtype)(x)
    advantage = constrain(advantage.astype(jnp.float32), "batch", "activation_actions")
    if not dueling:
        return advantage
    value = head(1, in_axis, "value", 1.0, "value_head", init, dtype)(x).astype(jnp.float32)
    value = constrain(value, "batch", None)
    return value + advantage - advantage.mean(axis=-1, keepdims=True)


def check_tensor_parallel(name_to_widths: dict[str, Sequence[int]], model_size: int) -> None:
    """Every column-split layer's width must divide by the ``model`` axis size."""
    for tower, widths in name_to_widths.items():
        if len(widths) and any(w < 1 for w in widths):
            raise ConfigError(f"{tower}: layer widths must be >= 1, got {tuple(widths)}")
        for i, width in enumerate(widths):
            if i % 2 == 0 and width % model_size:
                raise ConfigError(
                    f"{tower}/dense_{i}: width {width} is not divisible by the model axis size "
                    f"{model_size} (column-split layers are sharded over `model`); choose widths "
                    f"that are multiples of {model_size}"
                )


def check_torso(torso_widths: Sequence[int]) -> None:
    if len(torso_widths) % 2:
        raise ConfigError(
            f"torso_widths {tuple(torso_widths)}: a shared torso needs an even number of layers "
            "so that its output is replicated before the actor and critic towers"
        )


def init_dummy_obs(obs_shape: tuple[int, ...]) -> jax.Array:
    return jnp.zeros((1, *obs_shape), jnp.float32)
