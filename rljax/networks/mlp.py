"""Tensor-parallel MLPs and the PPO actor-critic.

Megatron layout over the ``model`` mesh axis: even layers split their kernel by columns
(``[embed, hidden@model]``: each device computes a slice of the outputs, no communication), odd
layers by rows (``[hidden@model, embed]``: each device holds a slice of the inputs and the partial
products are summed by one all-reduce). So every two-layer block costs one all-reduce of
``[batch, width]`` activations. A head after an odd number of layers sees model-sharded features
and is row-split as well.

Precision and rematerialisation (``ActorCritic``/``QNetwork`` fields, from ``NetworkSettings``):
``compute_dtype`` is the matmuls' dtype, ``param_dtype`` the stored parameters' (outputs are
float32 either way); ``remat="block"`` recomputes each layer (Dense + activation) from its input
in the backward pass, ``"full"`` each tower.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax.errors import ConfigError
from rljax.networks import matmul
from rljax.parallel.rules import constrain

ACTIVATIONS = {"tanh": nn.tanh, "relu": nn.relu, "gelu": nn.gelu, "silu": nn.silu}
# compute_dtype -> Flax ``dtype=`` of the matmuls (None: inferred from the inputs and parameters:
# float32 inputs make float32 matmuls, bfloat16 parameters are upcast).
COMPUTE_DTYPES = {"float32": None, "bfloat16": jnp.bfloat16}
# param_dtype -> the dtype parameters (and, through ``rljax.algos.base.adam``, Adam's moments)
# are stored in.
PARAM_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
# none: keep every activation for the backward pass; block: rematerialise each residual block /
# MLP layer from its input; full: each tower from its input.
REMAT = ("none", "block", "full")


def compute_dtype_of(name: str) -> Any:
    """``"float32"`` / ``"bfloat16"`` -> the ``dtype=`` of Flax layers."""
    if name not in COMPUTE_DTYPES:
        raise ConfigError(f"compute_dtype must be one of {list(COMPUTE_DTYPES)}, got {name!r}")
    return COMPUTE_DTYPES[name]


def param_dtype_of(name: str) -> Any:
    """``"float32"`` / ``"bfloat16"`` -> the ``param_dtype=`` of Flax layers."""
    if name not in PARAM_DTYPES:
        raise ConfigError(f"param_dtype must be one of {list(PARAM_DTYPES)}, got {name!r}")
    return PARAM_DTYPES[name]


def check_remat(name: str) -> str:
    if name not in REMAT:
        raise ConfigError(f"remat must be one of {list(REMAT)}, got {name!r}")
    return name


def remat_if(module_type: type, enabled: bool) -> type:
    """``module_type``, or its ``nn.remat`` (same parameter tree) when ``enabled``.

    Nothing inside is saved for the backward pass (``nn.remat``'s default policy, JAX's
    ``nothing_saveable``): the module keeps its input only and recomputes the rest. Saving the
    matmul outputs (``dots_with_no_batch_dims_saveable``) would keep exactly the wide hidden
    activations remat is meant to drop."""
    return nn.remat(module_type) if enabled else module_type


def _float32_init(init):
    """``init`` drawn in float32, then cast to the parameter dtype (orthogonal's QR has no
    bfloat16 kernel, and a bfloat16 draw is a worse sample)."""

    def draw(key, shape, dtype=jnp.float32):
        return init(key, shape, jnp.float32).astype(dtype)

    return draw


def dense(
    features,
    kernel_axes,
    bias_axes,
    scale,
    name,
    init="orthogonal",
    dtype=None,
    param_dtype=jnp.float32,
    activation=None,
    remat=False,
):
    """``init``: "orthogonal" with gain ``scale`` (PPO practice) or "lecun" (LeCun normal, Flax
    ``nn.Dense``'s default, what DQN implementations use; ``scale`` ignored). ``dtype``: of the
    matmul (None: from the inputs and parameters); ``param_dtype``: of the stored parameters.
    ``activation``: a ``DenseAct`` (``act(Dense(x))`` in one module) instead of a plain Dense;
    ``remat``: its ``nn.remat`` (see ``remat_if``)."""
    if init == "orthogonal":
        kernel = nn.initializers.orthogonal(scale)
    else:
        kernel = nn.initializers.lecun_normal()
    kwargs = {} if activation is None else {"activation": activation}
    module_type = remat_if(nn.Dense if activation is None else DenseAct, remat)
    return module_type(
        features,
        kernel_init=nn.with_logical_partitioning(_float32_init(kernel), kernel_axes),
        bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), bias_axes),
        dtype=dtype,
        param_dtype=param_dtype,
        dot_general=matmul.dot_general,
        name=name,
        **kwargs,
    )


class DenseAct(nn.Dense):
    """``act(Dense(x))``: one module (and ``nn.remat`` unit) with ``nn.Dense``'s parameters."""

    activation: str = "tanh"

    def __call__(self, x):
        return ACTIVATIONS[self.activation](super().__call__(x))


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
    param_dtype: Any = jnp.float32
    remat_layers: bool = False  # rematerialise each layer (Dense + activation) from its input
    # Logical name of the first kernel's input axis: None when the tower reads the observation,
    # whose size is arbitrary (it is not split over fsdp like the hidden `embed` axes).
    input_axis: str | None = "embed"

    @nn.compact
    def __call__(self, x):
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
                self.param_dtype,
                activation=self.activation,
                remat=self.remat_layers,
            )
            x = constrain(layer(x), "batch", activation_axis(bias_axes[0]))
        return x


