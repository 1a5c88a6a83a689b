"""PureJaxRL PPO baseline -- FOR BENCHMARKING ONLY.

This file is a port of PureJaxRL's single-file PPO (``purejaxrl/ppo.py`` and the
``LogWrapper`` / ``FlattenObservationWrapper`` from ``purejaxrl/wrappers.py``, by
Chris Lu, https://github.com/luchris429/purejaxrl, Apache-2.0). It is kept here only
as a speed (and sanity-return) reference for benchmarking the rest of this project; it
is not part of the library and nothing should import it for real training.

The port keeps the original's structure and per-update cost on purpose:

* ``ActorCritic``: separate actor and critic towers, each 2 x Dense(64) with tanh
  (or relu), orthogonal init with gain sqrt(2) for hidden layers, 0.01 for the policy
  head and 1.0 for the value head, zero biases.
* ``make_train(config)`` returns ``train(rng)``, which ``lax.scan``s over
  ``NUM_UPDATES`` updates; each update is a rollout scan of ``NUM_STEPS`` vectorised
  env steps, a reverse GAE scan (``unroll=16``), then ``UPDATE_EPOCHS`` x
  ``NUM_MINIBATCHES`` nested scans of clipped-PPO minibatch updates.
* Optimiser: ``optax.chain(clip_by_global_norm, adam(eps=1e-5))`` with linear LR
  annealing (per update, as in the original).
* ``done = terminated | truncated`` is treated as terminal for GAE (no bootstrapping
  on time-limit truncation), exactly as the original did with old gymnax's ``done``.

Changes relative to the original, all API updates with no intended cost change:

* gymnax 1.0.1: ``env.step`` returns ``(obs, state, reward, terminated, truncated,
  info)``; the ``LogWrapper`` forms ``done = terminated | truncated`` itself.
* jax 0.10: ``jax.tree.map`` instead of ``jax.tree_util.tree_map`` / ``jax.tree_map``,
  typed keys via ``jax.random.key``; ``NUM_UPDATES`` cast to ``int`` for ``lax.scan``.
* No distrax: the categorical sample / log-prob / entropy are written directly with
  ``jax.random.categorical`` and ``jax.nn.log_softmax``.
* ``LogEnvState`` counters are initialised with explicitly typed zeros (the original's
  Python ``0`` literals relied on weak-type promotion in ``lax.scan``).
* ``make_train`` copies ``config`` instead of mutating the caller's dict.
* Under ``vmap`` (several seeds) the network's parameters are drawn one seed at a time
  (``jax.custom_batching.sequential_vmap``; the same numbers). Vmapped, the orthogonal
  initialisers become a batched LAPACK QR, and jaxlib 0.10's CPU kernel for it deadlocks at
  random on two cores: two QRs run at once, each waiting in ``ParallelBatchMap`` for a pool
  thread the other holds (seen at 2 and 8 seeds on 2026-12-07, at 64 seeds before). rljax
  draws its seeds' parameters the same way.

Run ``python -m experiments.baselines.purejaxrl_ppo`` for a 1-seed and an 8-seed
(``vmap``) timing on CartPole-v1 with compile time reported separately.
"""

from __future__ import annotations

import time
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

# Hyper-parameters of the original ``purejaxrl/ppo.py`` ``__main__`` (DEBUG off).
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
    "ACTIVATION": "tanh",
    "ENV_NAME": "CartPole-v1",
    "ANNEAL_LR": True,
    "DEBUG": False,
}


# --------------------------------------------------------------------------------------
# Wrappers (port of purejaxrl/wrappers.py: GymnaxWrapper, FlattenObservationWrapper,
# LogWrapper), updated to gymnax 1.0.1's 6-tuple step.
# --------------------------------------------------------------------------------------
class GymnaxWrapper:
    """Base class for Gymnax wrappers: proxies unknown attributes to the wrapped env."""

    def __init__(self, env):
        self._env = env

    def __getattr__(self, name):
        return getattr(self._env, name)


class FlattenObservationWrapper(GymnaxWrapper):
    """Flatten the observations of the environment (a no-op reshape for CartPole)."""

    def observation_space(self, params):
        space = self._env.observation_space(params)
        return gymnax.environments.spaces.Box(
            low=space.low,
            high=space.high,
            shape=(int(np.prod(space.shape)),),
            dtype=space.dtype,
        )

    def reset(self, key, params=None):
        obs, state = self._env.reset(key, params)
        return jnp.reshape(obs, (-1,)), state

    def step(self, key, state, action, params=None):
        obs, state, reward, terminated, truncated, info = self._env.step(key, state, action, params)
        return jnp.reshape(obs, (-1,)), state, reward, terminated, truncated, info


