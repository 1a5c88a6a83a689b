"""Evaluation of the current policy on separate environments, reported apart from training.

``evaluate(algo, params, key, num_envs)`` steps ``num_envs`` fresh environments (their own
``BatchedEnv``, never the training batch) with the algorithm's greedy action (PPO: argmax of the
logits, or a sample with ``greedy=False``; DQN: argmax Q, no exploration; a recurrent policy
carries its hidden state from step to step, reset at each episode end) for as many steps as the
environment's time limit, so every environment finishes its first episode, and returns that
episode's mean return and length, and each episode's return (``eval_episode_returns
[num_envs]``). With per-replica parameters (local/adaptive sync) replica 0 is evaluated. With
``normalize_obs`` the policy sees observations normalised with the state's ``obs_stats``, frozen:
evaluation never updates them. The key decides everything: the same key gives the same numbers.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from rljax.envs import make_env
from rljax.errors import ConfigError
from rljax.run import compile_cache

DEFAULT_EVAL_STEPS = 1000  # for environments without a time limit in their params


def obs_stats_of(state):
    """The state's observation statistics (``normalize_obs``), ``None`` without them."""
    return getattr(state, "obs_stats", None)


class Evaluator:
    """A jittable ``evaluate(params, key, obs_stats=None) -> {"eval_return", "eval_length",
    "eval_finished", "eval_episode_returns" [num_envs]}`` for ``algo``; ``obs_stats``: the
    state's observation statistics (``normalize_obs``), read only: evaluation never updates
    them."""

    def __init__(self, algo, num_envs: int, greedy: bool = True):
        if num_envs < 1:
            raise ConfigError(f"eval_episodes must be >= 1, got {num_envs}")
        self.algo = algo
        self.greedy = greedy
        self.env = make_env(algo.config.env, num_envs)
        self.num_steps = self.env.time_limit or DEFAULT_EVAL_STEPS

    def __call__(self, params, key: jax.Array, obs_stats=None) -> dict[str, jax.Array]:
        params = self.algo.acting_params(params)
        # Only when there are statistics: an algorithm of its own may not take obs_stats.
        stats = {} if obs_stats is None else {"obs_stats": obs_stats}
        reset_key, steps_key = jax.random.split(key)
        batch = self.env.reset(reset_key)
        num_envs = self.env.num_envs
        # A recurrent policy's state, reset to its episode-start value after every episode end.
        fresh = self.algo.eval_memory(num_envs)

        def step(carry, step_key):
            batch, total, length, finished, memory = carry
            act_key, env_key = jax.random.split(step_key)
            if memory is None:
                action = self.algo.eval_action(params, batch.obs, act_key, self.greedy, **stats)
            else:
                action, memory = self.algo.eval_action(
                    params, batch.obs, act_key, self.greedy, **stats, memory=memory
                )
            batch, tr = self.env.step(env_key, batch, action)
            if memory is not None:
                ended = (tr.terminated | tr.truncated).reshape(-1, *[1] * (memory.ndim - 1))
                memory = jnp.where(ended, fresh, memory)
            live = jnp.logical_not(finished)
            total = total + jnp.where(live, tr.reward, 0.0)
            length = length + live.astype(jnp.int32)
            finished = finished | tr.terminated | tr.truncated
            return (batch, total, length, finished, memory), None

        zeros = jnp.zeros(num_envs, jnp.float32)
        carry = (batch, zeros, jnp.zeros(num_envs, jnp.int32), jnp.zeros(num_envs, bool), fresh)
        keys = jax.random.split(steps_key, self.num_steps)
        (_, total, length, finished, _), _ = jax.lax.scan(step, carry, keys)
        return {
            "eval_return": total.mean(),
            "eval_length": length.astype(jnp.float32).mean(),
            "eval_finished": finished.mean(),
            "eval_episode_returns": total,
        }


class Evaluation:
    """Greedy (or, ``greedy=False``, sampled) evaluation of a training run's state between
    chunks, compiled ahead of time; ``rljax eval`` uses it too, so it reproduces the numbers.

    The key of the evaluation after update ``u`` depends only on the run's seed and ``u``;
    with seeds, each seed is evaluated (vmapped) and the numbers averaged over seeds. A call
    returns the row columns ``eval_return`` (mean over seeds and episodes), ``eval_return_ci``
    (half-width of its 95 % t-interval over those episodes), ``eval_length``, ``eval_finished``;
    the episodes' returns of the latest call stay in ``last_returns`` (``[(S,) episodes]``, with
    its update in ``last_update``) for the run's summary."""

    def __init__(self, sharded_run, num_envs: int, seed: int, greedy: bool = True):
        self.sharded = sharded_run
        self.mesh = sharded_run.mesh
        self.num_seeds = sharded_run.num_seeds
        evaluator = Evaluator(sharded_run.algo, num_envs, greedy)
        jit = compile_cache.jit_for(self.mesh)
        self._evaluate = jit(jax.vmap(evaluator) if self.num_seeds > 1 else evaluator)
        self._key = jax.random.fold_in(jax.random.key(seed), 0xE7A1)
        self.last_returns: np.ndarray | None = None
        self.last_update: int | None = None

    def _eval_key(self, update: int):
        from rljax.run.sharded import replicate

        key = jax.random.fold_in(self._key, update)
        if self.num_seeds > 1:
            key = jax.random.split(key, self.num_seeds)
        return replicate(self.mesh, key)

    def compile(self, key: jax.Array) -> float:
        """Compile for the run's parameter layout (no compile inside the timed loop); seconds."""
        t0 = time.perf_counter()
        abstract = self.sharded.abstract_state(key)
        with self.sharded.layout.active():
            self._evaluate = self._evaluate.lower(
                abstract.params, self._eval_key(0), obs_stats_of(abstract)
            ).compile()
        return time.perf_counter() - t0

    def __call__(self, state, update: int) -> dict[str, float]:
        from rljax.run.loop import to_host
        from rljax.run.stats import mean_ci

        with self.sharded.layout.active():
            result = self._evaluate(state.params, self._eval_key(update), obs_stats_of(state))
        self.last_returns = to_host(result.pop("eval_episode_returns"))
        self.last_update = update
        row = {k: float(np.mean(to_host(v))) for k, v in result.items()}
        row["eval_return_ci"] = float(mean_ci(self.last_returns.ravel())[1])
        return row
