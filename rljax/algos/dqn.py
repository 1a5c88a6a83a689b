"""DQN and its common extensions on batched gymnax environments, as pure functions.

    dqn = DQN(DQNConfig(env="CartPole-v1"))
    state = dqn.init(jax.random.key(0))      # DQNState pytree (buffer included)
    state, metrics = dqn.update(state)        # steps_per_update vector env steps, each followed
                                              # by its gradient step(s) once learning started

Switches: Double DQN, dueling head, n-step returns, hard (``tau=1``) or Polyak target updates,
linear epsilon-greedy, Huber or MSE loss, global-norm clipping, linear LR decay, prioritized
replay. The replay buffer (``rljax.buffers``) is sharded along ``data`` with the environments:
each data shard writes and samples its own rows. Gradients go through ``rljax.parallel.sync``
like PPO's, so every synchronisation strategy works here too.

Truncation: every stored step keeps ``final_obs`` (the pre-reset observation). An n-step window
ends at its first terminated or truncated step; the target bootstraps from
``Q_target(final_obs)`` at that step after a truncation or a full window, never after a
termination. Counters (``learning_starts``, epsilon decay, ``train_frequency``,
``target_update_interval``) are in environment steps summed over all environments, as in
PureJaxRL and CleanRL.

``normalize_obs``: every vector step acts on observations normalised with ``state.obs_stats``,
then merges that step's observations into them. Replay keeps the raw observations; sampled
windows (``obs`` and the bootstrap ``final_obs``) are normalised with the current statistics, so
old and new samples reach the network on one scale (Stable-Baselines3's off-policy choice).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rljax.algos.base import Algorithm, adam, episode_metrics
from rljax.algos.dqn_config import DQNConfig, check_config
from rljax.algos.normalize import RunningStats
from rljax.algos.td import bootstrap_value, nstep_return, td_loss
from rljax.buffers import ReplayBuffer, add, init_buffer, sample, update_priorities
from rljax.buffers.replay import buffer_logical_specs
from rljax.envs import EnvBatch
from rljax.networks import zoo
from rljax.rng import index_from_bits, uniform_from_bits


@struct.dataclass
class DQNState:
    """``params``/``target_params``/``opt_state`` are ``[R@data, ...]`` for local/adaptive sync."""

    params: Any
    target_params: Any  # same layout as params
    opt_state: Any
    sync: dict[str, Any]
    env: EnvBatch
    buffer: ReplayBuffer  # leaves [B@batch, K, ...]
    key: jax.Array
    update_step: jax.Array  # int32: update() calls done
    env_steps: jax.Array  # int32: environment steps done (all envs)
    hparams: dict[str, jax.Array]  # swept fields as float32 scalars (empty unless sweeping)
    obs_stats: RunningStats | None = None  # normalize_obs: running statistics [D], replicated


class ReplayItem(NamedTuple):
    """One stored vector step, leaves ``[B@batch, ...]`` (a sampled window: ``[N, n, ...]``)."""

    obs: jax.Array  # [B, D] the observation acted on
    action: jax.Array  # [B] int32
    reward: jax.Array  # [B]
    terminated: jax.Array  # [B] bool
    truncated: jax.Array  # [B] bool
    final_obs: jax.Array  # [B, D] the step's last observation, before any reset


class DQNBatch(NamedTuple):
    """One replica's samples for the TD loss, leaves ``[n, ...]``."""

    obs: jax.Array  # [n, D]
    action: jax.Array  # [n] int32
    target: jax.Array  # [n] n-step TD target
    weight: jax.Array  # [n] importance weight (ones when uniform)


