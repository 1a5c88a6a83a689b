"""The ``fsdp`` mesh axis: parameters, gradients and Adam moments split ZeRO-3 style over it, the
batch over ``(data, fsdp)``, from the rules table alone. Sharded results equal one device's."""

import dataclasses
import subprocess

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from rljax import PPO, ConfigError, PPOConfig, RunConfig, train
from rljax.networks import ActorCritic, QNetwork, ResidualActorCritic, ResidualQNetwork
from rljax.networks.cnn import CNNActorCritic, CNNQNetwork
from rljax.parallel import Layout, make_mesh
from rljax.parallel.rules import effective_spec, to_mesh_spec
from rljax.parallel.sync import SyncConfig
from rljax.run.checkpoint import Checkpointer
from rljax.run.resume import abstract_state
from rljax.run.sharded import ShardedRun, prepare

FSDP_MESHES = ["fsdp=2,model=2", "data=2,fsdp=2,model=2", "fsdp=4"]
NETWORKS = {
    "mlp": ActorCritic(num_actions=3, actor_widths=(64, 64), critic_widths=(64, 64)),
    "residual": ResidualActorCritic(num_actions=3, width=32, depth=2, expansion=2),
    "q_mlp": QNetwork(num_actions=3, widths=(64, 64)),
    "q_residual": ResidualQNetwork(num_actions=3, width=32, depth=1, expansion=2, dueling=True),
    "cnn": CNNActorCritic(
        num_actions=3,
        obs_shape=(5, 5, 2),
        channels=(8,),
        actor_widths=(32, 32),
        critic_widths=(32, 32),
    ),
    "q_cnn": CNNQNetwork(
        num_actions=3,
        obs_shape=(5, 5, 2),
        channels=(8,),
        head_type="residual",
        residual=(32, 1, 2),
    ),
}
OBS = jax.random.normal(jax.random.key(1), (16, 50), jnp.float32)  # also a flattened 5x5x2 image


def loss(network, params, obs):
    """A scalar touching every output: the logits and values, or the Q-values."""
    out = network.apply(params, obs)
    return sum(jnp.sum(jnp.sin(x)) for x in jax.tree.leaves(out)), out


def single_device(network):
    boxed = network.init(jax.random.key(0), OBS[:1])
    params = nn.meta.unbox(boxed)
    (_, out), grads = jax.value_and_grad(lambda p: loss(network, p, OBS), has_aux=True)(params)
    return boxed, params, out, grads


@pytest.fixture(scope="module")
def references():
    return {name: single_device(net) for name, net in NETWORKS.items()}


