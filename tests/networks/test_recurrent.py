"""The GRU of the recurrent actor-critic: Flax ``GRUCell``'s parameters and numbers (checkpoints
stay interchangeable), a numpy reference for one step, and ``unroll`` equal to stepping the
network with the resets in between."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.networks.recurrent import GRU, RecurrentActorCritic, unroll

H = 16
INITS = dict(
    kernel_init=nn.initializers.lecun_normal(),
    recurrent_kernel_init=nn.initializers.orthogonal(),
    bias_init=nn.initializers.normal(0.1),  # non-zero, so the biases are checked too
)


def one_step(module, hidden, x):
    return module.step(hidden, module.gates(x))


@pytest.fixture(scope="module")
def cells():
    hidden = jax.random.normal(jax.random.key(1), (5, H))
    x = jax.random.normal(jax.random.key(2), (5, H))
    reference, ours = nn.GRUCell(H, **INITS), GRU(H, **INITS)
    params = reference.init(jax.random.key(0), hidden, x)
    return reference, ours, params, hidden, x


def test_the_gru_has_gru_cells_parameters_and_initial_values(cells):
    reference, ours, params, hidden, x = cells
    ours_params = ours.init(jax.random.key(0), hidden, x, method=one_step)
    assert jax.tree.structure(ours_params) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(ours_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_one_gru_step_matches_gru_cell_and_numpy(cells):
    reference, ours, params, hidden, x = cells
    expected, _ = reference.apply(params, hidden, x)
    got = ours.apply(params, hidden, x, method=one_step)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)

    p = jax.tree.map(np.asarray, params["params"])
    h, xs = np.asarray(hidden, np.float64), np.asarray(x, np.float64)
    sigmoid = lambda v: 1.0 / (1.0 + np.exp(-v))  # noqa: E731
    dense = lambda name, v: v @ p[name]["kernel"] + p[name].get("bias", 0.0)  # noqa: E731
    r = sigmoid(dense("ir", xs) + dense("hr", h))
    z = sigmoid(dense("iz", xs) + dense("hz", h))
    n = np.tanh(dense("in", xs) + r * dense("hn", h))
    np.testing.assert_allclose(got, (1 - z) * n + z * h, rtol=1e-5, atol=1e-5)


def test_unroll_equals_stepping_with_resets_after_episode_ends():
    net = RecurrentActorCritic(num_actions=3, width=H, actor_widths=(8,), critic_widths=(8,))
    t, b = 12, 3
    obs = jax.random.normal(jax.random.key(3), (t, b, 4))
    ends = jnp.zeros((t, b), bool).at[4, 0].set(True).at[5, 1].set(True).at[11, 2].set(True)
    hidden0 = jax.random.normal(jax.random.key(4), (b, H))
    params = net.init(jax.random.key(5), obs[0], hidden0)
    logits, value = jax.jit(lambda p: unroll(net, p, obs, ends, hidden0))(params)

    hidden = hidden0
    for step in range(t):
        out, v, hidden = net.apply(params, obs[step], hidden)
        np.testing.assert_allclose(logits[step], out, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(value[step], v, rtol=1e-5, atol=1e-5)
        hidden = jnp.where(ends[step][:, None], 0.0, hidden)
