"""Recurrent PPO: PPO with a GRU or LSTM actor-critic (``PPOConfig(recurrent="gru")``).

    ppo = PPO(PPOConfig(env="CartPole-v1-po", recurrent="gru"))   # a RecurrentPPO ("lstm" too)
    state = ppo.init(jax.random.key(0))      # state.hidden: [B@batch, H] zeros
    state, metrics = ppo.update(state)

What changes against PPO (the hooks ``collect``, ``training_batch``, ``forward``,
``placeholder_minibatch``; everything else is PPO's):

- the rollout carries the hidden state ``[B@batch, H]``, resets it to zeros after every step that
  ended an episode (terminated or truncated), and leaves the next step's in ``state.hidden``
  (checkpoints carry it);
- a truncated step bootstraps from ``V(final_observation)`` given the hidden state before the
  reset (the episode's history), as feed-forward PPO bootstraps from ``V(final_observation)``;
- training runs over whole environment sequences ``[n, T]``: minibatches split the environments,
  never time, each sequence starts from the hidden state stored at its start (the state's
  ``hidden`` before the rollout) and BPTT runs through it, with the same resets as the rollout.

Shapes: ``T = num_steps``, ``B = num_envs``, ``R`` data-parallel replicas, ``H`` the recurrent
state's width: ``recurrent_width`` for a GRU, ``2 x recurrent_width`` for an LSTM (its ``[c | h]``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.algos.actor_critic import Rollout
from rljax.algos.ppo import PPO, PPOBatch, PPOState
from rljax.errors import ConfigError
from rljax.networks.recurrent import unroll
from rljax.parallel.rules import constrain


def check_sequences(config, batch_shards: int = 1) -> None:
    """Minibatches of whole sequences: ``num_minibatches`` x the data shards must divide
    ``num_envs``; no shared ``torso_widths`` (the embedding and the cell are the torso)."""
    if tuple(config.torso_widths):
        raise ConfigError(
            f"recurrent={config.recurrent!r}: the embedding and the cell are the shared torso; "
            f"torso_widths must be (), got {tuple(config.torso_widths)}"
        )
    pieces = config.num_minibatches * batch_shards
    if config.num_envs % pieces:
        shards = f" on each of {batch_shards} data shards" if batch_shards > 1 else ""
        allowed = [
            m for m in range(1, config.num_envs + 1) if config.num_envs % (m * batch_shards) == 0
        ]
        raise ConfigError(
            f"recurrent={config.recurrent!r} trains on whole environment sequences of "
            f"num_steps={config.num_steps}, and num_minibatches={config.num_minibatches} does not "
            f"split num_envs={config.num_envs}{shards} into whole sequences (a minibatch takes "
            "num_envs / (num_minibatches * data shards) environments from every shard; cutting "
            f"time would cut sequences); allowed here: num_minibatches in {allowed}, or more envs"
        )


class RecurrentPPO(PPO):
    """PPO over a ``RecurrentActorCritic``; ``PPO(config)`` builds one when
    ``config.recurrent != "none"``."""

    @property
    def hidden_width(self) -> int:
        """``H``: the recurrent state's width (the network's ``state_size``)."""
        return self.network.state_size

    def initial_hidden(self, num_envs: int) -> jax.Array:
        """Zeros ``[num_envs@batch, H]``: the hidden state at an episode's start."""
        hidden = jnp.zeros((num_envs, self.hidden_width), jnp.float32)
        return constrain(hidden, "batch", "activation_recurrent")

    def init_boxed(self, key: jax.Array) -> PPOState:
        return super().init_boxed(key).replace(hidden=self.initial_hidden(self.config.num_envs))

    def state_specs(self):
        return super().state_specs().replace(hidden=PartitionSpec("batch", "activation_recurrent"))

    # -- acting -----------------------------------------------------------------------------------
    def step_network(self, params, obs: jax.Array, hidden: jax.Array):
        """``obs [B@batch, D]``, ``hidden [B@batch, H]`` -> ``(policy output, value [B@batch],
        hidden' [B@batch, H])`` (the hidden state after ``obs``, before any reset)."""
        return self.learner.apply(self.network.apply, params, obs, hidden)

    @property
    def truncates_once(self) -> bool:
        """An environment truncates at most once per rollout (time limit >= ``num_steps``)."""
        limit = self.env.time_limit
        return limit is not None and limit >= self.config.num_steps

    def rollout_sequences(self, params, env, hidden, key, obs_stats=None):
        """``num_steps`` steps from ``hidden [B@batch, H]`` -> ``((env, hidden after the rollout,
        truncation hidden [B, H] or None), (Rollout [T, B], final values [T, B] or None))``.

        A truncated step's bootstrap needs the hidden state before its reset: when each
        environment truncates at most once per rollout that state is kept in the carry (one
        critic call after the rollout); otherwise ``V(final_obs)`` is computed at every step."""
        once = self.truncates_once

        def step(carry, randomness):
            env, hidden, truncation_hidden = carry
            noise, env_keys = randomness
            out, value, new_hidden = self.step_network(
                params, self.observe(obs_stats, env.obs), hidden
            )
            action = self.dist.sample_with(noise, out)
            log_prob = self.dist.log_prob(out, action)
            env, tr = self.env.step(env_keys, env, self.dist.env_action(action))
            final_value = None
            if once:
                truncation_hidden = jnp.where(tr.truncated[:, None], new_hidden, truncation_hidden)
            else:
                final_obs = self.observe(obs_stats, tr.final_obs)
                final_value = self.step_network(params, final_obs, new_hidden)[1]
            ended = jnp.logical_or(tr.terminated, tr.truncated)
            hidden = jnp.where(ended[:, None], 0.0, new_hidden)
            return (env, hidden, truncation_hidden), (
                Rollout(tr, action, log_prob, value),
                final_value,
            )

        start = (env, hidden, jnp.zeros_like(hidden) if once else None)
        return jax.lax.scan(step, start, self.rollout_randomness(key))

    def collect(self, state: PPOState, key: jax.Array):
        (env, hidden, truncation_hidden), (rollout, final_values) = self.rollout_sequences(
            state.params, state.env, state.hidden, key, state.obs_stats
        )
        obs_stats, rollout, last_obs = self.observed_rollout(state.obs_stats, env, rollout)
        tr = rollout.transition
        value_of = lambda obs, h: self.step_network(state.params, obs, h)[1]  # noqa: E731
        if final_values is None:
            # Each environment's truncation step (0 if none): its final observation.
            step = jnp.argmax(tr.truncated, axis=0)
            truncation_obs = jnp.take_along_axis(tr.final_obs, step[None, :, None], axis=0)[0]
            truncation_value, last_value = jax.vmap(value_of)(
                jnp.stack([truncation_obs, last_obs]), jnp.stack([truncation_hidden, hidden])
            )
            final_values = truncation_value[None]
        else:
            last_value = value_of(last_obs, hidden)
        following = jnp.concatenate([rollout.value[1:], last_value[None]], axis=0)
        next_values = jnp.where(tr.truncated, final_values, following)
        return env, rollout, next_values, {"obs_stats": obs_stats, "hidden": hidden}

    # -- learning ---------------------------------------------------------------------------------
    def training_batch(self, state: PPOState, samples: PPOBatch, rollout: Rollout) -> PPOBatch:
        """``[T, B@batch, ...]`` -> whole sequences ``[R@replica, B/R, T, ...]`` with their
        episode ends and the hidden state at their start (``state.hidden``, ``[R, B/R, H]``)."""
        tr = rollout.transition
        samples = samples._replace(ends=jnp.logical_or(tr.terminated, tr.truncated))
        sequences = jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), samples)
        return self.learner.split(sequences._replace(hidden=state.hidden))

    def forward(self, params, batch: PPOBatch):
        """One replica's sequences (leaves ``[n, T, ...]``, ``hidden [n, H]``) -> ``(policy
        output [n, T, ...], value [n, T])``, unrolled from each sequence's first hidden state."""
        time_major = lambda x: jnp.swapaxes(x, 0, 1)  # noqa: E731
        out, value = unroll(
            self.network, params, time_major(batch.obs), time_major(batch.ends), batch.hidden
        )
        return jax.tree.map(time_major, out), time_major(value)

    def placeholder_minibatch(self) -> PPOBatch:
        c, obs_dim = self.config, self.env.spec.obs_dim
        n, t = c.num_envs // (c.num_minibatches * self.replicas), c.num_steps

        def zeros(*shape, dtype=jnp.float32):
            return constrain(jnp.zeros((self.replicas, n, *shape), dtype), "replica")

        action = constrain(self.placeholder_actions(self.replicas, n, t), "replica")
        return PPOBatch(
            zeros(t, obs_dim),
            action,
            zeros(t),
            zeros(t),
            zeros(t),
            zeros(t),
            zeros(t, dtype=bool),
            zeros(self.hidden_width),
        )

    # -- evaluation -------------------------------------------------------------------------------
    def eval_memory(self, num_envs: int) -> jax.Array:
        """The hidden state of ``num_envs`` evaluation episodes at their start: zeros ``[B, H]``."""
        return self.initial_hidden(num_envs)

    def eval_action(
        self, params, obs, key, greedy: bool = True, obs_stats=None, memory=None
    ) -> tuple[jax.Array, jax.Array]:
        """One replica's parameters, raw ``obs [B@batch, D]``, ``memory [B@batch, H]`` (from
        ``eval_memory``, then from the previous call) -> ``(actions, memory')``."""
        if memory is None:
            raise ValueError(
                "a recurrent policy acts from its hidden state: pass memory=eval_memory(num_envs) "
                "at the episodes' start and the memory each call returns after that"
            )
        out, _, memory = self.network.apply(params, self.observe(obs_stats, obs), memory)
        action = self.dist.mode(out) if greedy else self.dist.sample(key, out)
        return self.dist.env_action(action), memory
