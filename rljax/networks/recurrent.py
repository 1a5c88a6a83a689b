"""A recurrent (GRU or LSTM) actor-critic: an embedding, the cell, then ``ActorCritic``'s towers.

    net = RecurrentActorCritic(num_actions=2, width=128)       # cell_type="lstm": an LSTM
    x = net.apply(params, obs, method="embed")                 # [..., D] -> [..., H]
    hidden = net.apply(params, hidden, x, method="cell")        # one step: [B, S], [B, H] -> [B, S]
    out, value = net.apply(params, hidden, method="heads")      # [..., S] -> policy output, value

The recurrent state is ``S = net.state_size`` wide: the GRU's hidden state (``S = H``), or the
LSTM's cell memory and hidden state side by side (``[c | h]``, ``S = 2H``; the heads read ``h``).
``unroll`` runs a whole sequence (the embedding, the cell's input projections and the heads
batched over time; only the state's matmul sequential), resetting the state to zeros after
every step that ended an episode. The embedding and the cell are replicated over
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


class _SequenceCell(nn.Module):
    """A cell arranged for sequences: ``gates(x)`` projects the inputs of all steps in one matmul,
    and ``step``/``scan`` multiply the state once per step by the recurrent kernels side by side
    (``_recurrent``), then apply the cell's ``_cell``. On CPU this makes BPTT through 128 steps ~3x
    faster than a Flax cell per step."""

    width: int
    kernel_init: Callable
    recurrent_kernel_init: Callable
    bias_init: Callable
    dtype: Any = None
    param_dtype: Any = jnp.float32

    def _dense(self, kernel_init, use_bias):
        return _Dense(self.width, self.width, use_bias, kernel_init, self.bias_init,
                      self.param_dtype)  # fmt: skip

    def _cast(self, *xs):
        dtype = self.dtype or jnp.float32
        return tuple(jnp.asarray(x, dtype) for x in xs)

    def step(self, hidden, gates):
        """One step: ``hidden [B@batch, S]`` float32, ``gates`` (of ``gates(x)``) -> ``hidden'``."""
        return self._cell(hidden, gates, *self._recurrent())

    def scan(self, hidden, gates, starts):
        """``hidden [B, S]``, ``gates [T, B, kH]``, ``starts [T, B]`` (zero the state before step
        ``t``) -> the states after every step ``[T, B, S]``."""
        kernel, bias = self._recurrent()

        def step(h, xs):
            g_t, start_t = xs
            h = self._cell(jnp.where(start_t[:, None], 0.0, h), g_t, kernel, bias)
            return h, h

        return jax.lax.scan(step, hidden, (gates, starts))[1]


class GRU(_SequenceCell):
    """``nn.GRUCell``'s cell, parameters (``ir iz in hr hz hn``) and numbers; the state is the
    hidden state ``[B, H]``."""

    def setup(self):
        self.ir, self.iz = (self._dense(self.kernel_init, True) for _ in range(2))
        setattr(self, "in", self._dense(self.kernel_init, True))  # GRUCell's name, a keyword
        self.hr, self.hz = (self._dense(self.recurrent_kernel_init, False) for _ in range(2))
        self.hn = self._dense(self.recurrent_kernel_init, True)

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


class LSTM(_SequenceCell):
    """``nn.LSTMCell``'s cell, parameters (``ii if ig io`` without bias, ``hi hf hg ho`` with)
    and numbers; the state is ``[c | h]`` (``[B, 2H]``), ``nn.LSTMCell``'s carry ``(c, h)``
    side by side, and each step multiplies ``h`` by the four recurrent kernels at once."""

    def setup(self):
        for gate in "ifgo":  # "if" is a Python keyword: set by name, as GRU's "in"
            setattr(self, "i" + gate, self._dense(self.kernel_init, False))
            setattr(self, "h" + gate, self._dense(self.recurrent_kernel_init, True))

    def _gate_denses(self, prefix):
        return [getattr(self, prefix + gate) for gate in "ifgo"]

    def gates(self, x):
        """The input projections ``x [..., H]`` -> ``[..., 4H]`` (i, f, g, o; no biases)."""
        kernel = jnp.concatenate([d.kernel for d in self._gate_denses("i")], axis=1)
        x, kernel = self._cast(x, kernel)
        return x @ kernel

    def _recurrent(self):
        kernel = jnp.concatenate([d.kernel for d in self._gate_denses("h")], axis=1)
        bias = jnp.concatenate([d.bias for d in self._gate_denses("h")])
        return self._cast(kernel, bias)

    @staticmethod
    def _lstm(c, h, gates, kernel, bias):
        # nn.LSTMCell adds each gate's input projection to its recurrent Dense (bias included).
        pre = gates + (h.astype(kernel.dtype) @ kernel + bias)
        g_i, g_f, g_g, g_o = jnp.split(pre, 4, axis=-1)
        c = jax.nn.sigmoid(g_f) * c + jax.nn.sigmoid(g_i) * jnp.tanh(g_g)
        h = jax.nn.sigmoid(g_o) * jnp.tanh(c)
        return tuple(
            constrain(x.astype(jnp.float32), "batch", "activation_recurrent") for x in (c, h)
        )

    def _cell(self, state, gates, kernel, bias):
        c, h = jnp.split(state, 2, axis=-1)
        return jnp.concatenate(self._lstm(c, h, gates, kernel, bias), axis=-1)

    def scan(self, hidden, gates, starts):
        """As ``GRU.scan``, with ``c`` and ``h`` carried apart (no concatenation per step)."""
        kernel, bias = self._recurrent()

        def step(carry, xs):
            g_t, start_t = xs
            c, h = (jnp.where(start_t[:, None], 0.0, x) for x in carry)
            carry = self._lstm(c, h, g_t, kernel, bias)
            return carry, carry

        _, (cs, hs) = jax.lax.scan(step, tuple(jnp.split(hidden, 2, axis=-1)), (gates, starts))
        return jnp.concatenate([cs, hs], axis=-1)


