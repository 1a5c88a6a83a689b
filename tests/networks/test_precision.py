"""Precision: bfloat16 compute stays close to float32 and keeps float32 master parameters;
bfloat16 parameters store Adam's moments in bfloat16 too (half the bytes), round stochastically,
and still give float32 outputs and a finite PPO update; bad dtypes are one clear error each."""

import dataclasses
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import A2C, DQN, PPO, A2CConfig, DQNConfig, PPOConfig, RunConfig
from rljax.algos.base import adam, clip_by_global_norm, stochastic_round
from rljax.cli_flags import flags_of
from rljax.errors import ConfigError
from rljax.networks import ActorCritic, QNetwork, ResidualActorCritic, ResidualQNetwork
from rljax.run import memory
from rljax.run.sharded import prepare
from tests.networks.host_params import draw_host_params
from tests.networks.jaxprs import all_equations

OBS = jax.random.normal(jax.random.key(1), (16, 6))
BF16, F32 = jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float32)
NETWORKS = {
    "residual_actor_critic": ResidualActorCritic(num_actions=3, width=64, depth=2, expansion=2),
    "residual_q": ResidualQNetwork(num_actions=3, width=64, depth=2, expansion=2, dueling=True),
    "mlp_actor_critic": ActorCritic(num_actions=3, actor_widths=(64, 64), critic_widths=(64, 64)),
    "mlp_q": QNetwork(num_actions=3, widths=(64, 64)),
}


@functools.cache
def host_params(name):
    return draw_host_params(NETWORKS[name], OBS)


def relative_error(a, b) -> float:
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b))


@pytest.mark.parametrize("name", list(NETWORKS))
def test_bfloat16_compute_and_parameters_are_within_two_percent_of_float32(name):
    """Outputs (logits and values, Q-values) are float32 in every combination; bfloat16 matmuls
    and bfloat16-stored parameters each stay within 2 % (relative L2) of float32."""
    net32, params = NETWORKS[name], host_params(name)
    params16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    compute16 = net32.clone(compute_dtype="bfloat16")
    stored16 = net32.clone(param_dtype="bfloat16")
    both16 = net32.clone(compute_dtype="bfloat16", param_dtype="bfloat16")
    outs = jax.jit(
        lambda p, p16: (
            net32.apply(p, OBS),
            compute16.apply(p, OBS),
            stored16.apply(p16, OBS),
            both16.apply(p16, OBS),
        )
    )(params, params16)
    reference = jax.tree.leaves(outs[0])
    for out in outs[1:]:
        assert {leaf.dtype for leaf in jax.tree.leaves(out)} == {F32}
        for leaf, ref in zip(jax.tree.leaves(out), reference, strict=True):
            assert 0 < relative_error(leaf, ref) < 2e-2


@pytest.mark.parametrize("name", list(NETWORKS))
def test_param_dtype_bfloat16_stores_every_parameter_in_the_same_tree(name):
    net32 = NETWORKS[name]
    abstract32 = jax.eval_shape(net32.init, jax.random.key(0), OBS)
    abstract16 = jax.eval_shape(net32.clone(param_dtype="bfloat16").init, jax.random.key(0), OBS)
    assert {leaf.dtype for leaf in jax.tree.leaves(abstract16)} == {BF16}
    assert nn.get_partition_spec(abstract16) == nn.get_partition_spec(abstract32)
    chex.assert_trees_all_equal_shapes(abstract16, abstract32)
    # Every matmul: float32 (bfloat16 weights upcast) unless compute_dtype asks for bfloat16.
    # More rows than OBS: a float32 layer reading 6 features over 16 rows multiplies and adds
    # instead of calling a dot (rljax.networks.matmul); over 64 its dot sits in a custom_jvp.
    obs = jnp.tile(OBS, (4, 1))
    for compute, expected in (("float32", F32), ("bfloat16", BF16)):
        net = net32.clone(param_dtype="bfloat16", compute_dtype=compute)
        jaxpr = jax.make_jaxpr(net.apply)(abstract16, obs).jaxpr
        dots = [eqn for eqn in all_equations(jaxpr) if eqn.primitive.name == "dot_general"]
        assert len(dots) >= 3 and {v.aval.dtype for e in dots for v in e.invars} == {expected}