@struct.dataclass
class LogEnvState:
    env_state: Any
    episode_returns: jax.Array
    episode_lengths: jax.Array
    returned_episode_returns: jax.Array
    returned_episode_lengths: jax.Array
    timestep: jax.Array


class LogWrapper(GymnaxWrapper):
    """Log the episode returns and lengths (PureJaxRL's LogWrapper).

    ``step`` returns the original's 5-tuple ``(obs, state, reward, done, info)`` with
    ``done = terminated | truncated``.
    """

    def reset(self, key, params=None):
        obs, env_state = self._env.reset(key, params)
        zf, zi = jnp.zeros((), jnp.float32), jnp.zeros((), jnp.int32)
        state = LogEnvState(env_state, zf, zi, zf, zi, zi)
        return obs, state

    def step(self, key, state, action, params=None):
        obs, env_state, reward, terminated, truncated, info = self._env.step(
            key, state.env_state, action, params
        )
        done = jnp.logical_or(terminated, truncated)
        new_episode_return = state.episode_returns + reward
        new_episode_length = state.episode_lengths + 1
        state = LogEnvState(
            env_state=env_state,
            episode_returns=new_episode_return * (1 - done),
            episode_lengths=new_episode_length * (1 - done),
            returned_episode_returns=state.returned_episode_returns * (1 - done)
            + new_episode_return * done,
            returned_episode_lengths=state.returned_episode_lengths * (1 - done)
            + new_episode_length * done,
            timestep=state.timestep + 1,
        )
        info["returned_episode_returns"] = state.returned_episode_returns
        info["returned_episode_lengths"] = state.returned_episode_lengths
        info["timestep"] = state.timestep
        info["returned_episode"] = done
        return obs, state, reward, done, info


# --------------------------------------------------------------------------------------
# Categorical distribution helpers (replace distrax.Categorical(logits=...)).
# --------------------------------------------------------------------------------------
def categorical_log_prob(logits: jax.Array, action: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(log_probs, action[..., None].astype(jnp.int32), axis=-1)[..., 0]


def categorical_entropy(logits: jax.Array) -> jax.Array:
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)


# --------------------------------------------------------------------------------------
# Network
# --------------------------------------------------------------------------------------
class ActorCritic(nn.Module):
    """Separate 2x64 actor and critic towers; returns (policy logits, value)."""

    action_dim: int
    activation: str = "tanh"

    @nn.compact
    def __call__(self, x):
        activation = nn.relu if self.activation == "relu" else nn.tanh
        actor_mean = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x)
        actor_mean = activation(actor_mean)
        actor_mean = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(
            actor_mean
        )
        actor_mean = activation(actor_mean)
        logits = nn.Dense(self.action_dim, kernel_init=orthogonal(0.01), bias_init=constant(0.0))(
            actor_mean
        )

        critic = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(x)
        critic = activation(critic)
        critic = nn.Dense(64, kernel_init=orthogonal(np.sqrt(2)), bias_init=constant(0.0))(critic)
        critic = activation(critic)
        critic = nn.Dense(1, kernel_init=orthogonal(1.0), bias_init=constant(0.0))(critic)

        return logits, jnp.squeeze(critic, axis=-1)


