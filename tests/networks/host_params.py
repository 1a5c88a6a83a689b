"""Helpers shared by the network tests."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


def draw_host_params(network, obs):
    """float32 parameters of ``network.init``'s shapes, drawn on the host (no initialiser
    compiles): ``1/sqrt(fan_in)`` normal kernels, ``0.1`` normal elsewhere."""
    abstract = nn.meta.unbox(jax.eval_shape(network.init, jax.random.key(0), obs))
    rng = np.random.default_rng(0)

    def draw(x):
        scale = 1 / np.sqrt(x.shape[0]) if x.ndim == 2 else 0.1
        return jnp.asarray(scale * rng.standard_normal(x.shape), jnp.float32)

    return jax.tree.map(draw, abstract)