TINY = dict(
    num_envs=4,
    num_steps=8,
    total_timesteps=4 * 8 * 4,
    num_minibatches=1,
    update_epochs=1,
    network="residual",
    residual_width=16,
    residual_depth=1,
    residual_expansion=2,
)


@pytest.fixture(scope="module")
def ppo_update():
    """``(state before, state after one PPO update, metrics)`` on one device, bfloat16 compute
    and parameters. (That bfloat16 compute alone keeps float32 parameters and moments through
    PPO updates is test_residual.py's ``test_residual_bfloat16_ppo_trains_two_updates_...``.)"""
    algo = PPO(PPOConfig(**TINY, compute_dtype="bfloat16", param_dtype="bfloat16"))
    state = algo.init(jax.random.key(0))
    after, metrics = jax.jit(algo.update)(state)
    return state, after, metrics


def test_one_ppo_update_keeps_bfloat16_storage_and_float32_losses(ppo_update):
    before, after, metrics = ppo_update
    for state in (before, after):
        assert {leaf.dtype for leaf in jax.tree.leaves(state.params)} == {BF16}
        adam_state = state.opt_state[1][0]
        moments = jax.tree.leaves((adam_state.mu, adam_state.nu))
        assert {leaf.dtype for leaf in moments} == {BF16}
        assert adam_state.count.dtype == jnp.int32
    assert int(after.opt_state[1][0].count) == 1
    for key in ("loss", "value_loss", "policy_loss"):
        assert metrics[key].dtype == F32 and np.isfinite(metrics[key])
    assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(after.params))
    # Every kernel moved (how far rounding lets lr-sized steps go: the next test).
    changed = [
        np.mean(np.asarray(a) != np.asarray(b))
        for a, b in zip(jax.tree.leaves(after.params), jax.tree.leaves(before.params), strict=True)
        if a.size > 16
    ]
    assert min(changed) > 0


def test_adam_moves_bfloat16_parameters_by_steps_below_half_an_ulp_on_average():
    """Parameters at 1.0 with a constant gradient: Adam steps by lr = 1e-3 each time, under half
    a bfloat16 ulp below 1 (2**-9), so rounding to nearest would never move them; stochastic
    rounding moves them by lr per step on average."""
    n, steps = 4096, 10
    params = {"w": jnp.ones(n, jnp.bfloat16)}
    opt = adam(1e-3)

    @jax.jit
    def step(params, state):
        updates, state = opt.update({"w": jnp.ones(n, jnp.bfloat16)}, state, params)
        return optax.apply_updates(params, updates), state

    state = opt.init(params)
    for _ in range(steps):
        params, state = step(params, state)
    assert params["w"].dtype == BF16
    mean = float(params["w"].astype(jnp.float32).mean())
    assert mean == pytest.approx(1 - steps * 1e-3, abs=5e-4)


def test_stochastic_rounding_to_bfloat16_is_unbiased():
    # 1 + 2**-9 lies a quarter of the way from 1 to the next bfloat16, 1 + 2**-7.
    x = jnp.full((20_000,), 1 + 2**-9, jnp.float32)
    rounded = stochastic_round(x, jnp.bfloat16, jax.random.key(0))
    assert rounded.dtype == BF16
    assert set(np.unique(np.asarray(rounded, np.float32))) == {1.0, 1 + 2**-7}
    assert abs(float(rounded.astype(jnp.float32).mean()) - (1 + 2**-9)) < 2e-5
    assert x.astype(jnp.bfloat16).astype(jnp.float32).mean() == 1.0  # nearest: always down
    negative = stochastic_round(-x, jnp.bfloat16, jax.random.key(1)).astype(jnp.float32)
    assert abs(float(negative.mean()) + (1 + 2**-9)) < 2e-5
    assert stochastic_round(x, jnp.float32, jax.random.key(0)) is not None


