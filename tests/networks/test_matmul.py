"""``rljax.networks.matmul``: a narrow contraction over few rows is computed as multiply-adds whose
values, gradients and tangents match a dot's (numpy reference), and every other call is the dot
itself; the networks acting in a few environments take that path. A narrow output layer (a head)
is the dot, with its weight gradient as one vector-matrix product per output."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.networks import ActorCritic, matmul
from tests.networks.jaxprs import all_equations

DIMS = (((1,), (0,)), ((), ()))  # nn.Dense's: x [rows, K] . kernel [K, N]


def draw(rows, k, n, dtype=jnp.float32):
    x = jax.random.normal(jax.random.key(0), (rows, k), dtype)
    kernel = jax.random.normal(jax.random.key(1), (k, n), dtype)
    return x, kernel


def dots_in(fn, *args) -> int:
    """The dots in ``fn``'s lowered program (multiply-adds lower to none)."""
    return jax.jit(fn).lower(*args).as_text().count("stablehlo.dot_general")


@pytest.mark.parametrize("rows,k", [(1, 1), (4, 4), (32, 8), (3, 2)])
def test_multiply_adds_equal_the_numpy_product(rows, k):
    x, kernel = draw(rows, k, 7)
    assert dots_in(lambda x, w: matmul.dot_general(x, w, DIMS), x, kernel) == 0
    out = jax.jit(lambda x, w: matmul.dot_general(x, w, DIMS))(x, kernel)
    want = np.asarray(x, np.float64) @ np.asarray(kernel, np.float64)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "rows,k,dtype",
    [(33, 4, jnp.float32), (4, 9, jnp.float32), (4, 4, jnp.bfloat16)],
    ids=["many-rows", "wide-contraction-narrow-output", "bfloat16"],
)
def test_other_shapes_and_dtypes_are_the_dot_itself(rows, k, dtype):
    x, kernel = draw(rows, k, 7, dtype)
    fn = lambda x, w: matmul.dot_general(x, w, DIMS)  # noqa: E731
    assert dots_in(fn, x, kernel) == 1
    np.testing.assert_array_equal(
        np.asarray(jax.jit(fn)(x, kernel), np.float32),
        np.asarray(jax.jit(lambda x, w: jax.lax.dot_general(x, w, DIMS))(x, kernel), np.float32),
    )


def test_gradients_and_tangents_equal_the_dots_and_are_computed_by_dots():
    x, kernel = draw(4, 4, 5)

    def loss(product):
        return lambda x, w: jnp.sum(jnp.tanh(product(x, w)) ** 2)

    mine, dot = loss(lambda x, w: matmul.dot_general(x, w, DIMS)), loss(jnp.matmul)
    for argnums in (0, 1, (0, 1)):
        got, want = jax.grad(mine, argnums)(x, kernel), jax.grad(dot, argnums)(x, kernel)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), got, want)
    tangent = jax.random.normal(jax.random.key(2), kernel.shape)
    _, got = jax.jvp(lambda w: mine(x, w), (kernel,), (tangent,))
    _, want = jax.jvp(lambda w: dot(x, w), (kernel,), (tangent,))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(
        jax.hessian(mine, 1)(x, kernel), jax.hessian(dot, 1)(x, kernel), rtol=1e-4, atol=1e-5
    )
    # The weight gradient is a dot (one over the batch), not K reductions of broadcast products.
    backward = str(jax.make_jaxpr(jax.grad(mine, 1))(x, kernel)).split("custom_jvp_call")[-1]
    assert "dot_general" in backward and "reduce_sum[axes=(0,)" not in backward


def test_vmapped_seeds_equal_each_seed_alone():
    x, kernel = draw(4, 4, 6)
    kernels = jnp.stack([kernel, -2.0 * kernel])
    batched = jax.vmap(lambda w: matmul.dot_general(x, w, DIMS))(kernels)
    for seed in range(2):
        np.testing.assert_array_equal(batched[seed], matmul.dot_general(x, kernels[seed], DIMS))


