"""Residual MLPs: sharded equals single device, bfloat16 compute keeps float32 parameters and
outputs, PPO trains with them, and bad network settings are one clear error each."""

import dataclasses
import functools

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rljax import A2C, DQN, PPO, A2CConfig, DQNConfig, PPOConfig
from rljax.cli_flags import flags_of
from rljax.errors import ConfigError
from rljax.networks import ActorCritic, QNetwork, ResidualActorCritic, ResidualQNetwork
from rljax.parallel import Layout, rules_with
from rljax.run.sharded import ShardedRun

SHAPE = {"width": 16, "depth": 2, "expansion": 2}
OBS = jax.random.normal(jax.random.key(1), (8, 6))
ACTIONS = jnp.arange(8) % 3
RETURNS = jnp.linspace(-1.0, 1.0, 8)


def actor_critic_loss(net):
    def loss(params, obs):
        logits, value = net.apply(params, obs)
        logp = jax.nn.log_softmax(logits)[jnp.arange(8), ACTIONS]
        return -(logp * RETURNS).mean() + jnp.square(value - RETURNS).mean()

    return loss


def q_loss(net):
    def loss(params, obs):
        return jnp.square(net.apply(params, obs)[jnp.arange(8), ACTIONS] - RETURNS).mean()

    return loss


NETWORKS = {
    "actor_critic": ResidualActorCritic(num_actions=3, **SHAPE),
    "dueling_q": ResidualQNetwork(num_actions=3, dueling=True, **SHAPE),
    "mlp_actor_critic": ActorCritic(num_actions=3, actor_widths=(32, 32), critic_widths=(32, 32)),
    "mlp_q": QNetwork(num_actions=3, widths=(32, 32)),
}
LOSSES = {"actor_critic": actor_critic_loss, "dueling_q": q_loss}


@functools.cache
def initial(name):
    """``(logical specs, params)`` of the float32 network: random parameters of the init's
    shapes drawn on the host, scaled so that every activation is of order 1 (compiling the
    orthogonal initialisers would take seconds per network on CPU)."""
    abstract = jax.eval_shape(NETWORKS[name].init, jax.random.key(0), OBS)
    rng = np.random.default_rng(0)

    def draw(x):
        scale = 1 / np.sqrt(x.shape[0]) if x.ndim == 2 else 0.1
        return jnp.asarray(scale * rng.standard_normal(x.shape), jnp.float32)

    return nn.get_partition_spec(abstract), jax.tree.map(draw, nn.meta.unbox(abstract))


@functools.cache
def reference(name):
    """(net, logical specs, params, forward_and_grads, single-device outputs and gradients)."""
    net, (specs, params) = NETWORKS[name], initial(name)
    forward_and_grads = forward_and_grads_of(net, LOSSES[name](net))
    return net, specs, params, forward_and_grads, *forward_and_grads(params, OBS)


def forward_and_grads_of(net, loss):
    """One compiled program: ``(params, obs) -> (outputs, gradients of loss)``."""
    return jax.jit(lambda params, obs: (net.apply(params, obs), jax.grad(loss)(params, obs)))