def head(
    features: int,
    in_axis: str,
    out_axis: str,
    scale: float,
    name: str,
    init="orthogonal",
    dtype=None,
    *,
    pdtype=jnp.float32,
):
    """An output layer; callers cast its output to float32 (logits, values and Q-values are
    float32 whatever the compute and parameter dtypes)."""
    return dense(features, (in_axis, out_axis), (out_axis,), scale, name, init, dtype, pdtype)


class GaussianHead(nn.Module):
    """A diagonal Gaussian policy head: features ``[B@data, F]`` laid out on ``in_axis`` ->
    ``(mean, log_std)``, both ``[B@data, A]`` float32.

    ``mean`` is a Dense like the categorical head (kernel ``[in_axis, actions]``: row-split over
    ``model`` when the features are). ``log_std`` is a state-independent ``[A]`` parameter
    (initialised to 0), broadcast over the batch. Its logical axis ``actions`` is replicated: it
    is ``A`` floats that every device needs whole for its rows' log-probabilities, so splitting
    it would only add a gather."""

    action_dim: int
    in_axis: str
    dtype: Any = None
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x):
        mean = head(
            self.action_dim,
            self.in_axis,
            "actions",
            0.01,
            "mean",
            dtype=self.dtype,
            pdtype=self.param_dtype,
        )(x)
        mean = constrain(mean.astype(jnp.float32), "batch", "activation_actions")
        init = nn.with_logical_partitioning(nn.initializers.zeros_init(), ("actions",))
        log_std = self.param("log_std", init, (self.action_dim,), self.param_dtype)
        return mean, jnp.broadcast_to(log_std.astype(jnp.float32), mean.shape)


def policy_head(num_actions: int, continuous: bool, in_axis: str, dtype, pdtype):
    """The categorical logits head (``num_actions`` outputs) or, ``continuous``, a
    ``GaussianHead`` over ``num_actions`` action dimensions."""
    if continuous:
        return GaussianHead(num_actions, in_axis, dtype, pdtype, name="policy_head")
    return head(num_actions, in_axis, "actions", 0.01, "policy_head", dtype=dtype, pdtype=pdtype)


def policy_output(out):
    """A policy head's output as float32 with its activation layout (the Gaussian's already
    is)."""
    if isinstance(out, tuple):
        return out
    return constrain(out.astype(jnp.float32), "batch", "activation_actions")


