"""Draws built from one ``jax.random.bits`` call.

On CPU every ``jax.random`` sampler runs threefry as a loop, and ``randint`` runs it twice (it
splits the key for a high and a low word), so in a small per-step program the number of
sampler calls, not the number of bits, is what costs. These helpers turn one call's uint32 words
into the draws a step needs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

_ONE_BITS = np.array(1.0, np.float32).view(np.uint32)


def uniform_from_bits(bits: jax.Array) -> jax.Array:
    """uint32 words -> float32 uniforms in ``[0, 1)``, as ``jax.random.uniform`` makes them
    (the top 23 bits as the mantissa of a float in ``[1, 2)``, minus 1)."""
    mantissa = jnp.right_shift(bits, jnp.uint32(9)) | _ONE_BITS
    return jax.lax.bitcast_convert_type(mantissa, jnp.float32) - 1.0


def index_from_bits(bits: jax.Array, n) -> jax.Array:
    """uint32 words -> int32 indices uniform in ``[0, n)`` (``n`` >= 1, traced or static).

    Modulo reduction: an index is drawn with probability ``floor(2**32 / n) / 2**32`` or one
    ``2**-32`` more, a relative bias below ``n / 2**32`` (2e-4 at a million entries), the same
    order as ``jax.random.randint``'s documented bias.
    """
    return (bits % jnp.asarray(n).astype(jnp.uint32)).astype(jnp.int32)