def spec_of(array):
    entries = list(array.sharding.spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


@pytest.mark.parametrize(
    "name, fsdp", [("actor_critic", False), ("actor_critic", True), ("dueling_q", False)]
)
def test_sharded_forward_and_gradients_equal_single_device(mesh4, name, fsdp):
    """data=2,model=2: tensor parallel over `model`; with `rules_with(embed="data")` also the
    stream-width axis of every parameter over `data` (FSDP-style), by the rules alone."""
    net, specs, params, forward_and_grads, outputs, grads = reference(name)
    layout = Layout(mesh4, rules_with(embed="data")) if fsdp else Layout(mesh4)
    sharded = jax.device_put(params, layout.shardings(specs))
    obs = jax.device_put(OBS, NamedSharding(mesh4, PartitionSpec("data")))
    with layout.active():
        sharded_outputs, sharded_grads = forward_and_grads(sharded, obs)
    chex.assert_trees_all_close(sharded_outputs, outputs, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(sharded_grads, grads, atol=1e-5, rtol=1e-5)

    tower_name = "actor" if name == "actor_critic" else "tower"
    tower, block = sharded["params"][tower_name], sharded["params"][tower_name]["block_1"]
    if fsdp:  # the stream-width (`embed`) axis of every parameter is split over data as well
        expected = {"dense_0": ("data", "model"), "dense_1": ("model", "data"), "norm": ("data",)}
        assert spec_of(tower["embed"]["kernel"]) == (None, "data")
    else:
        expected = {"dense_0": (None, "model"), "dense_1": ("model",), "norm": ()}
        assert spec_of(tower["embed"]["kernel"]) == ()
    assert spec_of(block["dense_0"]["kernel"]) == expected["dense_0"]
    assert spec_of(block["dense_0"]["bias"]) == ("model",)
    assert spec_of(block["dense_1"]["kernel"]) == expected["dense_1"]
    assert spec_of(block["norm"]["scale"]) == expected["norm"]
    # Really split: the column-split kernel [16, 32] holds half its columns on each device.
    pieces = block["dense_0"]["kernel"].addressable_shards[0].data.shape
    assert pieces == ((8, 16) if fsdp else (16, 16))


@pytest.mark.parametrize("name", list(NETWORKS))
def test_bfloat16_compute_keeps_float32_parameters_and_outputs(name):
    net32 = NETWORKS[name]
    net16 = net32.clone(compute_dtype="bfloat16")
    # Master parameters are float32, in the float32 network's tree (checkpoints move between).
    abstract16 = jax.eval_shape(net16.init, jax.random.key(0), OBS)
    chex.assert_trees_all_equal_shapes_and_dtypes(
        abstract16, jax.eval_shape(net32.init, jax.random.key(0), OBS)
    )
    assert nn.get_partition_spec(abstract16) == initial(name)[0]
    assert {leaf.dtype for leaf in jax.tree.leaves(abstract16)} == {jnp.dtype(jnp.float32)}
    # The matmuls run in bfloat16.
    jaxpr = jax.make_jaxpr(net16.apply)(abstract16, OBS).jaxpr
    dots = [eqn for eqn in jaxpr.eqns if eqn.primitive.name == "dot_general"]
    assert dots and all(eqn.invars[0].aval.dtype == jnp.bfloat16 for eqn in dots)

    params = initial(name)[1]
    out16, out32 = jax.jit(lambda p: (net16.apply(p, OBS), net32.apply(p, OBS)))(params)
    assert {leaf.dtype for leaf in jax.tree.leaves(out16)} == {jnp.dtype(jnp.float32)}
    # bfloat16 keeps 8 mantissa bits: outputs of order 1 agree to about 1e-2.
    chex.assert_trees_all_close(out16, out32, atol=5e-2, rtol=5e-2)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(jax.tree.leaves(out16), jax.tree.leaves(out32), strict=True)
    )


TINY_PPO = PPOConfig(
    num_envs=8,
    num_steps=16,
    total_timesteps=8 * 16 * 2,
    num_minibatches=1,
    update_epochs=1,
    residual_width=16,
    residual_depth=1,
    residual_expansion=2,
)


def test_residual_bfloat16_ppo_trains_two_updates_on_the_mesh(mesh4):
    config = dataclasses.replace(TINY_PPO, network="residual", compute_dtype="bfloat16")
    run = ShardedRun(config, mesh4, num_seeds=1, chunk_size=2)
    state, metrics = run.run_chunk(run.init(jax.random.key(0)), 2)
    loss = np.asarray(metrics["loss"])
    assert loss.dtype == np.float32 and loss.shape == (2,) and np.isfinite(loss).all()
    kinds = {leaf.dtype for leaf in jax.tree.leaves((state.params, state.opt_state))}
    assert kinds == {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}  # int32: Adam's step count
    kernel = state.params["params"]["critic"]["block_0"]["dense_0"]["kernel"]
    assert spec_of(kernel) == (None, "model")
    mu = state.opt_state[1][0].mu["params"]["critic"]["block_0"]["dense_0"]["kernel"]
    assert mu.dtype == jnp.float32 and spec_of(mu) == (None, "model")


@pytest.mark.parametrize(
    "algorithm, config",
    [(PPO, PPOConfig()), (A2C, A2CConfig()), (DQN, DQNConfig())],
    ids=["ppo", "a2c", "dqn"],
)
@pytest.mark.parametrize(
    "change, model, message",
    [
        ({"residual_depth": 0}, 1, r"^residual_depth must be >= 1, got 0$"),
        ({"residual_expansion": 0}, 1, r"^residual_expansion must be >= 1, got 0$"),
        ({"residual_width": -4}, 1, r"^residual_width must be >= 1, got -4$"),
        (
            {"residual_width": 6, "residual_expansion": 1},
            4,
            r"residual_width\*residual_expansion = 6\*1 = 6 is not divisible by the model axis "
            r"size 4 .* a multiple of 4",
        ),
        (
            {"network": "lstm"},
            1,
            r"^network must be one of \['mlp', 'residual', 'cnn'\], got 'lstm'$",
        ),
        (
            {"compute_dtype": "float16"},
            1,
            r"^compute_dtype must be one of \['float32', 'bfloat16'\], got 'float16'$",
        ),
    ],
    ids=["depth", "expansion", "width", "model_split", "network", "dtype"],
)
def test_bad_network_settings_are_one_clear_error(algorithm, config, change, model, message):
    network = {"network": "residual"} if "network" not in change else {}
    config = dataclasses.replace(config, **network, **change)
    with pytest.raises(ConfigError, match=message):
        algorithm.validate(config, 1, model)


def test_residual_settings_are_ignored_by_the_mlp_and_fit_the_model_axis():
    PPO.validate(dataclasses.replace(PPOConfig(), residual_depth=0), 1, 1)  # network=mlp
    PPO.validate(PPOConfig(network="residual", residual_width=6, residual_expansion=2), 1, 4)


@pytest.mark.parametrize("algorithm", ["ppo", "a2c", "dqn"])
def test_network_flags_are_in_the_network_help_group(algorithm):
    flags = {f.name: f for f in flags_of(algorithm)}
    for name in ("network", "residual_width", "residual_depth", "residual_expansion"):
        assert flags[name].group == "network" and len(flags[name].help) > 20
    assert flags["compute_dtype"].group == "network"
    assert "float32" in flags["compute_dtype"].help
