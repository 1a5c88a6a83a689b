"""Gradient synchronisation strategies: equivalences, divergence, error feedback, int8 bounds."""

import dataclasses

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import PPO, PPOConfig
from rljax.errors import ConfigError
from rljax.networks import ActorCritic
from rljax.parallel import compression, make_mesh
from rljax.parallel.learner import Learner
from rljax.parallel.replicas import per_replica
from rljax.parallel.sync import SyncConfig, tree_norm, validate_sync
from rljax.parallel.sync.compressed import compression_groups
from rljax.run.sharded import ShardedRun

TINY = PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 16 * 2, num_minibatches=2)


# -- one optimizer step on a fixed global batch --------------------------------------------------
def make_learner(strategy="allreduce", replicas=1, **sync):
    net = ActorCritic(num_actions=3, actor_widths=(16, 16), critic_widths=(16, 16))
    boxed = jax.eval_shape(net.init, jax.random.key(0), jnp.zeros((1, 5)))
    opt = optax.chain(optax.clip_by_global_norm(0.5), optax.adam(1e-2))
    learner = Learner(opt, SyncConfig(strategy, **sync), replicas, boxed)
    params = nn.meta.unbox(net.init(jax.random.key(0), jnp.zeros((1, 5))))

    def loss(params, batch):  # a per-sample mean: the replicas' mean is the global mean
        logits, value = net.apply(params, batch["obs"])
        logp = jax.nn.log_softmax(logits)[jnp.arange(batch["obs"].shape[0]), batch["action"]]
        return -(logp * batch["ret"]).mean() + jnp.square(value - batch["ret"]).mean(), {}

    return learner, params, opt.init(params), loss


def global_batch(n=32, seed=1):
    k1, k2, k3 = jax.random.split(jax.random.key(seed), 3)
    return {
        "obs": jax.random.normal(k1, (n, 5)),
        "action": jax.random.randint(k2, (n,), 0, 3),
        "ret": jax.random.normal(k3, (n,)),
    }


def sgd_steps(learner, params, opt_state, loss, batches):
    """Run ``learner.step`` on each ``[R, n, ...]`` batch; returns the final state and history."""
    params, opt_state, sync = learner.init(params, opt_state)

    @jax.jit
    def step(params, opt_state, sync, batch):
        (_, _), grads = learner.grads(loss, params, batch)
        return learner.step(params, opt_state, sync, grads)

    history = []
    for batch in batches:
        params, opt_state, sync, metrics = step(params, opt_state, sync, batch)
        history.append((params, metrics))
    return params, opt_state, sync, history


def split(batch, replicas):
    return jax.tree.map(lambda x: x.reshape(replicas, -1, *x.shape[1:]), batch)


def test_allreduce_on_data4_equals_one_device_on_the_global_batch():
    batch = global_batch()
    learner, params, opt_state, loss = make_learner(replicas=1)
    expected, *_ = sgd_steps(learner, params, opt_state, loss, [split(batch, 1)])
    mesh = make_mesh("data=4,model=1")
    learner4, *_ = make_learner(replicas=4)
    with jax.set_mesh(mesh):
        sharded, *_ = sgd_steps(learner4, params, opt_state, loss, [split(batch, 4)])
    chex.assert_trees_all_close(sharded, expected, atol=1e-5, rtol=1e-5)


def test_local_sgd_diverges_between_averages_and_is_equal_right_after():
    period = 3
    learner, params, opt_state, loss = make_learner("local_sgd", 4, period=period)
    batches = [split(global_batch(seed=i), 4) for i in range(2 * period)]
    with jax.set_mesh(make_mesh("data=4,model=1")):
        _, _, sync, history = sgd_steps(learner, params, opt_state, loss, batches)
    for step, (params_r, metrics) in enumerate(history, start=1):
        kernel = np.asarray(params_r["params"]["critic"]["dense_0"]["kernel"])
        spread = np.abs(kernel - kernel[:1]).max()
        if step % period == 0:
            assert spread == 0.0 and int(metrics["synced"]) == 1, step
        else:
            assert spread > 1e-4 and int(metrics["synced"]) == 0, step
    assert int(sync["syncs"]) == 2


