"""Proximal Policy Optimisation on batched gymnax environments, as pure functions.

    ppo = PPO(PPOConfig(env="CartPole-v1"))
    state = ppo.init(jax.random.key(0))        # PPOState pytree
    state, metrics = ppo.update(state)          # one rollout + epochs x minibatches of SGD

Both can be ``jax.jit``-ed, ``jax.vmap``-ed over keys (seeds) and composed; ``rljax.run`` adds
shardings, chunking and logging around them. Shapes: ``T = num_steps``, ``B = num_envs``, ``D`` the
flattened observation, ``A`` the number of actions, ``R`` data-parallel replicas.

Truncation: a time-limit end bootstraps from ``V(final_observation)``; a termination does not.
``normalize_obs``: see ``ActorCriticAlgorithm.observed_rollout``.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from rljax.algos import shuffle
from rljax.algos.actor_critic import (
    ActorCriticAlgorithm,
    ActorCriticState,
    Rollout,
    env_major,
    gae,
    vtrace_advantages,
)
from rljax.algos.base import adam, episode_metrics
from rljax.algos.ppo_config import PPOConfig, check_config
from rljax.envs import check_env_name
from rljax.parallel.rules import constrain

PPOState = ActorCriticState


class PPOBatch(NamedTuple):
    """Samples for the loss, leaves ``[n, ...]`` (one replica's minibatch); recurrent: ``n``
    whole environment sequences, leaves ``[n, T, ...]``, with ``ends`` and ``hidden``."""

    obs: jax.Array  # [n, D]
    action: jax.Array  # [n] int32, or [n, A] float32 raw samples (continuous)
    log_prob: jax.Array  # [n] behaviour log-probability
    value: jax.Array  # [n] behaviour value
    advantage: jax.Array  # [n], normalised over the whole minibatch
    returns: jax.Array  # [n] GAE value targets
    ends: jax.Array | None = None  # recurrent: [n, T] bool, the step ended an episode
    hidden: jax.Array | None = None  # recurrent: [n, H] the hidden state at the sequence's start


class Experience(NamedTuple):
    """One rollout as the learner receives it (``act`` -> ``learn``), leaves ``[T, B@batch, ...]``
    unless noted. On an actor mesh it is made there and resharded to the learner's mesh."""

    rollout: Rollout  # observations as the network saw them; behaviour log-probs and values
    reward: jax.Array  # [T, B] to learn from (scaled with normalize_rewards)
    next_values: jax.Array  # [T, B] behaviour V of the observation after each step (GAE)
    last_obs: jax.Array  # [B, D] the observation after the rollout (V-trace recomputes V)
    key: jax.Array  # the update's epoch key (minibatch shuffles)


class PPO(ActorCriticAlgorithm):
    """PPO built from a config; methods are pure functions of their array arguments.

    A ``data=R`` mesh and ``R`` replicas emulated on one device give the same numbers; the model
    axis never changes them. ``PPO(config)`` with ``config.recurrent="gru"`` builds a
    ``RecurrentPPO`` (``rljax/algos/recurrent.py``), which overrides the hooks ``collect``,
    ``training_batch``, ``forward`` and ``placeholder_minibatch``.
    """

    name = "ppo"
    config_type = PPOConfig

    def __new__(cls, config=None, *args, **kwargs):
        if cls is PPO and getattr(config, "recurrent", "none") != "none":
            from rljax.algos.recurrent import RecurrentPPO

            cls = RecurrentPPO
        return super().__new__(cls)

    @classmethod
    def validate(cls, config: PPOConfig, batch_shards: int = 1, mlp_shards: int = 1) -> None:
        super().validate(config, batch_shards, mlp_shards)
        check_env_name(config.env)
        cls.check_policy(config)
        check_config(config, batch_shards, mlp_shards)

    def build_optimizer(self):
        c = self.config
        steps_per_update = c.update_epochs * c.num_minibatches

        def decay(count):  # linear annealing, constant within an update as in PureJaxRL
            if not c.anneal_lr:
                return 1.0
            return 1.0 - (count // steps_per_update) / c.num_updates

        return adam(
            c.lr,
            eps=1e-5,
            max_grad_norm=c.max_grad_norm,
            decay=decay,
            traced_lr="lr" in self.swept,
        )

    def init_boxed(self, key: jax.Array) -> PPOState:
        net_key, env_key, key = jax.random.split(key, 3)
        params = self.init_params(net_key)
        opt_state = self.optimizer.init(params)
        env = self.env.reset(env_key)
        step = jnp.zeros((), jnp.int32)
        hparams, obs_stats = self.initial_hparams(), self.init_obs_stats()
        reward_scaling = self.init_reward_scaling()
        return PPOState(params, opt_state, {}, env, key, step, hparams, obs_stats, reward_scaling)

    # -- learning targets ---------------------------------------------------------------------
    def next_values(self, params, rollout: Rollout, last_obs: jax.Array) -> jax.Array:
        """``V`` of the observation after each step, before any reset: ``[T, B@batch]``.

        ``last_obs: [B@batch, D]`` is the batch's observation after the rollout. A step that did
        not end an episode is followed by ``obs[t+1]``, whose value the rollout already holds;
        only truncated steps need ``V(final_obs)`` (terminated ones are not bootstrapped). With
        a time limit of at least ``T`` steps an environment truncates at most once per rollout,
        so one critic call on each environment's truncation step replaces one on all ``T x B``
        final observations; otherwise every step is evaluated.
        """
        tr = rollout.transition
        values_of = jax.vmap(self.value, in_axes=(None, 0))  # [K, B, D] -> [K, B]
        limit = self.env.time_limit
        if limit is None or limit < self.config.num_steps:
            return values_of(params, tr.final_obs)
        step = jnp.argmax(tr.truncated, axis=0)  # [B]: each env's truncation step (0 if none)
        truncation_obs = jnp.take_along_axis(tr.final_obs, step[None, :, None], axis=0)[0]
        truncation_value, last_value = values_of(params, jnp.stack([truncation_obs, last_obs]))
        following = jnp.concatenate([rollout.value[1:], last_value[None]], axis=0)
        return jnp.where(tr.truncated, truncation_value[None], following)

    # -- learning ---------------------------------------------------------------------------------
    def loss(self, params, batch: PPOBatch, hparams: dict[str, jax.Array]):
        """Clipped PPO loss of one replica's minibatch -> ``(loss, aux metrics)``."""
        c = self.resolve(hparams)
        out, value = self.forward(params, batch)
        log_prob = self.dist.log_prob(out, batch.action)
        log_ratio = log_prob - batch.log_prob
        ratio = jnp.exp(log_ratio)
        adv = batch.advantage
        policy_loss = -jnp.minimum(
            ratio * adv, jnp.clip(ratio, 1.0 - c.clip_eps, 1.0 + c.clip_eps) * adv
        ).mean()
        value_error = jnp.square(value - batch.returns)
        if c.clip_value_loss:
            clipped = batch.value + jnp.clip(value - batch.value, -c.clip_eps, c.clip_eps)
            value_error = jnp.maximum(value_error, jnp.square(clipped - batch.returns))
        value_loss = 0.5 * value_error.mean()
        entropy = self.dist.entropy(out).mean()
        loss = policy_loss + c.vf_coef * value_loss - c.ent_coef * entropy
        aux = {
            "policy_loss": policy_loss,
            "value_loss": value_loss,
            "entropy": entropy,
            "approx_kl": ((ratio - 1.0) - log_ratio).mean(),
            "clip_fraction": (jnp.abs(ratio - 1.0) > c.clip_eps).mean(),
        }
        return loss, aux

    def forward(self, params, batch: PPOBatch):
        """The network on one replica's minibatch: ``(policy output, value)`` per sample."""
        return self.network.apply(params, batch.obs)

    def sgd_step(self, carry, minibatch: PPOBatch, hparams):
        """One optimizer step on ``minibatch`` leaves ``[R@replica, n, ...]``."""
        params, opt_state, sync = carry
        adv = minibatch.advantage  # statistics over all replicas' samples: two scalars move
        centered = adv - adv.mean()
        std = jnp.sqrt(jnp.square(centered).sum() / adv.size)  # jnp.std's numbers, one mean
        minibatch = minibatch._replace(advantage=centered / (std + 1e-8))
        loss_fn = functools.partial(self.loss, hparams=hparams)
        (loss, aux), grads = self.learner.grads(loss_fn, params, minibatch)
        params, opt_state, sync, sync_metrics = self.learner.step(
            params, opt_state, sync, grads, scale=hparams.get("lr")
        )
        # Per replica [R]: averaged once per update in learn, not by a collective per step.
        metrics = {**aux, "loss": loss, **sync_metrics}
        return (params, opt_state, sync), metrics

    def minibatches(self, key, batch: PPOBatch) -> PPOBatch:
        """One epoch's shuffled minibatches: ``batch`` leaves ``[R@replica, N/R, ...]`` ->
        ``[M, R@replica, N/(R M), ...]``. Each replica shuffles its own rows (samples; recurrent:
        whole sequences); minibatch ``m`` takes a slice of every replica."""
        c, replicas = self.config, self.replicas
        rows = jax.tree.leaves(batch)[0].shape[1]
        permutations = jax.vmap(shuffle.permutation, in_axes=(0, None))(
            jax.random.split(key, replicas), rows
        )

        def to_minibatches(x):
            x = jax.vmap(lambda rows, p: jnp.take(rows, p, axis=0))(x, permutations)
            x = x.reshape(replicas, c.num_minibatches, -1, *x.shape[2:]).swapaxes(0, 1)
            return constrain(x, None, "replica")

        return jax.tree.map(to_minibatches, batch)

    def epoch(self, carry, key, batch: PPOBatch, hparams):
        """``update_epochs``' one pass: SGD over ``minibatches(key, batch)``."""
        step = functools.partial(self.sgd_step, hparams=hparams)
        return jax.lax.scan(step, carry, self.minibatches(key, batch))

    def collect(self, state: PPOState, key: jax.Array):
        """The rollout as the loss sees it -> ``(env, rollout, next_values [T, B@batch],
        state fields to replace)``."""
        env, rollout = self.rollout(state.params, state.env, key, state.obs_stats)
        obs_stats, rollout, last_obs = self.observed_rollout(state.obs_stats, env, rollout)
        next_values = self.next_values(state.params, rollout, last_obs)
        return env, rollout, next_values, {"obs_stats": obs_stats}

    def training_batch(self, state: PPOState, samples: PPOBatch, rollout: Rollout) -> PPOBatch:
        """``[T, B@batch, ...]`` samples -> rows ``[R@replica, B/R * T, ...]``: env-major, a
        replica's own environments, so no sample leaves its data shard."""
        return self.learner.split(env_major(samples))

    def act(self, state: PPOState, params) -> tuple[PPOState, Experience, dict[str, jax.Array]]:
        """The acting half of ``update``: a rollout with ``params`` (the behaviour policy, laid
        out as ``state.params``) from the state's environments, key, ``obs_stats`` and reward
        scaling -> ``(state with those advanced, Experience, rollout metrics)``. Reads no
        optimizer state, so an actor mesh can run it with stale parameters."""
        hp = self.resolve(state.hparams)
        key, rollout_key, epoch_key = jax.random.split(state.key, 3)
        acting = state.replace(params=params)
        env, rollout, next_values, replaced = self.collect(acting, rollout_key)
        tr = rollout.transition
        reward_scaling, reward = self.scaled_rewards(state.reward_scaling, tr, hp.gamma)
        last_obs = self.observe(state.obs_stats, env.obs)
        experience = Experience(rollout, reward, next_values, last_obs, epoch_key)
        metrics = dict(
            truncations=tr.truncated.sum(),
            terminations=tr.terminated.sum(),
            **episode_metrics(env.stats),
        )
        state = state.replace(key=key, env=env, reward_scaling=reward_scaling, **replaced)
        return state, experience, metrics

    def learn(self, state: PPOState, experience: Experience) -> tuple[PPOState, dict]:
        """The learning half of ``update``: GAE on ``experience`` and ``update_epochs`` x
        shuffled minibatches of SGD on the state's parameters and optimizer. With
        ``off_policy="vtrace"`` (the experience may come from older parameters: actor-learner
        layout) values and log-probabilities are recomputed under the state's (pre-update)
        parameters and the advantages and targets are V-trace's (``vtrace_advantages``)."""
        c, hp = self.config, self.resolve(state.hparams)
        rollout, tr = experience.rollout, experience.rollout.transition
        values, next_values, log_rho = rollout.value, experience.next_values, None
        if getattr(c, "off_policy", "none") == "vtrace":
            values, next_values, log_rho = self.recomputed(state.params, experience)
        if log_rho is None:
            advantages, returns = gae(
                experience.reward, values, next_values, tr.terminated, tr.truncated,
                hp.gamma, hp.gae_lambda,
            )  # fmt: skip
        else:
            advantages, returns = vtrace_advantages(
                experience.reward, values, next_values, tr.terminated, tr.truncated, log_rho,
                hp.gamma, hp.gae_lambda,
            )  # fmt: skip
        samples = PPOBatch(tr.obs, rollout.action, rollout.log_prob, values, advantages, returns)
        batch = self.training_batch(state, samples, rollout)
        (params, opt_state, sync), sgd_metrics = jax.lax.scan(
            lambda carry, k: self.epoch(carry, k, batch, state.hparams),
            (state.params, state.opt_state, state.sync),
            jax.random.split(experience.key, c.update_epochs),
        )
        metrics = jax.tree.map(lambda m: jnp.mean(m.astype(jnp.float32)), sgd_metrics)
        metrics.update(
            optimizer_steps=jnp.int32(c.update_epochs * c.num_minibatches),
            syncs=jnp.sum(sgd_metrics["synced"]),
        )
        if log_rho is not None:
            metrics["importance_weight"] = jnp.minimum(1.0, jnp.exp(log_rho)).mean()  # rho
        state = state.replace(update_step=state.update_step + 1)
        return self.with_learner(state, params, opt_state, sync), metrics

    def recomputed(self, params, experience: Experience):
        """Under ``params``: ``(values [T, B], next values [T, B], log pi(a)/mu(a) [T, B])`` of
        the experience's observations and actions (``mu``: its behaviour log-probabilities)."""
        rollout = experience.rollout
        obs = rollout.transition.obs
        outs, values = jax.vmap(self.policy, in_axes=(None, 0))(params, obs)
        log_prob = jax.vmap(self.dist.log_prob)(outs, rollout.action)
        now = rollout.replace(value=values)
        next_values = self.next_values(params, now, experience.last_obs)
        return values, next_values, log_prob - rollout.log_prob

    def update(self, state: PPOState) -> tuple[PPOState, dict[str, jax.Array]]:
        """One PPO iteration: ``act`` (rollout) with the state's own parameters, then ``learn``
        (GAE, ``update_epochs`` x shuffled minibatches)."""
        acted, experience, act_metrics = self.act(state, state.params)
        # learn reads the state from before the rollout (recurrent: its hidden state at the start)
        learned, metrics = self.learn(state, experience)
        state = acted.replace(update_step=learned.update_step)
        state = self.with_learner(state, learned.params, learned.opt_state, learned.sync)
        return state, {**metrics, **act_metrics}

    def placeholder_minibatch(self) -> PPOBatch:
        """Zeros shaped like one minibatch, leaves ``[R@replica, n, ...]``."""
        c, obs_dim = self.config, self.env.spec.obs_dim
        n = c.minibatch_size // self.replicas

        def zeros(*shape):
            return constrain(jnp.zeros((self.replicas, n, *shape), jnp.float32), "replica")

        action = constrain(self.placeholder_actions(self.replicas, n), "replica")
        return PPOBatch(zeros(obs_dim), action, zeros(), zeros(), zeros(), zeros())

    def optimizer_step(self, state: PPOState) -> PPOState:
        minibatch = self.placeholder_minibatch()
        (params, opt_state, sync), _ = self.sgd_step(
            (state.params, state.opt_state, state.sync), minibatch, state.hparams
        )
        return self.with_learner(state, params, opt_state, sync)