@pytest.mark.parametrize("spec", FSDP_MESHES)
@pytest.mark.parametrize("name", list(NETWORKS))
def test_forward_and_gradients_equal_one_device(references, name, spec):
    network = NETWORKS[name]
    boxed, params, out, grads = references[name]
    layout = Layout(make_mesh(spec))
    shardings = layout.shardings(nn.get_partition_spec(boxed))
    with layout.active():
        sharded_params = jax.device_put(params, shardings)
        obs = jax.device_put(OBS, layout.sharding(P("batch")))
        step = jax.jit(
            jax.value_and_grad(lambda p, o: loss(network, p, o), has_aux=True),
            out_shardings=(None, shardings),
        )
        (_, sharded_out), sharded_grads = step(sharded_params, obs)
    chex.assert_trees_all_close(sharded_out, out, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(sharded_grads, grads, atol=1e-5, rtol=1e-5)
    # Something really is split over fsdp: at least one parameter, its gradient alike.
    specs = [s.sharding.spec for s in jax.tree.leaves(sharded_grads)]
    assert any("fsdp" in str(s) for s in specs)
    assert obs.sharding.spec == effective_spec(P(("data", "fsdp")), layout.mesh)


SMALL = PPOConfig(
    num_envs=8,
    num_steps=8,
    total_timesteps=8 * 8 * 4,
    num_minibatches=2,
    actor_widths=(64, 64),
    critic_widths=(64, 64),
)


@pytest.fixture(scope="module")
def fsdp_state():
    """PPO on data=2,fsdp=2,model=2 after two updates: (run, state)."""
    run = ShardedRun(SMALL, Layout(make_mesh("data=2,fsdp=2,model=2")), chunk_size=2)
    state, _ = run.run_chunk(run.init(jax.random.key(0)), 2)
    return run, state


def test_parameters_and_moments_are_sharded_as_the_rules_say(fsdp_state):
    run, state = fsdp_state
    mesh = run.mesh
    logical = nn.get_partition_spec(jax.eval_shape(run.algo.init_boxed, jax.random.key(0))).params
    expected = jax.tree.map(
        lambda s: effective_spec(to_mesh_spec(s, run.layout.rules), mesh),
        logical,
        is_leaf=lambda x: isinstance(x, P),
    )
    got = jax.tree.map(lambda x: x.sharding.spec, state.params)
    assert got == expected
    adam = next(  # the Adam moments, wherever the optimizer chain keeps them
        x
        for x in jax.tree.leaves(state.opt_state, is_leaf=lambda x: hasattr(x, "mu"))
        if hasattr(x, "mu")
    )
    for moments in (adam.mu, adam.nu):
        assert jax.tree.map(lambda x: x.sharding.spec, moments) == expected
    # The hidden layers: a row-split kernel [mlp@model, embed@fsdp], a column-split one
    # [obs, mlp@model] (the observation axis is never split), the row-split bias [embed@fsdp].
    actor = state.params["params"]["actor"]
    assert actor["dense_1"]["kernel"].sharding.spec == P("model", "fsdp")
    assert actor["dense_0"]["kernel"].sharding.spec == P(None, "model")
    assert actor["dense_1"]["bias"].sharding.spec == P("fsdp")
    assert adam.mu["params"]["actor"]["dense_1"]["kernel"].sharding.spec == P("model", "fsdp")
    # ZeRO-3: each device holds a quarter of that kernel (2 model x 2 fsdp pieces).
    kernel = actor["dense_1"]["kernel"]
    assert kernel.addressable_shards[0].data.shape == (32, 32)
    assert state.env.obs.sharding.spec == P(("data", "fsdp"))


@pytest.mark.parametrize("strategy", ["allreduce", "local_sgd"])
def test_ppo_updates_on_fsdp_equal_one_device(fsdp_state, strategy):
    config = dataclasses.replace(SMALL, sync=SyncConfig(strategy, period=2))
    if strategy == "allreduce":
        _, state = fsdp_state
    else:
        run = ShardedRun(config, Layout(make_mesh("data=2,fsdp=2,model=2")), chunk_size=2)
        state, _ = run.run_chunk(run.init(jax.random.key(0)), 2)
    # Two data-parallel replicas emulated on one device: the same numbers.
    one = ShardedRun(PPO(config, replicas=2), make_mesh("data=1,model=1"), chunk_size=2)
    expected, _ = one.run_chunk(one.init(jax.random.key(0)), 2)
    chex.assert_trees_all_close(
        jax.device_get(state.params), jax.device_get(expected.params), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize(
    "config, mesh, message",
    [
        (
            dataclasses.replace(SMALL, sync=SyncConfig("compressed")),
            "data=2,fsdp=2",
            r"sync strategy 'compressed' does not compose with fsdp=2 .* with fsdp use .*"
            r"allreduce.* or keep 'compressed' on a mesh without fsdp \(e.g. data=4,model=1\)",
        ),
        (
            dataclasses.replace(SMALL, actor_widths=(64, 30)),
            "fsdp=4",
            r"parameter params/actor/dense_1/bias \(30,\): axis 0 \(embed, size 30\) is not "
            r"divisible by 4, the mesh axes fsdp=4",
        ),
        (
            dataclasses.replace(SMALL, network="residual", residual_width=30),
            "fsdp=4,model=2",
            r"params/actor/block_0/dense_0/kernel \(30, 120\): axis 0 \(embed, size 30\) is "
            r"not divisible by 4",
        ),
    ],
    ids=["strategy", "mlp-width", "residual-width"],
)
def test_bad_fsdp_input_is_one_error(config, mesh, message, tmp_path):
    with pytest.raises(ConfigError, match=message):
        prepare(config, RunConfig.make(mesh=mesh, runs_dir=str(tmp_path), quiet=True))
    assert list(tmp_path.iterdir()) == []


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """4 updates of PPO on fsdp=4,model=2, checkpointed at 4: (run dir, final state)."""
    tmp = tmp_path_factory.mktemp("fsdp")
    run = RunConfig.make(
        mesh="fsdp=4,model=2",
        runs_dir=str(tmp),
        run_name="f",
        log_every=2,
        checkpoint_every=4,
        checkpoint_min_seconds=0,
        eval_every=0,
        quiet=True,
    )
    result = train(SMALL, run)
    return tmp / "f", jax.device_get(result.state)


@pytest.mark.parametrize("mesh, replicas", [("data=1,model=1", 1), ("data=8", 8)])
def test_fsdp_checkpoint_resumes_on_other_meshes(fsdp_run, mesh, replicas, tmp_path):
    run_dir, final = fsdp_run
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    run = ShardedRun(PPO(SMALL, replicas=replicas), make_mesh(mesh))
    with Checkpointer(copy / "checkpoints") as ckpt:
        step, state, _ = ckpt.restore_latest(abstract_state(run))
    assert step == 4
    chex.assert_trees_all_equal(jax.device_get(state.params), final.params)
    longer = dataclasses.replace(SMALL, total_timesteps=SMALL.total_timesteps + 8 * 8 * 2)
    result = train(longer, RunConfig.make(mesh=mesh, resume=str(copy), quiet=True, log_every=2))
    assert result.resumed_from == 4 and result.updates_done == 6
    assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(result.state.params))