def test_the_policy_acting_in_four_environments_takes_multiply_adds_and_agrees_with_a_batch():
    """CartPole's 4 features over 4 environments: multiply-adds; the same observations inside a
    batch of 64 go through the dot, and both give the same logits and values to float32 rounding."""
    net = ActorCritic(num_actions=2, actor_widths=(64, 64), critic_widths=(64, 64))
    obs = jax.random.normal(jax.random.key(3), (64, 4))
    params = jax.jit(net.init)(jax.random.key(4), obs[:4])
    # Both towers' first layers: 2 dots fewer in 4 environments than in a batch of 64.
    assert dots_in(net.apply, params, obs) - dots_in(net.apply, params, obs[:4]) == 2
    small, large = jax.jit(net.apply)(params, obs[:4]), jax.jit(net.apply)(params, obs)
    for a, b in zip(small, large, strict=True):
        np.testing.assert_allclose(a, b[:4], rtol=1e-5, atol=1e-6)


def test_an_exported_symbolic_batch_takes_the_dot():
    """``rljax export`` traces the policy for any batch (``b``): its size is unknown, so the dot."""
    _, kernel = draw(4, 4, 6)
    batch = jax.ShapeDtypeStruct(jax.export.symbolic_shape("b, 4"), jnp.float32)
    exported = jax.export.export(jax.jit(lambda x, w: matmul.dot_general(x, w, DIMS)))(
        batch, kernel
    )
    assert "stablehlo.dot_general" in exported.mlir_module()
    for rows in (3, 100):
        x, _ = draw(rows, 4, 6)
        np.testing.assert_allclose(exported.call(x, kernel), x @ kernel, rtol=1e-6, atol=1e-6)


def test_vmapped_large_batches_multiply_and_add_and_match_the_dot_and_its_gradients():
    """Over more than SMALL_ROWS rows one call is a dot, but vmapped over two or more (seeds,
    emulated replicas) it multiplies and adds: values, gradients and tangents equal each seed's
    dot."""
    x, kernel = draw(64, 4, 6)
    kernels = jnp.stack([kernel, -0.5 * kernel, 2.0 * kernel])
    fn = lambda w: matmul.dot_general(x, w, DIMS)  # noqa: E731
    assert "dot_general" in str(jax.make_jaxpr(jax.jit(fn))(kernel))
    lowered = jax.jit(jax.vmap(fn)).lower(kernels).as_text()
    assert "dot_general" not in lowered and "multiply" in lowered
    # One seed (a vmap of size 1) keeps the dot, which is faster there.
    assert "dot_general" in jax.jit(jax.vmap(fn)).lower(kernels[:1]).as_text()

    def loss(w, x):
        return jnp.sum(jnp.tanh(matmul.dot_general(x, w, DIMS)) ** 2)

    def reference(w, x):
        return jnp.sum(jnp.tanh(x @ w) ** 2)

    xs = jnp.stack([x, x + 1.0, x * 0.5])
    for transform in (jax.vmap, lambda f: jax.vmap(jax.vmap(f, (None, 0)), (0, None))):
        got = transform(jax.value_and_grad(loss, (0, 1)))(kernels, xs)
        want = transform(jax.value_and_grad(reference, (0, 1)))(kernels, xs)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), got, want)
    tangent = jnp.ones_like(kernels)
    got = jax.vmap(lambda w, t: jax.jvp(lambda w: loss(w, x), (w,), (t,)))(kernels, tangent)
    want = jax.vmap(lambda w, t: jax.jvp(lambda w: reference(w, x), (w,), (t,)))(kernels, tangent)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # Second order: jacfwd vmaps over a basis the multiply-adds' inputs may not depend on.
    np.testing.assert_allclose(
        jax.hessian(loss)(kernel, x), jax.hessian(reference)(kernel, x), rtol=1e-4, atol=1e-4
    )


def uses_narrow_output(fn, *args) -> bool:
    return "narrow_output" in str(jax.make_jaxpr(fn)(*args))


