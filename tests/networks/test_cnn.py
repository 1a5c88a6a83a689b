"""Convolutional networks for image observations: shapes and dtypes on a MinAtar board, sharded
equals single device, PPO trains with them, and bad CNN settings are one clear error each."""

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
from rljax.envs import DISCRETE_ENVS, IMAGE_OBS_SHAPES, BatchedEnv
from rljax.errors import ConfigError
from rljax.networks import zoo
from rljax.parallel import Layout
from rljax.run.sharded import ShardedRun

ENV = "Breakout-MinAtar"
SPEC = BatchedEnv(ENV, 1).spec
B = 8
OBS = jax.random.bernoulli(jax.random.key(1), 0.3, (B, SPEC.obs_dim)).astype(jnp.float32)
ACTIONS = jnp.arange(B) % SPEC.num_actions
RETURNS = jnp.linspace(-1.0, 1.0, B)

SMALL = dict(env=ENV, network="cnn", cnn_channels=(8, 4))
NETWORKS = {
    # Two convolutions (the second gathers the first's model-sharded channels), MLP head.
    "actor_critic": zoo.actor_critic(
        PPOConfig(**SMALL, actor_widths=(16, 16), critic_widths=(16,)), SPEC
    ),
    # Dueling Q-values from a residual head.
    "dueling_q": zoo.q_network(
        DQNConfig(
            **SMALL,
            cnn_head="residual",
            residual_width=16,
            residual_depth=1,
            residual_expansion=2,
            dueling=True,
        ),
        SPEC,
    ),
}


def loss_of(name, net):
    def actor_critic(params, obs):
        logits, value = net.apply(params, obs)
        logp = jax.nn.log_softmax(logits)[jnp.arange(B), ACTIONS]
        return -(logp * RETURNS).mean() + jnp.square(value - RETURNS).mean()

    def q(params, obs):
        return jnp.square(net.apply(params, obs)[jnp.arange(B), ACTIONS] - RETURNS).mean()

    return actor_critic if name == "actor_critic" else q


@functools.cache
def initial(name):
    """``(logical specs, params)``: random parameters of the init's shapes drawn on the host, of
    order-1 activations (compiling the orthogonal initialisers takes seconds on CPU)."""
    abstract = jax.eval_shape(NETWORKS[name].init, jax.random.key(0), OBS)
    rng = np.random.default_rng(0)

    def draw(x):
        fan_in = np.prod(x.shape[:-1]) if x.ndim >= 2 else 100.0
        return jnp.asarray(rng.standard_normal(x.shape) / np.sqrt(fan_in), jnp.float32)

    return nn.get_partition_spec(abstract), jax.tree.map(draw, nn.meta.unbox(abstract))


@functools.cache
def reference(name):
    """``(forward_and_grads, single-device outputs, gradients)``: one compiled program."""
    net = NETWORKS[name]
    loss = loss_of(name, net)
    fn = jax.jit(lambda params, obs: (net.apply(params, obs), jax.grad(loss)(params, obs)))
    return fn, *fn(initial(name)[1], OBS)