class Transition(NamedTuple):
    done: jax.Array
    action: jax.Array
    value: jax.Array
    reward: jax.Array
    log_prob: jax.Array
    obs: jax.Array
    info: dict


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------
def make_train(config):
    config = dict(config)
    config["NUM_UPDATES"] = int(
        config["TOTAL_TIMESTEPS"] // config["NUM_STEPS"] // config["NUM_ENVS"]
    )
    config["MINIBATCH_SIZE"] = config["NUM_ENVS"] * config["NUM_STEPS"] // config["NUM_MINIBATCHES"]
    env, env_params = gymnax.make(config["ENV_NAME"])
    env = FlattenObservationWrapper(env)
    env = LogWrapper(env)

    def linear_schedule(count):
        frac = (
            1.0
            - (count // (config["NUM_MINIBATCHES"] * config["UPDATE_EPOCHS"]))
            / config["NUM_UPDATES"]
        )
        return config["LR"] * frac

    def train(rng):
        # INIT NETWORK
        network = ActorCritic(env.action_space(env_params).n, activation=config["ACTIVATION"])
        rng, _rng = jax.random.split(rng)
        init_x = jnp.zeros(env.observation_space(env_params).shape)
        # One seed at a time under vmap (the same numbers): see the module docstring.
        init = jax.custom_batching.sequential_vmap(lambda k: network.init(k, init_x))
        network_params = init(_rng)
        if config["ANNEAL_LR"]:
            tx = optax.chain(
                optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                optax.adam(learning_rate=linear_schedule, eps=1e-5),
            )
        else:
            tx = optax.chain(
                optax.clip_by_global_norm(config["MAX_GRAD_NORM"]),
                optax.adam(config["LR"], eps=1e-5),
            )
        train_state = TrainState.create(
            apply_fn=network.apply,
            params=network_params,
            tx=tx,
        )

        # INIT ENV
        rng, _rng = jax.random.split(rng)
        reset_rng = jax.random.split(_rng, config["NUM_ENVS"])
        obsv, env_state = jax.vmap(env.reset, in_axes=(0, None))(reset_rng, env_params)

        # TRAIN LOOP
        def _update_step(runner_state, unused):
            # COLLECT TRAJECTORIES
            def _env_step(runner_state, unused):
                train_state, env_state, last_obs, rng = runner_state

                # SELECT ACTION
                rng, _rng = jax.random.split(rng)
                logits, value = network.apply(train_state.params, last_obs)
                action = jax.random.categorical(_rng, logits)
                log_prob = categorical_log_prob(logits, action)

                # STEP ENV
                rng, _rng = jax.random.split(rng)
                rng_step = jax.random.split(_rng, config["NUM_ENVS"])
                obsv, env_state, reward, done, info = jax.vmap(env.step, in_axes=(0, 0, 0, None))(
                    rng_step, env_state, action, env_params
                )
                transition = Transition(done, action, value, reward, log_prob, last_obs, info)
                runner_state = (train_state, env_state, obsv, rng)
                return runner_state, transition

            runner_state, traj_batch = jax.lax.scan(
                _env_step, runner_state, None, config["NUM_STEPS"]
            )

            # CALCULATE ADVANTAGE
            train_state, env_state, last_obs, rng = runner_state
            _, last_val = network.apply(train_state.params, last_obs)

            def _calculate_gae(traj_batch, last_val):
                def _get_advantages(gae_and_next_value, transition):
                    gae, next_value = gae_and_next_value
                    done, value, reward = (
                        transition.done,
                        transition.value,
                        transition.reward,
                    )
                    delta = reward + config["GAMMA"] * next_value * (1 - done) - value
                    gae = delta + config["GAMMA"] * config["GAE_LAMBDA"] * (1 - done) * gae
                    return (gae, value), gae

                _, advantages = jax.lax.scan(
                    _get_advantages,
                    (jnp.zeros_like(last_val), last_val),
                    traj_batch,
                    reverse=True,
                    unroll=16,
                )
                return advantages, advantages + traj_batch.value

            advantages, targets = _calculate_gae(traj_batch, last_val)

            # UPDATE NETWORK
            def _update_epoch(update_state, unused):
                def _update_minbatch(train_state, batch_info):
                    traj_batch, advantages, targets = batch_info

                    def _loss_fn(params, traj_batch, gae, targets):
                        # RERUN NETWORK
                        logits, value = network.apply(params, traj_batch.obs)
                        log_prob = categorical_log_prob(logits, traj_batch.action)

                        # CALCULATE VALUE LOSS
                        value_pred_clipped = traj_batch.value + (value - traj_batch.value).clip(
                            -config["CLIP_EPS"], config["CLIP_EPS"]
                        )
                        value_losses = jnp.square(value - targets)
                        value_losses_clipped = jnp.square(value_pred_clipped - targets)
                        value_loss = 0.5 * jnp.maximum(value_losses, value_losses_clipped).mean()

                        # CALCULATE ACTOR LOSS
                        ratio = jnp.exp(log_prob - traj_batch.log_prob)
                        gae = (gae - gae.mean()) / (gae.std() + 1e-8)
                        loss_actor1 = ratio * gae
                        loss_actor2 = (
                            jnp.clip(
                                ratio,
                                1.0 - config["CLIP_EPS"],
                                1.0 + config["CLIP_EPS"],
                            )
                            * gae
                        )
                        loss_actor = -jnp.minimum(loss_actor1, loss_actor2)
                        loss_actor = loss_actor.mean()
                        entropy = categorical_entropy(logits).mean()

                        total_loss = (
                            loss_actor
                            + config["VF_COEF"] * value_loss
                            - config["ENT_COEF"] * entropy
                        )
                        return total_loss, (value_loss, loss_actor, entropy)

                    grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
                    total_loss, grads = grad_fn(train_state.params, traj_batch, advantages, targets)
                    train_state = train_state.apply_gradients(grads=grads)
                    return train_state, total_loss

                train_state, traj_batch, advantages, targets, rng = update_state
                rng, _rng = jax.random.split(rng)
                batch_size = config["MINIBATCH_SIZE"] * config["NUM_MINIBATCHES"]
                assert batch_size == config["NUM_STEPS"] * config["NUM_ENVS"], (
                    "batch size must be equal to number of steps * number of envs"
                )
                permutation = jax.random.permutation(_rng, batch_size)
                batch = (traj_batch, advantages, targets)
                batch = jax.tree.map(lambda x: x.reshape((batch_size,) + x.shape[2:]), batch)
                shuffled_batch = jax.tree.map(lambda x: jnp.take(x, permutation, axis=0), batch)
                minibatches = jax.tree.map(
                    lambda x: jnp.reshape(x, [config["NUM_MINIBATCHES"], -1] + list(x.shape[1:])),
                    shuffled_batch,
                )
                train_state, total_loss = jax.lax.scan(_update_minbatch, train_state, minibatches)
                update_state = (train_state, traj_batch, advantages, targets, rng)
                return update_state, total_loss

            update_state = (train_state, traj_batch, advantages, targets, rng)
            update_state, _loss_info = jax.lax.scan(
                _update_epoch, update_state, None, config["UPDATE_EPOCHS"]
            )
            train_state = update_state[0]
            metric = traj_batch.info
            rng = update_state[-1]
            if config.get("DEBUG"):

                def callback(info):
                    return_values = info["returned_episode_returns"][info["returned_episode"]]
                    timesteps = info["timestep"][info["returned_episode"]] * config["NUM_ENVS"]
                    for t in range(len(timesteps)):
                        print(f"global step={timesteps[t]}, episodic return={return_values[t]}")

                jax.debug.callback(callback, metric)

            runner_state = (train_state, env_state, last_obs, rng)
            return runner_state, metric

        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, env_state, obsv, _rng)
        runner_state, metric = jax.lax.scan(_update_step, runner_state, None, config["NUM_UPDATES"])
        return {"runner_state": runner_state, "metrics": metric}

    return train