@pytest.mark.parametrize(
    "rows,k,n,dtype,narrow",
    [
        (128, 84, 2, jnp.float32, True),
        (4, 64, 8, jnp.float32, True),
        (128, 64, 1, jnp.float32, False),
        (128, 64, 9, jnp.float32, False),
        (128, 64, 2, jnp.bfloat16, False),
    ],
    ids=["q-head", "8-outputs", "one-output", "9-outputs", "bfloat16"],
)
def test_narrow_output_layers_take_narrow_output_and_compute_the_dot(rows, k, n, dtype, narrow):
    """2 to SMALL_OUTPUTS float32 outputs (over a contraction wider than SMALL_CONTRACTION) take
    narrow_output, whose value is the dot's bit for bit; others are the dot itself."""
    x, kernel = draw(rows, k, n, dtype)
    fn = lambda x, w: matmul.dot_general(x, w, DIMS)  # noqa: E731
    assert uses_narrow_output(fn, x, kernel) == narrow
    np.testing.assert_array_equal(
        np.asarray(jax.jit(fn)(x, kernel), np.float32),
        np.asarray(jax.jit(lambda x, w: jax.lax.dot_general(x, w, DIMS))(x, kernel), np.float32),
    )


def test_narrow_output_gradients_and_tangents_match_numpy_and_the_weight_gradient_is_by_column():
    """The Q head's shape (128 rows, 84 features, 2 actions): gradients against a float64 numpy
    reference, tangents and Hessians against the dot's, unbatched and under a vmap of seeds. Reverse
    mode computes the kernel's gradient as one vector-matrix product per output ``[rows] x [rows,
    K] -> [K]``, never a dot of the ``[rows, 2]`` cotangent."""
    x, kernel = draw(128, 84, 2)
    target = jax.random.normal(jax.random.key(5), (128, 2))

    def loss(product):
        return lambda x, w: 0.5 * jnp.sum((product(x, w) - target) ** 2)

    mine, dot = loss(lambda x, w: matmul.dot_general(x, w, DIMS)), loss(jnp.matmul)
    gx, gw = jax.jit(jax.grad(mine, (0, 1)))(x, kernel)
    x64, w64 = np.asarray(x, np.float64), np.asarray(kernel, np.float64)
    residual = x64 @ w64 - np.asarray(target, np.float64)
    np.testing.assert_allclose(gw, x64.T @ residual, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(gx, residual @ w64.T, rtol=1e-4, atol=1e-3)
    tangent = jax.random.normal(jax.random.key(6), kernel.shape)
    _, got = jax.jvp(lambda w: mine(x, w), (kernel,), (tangent,))
    _, want = jax.jvp(lambda w: dot(x, w), (kernel,), (tangent,))
    np.testing.assert_allclose(got, want, rtol=1e-4)
    small_x, small_w = x[:8, :12], kernel[:12]

    def curved(product):
        return lambda w: jnp.sum(jnp.tanh(product(small_x, w)) ** 2)

    np.testing.assert_allclose(
        jax.hessian(curved(lambda x, w: matmul.dot_general(x, w, DIMS)))(small_w),
        jax.hessian(curved(jnp.matmul))(small_w),
        rtol=1e-4,
        atol=1e-4,
    )
    kernels = jnp.stack([kernel, -0.5 * kernel, 2.0 * kernel])
    got = jax.vmap(jax.value_and_grad(mine, (0, 1)), (None, 0))(x, kernels)
    want = jax.vmap(jax.value_and_grad(dot, (0, 1)), (None, 0))(x, kernels)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-3), got, want)

    weight_grad = jax.make_jaxpr(jax.grad(mine, 1))(x, kernel)
    dots = [e for e in all_equations(weight_grad.jaxpr) if e.primitive.name == "dot_general"]
    to_kernel = [e for e in dots if e.outvars[0].aval.shape == (84,)]
    assert len(to_kernel) == 2  # one per action
    assert not any(e.outvars[0].aval.shape == (84, 2) for e in dots)


def test_a_q_network_takes_narrow_output_for_its_head_only():
    """DQN's CartPole Q-network: the 2-action head is narrow_output; its hidden layers are not."""
    from rljax import DQN, DQNConfig

    dqn = DQN(DQNConfig())
    params = dqn.init_params(jax.random.key(0))
    jaxpr = jax.make_jaxpr(dqn.network.apply)(params, jnp.ones((128, 4)))
    assert str(jaxpr).count("name=narrow_output") == 1
