"""What actor-critic algorithms (PPO, A2C) share: the network from the config, acting through
the learner, the rollout, and GAE. Shapes: ``T = num_steps``, ``B = num_envs``, ``D`` the
flattened observation, ``A`` the number of actions (or action dimensions, continuous)."""

from __future__ import annotations

import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from flax import struct

from rljax.algos import normalize
from rljax.algos.base import Algorithm
from rljax.algos.normalize import RewardScaling, RunningStats
from rljax.envs import EnvBatch, Transition, is_continuous
from rljax.errors import ConfigError
from rljax.networks import distributions, zoo
from rljax.parallel.rules import constrain


@struct.dataclass
class ActorCriticState:
    """The training state of PPO and A2C (``PPOState``, ``A2CState``). ``params``/``opt_state``
    are ``[R@replica, ...]`` per replica for local/adaptive sync."""

    params: Any
    opt_state: Any
    sync: dict[str, Any]  # gradient-sync state (residuals, queues, counters)
    env: EnvBatch
    key: jax.Array
    update_step: jax.Array  # int32 scalar: updates done
    hparams: dict[str, jax.Array]  # swept fields as float32 scalars (empty unless sweeping)
    obs_stats: RunningStats | None = None  # normalize_obs: running statistics [D], replicated
    reward_scaling: RewardScaling | None = None  # normalize_rewards: returns [B@batch], stats [1]
    hidden: jax.Array | None = None  # recurrent PPO: [B@batch, H], the next step's hidden state


class Rollout(struct.PyTreeNode):
    """A rollout, every leaf ``[T, B@batch, ...]``."""

    transition: Transition
    action: jax.Array  # [T, B] int32, or [T, B, A] the raw (unclipped, unsquashed) sample
    log_prob: jax.Array  # [T, B] of ``action``
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


def vtrace_advantages(
    rewards: jax.Array,
    values: jax.Array,
    next_values: jax.Array,
    terminated: jax.Array,
    truncated: jax.Array,
    log_rho: jax.Array,
    gamma: float,
    gae_lambda: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
) -> tuple[jax.Array, jax.Array]:
    """GAE with V-trace's truncated importance weights, ``[T, B]`` inputs -> ``(advantages,
    returns)``; ``log_rho = log pi(a|x) - log mu(a|x)`` (target vs behaviour policy).

    ``rho = min(rho_bar, e^log_rho)`` weighs each TD error, ``c = lambda min(c_bar, e^log_rho)``
    each trace step: ``A_t = rho_t delta_t + gamma (1 - end_t) c_t A_{t+1}``; ``returns = A + V``
    are V-trace's targets (Espeholt et al. 2018, with lambda in the traces). With all ratios 1
    this is exactly ``gae``. Episode ends cut the trace as there."""
    ratio = jnp.exp(log_rho)
    rho = jnp.minimum(rho_bar, ratio)
    c = gae_lambda * jnp.minimum(c_bar, ratio)
    ended = jnp.logical_or(terminated, truncated).astype(jnp.float32)
    bootstrap = 1.0 - terminated.astype(jnp.float32)
    deltas = rho * (rewards + gamma * bootstrap * next_values - values)

    def backward(next_advantage, xs):
        delta, end, trace = xs
        advantage = delta + gamma * trace * (1.0 - end) * next_advantage
        return advantage, advantage

    _, advantages = jax.lax.scan(
        backward, jnp.zeros_like(deltas[0]), (deltas, ended, c), reverse=True, unroll=16
    )
    return advantages, advantages + values


def env_major(samples):
    """``[T, B@batch, ...]`` leaves -> ``[B*T, ...]``, each environment's steps together, so that
    ``learner.split`` gives every replica the steps of its own environments."""
    return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape(-1, *x.shape[2:]), samples)


