"""Pipeline parallelism over the ``stage`` axis: the pipelined residual tower equals the unsplit
one, its stacked blocks live on their stages, and bad input gets one error each."""

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from rljax import PPOConfig
from rljax.errors import ConfigError
from rljax.networks.residual import ResidualActorCritic
from rljax.networks.zoo import check_network, check_stages
from rljax.parallel import Layout, make_mesh, mesh_spec_of, parse_mesh_spec
from rljax.parallel.pipeline import bubble_fraction, num_stages

DEPTH = 4
# SiLU: smooth, so float32 rounding cannot flip a unit across a ReLU kink between the two orders.
TOWER = dict(num_actions=3, width=8, depth=DEPTH, expansion=2, activation="silu")


def unstacked(params):
    """Stacked ``blocks`` (leaves ``[L, ...]``) of every tower -> ``block_0 ... block_{L-1}``."""
    towers = {}
    for name, tower in params["params"].items():
        if "blocks" not in tower:
            towers[name] = tower
            continue
        rest = {k: v for k, v in tower.items() if k != "blocks"}
        blocks = tower["blocks"]
        for i in range(DEPTH):
            rest[f"block_{i}"] = jax.tree.map(lambda x, i=i: x[i], blocks)
        towers[name] = rest
    return {"params": towers}


def loss(net, params, obs):
    logits, value = net.apply(params, obs)
    return jnp.sum(jnp.sin(logits)) + jnp.sum(value**2)


@pytest.fixture(scope="module")
def reference():
    """Pipelined network, its boxed parameters, observations, and the unsplit network's
    forward and gradients (no mesh, separate block parameters)."""
    net = ResidualActorCritic(**TOWER, pipeline_microbatches=2)
    obs = jax.random.normal(jax.random.key(1), (8, 5))
    boxed = net.init(jax.random.key(0), obs[:1])
    params = nn.meta.unbox(boxed)
    plain = ResidualActorCritic(**TOWER)
    flat = unstacked(params)
    out = jax.jit(plain.apply)(flat, obs)
    grads = jax.jit(jax.grad(lambda p: loss(plain, p, obs)))(flat)
    return net, boxed, obs, out, grads


