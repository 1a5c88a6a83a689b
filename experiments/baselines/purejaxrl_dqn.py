"""PureJaxRL DQN baseline -- FOR BENCHMARKING ONLY.

This file is a port of PureJaxRL's single-file DQN (``purejaxrl/dqn.py``, itself a
port of CleanRL's ``dqn_jax.py``, by Chris Lu, https://github.com/luchris429/purejaxrl,
Apache-2.0) together with the flat replay buffer it takes from flashbax
(``flashbax.make_flat_buffer``, InstaDeep, https://github.com/instadeepai/flashbax,
Apache-2.0). It is kept here only as a speed and return reference that this
project's own DQN must match or beat; it is not part of the library and nothing
should import it for real training.

The port keeps the original's structure and per-step cost on purpose:

* ``QNetwork``: Dense(120) - relu - Dense(84) - relu - Dense(num_actions), flax
  default initialisers (lecun-normal kernels, zero biases).
* ``make_train(config)`` returns ``train(rng)``, which ``lax.scan``s over
  ``NUM_UPDATES = TOTAL_TIMESTEPS // NUM_ENVS`` iterations. Each iteration takes one
  epsilon-greedy vectorised env step (epsilon linear from ``EPSILON_START`` to
  ``EPSILON_FINISH`` over ``EPSILON_ANNEAL_TIME`` env steps), adds the transition
  ``(obs, action, reward, done)`` to the buffer, then under ``lax.cond`` does one
  Adam step on a ``BUFFER_BATCH_SIZE`` sample when the buffer can be sampled,
  ``timesteps > LEARNING_STARTS`` and ``timesteps % TRAINING_INTERVAL == 0``, and
  under a second ``lax.cond`` sets the target to
  ``optax.incremental_update(params, target, TAU)`` when
  ``timesteps % TARGET_UPDATE_INTERVAL == 0`` (``timesteps`` counts env steps over
  all envs, so with 10 envs every iteration is a "training interval" and the target
  is copied every 50 iterations).
* TD target ``r + (1 - done) * gamma * max_a Q_target(s', a)`` with plain MSE loss
  and no gradient clipping; ``done = terminated | truncated`` is treated as terminal
  (no bootstrapping on time-limit truncation), exactly as the original did with old
  gymnax's ``done``. ``s'`` is the *next stored observation* of the same env, which
  after an auto-reset is the reset observation; the ``done`` mask makes that harmless.
* Metrics per iteration: ``timesteps``, ``updates``, ``loss`` and ``returns`` (the
  env-mean of gymnax ``LogWrapper``'s ``returned_episode_returns``, i.e. the return
  of each env's last completed episode, 0 before its first one).
* The original's dummy key: after the env reset, ``rng`` is overwritten with
  ``PRNGKey(0)`` ("use a dummy rng here") and never restored, so the network init,
  the exploration and the buffer sampling use the same key stream for every seed;
  the seed only changes the initial env states. This is kept by default (the cost
  is identical); ``config["FIX_DUMMY_RNG"] = True`` (not in the original) keeps the
  seed's key instead, for seed-to-seed return spread.

Flat buffer (replaces flashbax 0.1.3, same semantics, same ops, same key usage): a
trajectory buffer of leaves ``[NUM_ENVS, BUFFER_SIZE // NUM_ENVS, ...]`` written
at one time index per iteration (``.at[:, [i]].set``, ring-buffer wrap, ``is_full``
flag), ``can_sample`` once ``BUFFER_BATCH_SIZE // NUM_ENVS + 1`` time steps are
stored, and ``sample`` draws ``BUFFER_BATCH_SIZE`` pairs ``(t, t + 1)`` uniformly:
the start index uniformly over the valid starts (period 1, sequence length 2, never
straddling the write head) and the env row uniformly and independently, returning
``first`` / ``second``. With the same keys the results equal flashbax's bit for bit.

Changes relative to the original, all API updates with no intended cost change:

* gymnax 1.0.1: ``env.step`` returns ``(obs, state, reward, terminated, truncated,
  info)``; ``done = terminated | truncated`` is formed here, also for the dummy
  step that gives the buffer its structure. The wrappers are gymnax's own
  ``gymnax.wrappers.purerl`` ones, as in the original.
* jax 0.10: ``jax.tree.map`` instead of ``jax.tree_map``, typed keys via
  ``jax.random.key``; ``NUM_UPDATES`` cast to ``int`` for ``lax.scan``; the
  ``timesteps`` / ``n_updates`` counters start as explicitly typed int32 zeros (the
  original's Python ``0`` relied on weak-type promotion in ``lax.scan``).
* flashbax replaced by the inline buffer above; ``chex.dataclass`` ``TimeStep``
  replaced by a ``NamedTuple``; the original's per-function ``jax.jit`` wrappers on
  the buffer (with ``donate_argnums``) are dropped: inside the outer ``jit`` they are
  inlined and donation is ignored.
* No wandb (its ``WANDB_MODE``/``ENTITY``/``PROJECT`` config keys are dropped, as are
  ``SEED``/``NUM_SEEDS``, which only the original's ``main`` read).
* ``make_train`` copies ``config`` instead of mutating the caller's dict.

The original's ``main`` runs ``jax.jit(jax.vmap(make_train(config)))`` over
``NUM_SEEDS = 1`` keys; under ``vmap`` both ``lax.cond``s become ``select``s (the
learn phase is computed every iteration), so that is slower than the unbatched
``jax.jit(make_train(config))`` timed here.

Run ``python -m experiments.baselines.purejaxrl_dqn`` for a 1-seed timing on
CartPole-v1 with compile time reported separately (plus a return check on 2 more
seeds).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import flax.linen as nn
import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training.train_state import TrainState
from gymnax.wrappers.purerl import FlattenObservationWrapper, LogWrapper

# Hyper-parameters of the original ``purejaxrl/dqn.py`` ``main`` (CartPole-v1).
DEFAULT_CONFIG: dict[str, Any] = {
    "NUM_ENVS": 10,
    "BUFFER_SIZE": 10000,
    "BUFFER_BATCH_SIZE": 128,
    "TOTAL_TIMESTEPS": 5e5,
    "EPSILON_START": 1.0,
    "EPSILON_FINISH": 0.05,
    "EPSILON_ANNEAL_TIME": 25e4,
    "TARGET_UPDATE_INTERVAL": 500,
    "LR": 2.5e-4,
    "LEARNING_STARTS": 10000,
    "TRAINING_INTERVAL": 10,
    "LR_LINEAR_DECAY": False,
    "GAMMA": 0.99,
    "TAU": 1.0,
    "ENV_NAME": "CartPole-v1",
    "FIX_DUMMY_RNG": False,  # not in the original; see the module docstring
}


# --------------------------------------------------------------------------------------
# Flat replay buffer (port of flashbax 0.1.3 make_flat_buffer / trajectory_buffer with
# add_sequences=False, add_batch_size=NUM_ENVS, sample_sequence_length=2, period=1).
# --------------------------------------------------------------------------------------
class FlatBufferState(NamedTuple):
    experience: Any  # pytree, leaves [add_batch_size, max_length_time_axis, ...]
    current_index: jax.Array  # int32 [], next time index to write
    is_full: jax.Array  # bool []


class ExperiencePair(NamedTuple):
    first: Any  # pytree, leaves [sample_batch_size, ...] at time t
    second: Any  # same at time t + 1 (same env row)


class FlatBuffer(NamedTuple):
    init: Callable[[Any], FlatBufferState]
    add: Callable[[FlatBufferState, Any], FlatBufferState]
    sample: Callable[[FlatBufferState, jax.Array], ExperiencePair]
    can_sample: Callable[[FlatBufferState], jax.Array]


def make_flat_buffer(
    max_length: int, min_length: int, sample_batch_size: int, add_batch_size: int
) -> FlatBuffer:
    """Flat transition buffer with flashbax's ``make_flat_buffer`` semantics.

    ``add`` takes one transition per env (leaves ``[add_batch_size, ...]``); ``sample``
    returns ``ExperiencePair(first, second)`` with leaves ``[sample_batch_size, ...]``.
    """
    max_t = max_length // add_batch_size
    min_t = max(min_length // add_batch_size + 1, 2)  # flashbax: at least seq length 2
    if max_t < 2 or min_t > max_t or sample_batch_size > max_length:
        raise ValueError(
            f"invalid flat buffer: max_length={max_length}, min_length={min_length}, "
            f"sample_batch_size={sample_batch_size}, add_batch_size={add_batch_size}"
        )

    def init(timestep) -> FlatBufferState:
        experience = jax.tree.map(
            lambda x: jnp.broadcast_to(
                jnp.empty_like(x)[None, None], (add_batch_size, max_t, *jnp.shape(x))
            ),
            timestep,
        )
        return FlatBufferState(experience, jnp.zeros((), jnp.int32), jnp.array(False))

    def add(state: FlatBufferState, batch) -> FlatBufferState:
        # Same scatter as flashbax (a length-1 time slice), so the same XLA op and cost.
        indices = (jnp.arange(1) + state.current_index) % max_t
        experience = jax.tree.map(
            lambda x, b: x.at[:, indices].set(b[:, None]), state.experience, batch
        )
        new_index = state.current_index + 1
        is_full = state.is_full | (new_index >= max_t)
        return FlatBufferState(experience, new_index % max_t, is_full)

    def sample(state: FlatBufferState, key: jax.Array) -> ExperiencePair:
        max_time = jnp.where(state.is_full, max_t, state.current_index)
        head = jnp.where(state.is_full, state.current_index, 0)
        max_start = max_time - 2
        num_valid = jnp.where(max_start >= 0, max_start + 1, 0)
        # Split order as in flashbax, so the same key draws the same batch.
        key, key_items = jax.random.split(key)
        key, key_rows = jax.random.split(key)
        start = jax.random.randint(key_items, (sample_batch_size,), 0, num_valid)
        start = (head + start) % max_t
        rows = jax.random.randint(key_rows, (sample_batch_size,), 0, add_batch_size)
        times = (start[:, None] + jnp.arange(2)) % max_t
        pairs = jax.tree.map(lambda x: x[rows[:, None], times], state.experience)
        return ExperiencePair(
            first=jax.tree.map(lambda x: x[:, 0], pairs),
            second=jax.tree.map(lambda x: x[:, 1], pairs),
        )

    def can_sample(state: FlatBufferState) -> jax.Array:
        return state.is_full | (state.current_index >= min_t)

    return FlatBuffer(init, add, sample, can_sample)


# --------------------------------------------------------------------------------------
# Network and state
# --------------------------------------------------------------------------------------
class QNetwork(nn.Module):
    """MLP 120-84 relu; returns Q-values [..., action_dim]."""

    action_dim: int

    @nn.compact
    def __call__(self, x: jax.Array):
        x = nn.Dense(120)(x)
        x = nn.relu(x)
        x = nn.Dense(84)(x)
        x = nn.relu(x)
        x = nn.Dense(self.action_dim)(x)
        return x


class TimeStep(NamedTuple):
    obs: jax.Array
    action: jax.Array
    reward: jax.Array
    done: jax.Array


class CustomTrainState(TrainState):
    target_network_params: Any
    timesteps: jax.Array  # env steps over all envs
    n_updates: jax.Array


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------
def make_train(config):
    config = dict(config)
    config["NUM_UPDATES"] = int(config["TOTAL_TIMESTEPS"] // config["NUM_ENVS"])

    basic_env, env_params = gymnax.make(config["ENV_NAME"])
    env = FlattenObservationWrapper(basic_env)
    env = LogWrapper(env)

    def vmap_reset(n_envs):
        return lambda rng: jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(rng, n_envs), env_params
        )

    def vmap_step(n_envs):
        return lambda rng, env_state, action: jax.vmap(env.step, in_axes=(0, 0, 0, None))(
            jax.random.split(rng, n_envs), env_state, action, env_params
        )

    def train(rng):
        # INIT ENV
        rng, _rng = jax.random.split(rng)
        init_obs, env_state = vmap_reset(config["NUM_ENVS"])(_rng)

        # INIT BUFFER
        buffer = make_flat_buffer(
            max_length=config["BUFFER_SIZE"],
            min_length=config["BUFFER_BATCH_SIZE"],
            sample_batch_size=config["BUFFER_BATCH_SIZE"],
            add_batch_size=config["NUM_ENVS"],
        )
        dummy_rng = jax.random.key(0)  # use a dummy rng here
        _action = basic_env.action_space().sample(dummy_rng)
        _, _env_state = env.reset(dummy_rng, env_params)
        _obs, _, _reward, _term, _trunc, _ = env.step(dummy_rng, _env_state, _action, env_params)
        _timestep = TimeStep(
            obs=_obs, action=_action, reward=_reward, done=jnp.logical_or(_term, _trunc)
        )
        buffer_state = buffer.init(_timestep)
        if not config.get("FIX_DUMMY_RNG", False):
            rng = dummy_rng  # the original overwrote rng here and never restored it

        # INIT NETWORK AND OPTIMIZER
        network = QNetwork(action_dim=env.action_space(env_params).n)
        rng, _rng = jax.random.split(rng)
        init_x = jnp.zeros(env.observation_space(env_params).shape)
        network_params = network.init(_rng, init_x)

        def linear_schedule(count):
            frac = 1.0 - (count / config["NUM_UPDATES"])
            return config["LR"] * frac

        lr = linear_schedule if config.get("LR_LINEAR_DECAY", False) else config["LR"]
        tx = optax.adam(learning_rate=lr)

        train_state = CustomTrainState.create(
            apply_fn=network.apply,
            params=network_params,
            target_network_params=jax.tree.map(lambda x: jnp.copy(x), network_params),
            tx=tx,
            timesteps=jnp.zeros((), jnp.int32),
            n_updates=jnp.zeros((), jnp.int32),
        )

        # epsilon-greedy exploration
        def eps_greedy_exploration(rng, q_vals, t):
            rng_a, rng_e = jax.random.split(rng, 2)
            eps = jnp.clip(
                (
                    (config["EPSILON_FINISH"] - config["EPSILON_START"])
                    / config["EPSILON_ANNEAL_TIME"]
                )
                * t
                + config["EPSILON_START"],
                config["EPSILON_FINISH"],
            )
            greedy_actions = jnp.argmax(q_vals, axis=-1)
            chosen_actions = jnp.where(
                jax.random.uniform(rng_e, greedy_actions.shape) < eps,
                jax.random.randint(
                    rng_a, shape=greedy_actions.shape, minval=0, maxval=q_vals.shape[-1]
                ),
                greedy_actions,
            )
            return chosen_actions

        # TRAINING LOOP
        def _update_step(runner_state, unused):
            train_state, buffer_state, env_state, last_obs, rng = runner_state

            # STEP THE ENV
            rng, rng_a, rng_s = jax.random.split(rng, 3)
            q_vals = network.apply(train_state.params, last_obs)
            action = eps_greedy_exploration(rng_a, q_vals, train_state.timesteps)
            obs, env_state, reward, terminated, truncated, info = vmap_step(config["NUM_ENVS"])(
                rng_s, env_state, action
            )
            done = jnp.logical_or(terminated, truncated)
            train_state = train_state.replace(timesteps=train_state.timesteps + config["NUM_ENVS"])

            # BUFFER UPDATE
            timestep = TimeStep(obs=last_obs, action=action, reward=reward, done=done)
            buffer_state = buffer.add(buffer_state, timestep)

            # NETWORKS UPDATE
            def _learn_phase(train_state, rng):
                learn_batch = buffer.sample(buffer_state, rng)

                q_next_target = network.apply(
                    train_state.target_network_params, learn_batch.second.obs
                )  # (batch_size, num_actions)
                q_next_target = jnp.max(q_next_target, axis=-1)  # (batch_size,)
                target = (
                    learn_batch.first.reward
                    + (1 - learn_batch.first.done) * config["GAMMA"] * q_next_target
                )

                def _loss_fn(params):
                    q_vals = network.apply(params, learn_batch.first.obs)
                    chosen_action_qvals = jnp.take_along_axis(
                        q_vals,
                        jnp.expand_dims(learn_batch.first.action, axis=-1),
                        axis=-1,
                    ).squeeze(axis=-1)
                    return jnp.mean((chosen_action_qvals - target) ** 2)

                loss, grads = jax.value_and_grad(_loss_fn)(train_state.params)
                train_state = train_state.apply_gradients(grads=grads)
                train_state = train_state.replace(n_updates=train_state.n_updates + 1)
                return train_state, loss

            rng, _rng = jax.random.split(rng)
            is_learn_time = (
                buffer.can_sample(buffer_state)
                & (train_state.timesteps > config["LEARNING_STARTS"])
                & (train_state.timesteps % config["TRAINING_INTERVAL"] == 0)
            )
            train_state, loss = jax.lax.cond(
                is_learn_time,
                lambda train_state, rng: _learn_phase(train_state, rng),
                lambda train_state, rng: (train_state, jnp.array(0.0)),  # do nothing
                train_state,
                _rng,
            )

            # update target network
            train_state = jax.lax.cond(
                train_state.timesteps % config["TARGET_UPDATE_INTERVAL"] == 0,
                lambda train_state: train_state.replace(
                    target_network_params=optax.incremental_update(
                        train_state.params,
                        train_state.target_network_params,
                        config["TAU"],
                    )
                ),
                lambda train_state: train_state,
                operand=train_state,
            )

            metrics = {
                "timesteps": train_state.timesteps,
                "updates": train_state.n_updates,
                "loss": loss.mean(),
                "returns": info["returned_episode_returns"].mean(),
            }
            runner_state = (train_state, buffer_state, env_state, obs, rng)
            return runner_state, metrics

        # train
        rng, _rng = jax.random.split(rng)
        runner_state = (train_state, buffer_state, env_state, init_obs, _rng)
        runner_state, metrics = jax.lax.scan(
            _update_step, runner_state, None, config["NUM_UPDATES"]
        )
        return {"runner_state": runner_state, "metrics": metrics}

    return train


# --------------------------------------------------------------------------------------
# Benchmark entry point
# --------------------------------------------------------------------------------------
def final_return(out) -> np.ndarray:
    """Env-mean return of each env's last completed episode at the end of training.

    ``out``: ``train``'s output (or its ``"metrics"``); ``[]`` per run, ``[S]`` if
    vmapped over ``S`` seeds.
    """
    metrics = out.get("metrics", out)
    return np.asarray(metrics["returns"][..., -1])


def main(num_runs: int = 3, extra_seeds: int = 2) -> None:
    cfg = dict(DEFAULT_CONFIG)
    total_steps = int(cfg["TOTAL_TIMESTEPS"] // cfg["NUM_ENVS"]) * cfg["NUM_ENVS"]
    print(f"devices: {jax.devices()}")

    key = jax.random.key(0)
    t0 = time.perf_counter()
    compiled = jax.jit(make_train(cfg)).lower(key).compile()
    compile_s = time.perf_counter() - t0
    print(f"compile {compile_s:.2f}s")

    run_s = []
    for i in range(num_runs):
        t0 = time.perf_counter()
        out = jax.block_until_ready(compiled(key))
        run_s.append(time.perf_counter() - t0)
        print(
            f"[seed 0, run {i}] {run_s[-1]:.2f}s | {total_steps / run_s[-1]:,.0f} env steps/s"
            f" | final return {float(final_return(out)):.1f}"
        )
    print(f"[seed 0] best {total_steps / min(run_s):,.0f} env steps/s")

    for seed in range(1, 1 + extra_seeds):
        out = jax.block_until_ready(compiled(jax.random.key(seed)))
        print(f"[seed {seed}] final return {float(final_return(out)):.1f}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