class ActorCriticAlgorithm(Algorithm):
    """An ``Algorithm`` acting with ``ActorCritic`` (config fields ``actor_widths``,
    ``critic_widths``, ``activation``, optionally ``torso_widths``) or, with
    ``network="residual"``, ``ResidualActorCritic`` (``residual_width/depth/expansion``), and a
    policy distribution chosen from the environment's action space (``dist``): categorical, or a
    diagonal Gaussian (``config.squash``). Both have ``__call__`` and ``value`` and take
    ``compute_dtype``."""

    @staticmethod
    def check_policy(config) -> None:
        """``squash`` is known, and ``tanh`` only for a continuous environment."""
        squash = getattr(config, "squash", "none")
        if squash not in distributions.SQUASHES:
            raise ConfigError(
                f"squash must be one of {list(distributions.SQUASHES)}, got {squash!r}"
            )
        if squash != "none" and not is_continuous(config.env):
            raise ConfigError(
                f"squash={squash!r} applies to continuous action spaces, and {config.env} has a "
                "discrete one; use squash='none'"
            )

    def build_network(self):
        return zoo.actor_critic(self.config, self.env.spec)

    @functools.cached_property
    def dist(self) -> distributions.Categorical | distributions.DiagGaussian:
        """The policy distribution of the environment's action space."""
        return distributions.for_spec(self.env.spec, getattr(self.config, "squash", "none"))

    # -- acting -----------------------------------------------------------------------------------
    def policy(self, params, obs: jax.Array):
        """``obs: [B@batch, D]`` -> ``(policy output, value [B@batch])``: ``logits [B@batch, A]``
        or, continuous, ``(mean, log_std) [B@batch, A]``."""
        return self.learner.apply(self.network.apply, params, obs)

    def value(self, params, obs: jax.Array) -> jax.Array:
        apply = lambda p, o: self.network.apply(p, o, method="value")  # noqa: E731
        return self.learner.apply(apply, params, obs)

    def eval_action(self, params, obs, key, greedy: bool = True, obs_stats=None) -> jax.Array:
        """One replica's parameters: the mode (argmax of the logits; the Gaussian's mean), or a
        sample, as the environment receives it (continuous: clipped or squashed to the bounds)."""
        out, _ = self.network.apply(params, self.observe(obs_stats, obs))
        action = self.dist.mode(out) if greedy else self.dist.sample(key, out)
        return self.dist.env_action(action)

    def rollout(
        self, params, env: EnvBatch, key: jax.Array, obs_stats=None
    ) -> tuple[EnvBatch, Rollout]:
        """``num_steps`` batched steps -> the new ``EnvBatch`` and a ``Rollout`` ``[T, B]`` of raw
        observations. The policy sees them through ``observe(obs_stats, .)``: ``obs_stats`` is
        frozen for the whole rollout."""

        def step(env, randomness):
            noise, env_keys = randomness
            out, value = self.policy(params, self.observe(obs_stats, env.obs))
            action = self.dist.sample_with(noise, out)
            log_prob = self.dist.log_prob(out, action)  # the raw sample's, never the clipped one
            env, transition = self.env.step(env_keys, env, self.dist.env_action(action))
            return env, Rollout(transition, action, log_prob, value)

        return jax.lax.scan(step, env, self.rollout_randomness(key))

    def rollout_randomness(self, key: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A rollout's random numbers, drawn before it in two calls: the policy's sampling
        noise ``[T, B@batch, A]`` (``dist.noise``) and the environments' keys ``[T, B@batch]``.

        Drawing per step costs one rolled loop per draw on CPU, about half a PPO rollout's
        time at PureJaxRL's settings; the samples follow the same distributions either way."""
        c = self.config
        act_key, env_key = jax.random.split(key)
        noise = constrain(self.dist.noise(act_key, (c.num_steps, c.num_envs)), None, "batch")
        return noise, self.env.step_keys(env_key, c.num_steps)

    def init_reward_scaling(self) -> RewardScaling | None:
        """The state's ``reward_scaling`` with ``normalize_rewards`` (its per-environment returns
        boxed along ``batch``, like the environments), else ``None``."""
        if not getattr(self.config, "normalize_rewards", False):
            return None
        scaling = normalize.init_reward_scaling(self.config.num_envs)
        return scaling.replace(returns=nn.LogicallyPartitioned(scaling.returns, names=("batch",)))

    def scaled_rewards(self, scaling, transition: Transition, gamma):
        """``(scaling, rewards [T, B@batch])`` to learn from: the rollout's rewards divided by the
        running standard deviation of the discounted return (``normalize.scale_rewards``), or
        as they are without ``normalize_rewards``. Call it outside any per-replica ``vmap``."""
        if scaling is None:
            return None, transition.reward
        done = transition.terminated | transition.truncated
        return normalize.scale_rewards(scaling, transition.reward, done, gamma)

    def placeholder_actions(self, *lead: int) -> jax.Array:
        """Zero actions ``[*lead]`` int32 or ``[*lead, A]`` float32 (for ``optimizer_step``)."""
        return jnp.zeros((*lead, *self.dist.action_shape), self.dist.action_dtype)

    def observed_rollout(
        self, obs_stats, env: EnvBatch, rollout: Rollout
    ) -> tuple[Any, Rollout, jax.Array]:
        """After ``rollout(..., obs_stats)``: ``(obs_stats merged with the rollout's observations,
        the rollout and the batch's last observation [B@batch, D] as the network saw them)``.

        The update learns from observations normalised with the ``obs_stats`` the rollout acted
        with, not the merged ones: the loss then sees exactly the inputs behind the behaviour
        log-probabilities and values (PPO's first ratio is 1), and the new data shapes the
        normalisation from the next rollout on. Without ``normalize_obs`` nothing changes."""
        if obs_stats is None:
            return None, rollout, env.obs
        tr = rollout.transition
        observed = tr._replace(
            obs=self.observe(obs_stats, tr.obs), final_obs=self.observe(obs_stats, tr.final_obs)
        )
        return (
            self.update_obs_stats(obs_stats, tr.obs),
            rollout.replace(transition=observed),
            self.observe(obs_stats, env.obs),
        )
