"""PureJaxRL continuous-action PPO baseline -- FOR BENCHMARKING ONLY.

A re-implementation, for gymnax 1.0 environments, of the algorithm in PureJaxRL's
``purejaxrl/ppo_continuous_action.py`` and its wrappers (``ClipAction``, ``VecEnv``,
``NormalizeVecObservation``, ``NormalizeVecReward``, ``LogWrapper``; Chris Lu,
https://github.com/luchris429/purejaxrl, Apache-2.0). It is a speed and sanity-return reference
for ``experiments/bench_ppo_family.py`` and nothing else imports it.

What it computes, per update, as the original does:

* ``ActorCritic``: separate actor and critic towers, 2 x Dense(256) tanh each, orthogonal init
  (gain sqrt(2) hidden, 0.01 for the mean head, 1.0 for the value head), zero biases; a
  state-independent ``log_std`` parameter initialised to 0; a diagonal Gaussian policy.
* Environment wrappers, per vectorised step: actions clipped to the action space's bounds (the
  original clips to [-1, 1], Brax's bounds; its own comment names the space's bounds as the
  intent), observations normalised by running mean/variance (count initialised to 1e-4, updated
  every step before normalising), rewards divided by the running std of the discounted return
  ``G = gamma G (1 - done) + r`` (updated every step).
* ``done = terminated | truncated`` ends the return without bootstrapping (the original's
  ``done``; truncation is treated as termination).
* Rollout scan, reverse GAE scan (``unroll=16``), ``UPDATE_EPOCHS`` x ``NUM_MINIBATCHES``
  shuffled minibatch scans of the clipped PPO loss with value clipping; ``clip_by_global_norm``
  then Adam (eps 1e-5), the learning rate constant unless ``ANNEAL_LR``.

The original's configuration targets Brax's hopper (2048 envs x 10 steps, 5e7 steps).
``DEFAULT_CONFIG`` keeps every hyperparameter and runs it on gymnax's Pendulum-v1 with fewer total
steps, which a CPU can time.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState

from experiments.baselines.purejaxrl_ppo import GymnaxWrapper, LogWrapper

DEFAULT_CONFIG: dict[str, Any] = {
    "LR": 3e-4,
    "NUM_ENVS": 2048,
    "NUM_STEPS": 10,
    "TOTAL_TIMESTEPS": 2_048 * 10 * 50,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 32,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.0,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ACTIVATION": "tanh",
    "ENV_NAME": "Pendulum-v1",
    "ANNEAL_LR": False,
    "NORMALIZE_ENV": True,
}

LOG_2PI = float(np.log(2.0 * np.pi))


def gaussian_log_prob(mean, log_std, action):
    z = (action - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * jnp.square(z) - log_std - 0.5 * LOG_2PI, axis=-1)


def gaussian_entropy(log_std, batch_shape):
    entropy = jnp.sum(0.5 + 0.5 * LOG_2PI + log_std)
    return jnp.broadcast_to(entropy, batch_shape)


# -- wrappers: the 5-tuple (obs, state, reward, done, info) of LogWrapper from here on -------------
class ClipAction(GymnaxWrapper):
    def __init__(self, env, low, high):
        super().__init__(env)
        self.low, self.high = low, high

    def step(self, key, state, action, params=None):
        return self._env.step(key, state, jnp.clip(action, self.low, self.high), params)


class VecEnv(GymnaxWrapper):
    def __init__(self, env):
        super().__init__(env)
        self.reset = jax.vmap(self._env.reset, in_axes=(0, None))
        self.step = jax.vmap(self._env.step, in_axes=(0, 0, 0, None))


def _merge(mean, var, count, batch):
    """Running (mean, var, count) merged with ``batch`` along axis 0 (Chan et al.)."""
    batch_mean, batch_var, n = jnp.mean(batch, axis=0), jnp.var(batch, axis=0), batch.shape[0]
    delta, total = batch_mean - mean, count + n
    m2 = var * count + batch_var * n + jnp.square(delta) * count * n / total
    return mean + delta * n / total, m2 / total, total


@struct.dataclass
class NormalizeVecObsEnvState:
    mean: jax.Array
    var: jax.Array
    count: jax.Array
    env_state: Any


class NormalizeVecObservation(GymnaxWrapper):
    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        mean, var, count = _merge(
            jnp.zeros_like(obs[0]), jnp.ones_like(obs[0]), jnp.float32(1e-4), obs
        )
        state = NormalizeVecObsEnvState(mean, var, count, env_state)
        return (obs - mean) / jnp.sqrt(var + 1e-8), state

    def step(self, key, state, action, params=None):
        obs, env_state, reward, done, info = self._env.step(key, state.env_state, action, params)
        mean, var, count = _merge(state.mean, state.var, state.count, obs)
        state = NormalizeVecObsEnvState(mean, var, count, env_state)
        return (obs - mean) / jnp.sqrt(var + 1e-8), state, reward, done, info


@struct.dataclass
class NormalizeVecRewEnvState:
    mean: jax.Array
    var: jax.Array
    count: jax.Array
    return_val: jax.Array
    env_state: Any


class NormalizeVecReward(GymnaxWrapper):
    def __init__(self, env, gamma):
        super().__init__(env)
        self.gamma = gamma

    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        zero = jnp.zeros((), jnp.float32)
        state = NormalizeVecRewEnvState(
            zero, zero + 1.0, zero + 1e-4, jnp.zeros((obs.shape[0],)), env_state
        )
        return obs, state

    def step(self, key, state, action, params=None):
        obs, env_state, reward, done, info = self._env.step(key, state.env_state, action, params)
        return_val = state.return_val * self.gamma * (1 - done) + reward
        mean, var, count = _merge(state.mean, state.var, state.count, return_val)
        state = NormalizeVecRewEnvState(mean, var, count, return_val, env_state)
        return obs, state, reward / jnp.sqrt(var + 1e-8), done, info


class ActorCritic(nn.Module):
    action_dim: int
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        act = nn.relu if self.activation == "relu" else nn.tanh
        hidden = dict(kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))
        a = act(nn.Dense(256, **hidden)(x))
        a = act(nn.Dense(256, **hidden)(a))
        mean = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(a)
        log_std = self.param("log_std", nn.initializers.zeros, (self.action_dim,))
        c = act(nn.Dense(256, **hidden)(x))
        c = act(nn.Dense(256, **hidden)(c))
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(c)
        return mean, log_std, jnp.squeeze(value, axis=-1)


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict


def make_env(config):
    env, env_params = gymnax.make(config["ENV_NAME"])
    space = env.action_space(env_params)
    env = ClipAction(LogWrapper(env), space.low, space.high)
    env = VecEnv(env)
    if config["NORMALIZE_ENV"]:
        env = NormalizeVecReward(NormalizeVecObservation(env), config["GAMMA"])
    return env, env_params, space.shape[0]


def make_train(config):
    config = dict(config)
    config["NUM_UPDATES"] = int(
        config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    )
    config["MINIBATCH_SIZE"] = config["NUM_ENVS"] * config["NUM_STEPS"] // config["NUM_MINIBATCHES"]
    env, env_params, action_dim = make_env(config)
    batch_size = config["NUM_ENVS"] * config["NUM_STEPS"]

    def linear_schedule(count):
        updates = count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"])
        return config["LR"] * (1.0 - updates / config["NUM_UPDATES"])

    def train(rng):
        network = ActorCritic(action_dim, activation=config["ACTIVATION"])
        rng, init_rng, reset_rng = jax.random.split(rng, 3)
        obs_dim = env.observation_space(env_params).shape
        params = network.init(init_rng, jnp.zeros(obs_dim))
        lr = linear_schedule if config["ANNEAL_LR"] else config["LR"]
        tx = optax.chain(
            optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(lr, eps=1e-5)
        )
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        obs, env_state = env.reset(jax.random.split(reset_rng, config["NUM_ENVS"]), env_params)

        def update_step(runner_state, _):
            def env_step(runner_state, _):
                train_state, env_state, last_obs, rng = runner_state
                rng, act_rng, step_rng = jax.random.split(rng, 3)
                mean, log_std, value = network.apply(train_state.params, last_obs)
                action = mean + jnp.exp(log_std) * jax.random.normal(act_rng, mean.shape)
                log_prob = gaussian_log_prob(mean, log_std, action)
                obs, env_state, reward, done, info = env.step(
                    jax.random.split(step_rng, config["NUM_ENVS"]), env_state, action, env_params
                )
                transition = Transition(done, action, value, reward, log_prob, last_obs, info)
                return (train_state, env_state, obs, rng), transition

            runner_state, traj = jax.lax.scan(env_step, runner_state, None, config["NUM_STEPS"])
            train_state, env_state, last_obs, rng = runner_state
            _, _, last_val = network.apply(train_state.params, last_obs)

            def gae_step(carry, t):
                gae, next_value = carry
                not_done = 1.0 - t.done
                delta = t.reward + config["GAMMA"] * next_value * not_done - t.value
                gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * not_done * gae
                return (gae, t.value), gae

            _, advantages = jax.lax.scan(
                gae_step, (jnp.zeros_like(last_val), last_val), traj, reverse=True, unroll=16
            )
            targets = advantages + traj.value

            def update_epoch(update_state, _):
                def update_minibatch(train_state, batch):
                    traj, gae, targets = batch

                    def loss_fn(params):
                        mean, log_std, value = network.apply(params, traj.obs)
                        log_prob = gaussian_log_prob(mean, log_std, traj.action)
                        clipped = traj.value + (value - traj.value).clip(
                            -config["CLIP_EPS"], config["CLIP_EPS"]
                        )
                        value_loss = (
                            0.5
                            * jnp.maximum(
                                jnp.square(value - targets), jnp.square(clipped - targets)
                            ).mean()
                        )
                        ratio = jnp.exp(log_prob - traj.log_prob)
                        norm = (gae - gae.mean()) / (gae.std() + 1e-8)
                        clip_ratio = jnp.clip(
                            ratio, 1.0 - config["CLIP_EPS"], 1.0 + config["CLIP_EPS"]
                        )
                        actor_loss = -jnp.minimum(ratio * norm, clip_ratio * norm).mean()
                        entropy = gaussian_entropy(log_std, value.shape).mean()
                        total = (
                            actor_loss
                            + config["VF_COEF"] * value_loss
                            - config["ENT_COEF"] * entropy
                        )
                        return total, (value_loss, actor_loss, entropy)

                    (total, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                        train_state.params
                    )
                    return train_state.apply_gradients(grads=grads), total

                train_state, traj, advantages, targets, rng = update_state
                rng, perm_rng = jax.random.split(rng)
                permutation = jax.random.permutation(perm_rng, batch_size)
                batch = jax.tree.map(
                    lambda x: x.reshape((batch_size,) + x.shape[2:]), (traj, advantages, targets)
                )
                minibatches = jax.tree.map(
                    lambda x: jnp.take(x, permutation, axis=0).reshape(
                        (config["NUM_MINIBATCHES"], -1) + x.shape[1:]
                    ),
                    batch,
                )
                train_state, total = jax.lax.scan(update_minibatch, train_state, minibatches)
                return (train_state, traj, advantages, targets, rng), total

            update_state = (train_state, traj, advantages, targets, rng)
            update_state, _ = jax.lax.scan(
                update_epoch, update_state, None, config["UPDATE_EPOCHS"]
            )
            train_state, rng = update_state[0], update_state[-1]
            return (train_state, env_state, last_obs, rng), traj.info

        rng, run_rng = jax.random.split(rng)
        runner_state, metrics = jax.lax.scan(
            update_step, (train_state, env_state, obs, run_rng), None, config["NUM_UPDATES"]
        )
        return {"runner_state": runner_state, "metrics": metrics}

    return train
