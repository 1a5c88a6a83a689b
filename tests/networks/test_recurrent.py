"""The cells of the recurrent actor-critic: Flax ``GRUCell``'s and ``LSTMCell``'s parameters and
numbers (checkpoints stay interchangeable), a numpy reference for one step of each, and
``unroll`` equal to stepping the network with the resets in between."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.networks.recurrent import GRU, LSTM, RecurrentActorCritic, unroll

H = 16
INITS = dict(
    kernel_init=nn.initializers.lecun_normal(),
    recurrent_kernel_init=nn.initializers.orthogonal(),
    bias_init=nn.initializers.normal(0.1),  # non-zero, so the biases are checked too
)
B = 5


def one_step(module, hidden, x):
    return module.step(hidden, module.gates(x))


def sigmoid(v):
    return 1.0 / (1.0 + np.exp(-v))


def numpy_gru(p, h, x):
    dense = lambda name, v: v @ p[name]["kernel"] + p[name].get("bias", 0.0)  # noqa: E731
    r = sigmoid(dense("ir", x) + dense("hr", h))
    z = sigmoid(dense("iz", x) + dense("hz", h))
    n = np.tanh(dense("in", x) + r * dense("hn", h))
    return (1 - z) * n + z * h


def numpy_lstm(p, state, x):
    c, h = state[:, :H], state[:, H:]
    dense = lambda name, v: v @ p[name]["kernel"] + p[name].get("bias", 0.0)  # noqa: E731
    i, f, g, o = (dense("i" + k, x) + dense("h" + k, h) for k in "ifgo")
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return np.concatenate([c, sigmoid(o) * np.tanh(c)], axis=1)


# name -> (Flax's cell, ours, the state's width, the numpy step, Flax's carry from our state,
# our state from Flax's carry)
CELLS = {
    "gru": (nn.GRUCell, GRU, H, numpy_gru, lambda s: s, lambda carry: carry),
    "lstm": (
        nn.LSTMCell,
        LSTM,
        2 * H,
        numpy_lstm,
        lambda s: (s[:, :H], s[:, H:]),  # LSTMCell's carry is (c, h)
        lambda carry: jnp.concatenate(carry, axis=1),
    ),
}


@pytest.fixture(scope="module", params=sorted(CELLS))
def cells(request):
    flax_cell, our_cell, width, numpy_step, to_carry, from_carry = CELLS[request.param]
    state = jax.random.normal(jax.random.key(1), (B, width))
    x = jax.random.normal(jax.random.key(2), (B, H))
    reference, ours = flax_cell(H, **INITS), our_cell(H, **INITS)
    params = reference.init(jax.random.key(0), to_carry(state), x)
    return reference, ours, params, state, x, numpy_step, to_carry, from_carry


def test_each_cell_has_flax_cells_parameters_and_initial_values(cells):
    reference, ours, params, state, x, *_ = cells
    ours_params = ours.init(jax.random.key(0), state, x, method=one_step)
    assert jax.tree.structure(ours_params) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(ours_params), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(a, b)


def test_one_step_matches_the_flax_cell_and_numpy(cells):
    reference, ours, params, state, x, numpy_step, to_carry, from_carry = cells
    carry, _ = reference.apply(params, to_carry(state), x)
    got = ours.apply(params, state, x, method=one_step)
    np.testing.assert_allclose(got, from_carry(carry), rtol=1e-5, atol=1e-6)

    p = jax.tree.map(np.asarray, params["params"])
    expected = numpy_step(p, np.asarray(state, np.float64), np.asarray(x, np.float64))
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cell", sorted(CELLS))
def test_unroll_equals_stepping_with_resets_after_episode_ends(cell):
    net = RecurrentActorCritic(
        num_actions=3, width=H, actor_widths=(8,), critic_widths=(8,), cell_type=cell
    )
    assert net.state_size == CELLS[cell][2]
    t, b = 12, 3
    obs = jax.random.normal(jax.random.key(3), (t, b, 4))
    ends = jnp.zeros((t, b), bool).at[4, 0].set(True).at[5, 1].set(True).at[11, 2].set(True)
    hidden0 = jax.random.normal(jax.random.key(4), (b, net.state_size))
    params = net.init(jax.random.key(5), obs[0], hidden0)
    assert set(params["params"]) == {"embedding", cell, "core"}
    logits, value = jax.jit(lambda p: unroll(net, p, obs, ends, hidden0))(params)

    hidden = hidden0
    for step in range(t):
        out, v, hidden = net.apply(params, obs[step], hidden)
        np.testing.assert_allclose(logits[step], out, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(value[step], v, rtol=1e-5, atol=1e-5)
        hidden = jnp.where(ends[step][:, None], 0.0, hidden)
