"""Brax environments (the optional extra) behind ``BatchedEnv``'s interface: names and the
install message without Brax, shapes, Brax's ``info["truncation"]`` mapped onto truncated vs
terminated (truncation bootstraps from ``final_obs``, termination does not), and PPO learning
inverted_pendulum. Tests that need Brax are skipped where it is not installed."""

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import DQN, PPO, ConfigError, DQNConfig, PPOConfig
from rljax.algos.ppo import gae
from rljax.envs import check_discrete, check_env_name, make_env

PENDULUM = "brax/inverted_pendulum"
ACTION_ENDS = "brax/rljax_test_action_ends"
INSTALL = r"pip install 'rljax\[brax\]'"


@pytest.fixture(scope="module")
def brax_envs():
    """``rljax.envs.brax_envs``, with ``ACTION_ENDS`` registered in Brax; skips without Brax."""
    pytest.importorskip("brax")
    from brax import envs
    from brax.envs.base import Env, State

    from rljax.envs import brax_envs

    class ActionEnds(Env):
        """Observes ``[steps taken, 1]`` (``[0, 0]`` after a reset); reward 1 a step; terminates
        on a step whose action is positive."""

        def reset(self, rng):
            zero = jnp.zeros(())
            return State(None, jnp.zeros(2), zero, zero, {}, {})

        def step(self, state, action):
            obs = jnp.stack([state.obs[0] + 1.0, jnp.float32(1.0)])
            done = (action[0] > 0).astype(jnp.float32)
            return state.replace(obs=obs, reward=jnp.ones(()), done=done)

        observation_size = property(lambda self: 2)
        action_size = property(lambda self: 1)
        backend = property(lambda self: "none")

    envs.register_environment(ACTION_ENDS.removeprefix("brax/"), ActionEnds)
    return brax_envs


def test_a_brax_name_without_brax_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "brax", None)  # `import brax` fails as if not installed
    for build in (
        lambda: check_env_name(PENDULUM),
        lambda: PPO.validate(PPOConfig(env=PENDULUM)),
        lambda: make_env(PENDULUM, 2),
    ):
        with pytest.raises(ConfigError, match=f"{PENDULUM} needs Brax.*{INSTALL}"):
            build()


def test_unknown_brax_names_list_the_known_ones():
    with pytest.raises(ConfigError, match="unknown Brax environment 'brax/cartpole'; known: "):
        check_env_name("brax/cartpole")
    with pytest.raises(ConfigError, match="Brax environments .pip install 'rljax.brax.'"):
        check_env_name("inverted_pendulum")  # the gymnax message points at the prefix


def test_dqn_refuses_brax_envs_naming_what_it_supports():
    with pytest.raises(ConfigError, match="dqn supports discrete action spaces only.*brax/"):
        check_discrete(PENDULUM, "dqn")


def test_dqn_validation_refuses_an_installed_brax_env(brax_envs):
    with pytest.raises(ConfigError, match="dqn supports discrete action spaces only"):
        DQN.validate(DQNConfig(env=PENDULUM))
    PPO.validate(PPOConfig(env=ACTION_ENDS))  # registered with Brax: a known name


@pytest.fixture(scope="module")
def pendulum_rollout(brax_envs):
    """16 steps of 2 pendulums with a 12-step time limit: env 0 keeps the pole up (action 0),
    env 1 topples it (full push) -> ``(batch after, transitions [T, B], obs after each step)``."""
    env = brax_envs.BraxEnv(PENDULUM, 2, episode_length=12)
    action = jnp.array([[0.0], [1.0]])

    def rollout(key):
        def step(batch, k):
            batch, tr = env.step(k, batch, action)
            return batch, (tr, batch.obs)

        return jax.lax.scan(step, env.reset(key), jax.random.split(key, 16))

    return jax.jit(rollout)(jax.random.key(0))


def test_reset_and_step_shapes(brax_envs, pendulum_rollout):
    env = make_env(PENDULUM, 4)
    assert isinstance(env, brax_envs.BraxEnv) and env.time_limit == 1000
    spec = env.spec
    assert spec.continuous and spec.obs_dim == 4 and spec.action_dim == 1
    assert spec.action_low == (-1.0,) and spec.action_high == (1.0,)
    assert jax.eval_shape(env.reset, jax.random.key(0)).obs.shape == (4, 4)
    batch, (tr, _) = pendulum_rollout
    assert tr.obs.shape == tr.final_obs.shape == (16, 2, 4) and batch.obs.shape == (2, 4)
    assert tr.obs.dtype == tr.final_obs.dtype == tr.reward.dtype == jnp.float32
    assert tr.reward.shape == tr.terminated.shape == tr.truncated.shape == (16, 2)
    assert tr.terminated.dtype == tr.truncated.dtype == jnp.bool_
    assert batch.stats.last_return.shape == batch.stats.completed.shape == (2,)