CELLS = {"gru": GRU, "lstm": LSTM}


class RecurrentActorCritic(nn.Module):
    """``obs [B@batch, D]`` -> embedding ``Dense(width)`` + activation -> ``GRU(width)`` or
    ``LSTM(width)`` -> ``ActorCritic`` towers and heads (``(logits [B@batch, A] or (mean,
    log_std), value [B@batch])``, float32). ``__call__(obs, hidden=None)`` is one step from
    ``hidden [B, S]`` (zeros when None) and returns ``(out, value, hidden')``."""

    num_actions: int  # continuous: the action dimensions
    width: int = 128  # H: the embedding's and the cell's width
    actor_widths: Sequence[int] = (128,)
    critic_widths: Sequence[int] = (128,)
    activation: str = "tanh"
    compute_dtype: str = "float32"
    param_dtype: str = "float32"
    remat: str = "none"  # of the towers after the cell
    continuous: bool = False
    cell_type: str = "gru"  # or "lstm"

    @property
    def state_size(self) -> int:
        """``S``: the recurrent state's width (an LSTM's holds ``c`` and ``h``)."""
        return 2 * self.width if self.cell_type == "lstm" else self.width

    def setup(self):
        dtype, pdtype = compute_dtype_of(self.compute_dtype), param_dtype_of(self.param_dtype)
        self.embedding = nn.Dense(
            self.width,
            kernel_init=_boxed(nn.initializers.orthogonal(np.sqrt(2)), (None, "recurrent")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("recurrent",)),
            dtype=dtype,
            param_dtype=pdtype,
        )
        cell = CELLS[self.cell_type](
            self.width,
            kernel_init=_boxed(nn.initializers.lecun_normal(), (None, "recurrent")),
            recurrent_kernel_init=_boxed(nn.initializers.orthogonal(), (None, "recurrent")),
            bias_init=nn.with_logical_partitioning(nn.initializers.zeros_init(), ("recurrent",)),
            dtype=dtype,
            param_dtype=pdtype,
        )
        setattr(self, self.cell_type, cell)  # the parameters' name: "gru" or "lstm"
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

    @property
    def _cell(self):
        return getattr(self, self.cell_type)

    def cell(self, hidden, x):
        """One step: ``hidden [B@batch, S]``, ``x [B@batch, H]`` -> ``hidden' [B@batch, S]``
        float32."""
        return self._cell.step(hidden, self._cell.gates(x))

    def cells(self, hidden, x, starts):
        """The cell over a sequence: ``hidden [B, S]``, ``x [T, B, H]``, ``starts [T, B]`` (the
        state is zeroed before step ``t``) -> states after every step ``[T, B, S]`` float32."""
        return self._cell.scan(hidden, self._cell.gates(x), starts)

    def heads(self, hidden):
        """``hidden [..., S]`` -> ``(policy output [..., A], value [...])`` (an LSTM's heads
        read its ``h``, the state's last ``H``)."""
        hidden = hidden[..., self.state_size - self.width :]
        lead = hidden.shape[:-1]
        out, value = self.core(hidden.reshape(-1, hidden.shape[-1]))
        reshape = lambda y: y.reshape(*lead, *y.shape[1:])  # noqa: E731
        return jax.tree.map(reshape, out), reshape(value)

    def __call__(self, obs, hidden=None):
        if hidden is None:
            hidden = jnp.zeros((obs.shape[0], self.state_size), jnp.float32)
        hidden = self.cell(hidden, self.embed(obs))
        out, value = self.heads(hidden)
        return out, value, hidden


def unroll(network: RecurrentActorCritic, params, obs, ends, hidden):
    """A sequence from its first hidden state: ``obs [T, B, D]``, ``ends [T, B]`` (step ``t``
    ended an episode: the state after it is reset to zeros), ``hidden [B, S]`` -> ``(policy
    output [T, B, ...], value [T, B])``, the same numbers as stepping ``__call__`` ``T`` times
    with the resets in between. Only the recurrent matmul runs in a ``lax.scan``."""
    x = network.apply(params, obs, method="embed")
    # The reset after step t-1 is applied before step t: each step's output is then its carry,
    # which makes BPTT on CPU ~25 % faster than resetting after the cell (same numbers).
    starts = jnp.concatenate([jnp.zeros_like(ends[:1]), ends[:-1]], axis=0)
    states = network.apply(params, hidden, x, starts, method="cells")
    return network.apply(params, states, method="heads")
