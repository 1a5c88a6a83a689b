"""A recurrent (GRU) actor-critic: an embedding, a GRU cell, then ``ActorCritic``'s towers.

    net = RecurrentActorCritic(num_actions=2, width=128)
    x = net.apply(params, obs, method="embed")                 # [..., D] -> [..., H]
    hidden = net.apply(params, hidden, x, method="cell")        # one step: [B, H], [B, H] -> [B, H]
    out, value = net.apply(params, hidden, method="heads")      # [..., H] -> policy output, value

``unroll`` runs a whole sequence (the embedding and the heads batched over time, only the cell
sequential), resetting the hidden state to zeros after every step that ended an episode. The
embedding and the cell are replicated over ``model`` (their logical axes ``recurrent`` map to no
mesh axis); the towers after the cell are ``ActorCritic``'s, tensor parallel. Why: see
``docs/architecture.md`` (recurrent policies).
"""

from __future__ import annotations

from collections.abc import Sequence

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


class RecurrentActorCritic(nn.Module):
    """``obs [B@batch, D]`` -> embedding ``Dense(width)`` + activation -> ``GRUCell(width)`` ->
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
        self.gru = nn.GRUCell(
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
        hidden, _ = self.gru(hidden, x)
        return constrain(hidden.astype(jnp.float32), "batch", "activation_recurrent")

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


UNROLL = 1  # cell steps per loop iteration: unrolled 8, the backward pass took 4.7x longer on CPU


def unroll(network: RecurrentActorCritic, params, obs, ends, hidden, unroll_steps: int = UNROLL):
    """A sequence from its first hidden state: ``obs [T, B, D]``, ``ends [T, B]`` (step ``t``
    ended an episode: the state after it is reset to zeros), ``hidden [B, H]`` -> ``(policy
    output [T, B, ...], value [T, B])``, the same numbers as stepping ``__call__`` ``T`` times
    with the resets in between. Only the cell runs in a ``lax.scan``."""
    x = network.apply(params, obs, method="embed")

    def step(h, xs):
        x_t, end_t = xs
        h = network.apply(params, h, x_t, method="cell")
        return jnp.where(end_t[:, None], 0.0, h), h

    # states: before each step's reset
    _, states = jax.lax.scan(step, hidden, (x, ends), unroll=unroll_steps)
    return network.apply(params, states, method="heads")
