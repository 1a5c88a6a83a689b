"""Policy distributions, written with ``jax.nn``/``jax.numpy``.

Categorical over ``logits: [..., A]`` (the module-level ``log_prob``/``entropy``/``sample``), and a
diagonal Gaussian over ``(mean, log_std)``, both ``[..., A]``, for continuous (Box) action spaces.
``for_spec`` picks one from the environment's action space; algorithms use the returned object's
``sample``/``log_prob``/``entropy``/``mode`` on the network's policy output and ``env_action`` on
what the environment receives.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

SQUASHES = ("none", "tanh")
_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def log_prob(logits: jax.Array, actions: jax.Array) -> jax.Array:
    """``logits: [..., A]``, ``actions: [...]`` int -> ``[...]``."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_p, actions[..., None].astype(jnp.int32), axis=-1)[..., 0]


def entropy(logits: jax.Array) -> jax.Array:
    """``[..., A]`` -> ``[...]``: ``-sum p log p``."""
    log_p = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_p) * log_p, axis=-1)


def sample(key: jax.Array, logits: jax.Array) -> jax.Array:
    """One action per row: ``[..., A]`` -> ``[...]`` int32."""
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


def gaussian_log_prob(mean: jax.Array, log_std: jax.Array, x: jax.Array) -> jax.Array:
    """Diagonal Gaussian density of ``x``: ``[..., A]`` each -> ``[...]`` (summed over ``A``)."""
    z = (x - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - _HALF_LOG_2PI, axis=-1)


def gaussian_entropy(log_std: jax.Array) -> jax.Array:
    """``[..., A]`` -> ``[...]``: ``sum_a log_std_a + 1/2 log(2 pi e)``."""
    return jnp.sum(log_std + 0.5 + _HALF_LOG_2PI, axis=-1)


def tanh_log_det(u: jax.Array) -> jax.Array:
    """``log |d tanh(u) / du|`` summed over the last axis: ``[..., A]`` -> ``[...]``.

    ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``: finite where ``tanh(u)`` rounds to 1.
    """
    return jnp.sum(2.0 * (math.log(2.0) - u - jax.nn.softplus(-2.0 * u)), axis=-1)


@dataclasses.dataclass(frozen=True)
class Categorical:
    """Discrete actions: the policy output is ``logits [B, A]``; actions ``[B]`` int32."""

    num_actions: int = 0  # A (for ``noise``)
    continuous = False
    action_shape: tuple[int, ...] = ()
    action_dtype = jnp.int32

    def sample(self, key, logits):
        return sample(key, logits)

    def noise(self, key, lead: tuple[int, ...]) -> jax.Array:
        """Gumbel noise ``[*lead, A]`` for ``sample_with``, drawn for a whole rollout at once:
        on CPU each random draw is a rolled loop of its own, so one draw of ``[T, B, A]`` costs
        about what one of ``[B, A]`` does."""
        return jax.random.gumbel(key, (*lead, self.num_actions), jnp.float32)

    def sample_with(self, noise, logits):
        """``jax.random.categorical``'s own Gumbel-max, on ``noise`` drawn beforehand."""
        return jnp.argmax(logits + noise, axis=-1).astype(jnp.int32)

    def log_prob(self, logits, action):
        return log_prob(logits, action)

    def entropy(self, logits):
        return entropy(logits)

    def mode(self, logits):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def env_action(self, action):
        return action


@dataclasses.dataclass(frozen=True)
class DiagGaussian:
    """Continuous actions in the Box ``[low, high]`` (``[A]`` each): the policy output is
    ``(mean, log_std)``, both ``[B, A]``. Actions ``[B, A]`` float32 are the *raw* samples: the
    trajectory stores them, and their log-probability.

    ``squash="none"``: the raw Gaussian sample; the environment receives it clipped to the
    bounds, and the log-probability is the unclipped sample's (clipping is part of the
    environment, not the policy). ``squash="tanh"``: the environment receives
    ``low + (tanh(u) + 1) (high - low) / 2``, and the log-probability is the density of that
    action: the Gaussian's minus the log-determinant of the squashing and rescaling. The entropy
    (bonus and metric) is the Gaussian's in both cases: the squashed distribution's has no closed
    form."""

    low: tuple[float, ...]
    high: tuple[float, ...]
    squash: str = "none"
    continuous = True
    action_dtype = jnp.float32

    @property
    def action_shape(self) -> tuple[int, ...]:
        return (len(self.low),)

    def sample(self, key, out):
        mean, log_std = out
        return self.sample_with(jax.random.normal(key, mean.shape, mean.dtype), out)

    def noise(self, key, lead: tuple[int, ...]) -> jax.Array:
        """Standard normal noise ``[*lead, A]`` for ``sample_with``."""
        return jax.random.normal(key, (*lead, *self.action_shape), jnp.float32)

    def sample_with(self, noise, out):
        mean, log_std = out
        return mean + jnp.exp(log_std) * noise

    def log_prob(self, out, action):
        mean, log_std = out
        lp = gaussian_log_prob(mean, log_std, action)
        if self.squash == "tanh":
            half_range = sum(
                math.log((h - lo) / 2.0) for lo, h in zip(self.low, self.high, strict=True)
            )
            lp = lp - tanh_log_det(action) - half_range
        return lp

    def entropy(self, out):
        return gaussian_entropy(out[1])

    def mode(self, out):
        return out[0]

    def env_action(self, action):
        low, high = jnp.asarray(self.low, jnp.float32), jnp.asarray(self.high, jnp.float32)
        if self.squash == "tanh":
            return low + (jnp.tanh(action) + 1.0) * (high - low) / 2.0
        return jnp.clip(action, low, high)


def for_spec(spec, squash: str = "none") -> Categorical | DiagGaussian:
    """The policy distribution of environment ``spec`` (an ``EnvSpec``): categorical for a
    discrete action space, a diagonal Gaussian for a Box (``squash`` applies to it only)."""
    if not spec.continuous:
        return Categorical(spec.num_actions)
    return DiagGaussian(tuple(spec.action_low), tuple(spec.action_high), squash)