class DQN(Algorithm):
    """DQN built from a config; methods are pure functions of their array arguments.

    Each of the ``replicas`` data-parallel replicas owns ``num_envs / R`` environments and their
    replay rows and samples ``batch_size / R`` per gradient step.
    """

    name = "dqn"
    config_type = DQNConfig

    @classmethod
    def validate(cls, config: DQNConfig, batch_shards: int = 1, mlp_shards: int = 1) -> None:
        super().validate(config, batch_shards, mlp_shards)
        check_config(config, batch_shards, mlp_shards)

    def build_network(self):
        return zoo.q_network(self.config, self.env.spec)

    def build_optimizer(self):
        c = self.config
        total_grad_steps = max(1, (c.total_timesteps - c.learning_starts) // c.train_frequency)
        decay = optax.linear_schedule(1.0, 0.0, total_grad_steps) if c.lr_decay else None
        return adam(c.lr, max_grad_norm=c.max_grad_norm, decay=decay, traced_lr="lr" in self.swept)

    def _buffer_item(self, obs) -> ReplayItem:
        b = self.config.num_envs
        flags = jnp.zeros((b,), bool)
        return ReplayItem(
            obs, jnp.zeros((b,), jnp.int32), jnp.zeros((b,), jnp.float32), flags, flags, obs
        )

    def start_from(self, state, params):
        """The target network starts from the same parameters."""
        return super().start_from(state, params).replace(target_params=params)

    def init_boxed(self, key: jax.Array) -> DQNState:
        c = self.config
        net_key, env_key, key = jax.random.split(key, 3)
        params = self.init_params(net_key)
        env = self.env.reset(env_key)
        buffer = init_buffer(self._buffer_item(env.obs), c.buffer_size, c.prioritized)
        zero = jnp.zeros((), jnp.int32)
        opt_state = self.optimizer.init(params)
        hparams, stats = self.initial_hparams(), self.init_obs_stats()
        return DQNState(params, params, opt_state, {}, env, buffer, key, zero, zero, hparams, stats)

    def with_learner(self, state, params, opt_state, sync):
        # The target network starts as a copy of the online one, in the same layout.
        return state.replace(params=params, target_params=params, opt_state=opt_state, sync=sync)

    def state_specs(self) -> DQNState:
        abstract = jax.eval_shape(self.init_boxed, jax.random.key(0))
        return super().state_specs().replace(buffer=buffer_logical_specs(abstract.buffer))

    # -- acting -----------------------------------------------------------------------------------
    def q_values(self, params, obs: jax.Array) -> jax.Array:
        """``obs: [B@batch, D]`` -> ``[B@batch, A]`` (replica ``r`` scores its own rows)."""
        return self.learner.apply(self.network.apply, params, obs)

    def epsilon(self, env_steps: jax.Array) -> jax.Array:
        c = self.config
        if c.epsilon_decay_steps == 0:
            fraction = jnp.ones_like(env_steps, jnp.float32)
        else:
            fraction = jnp.clip(env_steps / c.epsilon_decay_steps, 0.0, 1.0)
        return c.epsilon_start + fraction * (c.epsilon_end - c.epsilon_start)

    def act(self, params, obs, key, epsilon):
        """Epsilon-greedy ``[B@data]`` int32 actions."""
        greedy = jnp.argmax(self.q_values(params, obs), axis=-1).astype(jnp.int32)
        explore_bits, action_bits = jax.random.bits(key, (2, obs.shape[0]))
        random_action = index_from_bits(action_bits, self.env.spec.num_actions)
        explore = uniform_from_bits(explore_bits) < epsilon
        return jnp.where(explore, random_action, greedy)

    def eval_action(self, params, obs, key, greedy: bool = True, obs_stats=None) -> jax.Array:
        """One replica's parameters: argmax Q (no exploration; ``greedy`` has no other mode)."""
        del key, greedy
        q = self.network.apply(params, self.observe(obs_stats, obs))
        return jnp.argmax(q, axis=-1).astype(jnp.int32)

    # -- learning ---------------------------------------------------------------------------------
    def targets(self, params, target_params, window: ReplayItem, gamma) -> jax.Array:
        """TD targets ``[N@batch]`` of sampled windows (leaves ``[N@batch, n, ...]``)."""
        c = self.config
        partial, bootstrap, end = nstep_return(
            window.reward, window.terminated, window.truncated, gamma
        )
        last_obs = jnp.take_along_axis(window.final_obs, end[:, None, None], axis=1)[:, 0]
        next_q = self.q_values(target_params, last_obs)
        online_q = self.q_values(params, last_obs) if c.double_dqn else None
        next_value = bootstrap_value(next_q, online_q)
        return partial + bootstrap * jax.lax.stop_gradient(next_value)

    def loss(self, params, batch: DQNBatch):
        """One replica's TD loss on ``batch`` leaves ``[n, ...]`` -> ``(loss, aux)``."""
        q = self.network.apply(params, batch.obs)
        chosen = jnp.take_along_axis(q, batch.action[:, None], axis=-1)[:, 0]
        error = chosen - batch.target
        loss = jnp.mean(batch.weight * td_loss(error, self.config.loss))
        return loss, {"td_error": error, "q_mean": chosen.mean()}

    def _per_beta(self, env_steps):
        c = self.config
        fraction = jnp.clip(env_steps / c.total_timesteps, 0.0, 1.0)
        return c.per_beta + fraction * (1.0 - c.per_beta)

    def _gradient_step(self, state: DQNState, key) -> tuple[DQNState, dict[str, jax.Array]]:
        c = self.config
        drawn = sample(state.buffer, key, c.batch_size, c.n_step, self._per_beta(state.env_steps))
        # Replay holds raw observations: every sample is normalised with the current statistics,
        # the ones the network acts with now, however old the sample.
        window = drawn.window._replace(
            obs=self.observe(state.obs_stats, drawn.window.obs),
            final_obs=self.observe(state.obs_stats, drawn.window.final_obs),
        )
        gamma = self.resolve(state.hparams).gamma
        target = self.targets(state.params, state.target_params, window, gamma)
        batch = DQNBatch(window.obs[:, 0], window.action[:, 0], target, drawn.weight)
        # [N@batch] -> [R@replica, N/R]: replica r learns from the rows its shard sampled.
        (loss, aux), grads = self.learner.grads(self.loss, state.params, self.learner.split(batch))
        params, opt_state, sync, sync_metrics = self.learner.step(
            state.params, state.opt_state, state.sync, grads, scale=state.hparams.get("lr")
        )
        buffer = state.buffer
        if c.prioritized:
            td_error = aux["td_error"].reshape(-1)
            buffer = update_priorities(buffer, drawn.index, td_error, c.per_alpha, c.per_eps)
        metrics = {"loss": loss.mean(), "q_mean": aux["q_mean"].mean(), **sync_metrics}
        state = state.replace(params=params, opt_state=opt_state, sync=sync, buffer=buffer)
        return state, metrics

    def _train(self, state: DQNState, key) -> tuple[DQNState, dict[str, jax.Array]]:
        """The gradient steps due after one vector step (``grad_steps_per_env_step`` of them)."""
        steps = max(self.config.grad_steps_per_env_step, 1)
        if steps == 1:
            return self._gradient_step(state, key)
        state, metrics = jax.lax.scan(self._gradient_step, state, jax.random.split(key, steps))
        return state, jax.tree.map(jnp.mean, metrics)

    def _env_step(self, state: DQNState, key) -> tuple[DQNState, dict[str, jax.Array]]:
        """One vector step, its replay write, the gradient step(s) due and the target update."""
        c = self.config
        act_key, env_key, train_key = jax.random.split(key, 3)
        epsilon = self.epsilon(state.env_steps)
        observed = self.observe(state.obs_stats, state.env.obs)
        action = self.act(state.params, observed, act_key, epsilon)
        env, tr = self.env.step(env_key, state.env, action)
        item = ReplayItem(tr.obs, action, tr.reward, tr.terminated, tr.truncated, tr.final_obs)
        buffer = add(state.buffer, item)
        previous, env_steps = state.env_steps, state.env_steps + c.num_envs
        obs_stats = self.update_obs_stats(state.obs_stats, tr.obs)  # whole batch, every step
        state = state.replace(env=env, buffer=buffer, env_steps=env_steps, obs_stats=obs_stats)

        due = env_steps // c.train_frequency > previous // c.train_frequency
        learn = jnp.logical_and(env_steps > c.learning_starts, due)
        metric_shapes = jax.eval_shape(self._train, state, train_key)[1]

        def skip(state, key):
            return state, jax.tree.map(lambda m: jnp.zeros(m.shape, m.dtype), metric_shapes)

        state, train_metrics = jax.lax.cond(learn, self._train, skip, state, train_key)

        interval = c.target_update_interval
        update_target = env_steps // interval > previous // interval
        tau = self.resolve(state.hparams).tau
        # A cond, not a select over every parameter at every vector step (it is due 1 step in 50 at
        # the reference config): 4 us of a 25 us environment step on CPU.
        target = jax.lax.cond(
            update_target,
            lambda t, p: jax.tree.map(lambda t, p: tau * p + (1.0 - tau) * t, t, p),
            lambda t, p: t,
            state.target_params,
            state.params,
        )
        state = state.replace(target_params=target)
        metrics = {
            **train_metrics,
            "trained": learn.astype(jnp.int32),
            "epsilon": epsilon,
            "truncations": tr.truncated.sum(),
            "terminations": tr.terminated.sum(),
        }
        return state, metrics

    def update(self, state: DQNState) -> tuple[DQNState, dict[str, jax.Array]]:
        """``steps_per_update`` vector env steps (with learning) -> state, metrics averaged over
        the steps (losses over the steps that trained)."""
        key, steps_key = jax.random.split(state.key)
        state, per_step = jax.lax.scan(
            self._env_step, state, jax.random.split(steps_key, self.config.steps_per_update)
        )
        trained = per_step.pop("trained")
        count = jnp.maximum(trained.sum(), 1)
        # Learner metrics average over the steps that trained, the rest over all steps.
        metrics = {
            name: jnp.sum(value.astype(jnp.float32) * trained) / count
            if name not in ("epsilon", "truncations", "terminations")
            else jnp.mean(value.astype(jnp.float32))
            for name, value in per_step.items()
        }
        optimizer_steps = trained.sum() * max(self.config.grad_steps_per_env_step, 1)
        metrics.update(
            optimizer_steps=optimizer_steps,
            syncs=jnp.round(metrics["synced"] * optimizer_steps).astype(jnp.int32),
            **episode_metrics(state.env.stats),
            truncations=per_step["truncations"].sum(),
            terminations=per_step["terminations"].sum(),
        )
        return state.replace(key=key, update_step=state.update_step + 1), metrics

    def optimizer_step(self, state: DQNState) -> DQNState:
        """One gradient step (sample, targets, sync, priorities)."""
        return self._gradient_step(state, state.key)[0]