class ActorCritic(nn.Module):
    """Separate actor and critic towers over an optional shared torso.

    ``obs: [B@data, D]`` -> ``(logits: [B@data, A], value: [B@data])``, both float32; with
    ``continuous``, ``(mean, log_std)`` (``GaussianHead``) in place of the logits.
    """

    num_actions: int  # continuous: the action dimensions
    actor_widths: Sequence[int] = (64, 64)
    critic_widths: Sequence[int] = (64, 64)
    torso_widths: Sequence[int] = ()
    activation: str = "tanh"
    compute_dtype: str = "float32"  # of the matmuls; outputs stay float32
    param_dtype: str = "float32"  # of the stored parameters
    remat: str = "none"  # none | block (each layer) | full (each tower)
    continuous: bool = False  # a Gaussian policy head instead of logits

    def setup(self):
        dtype, pdtype = compute_dtype_of(self.compute_dtype), param_dtype_of(self.param_dtype)
        tower = remat_if(MLPTower, check_remat(self.remat) == "full")
        shape = dict(dtype=dtype, param_dtype=pdtype, remat_layers=self.remat == "block")
        tower_input = "embed" if len(self.torso_widths) else None
        self.torso = tower(self.torso_widths, self.activation, **shape, input_axis=None)
        self.actor = tower(self.actor_widths, self.activation, **shape, input_axis=tower_input)
        self.critic = tower(self.critic_widths, self.activation, **shape, input_axis=tower_input)
        # The towers restart the column/row alternation, so the torso must end replicated.
        actor_out = output_axis(len(self.actor_widths))
        critic_out = output_axis(len(self.critic_widths))
        self.policy_head = policy_head(self.num_actions, self.continuous, actor_out, dtype, pdtype)
        self.value_head = head(
            1, critic_out, "value", 1.0, "value_head", dtype=dtype, pdtype=pdtype
        )

    def _features(self, obs):
        x = constrain(obs.reshape(obs.shape[0], -1), "batch", "activation_embed")
        return self.torso(x)

    def __call__(self, obs):
        x = self._features(obs)
        return self._logits(x), self._value(x)

    def _logits(self, x):
        return policy_output(self.policy_head(self.actor(x)))

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
    compute_dtype: str = "float32"  # of the matmuls; Q-values stay float32
    param_dtype: str = "float32"  # of the stored parameters
    remat: str = "none"  # none | block (each layer) | full (the tower)

    @nn.compact
    def __call__(self, obs):
        dtype, pdtype = compute_dtype_of(self.compute_dtype), param_dtype_of(self.param_dtype)
        x = constrain(obs.reshape(obs.shape[0], -1), "batch", "activation_embed")
        x = remat_if(MLPTower, check_remat(self.remat) == "full")(
            self.widths,
            self.activation,
            self.initializer,
            dtype,
            pdtype,
            self.remat == "block",
            input_axis=None,
            name="tower",
        )(x)
        in_axis = output_axis(len(self.widths))
        return q_heads(x, in_axis, self.num_actions, self.dueling, self.initializer, dtype, pdtype)


def q_heads(x, in_axis: str, num_actions: int, dueling: bool, init: str, dtype, pdtype=jnp.float32):
    """Q-values ``[B@data, A]`` float32 from features ``x`` laid out on ``in_axis`` (call inside a
    compact module): one advantage head, plus a value head when dueling. ``pdtype``: of the
    heads' parameters."""
    advantage = head(num_actions, in_axis, "actions", 1.0, "q_head", init, dtype, pdtype=pdtype)
    advantage = constrain(advantage(x).astype(jnp.float32), "batch", "activation_actions")
    if not dueling:
        return advantage
    value = head(1, in_axis, "value", 1.0, "value_head", init, dtype, pdtype=pdtype)
    value = value(x).astype(jnp.float32)
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
