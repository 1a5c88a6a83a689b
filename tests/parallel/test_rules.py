"""Sharded networks equal single-device ones; parameters and env batch live where the rules say."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rljax.errors import ConfigError
from rljax.networks import ActorCritic
from rljax.parallel import RULES, Layout, make_mesh, rules_with, to_mesh_spec, use_rules
from rljax.parallel.rules import effective_spec

MESHES = ["data=1,model=1", "data=4,model=1", "data=2,model=2", "data=1,model=4"]


def make_net():
    # Even and odd tower depths: the odd one ends model-sharded and needs a row-split head.
    return ActorCritic(
        num_actions=3, actor_widths=(64, 64, 32), critic_widths=(64, 64), torso_widths=(32, 32)
    )


@pytest.fixture(scope="module")
def reference():
    net = make_net()
    obs = jax.random.normal(jax.random.key(1), (8, 6))
    boxed = net.init(jax.random.key(0), obs)
    params = nn.meta.unbox(boxed)
    actions = jnp.arange(8) % 3
    returns = jnp.linspace(-1.0, 1.0, 8)

    def loss(params, obs):
        logits, value = net.apply(params, obs)
        logp = jax.nn.log_softmax(logits)[jnp.arange(8), actions]
        return -(logp * returns).mean() + jnp.square(value - returns).mean()

    outputs = jax.jit(net.apply)(params, obs)
    grads = jax.jit(jax.grad(loss))(params, obs)
    return net, boxed, params, obs, loss, outputs, grads


@pytest.mark.parametrize("spec", MESHES)
def test_sharded_forward_and_gradients_equal_single_device(reference, spec):
    net, boxed, params, obs, loss, outputs, grads = reference
    mesh = make_mesh(spec)
    shardings = Layout(mesh).shardings(nn.get_partition_spec(boxed))
    sharded_params = jax.device_put(params, shardings)
    sharded_obs = jax.device_put(obs, NamedSharding(mesh, PartitionSpec("data")))
    with Layout(mesh).active():
        sharded_outputs = jax.jit(net.apply)(sharded_params, sharded_obs)
        sharded_grads = jax.jit(jax.grad(loss))(sharded_params, sharded_obs)
    chex.assert_trees_all_close(sharded_outputs, outputs, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(sharded_grads, grads, atol=1e-5, rtol=1e-5)
    if mesh.shape["model"] > 1:  # really split: a column kernel holds 1/model of the columns
        kernel = sharded_params["params"]["critic"]["dense_0"]["kernel"]
        assert kernel.addressable_shards[0].data.shape == (32, 64 // mesh.shape["model"])


def normalised(spec):
    entries = list(spec)
    while entries and entries[-1] is None:
        entries.pop()
    return tuple(entries)


def test_rules_table_maps_logical_names():
    assert to_mesh_spec(PartitionSpec("batch", "mlp")) == PartitionSpec(("data", "fsdp"), "model")
    assert to_mesh_spec(PartitionSpec("mlp", "embed")) == PartitionSpec("model", "fsdp")
    assert dict(RULES)["embed"] == "fsdp"
    # Parameter and activation axes are named apart: remapping one leaves the other.
    no_fsdp = rules_with(embed=None)
    assert to_mesh_spec(("embed", "mlp"), no_fsdp) == PartitionSpec(None, "model")
    assert to_mesh_spec(("batch", "activation_embed"), no_fsdp) == PartitionSpec(
        ("data", "fsdp"), None
    )


def test_rules_apply_as_a_context():
    assert to_mesh_spec(("batch",)) == PartitionSpec(("data", "fsdp"))
    with use_rules(rules_with(batch=None, seed="data")):
        assert to_mesh_spec(("seed", "batch")) == PartitionSpec("data", None)
    assert to_mesh_spec(("batch",)) == PartitionSpec(("data", "fsdp"))


def test_unknown_or_clashing_logical_names_are_errors():
    with pytest.raises(ConfigError, match="no rule"):
        to_mesh_spec(("hidden",))
    with pytest.raises(ConfigError, match="two axes onto one mesh axis"):
        to_mesh_spec(("batch", "replica"))
    with pytest.raises(ConfigError, match="unknown logical axes"):
        rules_with(hidden="model")


def test_parameters_shard_over_data_by_editing_rules_alone(reference):
    """FSDP-style: parameter `embed` axes split over `data` by one rules entry; the network and
    its numbers are unchanged."""
    net, boxed, params, obs, loss, outputs, grads = reference
    layout = Layout(make_mesh("data=2,model=2"), rules_with(embed="data"))
    shardings = layout.shardings(nn.get_partition_spec(boxed))
    sharded = jax.device_put(params, shardings)
    kernel = sharded["params"]["critic"]["dense_0"]["kernel"]  # [embed, mlp] = [32, 64]
    assert kernel.addressable_shards[0].data.shape == (16, 32)
    with layout.active():
        sharded_outputs = jax.jit(net.apply)(sharded, obs)
        sharded_grads = jax.jit(jax.grad(loss))(sharded, obs)
    chex.assert_trees_all_close(sharded_outputs, outputs, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(sharded_grads, grads, atol=1e-5, rtol=1e-5)


def test_every_parameter_is_born_with_the_rules_sharding(small_run):
    run, state, _ = small_run
    logical = run.algo.state_specs()
    pairs = zip(
        jax.tree.leaves(logical.params, is_leaf=lambda x: isinstance(x, PartitionSpec)),
        jax.tree.leaves(state.params),
        strict=True,
    )
    for logical_spec, leaf in pairs:
        expected = effective_spec(to_mesh_spec(logical_spec), run.mesh)  # fsdp=1: left out
        assert normalised(leaf.sharding.spec) == normalised(expected)
    actor = state.params["params"]["actor"]
    assert normalised(actor["dense_0"]["kernel"].sharding.spec) == (None, "model")
    assert normalised(actor["dense_1"]["kernel"].sharding.spec) == ("model",)
    assert normalised(state.params["params"]["policy_head"]["kernel"].sharding.spec) == ()
    # Adam moments are sharded like their parameters.
    mu = state.opt_state[1][0].mu["params"]["actor"]["dense_0"]["kernel"]
    assert normalised(mu.sharding.spec) == (None, "model")


def test_environment_batch_is_sharded_along_data(small_run):
    run, state, _ = small_run
    obs = state.env.obs
    assert normalised(obs.sharding.spec) == ("data",)
    rows = {shard.device.id: shard.data.shape[0] for shard in obs.addressable_shards}
    assert set(rows.values()) == {obs.shape[0] // run.mesh.shape["data"]}
    for leaf in jax.tree.leaves(state.env.state):
        assert normalised(leaf.sharding.spec) == ("data",)
    np.testing.assert_array_equal(np.asarray(state.update_step), 2)
