"""Proximal Policy Optimisation on batched gymnax environments, as pure functions.

    ppo = PPO(PPOConfig(env="CartPole-v1"))
    state = ppo.init(jax.random.key(0))        # PPOState pytree
    state, metrics = ppo.update(state)          # one rollout + epochs x minibatches of SGD

Both can be ``jax.jit``-ed, ``jax.vmap``-ed over keys (seeds) and composed; ``rljax.runner``
adds shardings, chunking and logging around them. Shapes: ``T = num_steps``, ``B = num_envs``,
``D`` the flattened observation, ``A`` the number of actions.

Truncation: a time-limit end bootstraps from ``V(final_observation)``; a termination does not.
After the rollout one batched critic call evaluates the truncation steps' ``final_obs`` (and the
last observation); every other step's next value is the rollout's own ``V(obs[t+1])``.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import struct

from rljax.algos import hparams as hparams_lib
from rljax.envs import BatchedEnv, EnvBatch, Transition, check_env_name
from rljax.errors import ConfigError
from rljax.networks import ActorCritic, distributions
from rljax.networks.mlp import check_tensor_parallel, check_torso, init_dummy_obs
from rljax.parallel.sharding import LOGICAL_RULES, LogicalRules, batch_spec_like, constrain
from rljax.parallel.sync import GradientSync, SyncConfig, validate_sync

# Float fields a sweep can hold in ``PPOState.hparams`` (traced) and vmap over.
SWEEPABLE = ("lr", "gamma", "gae_lambda", "clip_eps", "ent_coef", "vf_coef")


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO hyperparameters (defaults: PureJaxRL's CartPole settings)."""

    env: str = "CartPole-v1"
    """gymnax environment with discrete actions."""
    num_envs: int = 4
    """parallel environments (the batch, sharded along `data`)."""
    num_steps: int = 128
    """rollout length per update."""
    total_timesteps: int = 500_000
    """environment steps per seed; rounded down to whole updates."""
    update_epochs: int = 4
    """passes over each rollout."""
    num_minibatches: int = 4
    """minibatches per epoch (each sharded along `data`)."""
    lr: float = 2.5e-4
    """Adam learning rate (eps 1e-5)."""
    anneal_lr: bool = True
    """linear decay of the learning rate to 0 over training."""
    gamma: float = 0.99
    """discount."""
    gae_lambda: float = 0.95
    clip_eps: float = 0.2
    """PPO ratio clip (also the value-loss clip)."""
    clip_value_loss: bool = True
    ent_coef: float = 0.01
    """entropy bonus weight."""
    vf_coef: float = 0.5
    """value loss weight."""
    max_grad_norm: float = 0.5
    """global-norm gradient clipping."""
    actor_widths: tuple[int, ...] = (64, 64)
    """actor hidden widths; even layers column-split, odd row-split over `model`."""
    critic_widths: tuple[int, ...] = (64, 64)
    torso_widths: tuple[int, ...] = ()
    """shared layers before both towers (an even number of layers)."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    sync: SyncConfig = SyncConfig()
    """gradient synchronisation across the data axis (rljax.parallel.sync)."""

    @property
    def env_steps_per_update(self) -> int:
        return self.batch_size

    @property
    def batch_size(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def minibatch_size(self) -> int:
        return self.batch_size // self.num_minibatches

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.batch_size


def validate(config: PPOConfig, data_size: int = 1, model_size: int = 1) -> None:
    """Raise ``ConfigError`` naming the first invalid field; called before anything compiles.

    ``data_size`` is the number of data-parallel replicas (the data axis of the mesh)."""
    check_env_name(config.env)
    positive = ("num_envs", "num_steps", "total_timesteps", "update_epochs", "num_minibatches")
    for name in positive:
        if getattr(config, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
    if not config.lr > 0:
        raise ConfigError(f"lr (learning rate) must be > 0, got {config.lr}")
    for name in ("gamma", "gae_lambda"):
        if not 0.0 <= getattr(config, name) <= 1.0:
            raise ConfigError(f"{name} must be in [0, 1], got {getattr(config, name)}")
    for name in ("clip_eps", "ent_coef", "vf_coef", "max_grad_norm"):
        if getattr(config, name) < 0:
            raise ConfigError(f"{name} must be >= 0, got {getattr(config, name)}")
    if config.num_envs % data_size:
        raise ConfigError(
            f"num_envs={config.num_envs} is not divisible by the data axis size {data_size}; "
            f"use a multiple of {data_size}"
        )
    if config.batch_size % config.num_minibatches:
        raise ConfigError(
            f"num_minibatches={config.num_minibatches} does not divide the batch "
            f"num_envs*num_steps={config.batch_size}"
        )
    if config.minibatch_size % data_size:
        raise ConfigError(
            f"minibatch size {config.minibatch_size} (batch {config.batch_size} / "
            f"{config.num_minibatches} minibatches) is not divisible by the data axis size "
            f"{data_size}"
        )
    if config.num_updates < 1:
        raise ConfigError(
            f"total_timesteps={config.total_timesteps} is less than one update "
            f"(num_envs*num_steps={config.batch_size})"
        )
    validate_sync(config.sync)
    check_torso(config.torso_widths)
    check_tensor_parallel(
        {
            "torso": config.torso_widths,
            "actor": config.actor_widths,
            "critic": config.critic_widths,
        },
        model_size,
    )


@struct.dataclass
class PPOState:
    """``params``/``opt_state`` are ``[R@data, ...]`` per replica for local/adaptive sync."""

    params: Any
    opt_state: Any
    sync: dict[str, Any]  # gradient-sync state (residuals, queues, counters)
    env: EnvBatch
    key: jax.Array
    update_step: jax.Array  # int32 scalar: updates done
    hparams: dict[str, jax.Array]  # swept fields as float32 scalars (empty unless sweeping)


class Rollout(struct.PyTreeNode):
    """A rollout, every leaf ``[T, B@data, ...]``."""

    transition: Transition
    action: jax.Array
    log_prob: jax.Array
    value: jax.Array


def gae(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    gamma: float,
    gae_lambda: float,
) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation, ``[T, B]`` inputs -> ``(advantages, returns)``.

    ``next_values[t]`` is ``V`` of the observation after step ``t`` *before* any reset
    (``final_observation``). It is dropped on termination; the trace is cut at every episode end.
    """
    ended = jnp.logical_or(terminated, truncated).astype(jnp.float32)
    bootstrap = 1.0 - terminated.astype(jnp.float32)
    deltas = rewards + gamma * bootstrap * next_values - values

    def backward(next_advantage, xs):
        delta, end = xs
        advantage = delta + gamma * gae_lambda * (1.0 - end) * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, ended), reverse=True, unroll=16
    )
    return advantages, advantages + values


