"""A recurrent (GRU) actor-critic: an embedding, a GRU cell, then ``ActorCritic``'s towers.

    net = RecurrentActorCritic(num_actions=2, width=128)
    x = net.apply(params, obs, method="embed")                 # [..., D] -> [..., H]
    hidden = net.apply(params, hidden, x, method="cell")        # one step: [B, H], [B, H] -> [B, H]
    out, value = net.apply(params, hidden, method="heads")      # [..., H] -> policy output, value

``unroll`` runs a whole sequence (the embedding, the GRU's input projections and the heads
batched over time; only the hidden-state matmul sequential), resetting the hidden state to zeros
after every step that ended an episode. The embedding and the cell are replicated over
``model`` (their logical axes ``recurrent`` map to no mesh axis); the towers after the cell are
``ActorCritic``'s, tensor parallel. Why: see ``docs/architecture.md`` (recurrent policies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rljax.networks.mlp import (
    ACTIVATIONS,
    ActorCritic,
    _float32_init,
    compute_dtype_of,
    param_dtype_of,
)
from rljax.parallel.rules import constrain


def _boxed(init, axes):
    return nn.with_logical_partitioning(_float32_init(init), axes)


class _Dense(nn.Module):
    """The parameters of one ``nn.Dense`` (same names and initialisers) as attributes: ``GRU``
    concatenates kernels before multiplying, which ``nn.Dense`` (applied, never read) cannot
    offer. ``kernel [D, H]`` and, with ``use_bias``, ``bias [H]``."""

    in_features: int
    features: int
    use_bias: bool
    kernel_init: Callable
    bias_init: Callable
    param_dtype: Any

    def setup(self):
        shape = (self.in_features, self.features)
        self.kernel = self.param("kernel", self.kernel_init, shape, self.param_dtype)
        if self.use_bias:
            self.bias = self.param("bias", self.bias_init, (self.features,), self.param_dtype)


class GRU(nn.Module):
    """``nn.GRUCell``'s cell, parameters (``ir iz in hr hz hn``) and numbers, arranged for
    sequences: the input projections of all ``T`` steps are one matmul (``gates``), and each step
    multiplies the hidden state once by the three recurrent kernels side by side (``step``,
    ``scan``). On CPU this makes BPTT through 128 steps ~3x faster than a ``GRUCell`` per step."""

    width: int
    kernel_init: Callable
    recurrent_kernel_init: Callable
    bias_init: Callable
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def setup(self):
        def dense(kernel_init, use_bias):
            return _Dense(self.width, self.width, use_bias, kernel_init, self.bias_init,
                          self.param_dtype)  # fmt: skip

        self.ir, self.iz = (dense(self.kernel_init, True) for _ in range(2))
        setattr(self, "in", dense(self.kernel_init, True))  # GRUCell's name, a Python keyword
        self.hr, self.hz = (dense(self.recurrent_kernel_init, False) for _ in range(2))
        self.hn = dense(self.recurrent_kernel_init, True)

    def _cast(self, *xs):
        dtype = self.dtype or jnp.float32
        return tuple(jnp.asarray(x, dtype) for x in xs)

    def gates(self, x):
        """The input projections ``x [..., H]`` -> ``[..., 3H]`` (r, z, n; biases included)."""
        n = getattr(self, "in")
        kernel = jnp.concatenate([self.ir.kernel, self.iz.kernel, n.kernel], axis=1)
        bias = jnp.concatenate([self.ir.bias, self.iz.bias, n.bias])
        x, kernel, bias = self._cast(x, kernel, bias)
        return x @ kernel + bias

    def _recurrent(self):
        kernel = jnp.concatenate([self.hr.kernel, self.hz.kernel, self.hn.kernel], axis=1)
        return self._cast(kernel, self.hn.bias)

    @staticmethod
    def _cell(hidden, gates, kernel, bias_n):
        h = hidden.astype(kernel.dtype) @ kernel
        g_r, g_z, g_n = jnp.split(gates, 3, axis=-1)
        h_r, h_z, h_n = jnp.split(h, 3, axis=-1)
        r = jax.nn.sigmoid(g_r + h_r)
        z = jax.nn.sigmoid(g_z + h_z)
        n = jnp.tanh(g_n + r * (h_n + bias_n))
        new = (1.0 - z) * n + z * hidden
        return constrain(new.astype(jnp.float32), "batch", "activation_recurrent")

    def step(self, hidden, gates):
        """One step: ``hidden [B@batch, H]`` float32, ``gates [B@batch, 3H]`` -> ``hidden'``."""
        return self._cell(hidden, gates, *self._recurrent())

    def scan(self, hidden, gates, starts):
        """``hidden [B, H]``, ``gates [T, B, 3H]``, ``starts [T, B]`` (zero the state before step
        ``t``) -> the states after every step ``[T, B, H]``."""
        kernel, bias_n = self._recurrent()

        def step(h, xs):
            g_t, start_t = xs
            h = self._cell(jnp.where(start_t[:, None], 0.0, h), g_t, kernel, bias_n)
            return h, h

        return jax.lax.scan(step, hidden, (gates, starts))[1]


