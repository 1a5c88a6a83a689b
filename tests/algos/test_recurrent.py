"""Recurrent (GRU and LSTM) PPO: the hidden state resets exactly at episode ends, training
replays the rollout's numbers from each sequence's stored start state, minibatches keep sequences
whole, sharded equals single-device, evaluation carries the state, bad configs get one
ConfigError, and a short fixed-seed run of each cell learns the partially observable CartPole."""

import dataclasses
import re

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import A2C, DQN, PPO, A2CConfig, ConfigError, DQNConfig, PPOConfig
from rljax.algos.recurrent import RecurrentPPO
from rljax.run.checkpoint import Checkpointer, abstract_of
from rljax.run.evaluation import Evaluator
from rljax.run.sharded import ShardedRun
from tests.algos.updates import jitted_updates

TINY = PPOConfig(
    env="CartPole-v1-po",
    recurrent="gru",
    recurrent_width=8,
    actor_widths=(8, 8, 8),  # odd: the logits head reads model-sharded features (row split)
    critic_widths=(8, 8),
    num_envs=8,
    num_steps=32,
    num_minibatches=2,
    total_timesteps=8 * 32 * 4,
)


@pytest.fixture(scope="module")
def after_one_update():
    """A TINY RecurrentPPO after one update (so ``state.hidden`` is not all zeros)."""
    ppo = PPO(TINY)
    state, _ = jax.jit(ppo.update)(ppo.init(jax.random.key(0)))
    return ppo, state


@pytest.mark.parametrize("cell, width", [("gru", 8), ("lstm", 16)])  # an LSTM's state: [c | h]
def test_ppo_with_recurrent_builds_recurrent_ppo_and_keeps_the_state(cell, width):
    ppo = PPO(dataclasses.replace(TINY, recurrent=cell), replicas=2)
    assert isinstance(ppo, RecurrentPPO) and isinstance(ppo.rebuild(replicas=1), RecurrentPPO)
    assert type(PPO(dataclasses.replace(TINY, recurrent="none", env="CartPole-v1"))) is PPO
    state = ppo.init(jax.random.key(0))
    assert state.hidden.shape == (8, width) and not state.hidden.any()
    assert set(state.params["params"]) == {"embedding", cell, "core"}
    assert tuple(ppo.state_specs().hidden) == ("batch", "activation_recurrent")


def test_vmapped_init_draws_each_seed_alone_and_equals_its_own_init():
    """``jax.vmap(ppo.init)`` runs the seeds' orthogonal initialisers one after another: no QR
    is batched (a batched LAPACK QR deadlocked two vmapped GRU PPO inits on one CPU device)."""
    ppo = PPO(TINY)
    keys = jax.random.split(jax.random.key(0), 2)
    vmapped = jax.jit(jax.vmap(ppo.init))
    hlo = vmapped.lower(keys).compile().as_text()
    qr_lines = [line for line in hlo.splitlines() if 'custom_call_target="lapack_sgeqrf' in line]
    assert qr_lines, "no LAPACK QR in the init program: nothing checked"
    for line in qr_lines:
        assert all(shape.count(",") <= 1 for shape in re.findall(r"f32\[([\d,]*)\]", line)), line
    states = vmapped(keys)
    for i, key in enumerate(keys):
        one = jax.jit(ppo.init)(key)
        chex.assert_trees_all_equal(jax.tree.map(lambda x, i=i: x[i], states), one)


@pytest.mark.parametrize("time_limit", [7, 500])
def test_hidden_state_resets_exactly_at_episode_ends(after_one_update, time_limit):
    """Every step's value is the network's from zeros at its episode's first step (or, before
    the rollout's first episode end, from the stored state), stepped without the rollout.
    ``time_limit=7`` truncates often (V(final_obs) at every step), 500 never within a rollout
    of 32 steps (the truncation hidden state carried)."""
    ppo, state = after_one_update
    ppo = PPO(TINY)
    ppo.env.params = ppo.env.params.replace(max_steps_in_episode=time_limit)
    assert ppo.truncates_once == (time_limit >= TINY.num_steps)
    env = ppo.env.reset(jax.random.key(3))
    hidden = state.hidden
    assert np.abs(np.asarray(hidden)).max() > 0
    (_, last_hidden, _), (rollout, _) = jax.jit(ppo.rollout_sequences)(
        state.params, env, hidden, jax.random.key(4)
    )
    tr = rollout.transition
    ends = np.asarray(tr.terminated | tr.truncated)
    assert ends.any(axis=0).all() and ends[:-1].any()
    step = jax.jit(ppo.network.apply)
    h = hidden
    for t in range(TINY.num_steps):
        _, value, h = step(state.params, tr.obs[t], h)
        np.testing.assert_allclose(value, rollout.value[t], rtol=1e-5, atol=1e-5)
        h = jnp.where(ends[t][:, None], 0.0, h)
    np.testing.assert_allclose(last_hidden, h, rtol=1e-5, atol=1e-6)
    assert not np.asarray(last_hidden)[ends[-1]].any()  # ended on the last step: zeros
    # Without the reset the values after an episode end differ: the test can tell.
    _, no_reset, _ = step(state.params, tr.obs[1], step(state.params, tr.obs[0], hidden)[2])
    first_end = ends[0]
    if first_end.any():
        assert not np.allclose(no_reset[first_end], rollout.value[1][first_end], atol=1e-4)


