"""PureJaxRL recurrent PPO baseline -- FOR BENCHMARKING ONLY.

A re-implementation, for gymnax 1.0, of the algorithm in PureJaxRL's ``purejaxrl/ppo_rnn.py``
(Chris Lu, https://github.com/luchris429/purejaxrl, Apache-2.0). It is a speed and sanity-return
reference for ``experiments/bench_ppo_family.py`` and nothing else imports it.

What it computes, as the original does:

* ``ActorCriticRNN``: Dense(128) relu embedding (orthogonal sqrt(2)), a GRU cell of 128 scanned
  over time whose carry is reset to zeros where the step's input ``done`` flag is set, then actor
  and critic heads Dense(128) relu (orthogonal 2) -> logits (orthogonal 0.01) / value
  (orthogonal 1.0); a categorical policy.
* The rollout feeds each step's previous ``done`` with its observation, so the hidden state resets
  at the first step of every new episode. ``done = terminated | truncated`` (no bootstrap on a
  time limit, as the original).
* GAE with ``unroll=16``; the last value is zeroed after a done.
* Minibatches are whole environment sequences: each epoch permutes the environments and splits
  them into ``NUM_MINIBATCHES`` groups; the loss re-runs the GRU over the sequence from the hidden
  state stored at the rollout's start.
* ``clip_by_global_norm`` then Adam (eps 1e-5), linear annealing per update when ``ANNEAL_LR``.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.linen.initializers import constant, orthogonal
from flax.training.train_state import TrainState

from experiments.baselines.purejaxrl_ppo import (
    FlattenObservationWrapper,
    LogWrapper,
    categorical_entropy,
    categorical_log_prob,
)

DEFAULT_CONFIG: dict[str, Any] = {
    "LR": 2.5e-4,
    "NUM_ENVS": 4,
    "NUM_STEPS": 128,
    "TOTAL_TIMESTEPS": 5e5,
    "UPDATE_EPOCHS": 4,
    "NUM_MINIBATCHES": 4,
    "GAMMA": 0.99,
    "GAE_LAMBDA": 0.95,
    "CLIP_EPS": 0.2,
    "ENT_COEF": 0.01,
    "VF_COEF": 0.5,
    "MAX_GRAD_NORM": 0.5,
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
}
HIDDEN = 128


class ScannedRNN(nn.Module):
    @functools.partial(
        nn.scan,
        variable_broadcast="params",
        in_axes=0,
        out_axes=0,
        split_rngs={"params": False},
    )
    @nn.compact
    def __call__(self, carry, x):
        ins, resets = x
        carry = jnp.where(resets[:, None], jnp.zeros_like(carry), carry)
        return nn.GRUCell(features=HIDDEN)(carry, ins)

    @staticmethod
    def initialize_carry(batch_size):
        return jnp.zeros((batch_size, HIDDEN), jnp.float32)


class ActorCriticRNN(nn.Module):
    action_dim: int

    @nn.compact
    def __call__(self, hidden, x):
        obs, dones = x
        embedding = nn.relu(
            nn.Dense(HIDDEN, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(obs)
        )
        hidden, embedding = ScannedRNN()(hidden, (embedding, dones))
        head = dict(kernel_init=orthogonal(2), bias_init=constant(0.0))
        actor = nn.relu(nn.Dense(HIDDEN, **head)(embedding))
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(
            actor
        )
        critic = nn.relu(nn.Dense(HIDDEN, **head)(embedding))
        value = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)
        return hidden, logits, jnp.squeeze(value, axis=-1)


class Transition(NamedTuple):
    done: jax.Array  # the step's own done
    prev_done: jax.Array  # the done fed with ``obs`` (resets the carry)
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict


def make_train(config):
    config = dict(config)
    config["NUM_UPDATES"] = int(
        config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    )
    num_envs = config["NUM_ENVS"]
    env, env_params = gymnax.make(config["ENV_NAME"])
    env = LogWrapper(FlattenObservationWrapper(env))

    def linear_schedule(count):
        updates = count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"])
        return config["LR"] * (1.0 - updates / config["NUM_UPDATES"])

    network = ActorCriticRNN(env.action_space(env_params).n)

    def init(rng):
        """The network's initial parameters, as ``train(rng)`` draws them."""
        _, init_rng, _ = jax.random.split(rng, 3)
        obs_shape = env.observation_space(env_params).shape
        init_x = (jnp.zeros((1, num_envs, *obs_shape)), jnp.zeros((1, num_envs), bool))
        return network.init(init_rng, ScannedRNN.initialize_carry(num_envs), init_x)

    def train(rng, params=None):
        # params: init(rng) computed beforehand (e.g. lax.map over seeds: a vmapped orthogonal
        # init, a batched LAPACK QR, can deadlock on jaxlib 0.10's CPU backend).
        if params is None:
            params = init(rng)
        rng, _, reset_rng = jax.random.split(rng, 3)
        lr = linear_schedule if config["ANNEAL_LR"] else config["LR"]
        tx = optax.chain(
            optax.clip_by_global_norm(config["MAX_GRAD_NORM"]), optax.adam(lr, eps=1e-5)
        )
        train_state = TrainState.create(apply_fn=network.apply, params=params, tx=tx)
        reset = jax.vmap(env.reset, in_axes=(0, None))
        obs, env_state = reset(jax.random.split(reset_rng, num_envs), env_params)
        step = jax.vmap(env.step, in_axes=(0, 0, 0, None))

        def update_step(runner_state, _):
            initial_hidden = runner_state[4]

            def env_step(runner_state, _):
                train_state, env_state, last_obs, last_done, hidden, rng = runner_state
                rng, act_rng, step_rng = jax.random.split(rng, 3)
                hidden, logits, value = network.apply(
                    train_state.params, hidden, (last_obs[None], last_done[None])
                )
                logits, value = logits[0], value[0]
                action = jax.random.categorical(act_rng, logits)
                log_prob = categorical_log_prob(logits, action)
                obs, env_state, reward, done, info = step(
                    jax.random.split(step_rng, num_envs), env_state, action, env_params
                )
                transition = Transition(
                    done, last_done, action, value, reward, log_prob, last_obs, info
                )
                return (train_state, env_state, obs, done, hidden, rng), transition

            runner_state, traj = jax.lax.scan(env_step, runner_state, None, config["NUM_STEPS"])
            train_state, env_state, last_obs, last_done, hidden, rng = runner_state
            _, _, last_val = network.apply(
                train_state.params, hidden, (last_obs[None], last_done[None])
            )
            last_val = jnp.where(last_done, 0.0, last_val[0])

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
                    hidden0, traj, gae, targets = batch

                    def loss_fn(params):
                        _, logits, value = network.apply(
                            params, hidden0, (traj.obs, traj.prev_done)
                        )
                        log_prob = categorical_log_prob(logits, traj.action)
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
                        clip_eps = config["CLIP_EPS"]
                        clip_ratio = jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
                        actor_loss = -jnp.minimum(ratio * norm, clip_ratio * norm).mean()
                        entropy = categorical_entropy(logits).mean()
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

                train_state, rng = update_state
                rng, perm_rng = jax.random.split(rng)
                permutation = jax.random.permutation(perm_rng, num_envs)
                # Whole sequences: the env axis (1 for [T, B] leaves, 0 for the hidden state).
                per_env = (traj, advantages, targets)
                shuffled = jax.tree.map(lambda x: jnp.take(x, permutation, axis=1), per_env)
                hidden0 = jnp.take(initial_hidden, permutation, axis=0)
                m = config["NUM_MINIBATCHES"]
                minibatches = (
                    hidden0.reshape(m, -1, HIDDEN),
                    *jax.tree.map(
                        lambda x: jnp.swapaxes(x.reshape(x.shape[0], m, -1, *x.shape[2:]), 0, 1),
                        shuffled,
                    ),
                )
                train_state, total = jax.lax.scan(update_minibatch, train_state, minibatches)
                return (train_state, rng), total

            (train_state, rng), _ = jax.lax.scan(
                update_epoch, (train_state, rng), None, config["UPDATE_EPOCHS"]
            )
            return (train_state, env_state, last_obs, last_done, hidden, rng), traj.info

        rng, run_rng = jax.random.split(rng)
        done0 = jnp.zeros((num_envs,), bool)
        hidden0 = ScannedRNN.initialize_carry(num_envs)
        runner_state = (train_state, env_state, obs, done0, hidden0, run_rng)
        runner_state, metrics = jax.lax.scan(update_step, runner_state, None, config["NUM_UPDATES"])
        return {"runner_state": runner_state, "metrics": metrics}

    train.init = init
    return train