class RecurrentActorCritic(nn.Module):
    """``obs [B@batch, D]`` -> embedding ``Dense(width)`` + activation -> ``GRU(width)`` ->
    ``ActorCritic`` towers and heads (``(logits [B@batch, A] or (mean, log_std), value
    [B@batch])``, float32). ``__call__(obs, hidden=None)`` is one step from ``hidden [B, H]``
    (zeros when None) and returns ``(out, value, hidden')``."""

    num_actions: int  # continuous: the action dimensions
    width: int = 128  # H: the embedding's and the GRU's width
    actor_widths: Sequence[int] = (128,)
    critic_widths: Sequence[int] = (128,)
    activation: str = "tanh"
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # of the towers after the cell
    continuous: bool = False

    def setup(self):
        dtype, pdtype = compute_dtype_of(self.compute_dtype), param_dtype_of(self.param_dtype)
        self.embedding = nn.Dense(
            self.width,
            kernel_init=_boxed(nn.initializers.orthogonal(np.sqrt(2)), (None, "recurrent")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("recurrent",)),
            dtype=dtype,
            param_dtype=pdtype,
        )
        self.gru = GRU(
            self.width,
            kernel_init=_boxed(nn.initializers.lecun_normal(), (None, "recurrent")),
            recurrent_kernel_init=_boxed(nn.initializers.orthogonal(), (None, "recurrent")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("recurrent",)),
            dtype=dtype,
            param_dtype=pdtype,
        )
        self.core = ActorCritic(
            self.num_actions,
            self.actor_widths,
            self.critic_widths,
            (),
            self.activation,
            self.compute_dtype,
            self.param_dtype,
            self.remat,
            self.continuous,
        )

    def embed(self, obs):
        """``obs [..., D]`` -> ``[..., H]`` float32."""
        x = ACTIVATIONS[self.activation](self.embedding(obs.astype(jnp.float32)))
        return x.astype(jnp.float32)

    def cell(self, hidden, x):
        """One GRU step: ``hidden, x: [B@batch, H]`` -> ``hidden' [B@batch, H]`` float32."""
        return self.gru.step(hidden, self.gru.gates(x))

    def cells(self, hidden, x, starts):
        """The GRU over a sequence: ``hidden [B, H]``, ``x [T, B, H]``, ``starts [T, B]`` (the
        state is zeroed before step ``t``) -> states after every step ``[T, B, H]`` float32."""
        return self.gru.scan(hidden, self.gru.gates(x), starts)

    def heads(self, hidden):
        """``hidden [..., H]`` -> ``(policy output [..., A], value [...])``."""
        lead = hidden.shape[:-1]
        out, value = self.core(hidden.reshape(-1, hidden.shape[-1]))
        reshape = lambda y: y.reshape(*lead, *y.shape[1:])  # noqa: E731
        return jax.tree.map(reshape, out), reshape(value)

    def __call__(self, obs, hidden=None):
        if hidden is None:
            hidden = jnp.zeros((obs.shape[0], self.width), jnp.float32)
        hidden = self.cell(hidden, self.embed(obs))
        out, value = self.heads(hidden)
        return out, value, hidden


def unroll(network: RecurrentActorCritic, params, obs, ends, hidden):
    """A sequence from its first hidden state: ``obs [T, B, D]``, ``ends [T, B]`` (step ``t``
    ended an episode: the state after it is reset to zeros), ``hidden [B, H]`` -> ``(policy
    output [T, B, ...], value [T, B])``, the same numbers as stepping ``__call__`` ``T`` times
    with the resets in between. Only the recurrent matmul runs in a ``lax.scan``."""
    x = network.apply(params, obs, method="embed")
    # The reset after step t-1 is applied before step t: each step's output is then its carry,
    # which makes BPTT on CPU ~25 % faster than resetting after the cell (same numbers).
    starts = jnp.concatenate([jnp.zeros_like(ends[:1]), ends[:-1]], axis=0)
    states = network.apply(params, hidden, x, starts, method="cells")
    return network.apply(params, states, method="heads")
