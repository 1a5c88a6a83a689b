"""Synchronous advantage actor-critic (A2C) on batched gymnax environments, as pure functions.

    a2c = A2C(A2CConfig(env="CartPole-v1"))
    state = a2c.init(jax.random.key(0))        # A2CState pytree
    state, metrics = a2c.update(state)          # one rollout + one gradient step on all of it

Shapes: ``T = num_steps``, ``B = num_envs``, ``D`` the flattened observation, ``A`` the number of
actions, ``R`` data-parallel replicas. Advantages are GAE over the rollout (``gae_lambda=1``:
n-step returns), with PPO's truncation rule: a time-limit end bootstraps from
``V(final_observation)``; a termination does not.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Literal, NamedTuple

import jax
import jax.numpy as jnp

from rljax.algos.actor_critic import (
    ActorCriticAlgorithm,
    ActorCriticState,
    Rollout,
    env_major,
    gae,
)
from rljax.algos.base import adam, check_divisible, episode_metrics, resumable, sweepable
from rljax.envs import check_env_name
from rljax.errors import ConfigError
from rljax.networks import check_tensor_parallel
from rljax.networks.zoo import NetworkSettings, check_network
from rljax.parallel.sync import SyncConfig, validate_sync


@dataclasses.dataclass(frozen=True)
class A2CConfig(NetworkSettings):
    """A2C hyperparameters (defaults: tuned to solve CartPole-v1 in ~250k steps)."""

    env: str = "CartPole-v1"
    """gymnax environment, or brax/<name> (pip install 'rljax[brax]'); discrete actions get a
    categorical policy, continuous (Box) ones a diagonal Gaussian."""
    num_envs: int = 32
    """parallel environments (the batch, split over data-parallel replicas)."""
    num_steps: int = 8
    """rollout length per update (the n of n-step returns)."""
    total_timesteps: int = resumable(262_144)
    """environment steps per seed; rounded down to whole updates."""
    lr: float = sweepable(3e-3)
    """Adam learning rate (eps 1e-5)."""
    anneal_lr: bool = True
    """linear decay of the learning rate to 0 over training."""
    gamma: float = sweepable(0.99)
    """discount."""
    gae_lambda: float = sweepable(1.0)
    """GAE trace decay (1: n-step returns up to the rollout's end, 0: one-step TD)."""
    ent_coef: float = sweepable(0.01)
    """entropy bonus weight."""
    vf_coef: float = sweepable(0.5)
    """value loss weight."""
    max_grad_norm: float = 0.5
    """global-norm gradient clipping; 0 disables it."""
    actor_widths: tuple[int, ...] = (64, 64)
    """actor hidden widths; even layers column-split, odd row-split (tensor parallel)."""
    critic_widths: tuple[int, ...] = (64, 64)
    """critic hidden widths."""
    activation: Literal["tanh", "relu", "gelu", "silu"] = "tanh"
    """hidden-layer nonlinearity."""
    normalize_rewards: bool = False
    """divide the rewards the update learns from by the running standard deviation of each
    environment's discounted return (restarted at every episode end; kept in the training state
    and checkpoints), clipped to +-10. Logged returns and evaluation stay in raw rewards."""
    squash: Literal["none", "tanh"] = "none"
    """continuous actions: none (the Gaussian sample, clipped to the bounds at the environment)
    or tanh (squashed and rescaled to the bounds; log-prob with the log-det correction)."""
    sync: SyncConfig = SyncConfig()
    """gradient synchronisation across data-parallel replicas (rljax.parallel.sync)."""

    @property
    def env_steps_per_update(self) -> int:
        return self.num_envs * self.num_steps

    @property
    def num_updates(self) -> int:
        return self.total_timesteps // self.env_steps_per_update


A2CState = ActorCriticState


class A2CBatch(NamedTuple):
    """Samples for the loss, leaves ``[n, ...]`` (one replica's share of the rollout)."""

    obs: jax.Array  # [n, D]
    action: jax.Array  # [n] int32, or [n, A] float32 raw samples (continuous)
    advantage: jax.Array  # [n] GAE advantage (not normalised)
    returns: jax.Array  # [n] value targets


class A2C(ActorCriticAlgorithm):
    """A2C built from a config; methods are pure functions of their array arguments.

    On-policy with one gradient step per rollout, so the loss needs no behaviour log-probabilities.
    A ``data=R`` mesh and ``R`` replicas emulated on one device give the same numbers.
    """

    name = "a2c"
    config_type = A2CConfig

    @classmethod
    def validate(cls, config: A2CConfig, batch_shards: int = 1, mlp_shards: int = 1) -> None:
        super().validate(config, batch_shards, mlp_shards)
        check_env_name(config.env)
        cls.check_policy(config)
        for name in ("num_envs", "num_steps", "total_timesteps"):
            if getattr(config, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(config, name)}")
        if not config.lr > 0:
            raise ConfigError(f"lr (learning rate) must be > 0, got {config.lr}")
        for name in ("gamma", "gae_lambda"):
            if not 0.0 <= getattr(config, name) <= 1.0:
                raise ConfigError(f"{name} must be in [0, 1], got {getattr(config, name)}")
        for name in ("ent_coef", "vf_coef", "max_grad_norm"):
            if getattr(config, name) < 0:
                raise ConfigError(f"{name} must be >= 0, got {getattr(config, name)}")
        check_divisible(f"num_envs={config.num_envs}", config.num_envs, batch_shards)
        if config.num_updates < 1:
            raise ConfigError(
                f"total_timesteps={config.total_timesteps} is less than one update "
                f"(num_envs*num_steps={config.env_steps_per_update})"
            )
        validate_sync(config.sync)
        check_network(config, mlp_shards, "a2c")
        if config.network == "mlp":
            check_tensor_parallel(
                {"actor": config.actor_widths, "critic": config.critic_widths}, mlp_shards
            )

    def build_optimizer(self):
        c = self.config  # one optimizer step per update: the step count is the update count

        def decay(count):
            return 1.0 - count / c.num_updates if c.anneal_lr else 1.0

        traced = "lr" in self.swept
        return adam(c.lr, eps=1e-5, max_grad_norm=c.max_grad_norm, decay=decay, traced_lr=traced)

    def init_boxed(self, key: jax.Array) -> A2CState:
        net_key, env_key, key = jax.random.split(key, 3)
        params = self.init_params(net_key)
        opt_state = self.optimizer.init(params)
        env = self.env.reset(env_key)
        step = jnp.zeros((), jnp.int32)
        hparams, obs_stats = self.initial_hparams(), self.init_obs_stats()
        reward_scaling = self.init_reward_scaling()
        return A2CState(params, opt_state, {}, env, key, step, hparams, obs_stats, reward_scaling)

    # -- learning ---------------------------------------------------------------------------------
    def advantages(self, params, rollout: Rollout, hparams: dict[str, jax.Array], reward=None):
        """``(advantages, returns)``, both ``[T, B@batch]``, of ``reward [T, B@batch]`` (the
        rollout's own by default).

        Every step bootstraps from ``V(final_obs)``, the observation after it before any reset
        (``obs[t+1]`` unless the episode ended; the rollout's last step included); ``gae`` drops
        it after a termination. One critic call on all ``T x B`` rows: A2C's rollouts are short.
        """
        hp, tr = self.resolve(hparams), rollout.transition
        next_values = jax.vmap(self.value, in_axes=(None, 0))(params, tr.final_obs)
        ends = (tr.terminated, tr.truncated)
        reward = tr.reward if reward is None else reward
        return gae(reward, rollout.value, next_values, *ends, hp.gamma, hp.gae_lambda)

    def loss(self, params, batch: A2CBatch, hparams: dict[str, jax.Array]):
        """Policy gradient + value regression - entropy bonus of one replica's samples."""
        c = self.resolve(hparams)
        out, value = self.network.apply(params, batch.obs)
        log_prob = self.dist.log_prob(out, batch.action)
        policy_loss = -(log_prob * batch.advantage).mean()
        value_loss = 0.5 * jnp.square(value - batch.returns).mean()
        entropy = self.dist.entropy(out).mean()
        loss = policy_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        return loss, {"policy_loss": policy_loss, "value_loss": value_loss, "entropy": entropy}

    def sgd_step(self, params, opt_state, sync, batch: A2CBatch, hparams):
        """One optimizer step on ``batch`` leaves ``[R@replica, n, ...]``."""
        loss_fn = functools.partial(self.loss, hparams=hparams)
        (loss, aux), grads = self.learner.grads(loss_fn, params, batch)
        params, opt_state, sync, sync_metrics = self.learner.step(
            params, opt_state, sync, grads, scale=hparams.get("lr")
        )
        metrics = {**jax.tree.map(jnp.mean, aux), "loss": loss.mean(), **sync_metrics}
        return params, opt_state, sync, metrics

    def update(self, state: A2CState) -> tuple[A2CState, dict[str, jax.Array]]:
        """One A2C iteration: rollout, advantages, one gradient step on the whole rollout."""
        key, rollout_key = jax.random.split(state.key)
        env, rollout = self.rollout(state.params, state.env, rollout_key, state.obs_stats)
        obs_stats, rollout, _ = self.observed_rollout(state.obs_stats, env, rollout)
        tr = rollout.transition
        gamma = self.resolve(state.hparams).gamma
        reward_scaling, reward = self.scaled_rewards(state.reward_scaling, tr, gamma)
        advantages, returns = self.advantages(state.params, rollout, state.hparams, reward)
        samples = A2CBatch(tr.obs, rollout.action, advantages, returns)
        # [T, B@batch, ...] -> [B*T, ...] env-major, then [R@replica, B/R * T, ...]: a replica's
        # own environments, so no sample leaves its data shard.
        batch = self.learner.split(env_major(samples))
        params, opt_state, sync, metrics = self.sgd_step(
            state.params, state.opt_state, state.sync, batch, state.hparams
        )
        metrics = jax.tree.map(lambda m: jnp.mean(m.astype(jnp.float32)), metrics)
        metrics.update(
            optimizer_steps=jnp.int32(1),
            syncs=metrics["synced"].astype(jnp.int32),
            truncations=tr.truncated.sum(),
            terminations=tr.terminated.sum(),
            **episode_metrics(env.stats),
        )
        step = state.update_step + 1
        state = state.replace(
            key=key, env=env, update_step=step, obs_stats=obs_stats, reward_scaling=reward_scaling
        )
        return self.with_learner(state, params, opt_state, sync), metrics

    def optimizer_step(self, state: A2CState) -> A2CState:
        def zeros(*shape, dtype=jnp.float32):
            return jnp.zeros((self.config.env_steps_per_update, *shape), dtype)

        obs_dim, n = self.env.spec.obs_dim, self.config.env_steps_per_update
        batch = self.learner.split(
            A2CBatch(zeros(obs_dim), self.placeholder_actions(n), zeros(), zeros())
        )
        params, opt_state, sync, _ = self.sgd_step(
            state.params, state.opt_state, state.sync, batch, state.hparams
        )
        return self.with_learner(state, params, opt_state, sync)
