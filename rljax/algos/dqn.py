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

import dataclasses
from typing import Any, Literal, NamedTuple

import jax
import jax.numpy as jnp
import optax
from flax import struct

from rljax.algos.base import Algorithm, adam, check_divisible, episode_metrics, resumable
from rljax.algos.base import sweepable as sweepable_field
from rljax.algos.normalize import RunningStats
from rljax.algos.td import bootstrap_value, nstep_return, td_loss
from rljax.buffers import ReplayBuffer, add, init_buffer, sample, update_priorities
from rljax.buffers.replay import buffer_logical_specs
from rljax.envs import EnvBatch, check_discrete, check_env_name
from rljax.errors import ConfigError
from rljax.networks import zoo
from rljax.networks.mlp import check_tensor_parallel
from rljax.networks.zoo import NetworkSettings, check_network
from rljax.parallel.sync import SyncConfig, validate_sync


@dataclasses.dataclass(frozen=True)
class DQNConfig(NetworkSettings):
    """DQN hyperparameters (defaults: PureJaxRL's CartPole DQN)."""

    env: str = "CartPole-v1"
    """gymnax environment with discrete actions."""
    num_envs: int = 10
    """parallel environments (sharded along `data`, each shard with its own replay rows)."""
    total_timesteps: int = resumable(500_000)
    """environment steps per seed; rounded down to whole updates."""
    steps_per_update: int = 50
    """vector env steps per `update` call (one metrics row)."""
    buffer_size: int = 10_000
    """replay capacity in transitions (a multiple of num_envs)."""
    batch_size: int = 128
    """transitions per gradient step (sharded along `data`)."""
    learning_starts: int = 10_000
    """environment steps before the first gradient step."""
    train_frequency: int = 10
    """environment steps per gradient step (divides num_envs or is a multiple of it)."""
    target_update_interval: int = 500
    """environment steps between target-network updates."""
    tau: float = sweepable_field(1.0)
    """target update: 1 copies the online network (hard), < 1 is Polyak averaging."""
    gamma: float = sweepable_field(0.99)
    """discount."""
    n_step: int = 1
    """n-step returns (windows cut at episode ends)."""
    double_dqn: bool = False
    """select the next action with the online network, evaluate it with the target network."""
    dueling: bool = False
    """dueling head: Q = V + A - mean(A)."""
    loss: Literal["mse", "huber"] = "mse"
    """TD loss: squared error, or Huber (smooth L1)."""
    lr: float = sweepable_field(2.5e-4)
    """Adam learning rate."""
    lr_decay: bool = False
    """linear decay of the learning rate to 0 over training."""
    max_grad_norm: float = 0.0
    """global-norm gradient clipping; 0 disables it."""
    epsilon_start: float = 1.0
    """exploration epsilon at the first environment step."""
    epsilon_end: float = 0.05
    """exploration epsilon after epsilon_decay_steps."""
    epsilon_decay_steps: int = 250_000
    """environment steps over which epsilon falls linearly from start to end (0: epsilon_end
    from the first step)."""
    prioritized: bool = False
    """proportional prioritized replay."""
    per_alpha: float = 0.6
    """prioritized replay: priority exponent (0: uniform sampling)."""
    per_beta: float = 0.4
    """initial importance-weight exponent, annealed linearly to 1 over training."""
    per_eps: float = 1e-6
    """added to |TD error| before the exponent, so no item's priority is 0 (must be > 0)."""
    q_widths: tuple[int, ...] = (120, 84)
    """Q-network hidden widths; even layers column-split, odd row-split over `model`."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "relu"
    """hidden-layer nonlinearity."""
    sync: SyncConfig = SyncConfig()
    """gradient synchronisation across the data axis (rljax.parallel.sync)."""

    @property
    def env_steps_per_update(self) -> int:
        return self.num_envs * self.steps_per_update

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.env_steps_per_update

    @property
    def grad_steps_per_env_step(self) -> int:
        """Gradient steps after each vector step (0: one every ``train_frequency // num_envs``)."""
        return self.num_envs // self.train_frequency


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
        c = config
        check_env_name(c.env)
        check_discrete(c.env, "dqn")
        for name in (
            "num_envs",
            "total_timesteps",
            "steps_per_update",
            "buffer_size",
            "batch_size",
            "train_frequency",
            "target_update_interval",
            "n_step",
        ):
            if getattr(c, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(c, name)}")
        for name in ("learning_starts", "epsilon_decay_steps", "max_grad_norm", "per_alpha"):
            if getattr(c, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(c, name)}")
        if not c.per_eps > 0:
            raise ConfigError(
                f"per_eps must be > 0 (a zero priority would never be sampled again), got "
                f"{c.per_eps}"
            )
        if not c.lr > 0:
            raise ConfigError(f"lr (learning rate) must be > 0, got {c.lr}")
        for name in ("epsilon_start", "epsilon_end", "gamma", "per_beta"):
            if not 0.0 <= getattr(c, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(c, name)}")
        if not 0.0 < c.tau <= 1.0:
            raise ConfigError(f"tau must be in (0, 1] (1 = hard target update), got {c.tau}")
        check_divisible(f"num_envs={c.num_envs}", c.num_envs, batch_shards)
        check_divisible(
            f"batch_size={c.batch_size}",
            c.batch_size,
            batch_shards,
            f" (each data shard samples batch_size / {batch_shards} from its own replay rows)",
        )
        if c.buffer_size % c.num_envs or c.buffer_size < c.num_envs:
            raise ConfigError(
                f"buffer_size={c.buffer_size} must be a positive multiple of num_envs={c.num_envs} "
                "(one ring per environment)"
            )
        if c.buffer_size < c.batch_size:
            raise ConfigError(
                f"buffer_size={c.buffer_size} is smaller than batch_size={c.batch_size}; the "
                "replay buffer must hold at least one batch"
            )
        if c.n_step > c.buffer_size // c.num_envs:
            raise ConfigError(
                f"n_step={c.n_step} exceeds the items kept per environment "
                f"(buffer_size / num_envs = {c.buffer_size // c.num_envs})"
            )
        if c.num_envs % c.train_frequency and c.train_frequency % c.num_envs:
            raise ConfigError(
                f"train_frequency={c.train_frequency} must divide num_envs={c.num_envs} or be a "
                "multiple of it (gradient steps happen between vector env steps)"
            )
        if c.num_updates < 1:
            raise ConfigError(
                f"total_timesteps={c.total_timesteps} is less than one update "
                f"(num_envs*steps_per_update={c.env_steps_per_update})"
            )
        if c.learning_starts >= c.total_timesteps:
            raise ConfigError(
                f"learning_starts={c.learning_starts} is not below total_timesteps="
                f"{c.total_timesteps}: the run would never learn"
            )
        # Every sampled window must lie in written steps: learning_starts fills n_step per row.
        if c.learning_starts < c.n_step * c.num_envs:
            raise ConfigError(
                f"learning_starts={c.learning_starts} must be >= n_step * num_envs = "
                f"{c.n_step * c.num_envs} so that whole n-step windows exist before sampling"
            )
        validate_sync(c.sync)
        check_network(c, mlp_shards, "dqn")
        if c.network == "mlp":
            check_tensor_parallel({"q": c.q_widths}, mlp_shards)

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
        explore_key, action_key = jax.random.split(key)
        b = obs.shape[0]
        random_action = jax.random.randint(action_key, (b,), 0, self.env.spec.num_actions)
        explore = jax.random.uniform(explore_key, (b,)) < epsilon
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