def test_adaptive_synchronises_on_divergence_and_max_period():
    learner, params, opt_state, loss = make_learner("adaptive", 4, threshold=1e9, max_period=2)
    batches = [split(global_batch(seed=i), 4) for i in range(4)]
    _, _, sync, history = sgd_steps(learner, params, opt_state, loss, batches)
    assert [int(m["synced"]) for _, m in history] == [0, 1, 0, 1]  # only max_period triggers
    learner, *_ = make_learner("adaptive", 4, threshold=0.0, max_period=100)
    _, _, sync, history = sgd_steps(learner, params, opt_state, loss, batches)
    # Step 1 starts undiverged (no sync); any drift then exceeds a zero threshold.
    assert [int(m["synced"]) for _, m in history] == [0, 1, 0, 1]
    assert float(history[0][1]["divergence"]) == 0.0 and float(history[2][1]["divergence"]) == 0.0
    assert int(sync["syncs"]) == 2


def test_stale_applies_gradients_late():
    batches = [split(global_batch(seed=i), 2) for i in range(3)]
    learner, params, opt_state, loss = make_learner("stale", 2, staleness=2)
    _, _, _, history = sgd_steps(learner, params, opt_state, loss, batches)
    chex.assert_trees_all_equal(history[1][0], params)  # nothing applied for tau steps
    reference, *_ = make_learner("allreduce", 2)
    _, _, _, ref_history = sgd_steps(reference, params, opt_state, loss, batches[:1])
    # The first gradient (computed on the initial parameters) lands at step tau + 1.
    chex.assert_trees_all_close(history[2][0], ref_history[0][0], atol=1e-6)


# -- whole PPO updates: strategies that must equal allreduce -----------------------------------
@pytest.fixture(scope="module")
def ppo_allreduce_data4():
    return run_ppo(TINY, "data=4,model=1", replicas=4)


def run_ppo(config, mesh_spec, replicas, updates=2):
    run = ShardedRun(PPO(config, replicas=replicas), make_mesh(mesh_spec), chunk_size=updates)
    state, metrics = run.run_chunk(run.init(jax.random.key(3)), updates)
    return jax.device_get(state), jax.device_get(metrics)


def replica0(params):
    return jax.tree.map(lambda x: x[0], params)