def spec_of(array):
    entries = list(array.sharding.spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def test_image_envs_and_their_shapes_match_gymnax():
    """The static table (checked before JAX starts) is the rank-3 observations of gymnax."""
    from rljax.envs.wrappers import make

    rank3 = {}
    for name in DISCRETE_ENVS:
        env, params = make(name)
        shape = tuple(env.observation_space(params).shape)
        if len(shape) == 3:
            rank3[name] = shape
    assert rank3 == IMAGE_OBS_SHAPES
    assert SPEC.obs_shape == (10, 10, 4) and SPEC.obs_dim == 400  # obs stay flattened
    assert BatchedEnv("CartPole-v1", 1).spec.obs_shape == (4,)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_forward_shapes_and_dtypes_in_float32_and_bfloat16(name):
    net32 = NETWORKS[name]
    net16 = net32.clone(compute_dtype="bfloat16")
    specs, params = initial(name)
    abstract16 = jax.eval_shape(net16.init, jax.random.key(0), OBS)
    assert nn.get_partition_spec(abstract16) == specs
    assert {leaf.dtype for leaf in jax.tree.leaves(abstract16)} == {jnp.dtype(jnp.float32)}
    # The convolutions (and matmuls) run in bfloat16.
    jaxpr = jax.make_jaxpr(net16.apply)(abstract16, OBS).jaxpr
    convs = [e for e in jaxpr.eqns if e.primitive.name == "conv_general_dilated"]
    assert len(convs) == 2 and all(e.invars[0].aval.dtype == jnp.bfloat16 for e in convs)

    _, out32, _ = reference(name)
    out16 = jax.jit(net16.apply)(params, OBS)
    expected = [(B, SPEC.num_actions), (B,)] if name == "actor_critic" else [(B, SPEC.num_actions)]
    assert [x.shape for x in jax.tree.leaves(out32)] == expected
    assert [x.shape for x in jax.tree.leaves(out16)] == expected
    assert {leaf.dtype for leaf in jax.tree.leaves((out32, out16))} == {jnp.dtype(jnp.float32)}
    chex.assert_trees_all_close(out16, out32, atol=5e-2, rtol=5e-2)
    # A 2-D [B, H*W*C] and a 4-D [B, H, W, C] observation are the same input.
    images = OBS.reshape(B, *SPEC.obs_shape)
    chex.assert_trees_all_close(jax.jit(net32.apply)(params, images), out32, atol=1e-6)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_sharded_forward_and_gradients_equal_single_device(mesh4, name):
    """data=2,model=2: every convolution's output channels split over `model`."""
    fn, outputs, grads = reference(name)
    specs, params = initial(name)
    layout = Layout(mesh4)
    sharded = jax.device_put(params, layout.shardings(specs))
    obs = jax.device_put(OBS, NamedSharding(mesh4, PartitionSpec("data")))
    with layout.active():
        sharded_outputs, sharded_grads = fn(sharded, obs)
    chex.assert_trees_all_close(sharded_outputs, outputs, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(sharded_grads, grads, atol=1e-5, rtol=1e-5)

    torso = sharded["params"]["torso"]
    for conv in ("conv_0", "conv_1"):
        assert spec_of(torso[conv]["kernel"]) == (None, None, None, "model")
        assert spec_of(torso[conv]["bias"]) == ("model",)
    # Really split: conv_0's [3, 3, 4, 8] kernel holds 4 output channels on each device.
    assert torso["conv_0"]["kernel"].addressable_shards[0].data.shape == (3, 3, 4, 4)
    assert torso["conv_1"]["kernel"].addressable_shards[0].data.shape == (3, 3, 8, 2)
    if name == "actor_critic":  # the MLP towers after the flatten, as the plain MLP's
        actor = sharded["params"]["actor"]
        assert actor["dense_0"]["kernel"].shape == (10 * 10 * 4, 16)
        assert spec_of(actor["dense_0"]["kernel"]) == (None, "model")
        assert spec_of(actor["dense_1"]["kernel"]) == ("model",)
    else:
        tower = sharded["params"]["tower"]
        assert tower["embed"]["kernel"].shape == (10 * 10 * 4, 16)
        assert spec_of(tower["block_0"]["dense_0"]["kernel"]) == (None, "model")


def test_ppo_with_a_cnn_trains_on_breakout_minatar_on_the_mesh(mesh4):
    """Two PPO updates on data=2,model=2: sharded init, finite losses, every parameter moved,
    the convolution's output channels split over `model` in the training state."""
    config = PPOConfig(
        env=ENV,
        network="cnn",
        num_envs=4,
        num_steps=8,
        total_timesteps=4 * 8 * 2,
        num_minibatches=1,
        update_epochs=1,
        actor_widths=(32,),
        critic_widths=(32,),
    )
    run = ShardedRun(PPO(config, replicas=2), mesh4, num_seeds=1, chunk_size=2)
    state = run.init(jax.random.key(0))
    initial_params = jax.device_get(state.params)
    state, metrics = run.run_chunk(state, 2)
    loss = np.asarray(metrics["loss"])
    assert loss.shape == (2,) and np.isfinite(loss).all()
    kernel = state.params["params"]["torso"]["conv_0"]["kernel"]
    assert kernel.shape == (3, 3, 4, 16) and spec_of(kernel) == (None, None, None, "model")
    assert kernel.addressable_shards[0].data.shape == (3, 3, 4, 8)
    moved = jax.tree.map(
        lambda a, b: bool(np.any(a != b)), jax.device_get(state.params), initial_params
    )
    assert all(jax.tree.leaves(moved))


ALGORITHMS = [(PPO, PPOConfig()), (A2C, A2CConfig()), (DQN, DQNConfig())]


@pytest.mark.parametrize("algorithm, config", ALGORITHMS, ids=["ppo", "a2c", "dqn"])
def test_a_cnn_on_vector_observations_is_one_clear_error(algorithm, config):
    config = dataclasses.replace(config, network="cnn")  # env CartPole-v1
    message = (
        r"^network=cnn needs image observations \[H, W, C\], and CartPole-v1 does not have "
        r"them; the image environments are Asterix-MinAtar, Breakout-MinAtar, .*Pong-misc$"
    )
    with pytest.raises(ConfigError, match=message):
        algorithm.validate(config, 1, 1)


@pytest.mark.parametrize(
    "change, model, message",
    [
        (
            {"cnn_channels": (16, 6)},
            4,
            r"^cnn_channels \(16, 6\): conv_1's 6 channels are not divisible by the model axis "
            r"size 4 .* choose multiples of 4$",
        ),
        ({"cnn_channels": ()}, 1, r"^cnn_channels must be one or more values >= 1, got \(\)$"),
        ({"cnn_channels": (16, 0)}, 1, r"^cnn_channels must be .* got \(16, 0\)$"),
        ({"cnn_kernel": 0}, 1, r"^cnn_kernel must be >= 1, got 0$"),
        ({"cnn_head": "lstm"}, 1, r"^cnn_head must be one of \['mlp', 'residual'\], got 'lstm'$"),
        ({"actor_widths": (6, 6)}, 4, r"^actor/dense_0: width 6 is not divisible by the model"),
        (
            {"cnn_head": "residual", "residual_width": 6, "residual_expansion": 1},
            4,
            r"residual_width\*residual_expansion = 6\*1 = 6 is not divisible",
        ),
    ],
    ids=["model_split", "no_channels", "zero_channels", "kernel", "head", "mlp_head", "res_head"],
)
def test_bad_cnn_settings_are_one_clear_error(change, model, message):
    config = dataclasses.replace(PPOConfig(env=ENV, network="cnn"), **change)
    with pytest.raises(ConfigError, match=message):
        PPO.validate(config, 1, model)


def test_cnn_settings_fit_the_model_axis_and_are_network_flags():
    PPO.validate(PPOConfig(env=ENV, network="cnn", cnn_channels=(8, 4)), 1, 4)
    DQN.validate(DQNConfig(env=ENV, network="cnn", q_widths=(128,)), 1, 2)
    PPO.validate(PPOConfig(cnn_channels=(3,)), 1, 2)  # network=mlp ignores them
    for algorithm in ("ppo", "a2c", "dqn"):
        flags = {f.name: f for f in flags_of(algorithm)}
        for name in ("cnn_channels", "cnn_kernel", "cnn_head"):
            assert flags[name].group == "network" and len(flags[name].help) > 20
        assert "cnn" in flags["network"].help