@pytest.mark.parametrize("spec", ["stage=2", "data=2,stage=2,model=2", "stage=4,data=2"])
def test_pipeline_equals_unsplit_network(reference, spec):
    net, boxed, obs, out, grads = reference
    layout = Layout(make_mesh(spec))
    params = jax.device_put(nn.meta.unbox(boxed), layout.shardings(nn.get_partition_spec(boxed)))
    with layout.active():
        assert num_stages() == parse_mesh_spec(spec)["stage"]
        got = jax.jit(net.apply)(params, obs)
        got_grads = jax.jit(jax.grad(lambda p: loss(net, p, obs)))(params)
    chex.assert_trees_all_close(got, out, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(unstacked(got_grads), grads, atol=1e-5, rtol=1e-5)
    # Each device holds its stage's consecutive blocks only.
    kernel = params["params"]["actor"]["blocks"]["dense_0"]["kernel"]
    stages = layout.mesh.shape["stage"]
    assert {s.data.shape[0] for s in kernel.addressable_shards} == {DEPTH // stages}


def test_pipeline_under_replica_vmap(reference):
    """Per-replica gradients (the learner's vmap over data-parallel replicas) equal the unsplit
    network's on each replica's rows."""
    from rljax.parallel.rules import spending

    net, boxed, obs, _, _ = reference
    params = nn.meta.unbox(boxed)
    plain, flat = ResidualActorCritic(**TOWER), unstacked(params)
    halves = obs.reshape(2, 4, -1)
    want = jax.jit(jax.vmap(jax.grad(lambda p, o: loss(plain, p, o)), in_axes=(None, 0)))(
        flat, halves
    )
    layout = Layout(make_mesh("data=2,stage=2"))

    def grad(p, o):
        with spending("data"):
            return jax.grad(lambda p: loss(net, p, o))(p)

    with layout.active():
        got = jax.jit(jax.vmap(grad, in_axes=(None, 0), spmd_axis_name="data"))(params, halves)
    chex.assert_trees_all_close(jax.vmap(unstacked)(got), want, atol=1e-5, rtol=1e-5)


def test_stage_axis_in_mesh_specs():
    assert parse_mesh_spec("data=2,stage=2,model=2") == dict(data=2, fsdp=1, stage=2, model=2)
    assert mesh_spec_of(make_mesh("data=2,model=2")) == "data=2,model=2"
    assert mesh_spec_of(make_mesh("stage=2,data=2")) == "data=2,stage=2,model=1"


def test_bubble_fraction():
    assert bubble_fraction(1, 4) == 0.0
    assert bubble_fraction(2, 4) == pytest.approx(1 / 5)
    assert bubble_fraction(4, 4) == pytest.approx(3 / 7)


def residual(**kw):
    base = dict(network="residual", residual_depth=4, pipeline_microbatches=2, num_envs=8)
    return PPOConfig(**{**base, **kw})


@pytest.mark.parametrize(
    "config, stages, match",
    [
        (residual(residual_depth=3), 2, "residual_depth=3 blocks do not split over the 2"),
        (residual(pipeline_microbatches=3), 2, "pipeline_microbatches=3 does not divide"),
        (residual(network="mlp", pipeline_microbatches=0), 2, "network='mlp' has none"),
        (residual(pipeline_microbatches=0), 2, "needs pipeline_microbatches >= 1"),
    ],
)
def test_bad_pipeline_input_one_error_each(config, stages, match):
    with pytest.raises(ConfigError, match=match):
        check_stages(config, stages, batch_shards=2)


def test_microbatches_only_for_residual():
    with pytest.raises(ConfigError, match="pipeline_microbatches=2"):
        check_network(residual(network="mlp"), 1)
    check_stages(residual(network="mlp", pipeline_microbatches=0), 1, 1)  # no stage: no check


def tiny_ppo(**kw):
    base = dict(num_envs=8, num_steps=4, num_minibatches=2, update_epochs=1, total_timesteps=32)
    net = dict(residual_width=8, residual_depth=2, residual_expansion=2)
    return residual(**{**base, **net, **kw})


def test_pipeline_errors_come_from_prepare():
    from rljax import RunConfig
    from rljax.run.sharded import prepare

    run = RunConfig.make(mesh="data=2,stage=2")
    with pytest.raises(ConfigError, match="residual_depth=3 blocks"):
        prepare(tiny_ppo(residual_depth=3), run)


def test_ppo_on_stage_mesh_equals_unpipelined_mesh():
    """A PPO update on data=2,stage=2 ends with the parameters of data=2 (same stacked net)."""
    from rljax import PPO
    from rljax.run.sharded import ShardedRun

    finals = []
    for spec in ("data=2", "data=2,stage=2"):
        run = ShardedRun(PPO(tiny_ppo(), replicas=2), make_mesh(spec), chunk_size=1)
        state, _ = run.run_chunk(run.init(jax.random.key(0)), 1)
        finals.append(jax.device_get(state.params))
    chex.assert_trees_all_close(finals[0], finals[1], atol=1e-5, rtol=1e-5)


def test_pipeline_with_bfloat16_parameters():
    """bfloat16 parameters (float32 stream) compile pipelined and match the unsplit network."""
    net = ResidualActorCritic(**TOWER, param_dtype="bfloat16", pipeline_microbatches=2)
    obs = jax.random.normal(jax.random.key(1), (8, 5))
    boxed = net.init(jax.random.key(0), obs[:1])
    params = nn.meta.unbox(boxed)
    plain, flat = ResidualActorCritic(**TOWER, param_dtype="bfloat16"), unstacked(params)
    want = jax.jit(jax.grad(lambda p: loss(plain, p, obs)))(flat)
    layout = Layout(make_mesh("data=2,stage=2"))
    params = jax.device_put(params, layout.shardings(nn.get_partition_spec(boxed)))
    with layout.active():
        got = jax.jit(jax.grad(lambda p: loss(net, p, obs)))(params)
    assert jax.tree.leaves(got)[0].dtype == jnp.bfloat16
    chex.assert_trees_all_close(unstacked(got), want, atol=1e-2, rtol=1e-2)


def test_plan_reports_stages_bubble_and_stacked_bytes():
    from rljax import RunConfig
    from rljax.run.plan import plan

    p = plan(tiny_ppo(pipeline_microbatches=4), RunConfig.make(mesh="data=2,stage=2"))
    pipe = p.as_dict()["pipeline"]
    assert (pipe["stages"], pipe["microbatches"]) == (2, 4)
    assert pipe["bubble"] == pytest.approx(1 / 5)
    # width 8, expansion 2, depth 2, two towers, float32; half the blocks per device
    per_block = (8 + 8) + (8 * 16 + 16) + (16 * 8 + 8)
    assert pipe["stacked_param_bytes"] == 2 * 2 * per_block * 4 // 2
    assert "pipeline: 2 stages x 4 microbatches" in p.table()