@pytest.mark.parametrize(
    "sync",
    [SyncConfig("local_sgd", period=1), SyncConfig("stale", staleness=0)],
    ids=["local_sgd-K1", "stale-tau0"],
)
def test_degenerate_settings_equal_allreduce(ppo_allreduce_data4, sync):
    expected_state, expected_metrics = ppo_allreduce_data4
    state, metrics = run_ppo(dataclasses.replace(TINY, sync=sync), "data=4,model=1", 4)
    params = replica0(state.params) if sync.strategy == "local_sgd" else state.params
    chex.assert_trees_all_close(params, expected_state.params, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(metrics["loss"], expected_metrics["loss"], atol=1e-5, rtol=1e-5)


def test_data4_mesh_equals_four_replicas_emulated_on_one_device(ppo_allreduce_data4):
    expected_state, expected_metrics = ppo_allreduce_data4
    state, metrics = run_ppo(TINY, "data=1,model=1", replicas=4)
    chex.assert_trees_all_close(state.params, expected_state.params, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(metrics, expected_metrics, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("strategy", ["local_sgd", "compressed"])
def test_strategies_keep_tensor_parallel_sharding(strategy):
    config = dataclasses.replace(TINY, sync=SyncConfig(strategy, period=2))
    mesh = make_mesh("data=2,model=2")
    run = ShardedRun(PPO(config, replicas=2), mesh, chunk_size=2)
    state, metrics = run.run_chunk(run.init(jax.random.key(0)), 2)
    kernel = state.params["params"]["actor"]["dense_0"]["kernel"]
    expected = ("replica", None, "model") if strategy == "local_sgd" else (None, "model")
    expected = tuple("data" if a == "replica" else a for a in expected)
    assert tuple(kernel.sharding.spec)[: len(expected)] == expected
    if strategy == "compressed":
        residual = state.sync["residual"]["params"]["actor"]["dense_0"]["kernel"]
        assert tuple(residual.sharding.spec)[:3] == ("data", None, "model")
    assert np.isfinite(metrics["loss"]).all()


# -- compression: error feedback and int8 bounds -------------------------------------------------
def replicated_call(fn, v):
    """Run ``fn(v_r)`` for every row of ``v: [R, L]`` with collectives over ``data``."""
    spec = jax.P("data")
    return per_replica(fn, v.shape[0], (spec,), (jax.P(), spec))(v)


@pytest.mark.parametrize("on_mesh", [False, True])
@pytest.mark.parametrize("kind", ["int8", "topk"])
def test_error_feedback_residual_is_exactly_the_compression_error(kind, on_mesh):
    v = jax.random.normal(jax.random.key(0), (4, 1000)) * jnp.linspace(0.01, 3.0, 1000)
    if kind == "int8":
        fn = lambda x: compression.int8_mean(x, 4, 64)  # noqa: E731
    else:
        fn = lambda x: compression.topk_mean(x, 4, 0.05)  # noqa: E731
    if on_mesh:
        with jax.set_mesh(make_mesh("data=4,model=1")):
            estimate, residual = jax.jit(lambda v: replicated_call(fn, v))(v)
    else:
        estimate, residual = replicated_call(fn, v)
    v, estimate, residual = (np.asarray(x, np.float64) for x in (v, estimate, residual))
    # What the replicas meant to average, minus what they got, is what they carry forward.
    np.testing.assert_allclose(v.mean(0) - estimate, residual.mean(0), atol=1e-6)
    if kind == "topk":
        k = compression.topk_count(1000, 0.05)
        assert ((residual == 0).sum(1) == k).all()  # each replica sent exactly k entries
        assert np.count_nonzero(estimate) <= 4 * k
    else:
        assert np.abs(v.mean(0) - estimate).max() < 0.05 * np.abs(v).max()


def test_int8_round_trip_within_half_a_step():
    x = jax.random.normal(jax.random.key(1), (4096,)) * 10.0
    q, scale = compression.quantize_int8(x, 128)
    assert q.dtype == jnp.int8 and scale.shape == (32,)
    error = np.abs(np.asarray(x - compression.dequantize_int8(q, scale))).reshape(32, 128)
    assert (error <= np.asarray(scale)[:, None] / 2 + 1e-6).all()
    zeros_q, zeros_scale = compression.quantize_int8(jnp.zeros(128), 128)
    assert not np.asarray(zeros_q).any() and float(zeros_scale[0]) == 0.0


def test_bad_sync_settings_are_rejected():
    with pytest.raises(ConfigError, match="sync period must be >= 1, got 0"):
        validate_sync(SyncConfig("local_sgd", period=0))
    with pytest.raises(ConfigError, match=r"topk_fraction must be in \(0, 1\], got 1.5"):
        validate_sync(SyncConfig("compressed", topk_fraction=1.5))
    with pytest.raises(ConfigError, match="staleness must be >= 0"):
        validate_sync(SyncConfig("stale", staleness=-1))


# -- communication accounting -------------------------------------------------------------------
def data_bytes(strategy, **sync):
    """(always, on_sync) bytes per device over `data` of one compiled learner step on data=4."""
    from rljax.diagnostics.hlo import collectives

    learner, params, opt_state, loss = make_learner(strategy, 4, **sync)
    mesh = make_mesh("data=4,model=1")
    with jax.set_mesh(mesh):
        state = jax.jit(learner.init)(params, opt_state)
        batch = split(global_batch(), 4)

        def step(params, opt_state, sync, batch):
            (_, _), grads = learner.grads(loss, params, batch)
            return learner.step(params, opt_state, sync, grads)

        compiled = jax.jit(step).lower(*state, batch).compile()
    # The synchronisation's own collectives (in shard_map); metrics such as the residual norm
    # add a few bytes of scalar reductions outside it.
    ops = [
        c for c in collectives(compiled, mesh) if c.axes == ("data",) and "shard_map" in c.op_name
    ]
    always = sum(c.sent_bytes * c.multiplicity for c in ops if not c.conditional)
    on_sync = sum(c.sent_bytes * c.multiplicity for c in ops if c.conditional)
    return always, on_sync, params


@pytest.fixture(scope="module")
def allreduce_bytes():
    always, on_sync, params = data_bytes("allreduce")
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    return always, on_sync, param_bytes


def test_allreduce_bytes_are_the_ring_all_reduce_of_the_parameters(allreduce_bytes):
    always, on_sync, param_bytes = allreduce_bytes
    assert on_sync == 0
    assert always == pytest.approx(2 * 3 / 4 * param_bytes)


def test_int8_sends_about_a_quarter(allreduce_bytes):
    block = 64
    always, _, params = data_bytes("compressed", compression="int8", block_size=block)
    learner, *_ = make_learner("compressed", 4)
    sizes = [x.size for x in jax.tree.leaves(params)]
    _, groups = compression_groups(learner)
    length = sum(sizes)
    padded = sum(compression.padded_length(sum(sizes[i] for i in g), 4, block) for g in groups)
    # Two int8 stages (all_to_all, all_gather) plus one f32 scale per block, ring convention.
    assert always == pytest.approx(2 * 3 / 4 * padded * (1 + 4 / block))
    # A quarter of the f32 all-reduce, plus scales (1/16 here) and padding to whole blocks.
    ratio = always / allreduce_bytes[0]
    assert ratio == pytest.approx(0.25 * (1 + 4 / block) * padded / length)
    assert 0.25 < ratio < 0.36


def test_topk_bytes_match_k(allreduce_bytes):
    fraction = 0.05
    always, _, params = data_bytes("compressed", compression="topk", topk_fraction=fraction)
    learner, *_ = make_learner("compressed", 4)
    sizes = [x.size for x in jax.tree.leaves(params)]
    _, groups = compression_groups(learner)
    k = sum(compression.topk_count(sum(sizes[i] for i in g), fraction) for g in groups)
    assert k == pytest.approx(fraction * sum(sizes), abs=len(groups))
    assert always == pytest.approx(3 * k * (4 + 4))  # (R-1) * k * (f32 value + int32 index)


def test_local_sgd_is_amortised_over_k(allreduce_bytes):
    always, on_sync, _ = data_bytes("local_sgd", period=4)
    assert always == 0
    # A synchronising step averages the gradient and the parameters: 2 all-reduces.
    assert on_sync == pytest.approx(2 * allreduce_bytes[0])
    amortised = (always * 4 + on_sync) / 4
    assert amortised == pytest.approx(allreduce_bytes[0] * 2 / 4)


def test_tree_norm_matches_numpy_with_and_without_mesh():
    tree = {
        "w": jnp.arange(12.0).reshape(3, 4),
        "b": jnp.ones(5, jnp.bfloat16),
        "s": jnp.float32(2.0),
    }
    want = np.sqrt(np.sum(np.arange(12.0) ** 2) + 5 + 4)
    np.testing.assert_allclose(jax.jit(tree_norm)(tree), want, rtol=1e-6)
    with jax.set_mesh(make_mesh("data=2")):
        np.testing.assert_allclose(jax.jit(tree_norm)(tree), want, rtol=1e-6)
    assert float(tree_norm({})) == 0.0