# --------------------------------------------------------------------------------------
# Benchmark entry point
# --------------------------------------------------------------------------------------
def _final_mean_return(metrics) -> np.ndarray:
    """Mean returned-episode return over the last update (per seed if batched).

    NaN for a seed whose last update finished no episode (with 500-step CartPole
    episodes and 128 x 4 steps per update this does happen).
    """
    ret = np.asarray(metrics["returned_episode_returns"][..., -1, :, :])
    done = np.asarray(metrics["returned_episode"][..., -1, :, :])
    axes = (-2, -1)
    n_done = np.sum(done, axis=axes)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n_done > 0, np.sum(ret * done, axis=axes) / n_done, np.nan)


def _bench(fn, arg, total_steps: int, label: str) -> Any:
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(arg).compile()
    compile_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    out = jax.block_until_ready(compiled(arg))
    run_s = time.perf_counter() - t0

    final = _final_mean_return(out["metrics"])
    mean_final = np.nanmean(final) if np.isfinite(final).any() else np.nan
    print(
        f"[{label}] compile {compile_s:.2f}s | run {run_s:.2f}s | "
        f"{total_steps / run_s:,.0f} env steps/s | "
        f"final mean return {mean_final:.1f} (per seed: {final})"
    )
    return out


def main() -> None:
    cfg = dict(DEFAULT_CONFIG)
    num_updates = int(cfg["TOTAL_TIMESTEPS"] // cfg["NUM_STEPS"] // cfg["NUM_ENVS"])
    steps_per_seed = num_updates * cfg["NUM_STEPS"] * cfg["NUM_ENVS"]
    print(f"devices: {jax.devices()}")

    # 1 seed.
    _bench(make_train(cfg), jax.random.key(42), steps_per_seed, "1 seed")

    # 8 seeds, vmapped.
    num_seeds = 8
    keys = jax.random.split(jax.random.key(42), num_seeds)
    _bench(jax.vmap(make_train(cfg)), keys, steps_per_seed * num_seeds, f"{num_seeds} seeds")


if __name__ == "__main__":
    main()
