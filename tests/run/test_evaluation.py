"""Greedy evaluation on separate environments."""

import jax
import numpy as np

from rljax import PPO, PPOConfig
from rljax.run.evaluation import Evaluator

TINY = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2)


def test_evaluation_is_deterministic_and_separate_from_training():
    ppo = PPO(TINY)
    state = ppo.init(jax.random.key(0))
    evaluate = jax.jit(Evaluator(ppo, num_envs=4))
    first = evaluate(state.params, jax.random.key(1))
    second = evaluate(state.params, jax.random.key(1))
    assert all(np.array_equal(first[k], second[k]) for k in first)
    assert first["eval_episode_returns"].shape == (4,)  # one return per episode
    assert float(first["eval_return"]) == float(first["eval_episode_returns"].mean())
    assert float(first["eval_finished"]) == 1.0  # every environment ended its episode
    assert 5 <= float(first["eval_return"]) <= 500