def test_truncation_and_termination_of_the_pendulum(pendulum_rollout):
    batch, (tr, next_obs) = pendulum_rollout
    assert tr.truncated[:, 0].tolist() == [t == 11 for t in range(16)]
    assert not tr.terminated[:, 0].any() and not tr.truncated[:, 1].any()
    ended = np.asarray(tr.terminated | tr.truncated)
    assert ended[:, 1].sum() >= 2
    # The final observation is the old episode's last; the batch moves on to a reset one.
    np.testing.assert_array_equal(tr.final_obs[~ended], next_obs[~ended])
    assert not np.allclose(tr.final_obs[11, 0], next_obs[11, 0])
    assert (np.abs(tr.final_obs[ended[:, 1], 1, 1]) > 0.2).all()  # toppled past 0.2 rad
    assert (np.abs(next_obs[ended[:, 1], 1]) <= 0.01).all()  # a fresh start
    assert batch.stats.completed.tolist() == [1, int(ended[:, 1].sum())]
    assert int(batch.stats.last_length[0]) == 12 and float(batch.stats.last_return[0]) == 12.0


def test_truncation_on_the_last_step_is_termination_when_it_terminated(brax_envs):
    env = brax_envs.BraxEnv(ACTION_ENDS, 3, episode_length=3)
    # Env 0 never terminates (truncated at step 3); env 1 terminates on step 3, at the time
    # limit; env 2 terminates on step 1, and again after 2 steps of its next episode.
    actions = jnp.array([[[-1.0], [-1.0], [1.0]], [[-1.0], [-1.0], [-1.0]], [[-1.0], [1.0], [1.0]]])
    batch, step = env.reset(jax.random.key(0)), jax.jit(env.step)
    ends = []
    for t in range(3):
        batch, tr = step(jax.random.key(t), batch, actions[t])
        ends.append((tr.terminated.tolist(), tr.truncated.tolist()))
    assert ends[0] == ([False, False, True], [False, False, False])
    assert ends[2] == ([False, True, True], [True, False, False])
    np.testing.assert_array_equal(tr.final_obs, [[3.0, 1.0], [3.0, 1.0], [2.0, 1.0]])
    np.testing.assert_array_equal(batch.obs, np.zeros((3, 2)))  # all three were reset
    assert batch.stats.last_length.tolist() == [3, 3, 2]


def test_ppo_bootstraps_truncation_from_the_final_observation_and_not_termination(brax_envs):
    config = PPOConfig(
        env=ACTION_ENDS, num_envs=8, num_steps=16, total_timesteps=8 * 16,
        gamma=0.9, gae_lambda=0.8, actor_widths=(8,), critic_widths=(8,),
    )  # fmt: skip
    ppo = PPO(config)
    ppo.env = brax_envs.BraxEnv(ACTION_ENDS, config.num_envs, episode_length=3)

    def targets(key):
        state = ppo.init(key)
        env, rollout = ppo.rollout(state.params, state.env, key)
        next_values = ppo.next_values(state.params, rollout, env.obs)
        tr = rollout.transition
        adv, _ = gae(tr.reward, rollout.value, next_values, tr.terminated, tr.truncated, 0.9, 0.8)
        final_values = jax.vmap(ppo.value, in_axes=(None, 0))(state.params, tr.final_obs)
        return tr, rollout.value, final_values, adv

    tr, value, final_value, adv = jax.jit(targets)(jax.random.key(0))
    assert tr.terminated.any() and tr.truncated.any()
    # An episode's end cuts GAE: its advantage is its own TD error.
    np.testing.assert_allclose(adv[tr.terminated], 1.0 - value[tr.terminated], rtol=1e-5)
    truncated = 1.0 + 0.9 * final_value - value
    np.testing.assert_allclose(adv[tr.truncated], truncated[tr.truncated], rtol=1e-5)
    assert (np.abs(final_value[tr.truncated]) > 1e-3).all()  # a bootstrap that matters


def test_ppo_learns_inverted_pendulum(brax_envs):
    # Measured (100k steps, seeds 0-4): the first 10 updates return ~16 (episodes of ~16 steps),
    # the last 10 % 777, 743, 393, 599, 803; about 12 s to compile and 2-3 s to run on 2 cores.
    config = PPOConfig(
        env=PENDULUM, num_envs=16, num_steps=64, total_timesteps=100_000, num_minibatches=4,
        update_epochs=4, lr=1e-3, gamma=0.99, ent_coef=0.0, clip_value_loss=False,
        actor_widths=(64, 64), critic_widths=(64, 64),
    )  # fmt: skip
    ppo = PPO(config)

    def run(key):
        return jax.lax.scan(lambda s, _: ppo.update(s), ppo.init(key), length=config.num_updates)

    _, metrics = jax.jit(run)(jax.random.key(0))
    returns = np.asarray(metrics["episode_return"])
    first, last = returns[:10].mean(), returns[-len(returns) // 10 :].mean()
    assert first < 50 and last >= 200, (first, last)
    assert np.isfinite(np.asarray(metrics["loss"])).all()