class PPO:
    """PPO built from a config; methods are pure functions of their array arguments.

    ``replicas`` data-parallel replicas (the mesh's data axis size; ``rljax.runner`` sets it) each
    own ``num_envs / R`` environments, shuffle their own samples and compute their own gradient,
    which ``config.sync`` synchronises. A ``data=R`` mesh and ``R`` replicas emulated on one device
    give the same numbers; the model axis never changes them.
    """

    def __init__(
        self,
        config: PPOConfig,
        rules: LogicalRules = LOGICAL_RULES,
        replicas: int = 1,
        swept: tuple[str, ...] = (),
    ):
        """``swept``: fields of ``SWEEPABLE`` held as traced ``state.hparams`` (sweeps)."""
        self.config = config
        self.rules = dict(rules)
        self.replicas = replicas
        self.swept = hparams_lib.check_swept(swept, SWEEPABLE, "ppo")
        self.env = BatchedEnv(config.env, config.num_envs, self.rules)
        self.network = ActorCritic(
            num_actions=self.env.spec.num_actions,
            actor_widths=config.actor_widths,
            critic_widths=config.critic_widths,
            torso_widths=config.torso_widths,
            activation=config.activation,
            rules=tuple(self.rules.items()),
        )
        c = config
        steps_per_update = c.update_epochs * c.num_minibatches

        def frac(count):  # linear annealing, constant within an update as in PureJaxRL
            if not c.anneal_lr:
                return 1.0
            return 1.0 - (count // steps_per_update) / c.num_updates

        if "lr" in self.swept:
            # Adam with a unit rate; the traced learning rate multiplies the update
            # (GradientSync.step(scale=...)).
            adam = optax.chain(
                optax.scale_by_adam(eps=1e-5), optax.scale_by_schedule(lambda n: -frac(n))
            )
        else:
            adam = optax.adam(lambda n: c.lr * frac(n), eps=1e-5)
        self.optimizer = optax.chain(optax.clip_by_global_norm(c.max_grad_norm), adam)
        boxed_params = jax.eval_shape(self._init_params, jax.random.key(0))
        self.sync = GradientSync(c.sync, self.optimizer, replicas, boxed_params, self.rules)

    # -- initialisation ---------------------------------------------------------------------------
    def _init_params(self, key: jax.Array):
        return self.network.init(key, init_dummy_obs((self.env.spec.obs_dim,)))

    def init_boxed(self, key: jax.Array) -> PPOState:
        """One replica's state, parameters and optimizer moments in logical-axis boxes."""
        net_key, env_key, key = jax.random.split(key, 3)
        params = self._init_params(net_key)
        opt_state = self.optimizer.init(params)
        env = self.env.reset(env_key)
        hparams = hparams_lib.initial(self.config, self.swept)
        return PPOState(params, opt_state, {}, env, key, jnp.zeros((), jnp.int32), hparams)

    def init(self, key: jax.Array) -> PPOState:
        """``key`` -> a fresh ``PPOState`` (plain arrays, in the sync strategy's layout)."""
        state = nn.meta.unbox(self.init_boxed(key))
        params, opt_state, sync = self.sync.init(state.params, state.opt_state)
        return state.replace(params=params, opt_state=opt_state, sync=sync)

    def logical_specs(self) -> PPOState:
        """Logical ``PartitionSpec`` of every leaf of the state (for ``rljax.runner``)."""
        abstract = jax.eval_shape(self.init_boxed, jax.random.key(0))
        specs = nn.get_partition_spec(abstract)
        params, opt_state, sync = self.sync.logical_specs()
        return specs.replace(
            params=params, opt_state=opt_state, sync=sync, env=batch_spec_like(abstract.env)
        )

    # -- acting -----------------------------------------------------------------------------------
    def policy(self, params, obs: jax.Array):
        """``obs: [B@data, D]`` -> ``(logits [B@data, A], value [B@data])``."""
        return self.sync.map_replicas(self.network.apply, params, obs)

    def value(self, params, obs: jax.Array) -> jax.Array:
        apply = lambda p, o: self.network.apply(p, o, method=ActorCritic.value)  # noqa: E731
        return self.sync.map_replicas(apply, params, obs)

    def eval_action(self, params, obs, key, greedy: bool = True) -> jax.Array:
        """One replica's parameters: argmax of the logits, or a sample."""
        logits, _ = self.network.apply(params, obs)
        if greedy:
            return jnp.argmax(logits, axis=-1).astype(jnp.int32)
        return distributions.sample(key, logits)

    def rollout(self, params, env: EnvBatch, key: jax.Array) -> tuple[EnvBatch, Rollout]:
        """``num_steps`` batched steps -> the new ``EnvBatch`` and a ``Rollout`` ``[T, B@data]``."""

        def step(carry, step_key):
            env = carry
            act_key, env_key = jax.random.split(step_key)
            logits, value = self.policy(params, env.obs)
            action = distributions.sample(act_key, logits)
            log_prob = distributions.log_prob(logits, action)
            env, transition = self.env.step(env_key, env, action)
            return env, Rollout(transition, action, log_prob, value)

        keys = jax.random.split(key, self.config.num_steps)
        return jax.lax.scan(step, env, keys)

    def next_values(self, params, rollout: Rollout, last_obs: jax.Array) -> jax.Array:
        """``V`` of the observation after each step, before any reset: ``[T, B@data]``.

        ``last_obs: [B@data, D]`` is the batch's observation after the rollout. A step that did
        not end an episode is followed by ``obs[t+1]``, whose value the rollout already holds;
        only truncated steps need ``V(final_obs)`` (terminated ones are not bootstrapped). With
        a time limit of at least ``T`` steps (CartPole: 500 >= 128) an environment truncates at
        most once per rollout, so one critic call on each environment's truncation step replaces
        one on all ``T x B`` final observations; otherwise every step is evaluated.
        """
        tr = rollout.transition
        values_of = jax.vmap(self.value, in_axes=(None, 0))  # [K, B@data, D] -> [K, B@data]
        limit = self.env.time_limit
        if limit is None or limit < self.config.num_steps:
            return values_of(params, tr.final_obs)
        step = jnp.argmax(tr.truncated, axis=0)  # [B]: each env's truncation step (0 if none)
        truncation_obs = jnp.take_along_axis(tr.final_obs, step[None, :, None], axis=0)[0]
        truncation_value, last_value = values_of(params, jnp.stack([truncation_obs, last_obs]))
        following = jnp.concatenate([rollout.value[1:], last_value[None]], axis=0)
        return jnp.where(tr.truncated, truncation_value[None], following)

    # -- learning ---------------------------------------------------------------------------------
    def loss(self, params, batch: dict[str, jax.Array], hparams: dict[str, jax.Array]):
        """Clipped PPO loss of one replica's minibatch ``[n, ...]`` -> ``(loss, aux metrics)``.

        ``batch["advantage"]`` is already normalised over the whole (all-replica) minibatch;
        ``hparams``: the swept fields (``PPOState.hparams``), the rest comes from the config.
        """
        c = hparams_lib.resolve(self.config, hparams)
        logits, value = self.network.apply(params, batch["obs"])
        log_prob = distributions.log_prob(logits, batch["action"])
        log_ratio = log_prob - batch["log_prob"]
        ratio = jnp.exp(log_ratio)
        adv = batch["advantage"]
        policy_loss = -jnp.minimum(
            ratio * adv, jnp.clip(ratio, 1.0 - c.clip_eps, 1.0 + c.clip_eps) * adv
        ).mean()
        value_error = jnp.square(value - batch["return"])
        if c.clip_value_loss:
            clipped = batch["value"] + jnp.clip(value - batch["value"], -c.clip_eps, c.clip_eps)
            value_error = jnp.maximum(value_error, jnp.square(clipped - batch["return"]))
        value_loss = 0.5 * value_error.mean()
        entropy = distributions.entropy(logits).mean()
        loss = policy_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        aux = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_fraction": (jnp.abs(ratio - 1.0) > c.clip_eps).mean(),
        }
        return loss, aux

    def _sgd_step(self, carry, minibatch, hparams):
        """One optimizer step on ``minibatch`` leaves ``[R@data, n, ...]``."""
        params, opt_state, sync = carry
        adv = minibatch["advantage"]  # statistics over all replicas' samples: two scalars move
        minibatch = {**minibatch, "advantage": (adv - adv.mean()) / (adv.std() + 1e-8)}
        loss_fn = functools.partial(self.loss, hparams=hparams)
        (loss, aux), grads = self.sync.grads(loss_fn, params, minibatch)
        params, opt_state, sync, sync_metrics = self.sync.step(
            params, opt_state, sync, grads, scale=hparams.get("lr")
        )
        metrics = {**jax.tree.map(jnp.mean, aux), "loss": loss.mean(), **sync_metrics}
        return (params, opt_state, sync), metrics

    def _epoch(self, carry, key, batch, hparams):
        """``batch`` leaves ``[R@data, N/R, ...]``: each replica shuffles its own samples."""
        c, replicas = self.config, self.replicas
        per_replica = c.batch_size // replicas
        permutations = jax.vmap(jax.random.permutation, in_axes=(0, None))(
            jax.random.split(key, replicas), per_replica
        )

        def to_minibatches(x):
            # [R, N/R, ...] -> [M, R, N/(R M), ...]: minibatch m takes a slice of every replica.
            x = jax.vmap(lambda rows, p: jnp.take(rows, p, axis=0))(x, permutations)
            x = x.reshape(replicas, c.num_minibatches, -1, *x.shape[2:]).swapaxes(0, 1)
            return constrain(x, None, "replica", rules=self.rules)

        step = functools.partial(self._sgd_step, hparams=hparams)
        return jax.lax.scan(step, carry, jax.tree.map(to_minibatches, batch))

    def update(self, state: PPOState) -> tuple[PPOState, dict[str, jax.Array]]:
        """One PPO iteration: rollout, GAE, ``update_epochs`` x shuffled minibatches."""
        c = self.config
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        env, rollout = self.rollout(state.params, state.env, rollout_key)
        tr = rollout.transition
        next_values = self.next_values(state.params, rollout, env.obs)
        advantages, returns = gae(
            tr.reward,
            rollout.value,
            next_values,
            tr.terminated,
            tr.truncated,
            hparams_lib.resolve(c, state.hparams).gamma,
            hparams_lib.resolve(c, state.hparams).gae_lambda,
        )
        samples = {
            "obs": tr.obs,
            "action": rollout.action,
            "log_prob": rollout.log_prob,
            "value": rollout.value,
            "advantage": advantages,
            "return": returns,
        }
        # [T, B@data, ...] -> [R@data, B/R * T, ...]: a replica's own environments, env-major,
        # so no sample leaves its data shard.
        batch = jax.tree.map(
            lambda x: constrain(
                jnp.swapaxes(x, 0, 1).reshape(self.replicas, -1, *x.shape[2:]),
                "replica",
                rules=self.rules,
            ),
            samples,
        )
        (params, opt_state, sync), sgd_metrics = jax.lax.scan(
            lambda carry, k: self._epoch(carry, k, batch, state.hparams),
            (state.params, state.opt_state, state.sync),
            jax.random.split(epoch_key, c.update_epochs),
        )
        stats = env.stats
        finished = stats.completed > 0
        metrics = jax.tree.map(lambda m: jnp.mean(m.astype(jnp.float32)), sgd_metrics)
        metrics.update(
            optimizer_steps=jnp.int32(c.update_epochs * c.num_minibatches),
            syncs=jnp.sum(sgd_metrics["synced"]),
            episode_return=jnp.sum(jnp.where(finished, stats.last_return, 0.0))
            / jnp.maximum(finished.sum(), 1),
            episode_length=jnp.sum(jnp.where(finished, stats.last_length, 0))
            / jnp.maximum(finished.sum(), 1),
            episodes=stats.completed.sum(),
            truncations=tr.truncated.sum(),
            terminations=tr.terminated.sum(),
        )
        new_state = state.replace(
            params=params,
            opt_state=opt_state,
            sync=sync,
            env=env,
            key=key,
            update_step=state.update_step + 1,
        )
        return new_state, metrics

    def optimizer_step(self, state: PPOState) -> PPOState:
        """One optimizer step on a placeholder minibatch ``[R@data, n, ...]``: the program whose
        collectives ``rljax.runner.communication`` counts (values do not matter there)."""
        c, obs_dim = self.config, self.env.spec.obs_dim
        n = c.minibatch_size // self.replicas
        shapes = {"obs": (n, obs_dim), "action": (n,), "log_prob": (n,), "value": (n,)}
        shapes |= {"advantage": (n,), "return": (n,)}
        minibatch = {
            k: constrain(
                jnp.zeros((self.replicas, *shape), jnp.int32 if k == "action" else jnp.float32),
                "replica",
                rules=self.rules,
            )
            for k, shape in shapes.items()
        }
        (params, opt_state, sync), _ = self._sgd_step(
            (state.params, state.opt_state, state.sync), minibatch, state.hparams
        )
        return state.replace(params=params, opt_state=opt_state, sync=sync)

    def env_steps(self, state: PPOState) -> jax.Array:
        return state.update_step * self.config.batch_size