def test_training_replays_the_rollout_from_each_sequence_start(after_one_update):
    """``training_batch`` + ``forward`` (BPTT path) give the rollout's log-probabilities and
    values: PPO's first ratio is exactly 1, also for sequences starting mid-episode."""
    ppo, state = after_one_update
    collect = jax.jit(ppo.collect)
    env, rollout, next_values, replaced = collect(state, jax.random.key(5))
    zeros = jnp.zeros_like(rollout.value)
    samples = ppo_batch(rollout, zeros)
    batch = ppo.training_batch(state, samples, rollout)
    assert batch.obs.shape == (1, 8, 32, 2) and batch.hidden.shape == (1, 8, 8)
    out, value = jax.jit(ppo.forward)(state.params, jax.tree.map(lambda x: x[0], batch))
    log_prob = ppo.dist.log_prob(out, batch.action[0])
    np.testing.assert_allclose(value, rollout.value.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(log_prob, rollout.log_prob.T, rtol=1e-5, atol=1e-5)
    assert next_values.shape == (32, 8) and replaced["hidden"].shape == (8, 8)


def ppo_batch(rollout, zeros):
    from rljax.algos.ppo import PPOBatch

    tr = rollout.transition
    return PPOBatch(tr.obs, rollout.action, rollout.log_prob, rollout.value, zeros, zeros)


def test_minibatches_are_whole_sequences(monkeypatch):
    """Each minibatch row is one environment's whole rollout in time order, with its own start
    state, from that replica's environments; every sequence appears once per epoch."""
    ppo = PPO(TINY, replicas=2)  # 8 envs, 2 replicas, 2 minibatches: 2 sequences per piece
    state = ppo.init(jax.random.key(0))
    state = state.replace(hidden=jax.random.normal(jax.random.key(9), state.hidden.shape))
    _, rollout, _, _ = jax.jit(ppo.collect)(state, jax.random.key(1))
    zeros = jnp.zeros_like(rollout.value)
    batch = ppo.training_batch(state, ppo_batch(rollout, zeros), rollout)
    assert batch.obs.shape == (2, 4, 32, 2)  # [R, B/R, T, D]
    monkeypatch.setattr(ppo, "sgd_step", lambda carry, mb, hparams: (carry, {"mb": mb}))
    _, recorded = ppo.epoch((None, None, None), jax.random.key(2), batch, {})
    minibatches = recorded["mb"]
    assert minibatches.obs.shape == (2, 2, 2, 32, 2)  # [M, R, n, T, D]
    obs, ends = np.asarray(rollout.transition.obs), np.asarray(minibatches.ends)
    hidden = np.asarray(state.hidden)
    for r in range(2):
        envs = []
        for m in range(2):
            for j in range(2):
                sequence = np.asarray(minibatches.obs[m, r, j])  # [T, D]
                matches = [b for b in range(8) if np.array_equal(obs[:, b], sequence)]
                assert len(matches) == 1 and r * 4 <= matches[0] < r * 4 + 4
                b = matches[0]
                np.testing.assert_array_equal(minibatches.hidden[m, r, j], hidden[b])
                tr = rollout.transition
                np.testing.assert_array_equal(ends[m, r, j], (tr.terminated | tr.truncated)[:, b])
                envs.append(b)
        assert sorted(envs) == list(range(r * 4, r * 4 + 4))


@pytest.mark.parametrize("cell, recurrent_kernel", [("gru", "hr"), ("lstm", "hf")])
def test_sharded_equals_single_device_and_checkpoints_carry_the_hidden_state(
    mesh4, tmp_path, cell, recurrent_kernel
):
    config = dataclasses.replace(TINY, recurrent=cell)
    run = ShardedRun(PPO(config, replicas=2), mesh4, num_seeds=1, chunk_size=2)
    state, metrics = run.run_chunk(run.init(jax.random.key(0)), 2)
    with Checkpointer(tmp_path / "ckpt", async_save=False) as checkpointer:
        checkpointer.save(2, state, {})
        restored, _ = checkpointer.restore(2, abstract_of(state))
    np.testing.assert_array_equal(restored.hidden, state.hidden)
    assert restored.hidden.sharding == state.hidden.sharding and state.hidden.any()
    params = state.params["params"]
    # The cell and the embedding are replicated; the towers after them tensor parallel.
    assert all(s is None for s in tuple(params[cell][recurrent_kernel]["kernel"].sharding.spec))
    assert all(s is None for s in tuple(params["embedding"]["kernel"].sharding.spec))
    assert "model" in tuple(params["core"]["actor"]["dense_0"]["kernel"].sharding.spec)
    assert tuple(state.hidden.sharding.spec)[:1] == ("data",)
    expected_state, expected = jitted_updates(PPO(config, replicas=2), jax.random.key(0), 2)
    chex.assert_trees_all_close(state.params, expected_state.params, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(state.hidden, expected_state.hidden, atol=1e-5, rtol=1e-5)
    chex.assert_trees_all_close(
        jax.tree.map(lambda m: m[:2], metrics), expected, atol=1e-4, rtol=1e-4
    )


def test_evaluation_carries_the_hidden_state(after_one_update):
    ppo, state = after_one_update
    result = jax.jit(Evaluator(ppo, 3))(state.params, jax.random.key(0))
    assert result["eval_episode_returns"].shape == (3,) and float(result["eval_finished"]) == 1.0
    obs = jnp.zeros((3, 2))
    with pytest.raises(ValueError, match="recurrent policy acts from its hidden state"):
        ppo.eval_action(state.params, obs, jax.random.key(0))
    action, memory = ppo.eval_action(
        state.params, obs, jax.random.key(0), memory=ppo.eval_memory(3)
    )
    assert action.shape == (3,) and memory.shape == (3, 8)


def test_optimizer_step_runs_on_placeholder_sequences():
    ppo = PPO(TINY, replicas=2)
    state = ppo.init(jax.random.key(0))
    stepped = jax.jit(ppo.optimizer_step)(state)
    assert int(stepped.sync["steps"]) == 1


@pytest.mark.parametrize(
    "changes, batch_shards, match",
    [
        (dict(num_envs=4, num_minibatches=3), 1, r"num_minibatches=3 does not split num_envs=4"),
        (dict(num_envs=4, num_minibatches=4), 2, r"on each of 2 data shards.*in \[1, 2\]"),
        (dict(torso_widths=(8, 8)), 1, r"torso_widths must be \(\)"),
        (dict(network="residual"), 1, r"goes with network='mlp'"),
        (dict(recurrent_width=0), 1, r"recurrent_width must be >= 1"),
        (dict(recurrent="rnn"), 1, r"recurrent must be one of \['none', 'gru', 'lstm'\]"),
    ],
)
def test_bad_recurrent_configs_get_one_config_error(changes, batch_shards, match):
    with pytest.raises(ConfigError, match=match):
        PPO.validate(dataclasses.replace(TINY, **changes), batch_shards=batch_shards)


def test_a2c_and_dqn_refuse_recurrent():
    with pytest.raises(ConfigError, match="recurrent='gru' is built for ppo only; a2c"):
        A2C.validate(A2CConfig(recurrent="gru"))
    with pytest.raises(ConfigError, match="recurrent='gru' is built for ppo only; dqn"):
        DQN.validate(DQNConfig(recurrent="gru"))


# One seed's return after 50 updates moves with the compiler: seed 0's GRU ended at 155 (jax
# 0.10.2) and 99 (jax 0.11.2) at the suite's LLVM -O2, and at 242 / 177 at -O3. So the test
# averages the first two seeds of split(key(0)) (a vmap), measured at -O2: GRU last 10 % of
# updates 101 / 140 (jax 0.10.2) and 138 / 123 (0.11.2) from ~25 in the first 10 %; the MLP
# 49 / 50 on both (at 2e6 steps it plateaus near 48, experiments/results/ppo_recurrent.md).
# The LSTM learns more slowly at lr 1e-3: 124 / 106 from 23 (2026-12-07, jax 0.10.2, -O2), but
# 103 on average on an AMD EPYC host, and 72-117 over four seeds there. At 3e-3 it gave 124 / 170
# there (97-191 over eight seeds), so the LSTM's test runs at 3e-3.
LEARN = PPOConfig(
    env="CartPole-v1-po",
    recurrent="gru",
    recurrent_width=64,
    actor_widths=(64,),
    critic_widths=(64,),
    activation="relu",
    num_envs=16,
    num_steps=128,
    num_minibatches=4,
    lr=1e-3,
    anneal_lr=False,
    total_timesteps=102_400,
)
SEEDS = jax.random.split(jax.random.key(0), 2)


def learning_returns(recurrent: str, lr: float = LEARN.lr) -> np.ndarray:
    """``episode_return [seeds, updates]`` of ``LEARN`` with ``recurrent`` and ``lr``, two vmapped
    seeds."""
    config = dataclasses.replace(LEARN, recurrent=recurrent, lr=lr)
    _, metrics = jitted_updates(PPO(config), SEEDS, config.num_updates)
    assert np.isfinite(np.asarray(metrics["loss"])).all()
    return np.asarray(metrics["episode_return"])


@pytest.fixture(scope="module")
def feed_forward_returns():
    return learning_returns("none")


@pytest.mark.parametrize("cell, lr", [("gru", 1e-3), ("lstm", 3e-3)])
def test_recurrent_ppo_learns_partially_observable_cartpole_where_the_mlp_does_not(
    cell, lr, feed_forward_returns
):
    returns = learning_returns(cell, lr)
    tenth = returns.shape[1] // 10
    first, last = returns[:, :tenth].mean(), returns[:, -tenth:].mean()
    assert last >= 100 and last >= 3 * first, (first, last)
    assert feed_forward_returns[:, -tenth:].mean() <= 80