def test_adam_on_float32_parameters_is_optax_adam():
    params = {"w": jnp.linspace(-1.0, 1.0, 8), "b": jnp.ones(3)}
    grads = {"w": jnp.cos(jnp.arange(8.0)), "b": jnp.full(3, 0.5)}
    ours, theirs = (
        adam(3e-4, eps=1e-5, max_grad_norm=0.5),
        optax.chain(optax.clip_by_global_norm(0.5), optax.adam(3e-4, eps=1e-5)),
    )
    state, reference = ours.init(params), theirs.init(params)
    for _ in range(3):
        updates, state = ours.update(grads, state, params)
        expected, reference = theirs.update(grads, reference, params)
        # The clipping norm sums in another order (one dot over all leaves): float32 rounding.
        chex.assert_trees_all_close(updates, expected, rtol=1e-6, atol=0)
        chex.assert_trees_all_close(state, reference, rtol=1e-6, atol=0)


@pytest.mark.parametrize("scale", [0.1, 1.0, 10.0])
def test_clip_by_global_norm_is_optax(scale):
    grads = {"w": scale * jnp.cos(jnp.arange(12.0)).reshape(3, 4), "b": jnp.full(3, 0.1 * scale)}
    norm = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(grads)))
    ours, _ = clip_by_global_norm(1.0).update(grads, clip_by_global_norm(1.0).init(grads))
    theirs, _ = optax.clip_by_global_norm(1.0).update(grads, optax.EmptyState())
    chex.assert_trees_all_close(ours, theirs, rtol=1e-6, atol=0)
    clipped = np.sqrt(sum(np.sum(np.asarray(g, np.float64) ** 2) for g in jax.tree.leaves(ours)))
    np.testing.assert_allclose(clipped, min(norm, 1.0), rtol=1e-6)


def test_adam_bfloat16_moments_track_nu_decay_that_nearest_rounding_loses():
    """After a large gradient, nu decays by b2 = 0.999 a step: far below bfloat16's resolution
    (2**-8), so nearest rounding keeps nu where it was; stochastic rounding decays it on
    average."""
    n = 4096
    params = {"w": jnp.zeros(n, jnp.bfloat16)}
    opt = adam(1e-3)
    step = jax.jit(lambda g, s, p: opt.update(g, s, p))
    state = opt.init(params)
    assert state[0][0].nu["w"].dtype == BF16
    _, state = step({"w": jnp.ones(n, jnp.bfloat16)}, state, params)
    first = float(state[0][0].nu["w"].astype(jnp.float32).mean())
    zero = {"w": jnp.zeros(n, jnp.bfloat16)}
    for _ in range(50):
        _, state = step(zero, state, params)
    nu = float(state[0][0].nu["w"].astype(jnp.float32).mean())
    assert nu == pytest.approx(first * 0.999**50, rel=1e-2)
    assert nu < first * 0.97


def test_bfloat16_parameters_halve_parameter_and_optimizer_memory():
    run = RunConfig.make(mesh="data=1")
    parts = {}
    for dtype in ("float32", "bfloat16"):
        layout, algo = prepare(PPOConfig(**{**TINY, "residual_width": 64}, param_dtype=dtype), run)
        estimate = memory.estimate(algo, layout)
        parts[dtype] = estimate.parts["parameters"] + estimate.parts["optimizer state"]
    # Only Adam's int32 step counts do not halve.
    assert parts["bfloat16"] / parts["float32"] == pytest.approx(0.5, abs=2e-3)


@pytest.mark.parametrize(
    "algorithm, config",
    [(PPO, PPOConfig()), (A2C, A2CConfig()), (DQN, DQNConfig())],
    ids=["ppo", "a2c", "dqn"],
)
@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"param_dtype": "float16"},
            r"^param_dtype must be one of \['float32', 'bfloat16'\], got 'float16'$",
        ),
        ({"remat": "layers"}, r"^remat must be one of \['none', 'block', 'full'\], got 'layers'$"),
    ],
    ids=["param_dtype", "remat"],
)
@pytest.mark.parametrize("network", ["mlp", "residual"])
def test_bad_precision_settings_are_one_clear_error(algorithm, config, change, message, network):
    with pytest.raises(ConfigError, match=message):
        algorithm.validate(dataclasses.replace(config, network=network, **change), 1, 1)


@pytest.mark.parametrize("algorithm", ["ppo", "a2c", "dqn"])
def test_precision_flags_are_in_the_network_help_group(algorithm):
    flags = {f.name: f for f in flags_of(algorithm)}
    assert flags["param_dtype"].group == "network" and "Adam" in flags["param_dtype"].help
    assert flags["remat"].group == "network" and "gradients" in flags["remat"].help
