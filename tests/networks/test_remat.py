"""Rematerialisation: ``remat="block"`` / ``"full"`` keep the parameter tree and the gradients of
``remat="none"`` and really put checkpoints into the differentiated program."""

import functools
import math

import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest

from rljax.networks import ActorCritic, QNetwork, ResidualActorCritic, ResidualQNetwork
from tests.networks.host_params import draw_host_params
from tests.networks.jaxprs import all_equations

OBS = jax.random.normal(jax.random.key(2), (8, 6))
TARGETS = jnp.linspace(-1.0, 1.0, 8)
NETWORKS = {
    "residual_actor_critic": ResidualActorCritic(num_actions=3, width=16, depth=2, expansion=2),
    "residual_q": ResidualQNetwork(num_actions=3, width=16, depth=2, expansion=2, dueling=True),
    "mlp_actor_critic": ActorCritic(
        num_actions=3, actor_widths=(32, 32), critic_widths=(32, 32), torso_widths=(32, 32)
    ),
    "mlp_q": QNetwork(num_actions=3, widths=(32, 32, 32)),
}
# jax.checkpoint's primitive: "remat2" on jax 0.10, "checkpoint" on later releases.
CHECKPOINT_PRIMITIVES = {"remat2", "checkpoint", "remat"}


def loss_of(net):
    def loss(params):
        outputs = jax.tree.leaves(net.apply(params, OBS))
        return sum(jnp.square(out.reshape(8, -1) - TARGETS[:, None]).mean() for out in outputs)

    return loss


@functools.cache
def host_params(name):
    return draw_host_params(NETWORKS[name], OBS)


def checkpoints(jaxpr) -> int:
    """Checkpointed sub-programs in ``jaxpr``, nested ones included."""
    return sum(eqn.primitive.name in CHECKPOINT_PRIMITIVES for eqn in all_equations(jaxpr))


@functools.cache
def gradients(name):
    """``{remat: (loss, gradients, checkpoints in the grad's jaxpr)}``, one compile."""
    nets = {remat: NETWORKS[name].clone(remat=remat) for remat in ("none", "block", "full")}
    grads = {remat: jax.value_and_grad(loss_of(net)) for remat, net in nets.items()}
    params = host_params(name)
    values = jax.jit(lambda p: {remat: g(p) for remat, g in grads.items()})(params)
    return {
        remat: (*values[remat], checkpoints(jax.make_jaxpr(g)(params).jaxpr))
        for remat, g in grads.items()
    }


@pytest.mark.parametrize("name", list(NETWORKS))
@pytest.mark.parametrize("remat", ["block", "full"])
def test_remat_keeps_the_parameter_tree_and_gradients(name, remat):
    net = NETWORKS[name]
    abstract = jax.eval_shape(net.clone(remat=remat).init, jax.random.key(0), OBS)
    reference = jax.eval_shape(net.init, jax.random.key(0), OBS)
    assert nn.get_partition_spec(abstract) == nn.get_partition_spec(reference)
    chex.assert_trees_all_equal_shapes_and_dtypes(abstract, reference)

    results = gradients(name)
    loss, grads, _ = results[remat]
    chex.assert_trees_all_close(loss, results["none"][0], rtol=1e-6, atol=1e-7)
    chex.assert_trees_all_close(grads, results["none"][1], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", list(NETWORKS))
def test_remat_puts_checkpoints_into_the_gradient_program(name):
    """none: no checkpoint; block: one per residual block / MLP layer; full: one per tower."""
    counts = {remat: result[2] for remat, result in gradients(name).items()}
    blocks = {
        "residual_actor_critic": 2 * 2,  # two towers of two blocks
        "residual_q": 2,
        "mlp_actor_critic": 2 + 2 + 2,  # torso, actor, critic: two layers each
        "mlp_q": 3,
    }[name]
    towers = {"mlp_actor_critic": 3, "residual_actor_critic": 2}.get(name, 1)
    assert counts == {"none": 0, "block": blocks, "full": towers}


@pytest.mark.parametrize("name", ["residual_actor_critic", "mlp_q"])
def test_remat_shrinks_what_the_forward_pass_saves_for_the_backward(name):
    """Bytes of the residuals ``jax.vjp`` keeps (traced only): block < none, full < block."""
    saved = {}
    for remat in ("none", "block", "full"):
        vjp = jax.eval_shape(
            lambda p, remat=remat: jax.vjp(loss_of(NETWORKS[name].clone(remat=remat)), p)[1],
            host_params(name),
        )
        saved[remat] = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(vjp))
    assert saved["full"] < saved["block"] < saved["none"]
