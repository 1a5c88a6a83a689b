"""One episode of a loaded run's policy drawn to a GIF with gymnax's visualiser.

gymnax draws the classic-control environments through Gymnasium's renderer (needs ``pygame``)
and the MinAtar ones with matplotlib (needs ``seaborn``): ``pip install 'rljax[render]'``.
"""

from __future__ import annotations

import importlib.util

from rljax.errors import ConfigError

CLASSIC = ("Acrobot-v1", "CartPole-v1", "Pendulum-v1", "MountainCar-v0", "MountainCarContinuous-v0")
MINATAR = ("Asterix-MinAtar", "Breakout-MinAtar", "Freeway-MinAtar", "SpaceInvaders-MinAtar")
OTHER = ("Catch-bsuite", "Pong-misc", "PointRobot-misc", "MetaMaze-misc", "FourRooms-misc")
RENDERABLE = CLASSIC + MINATAR + OTHER


def check_renderable(env: str) -> None:
    """One ``ConfigError`` when gymnax cannot draw ``env`` or a package it needs is missing."""
    if env not in RENDERABLE:
        raise ConfigError(
            f"rendering {env} is not supported: gymnax's visualiser draws {', '.join(RENDERABLE)}"
        )
    needs = ["pygame"] if env in CLASSIC else ["seaborn"] if env in MINATAR else []
    missing = [m for m in needs if importlib.util.find_spec(m) is None]
    if missing:
        raise ConfigError(
            f"rendering {env} needs {', '.join(missing)}, which is not installed: "
            "pip install 'rljax[render]'"
        )


def render_episode(loaded, path: str, seed: int, max_steps: int = 500) -> dict:
    """Play one greedy episode of seed 0's policy on one environment (at most ``max_steps``)
    and write it to ``path``; ``{"path", "frames", "return"}``."""
    import os

    # Gymnasium's renderer starts pygame: no sound card, no display needed.
    os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    import gymnax
    import jax
    import numpy as np
    from gymnax.visualize import Visualizer

    from rljax.run.evaluation import obs_stats_of

    algo, state = loaded.algo, loaded.state
    if loaded.run.num_seeds > 1:
        state = jax.tree.map(lambda x: x[0], state)
    params = algo.acting_params(state.params)
    stats = obs_stats_of(state)
    env, env_params = gymnax.make(loaded.algo_config.env)
    key = jax.random.fold_in(jax.random.key(seed), 0x7E4D)
    memory = algo.eval_memory(1)  # a recurrent policy carries its hidden state

    @jax.jit
    def act(p, o, k, s, memory):
        if memory is None:
            return algo.eval_action(p, o.reshape(1, -1), k, True, **s)[0], None
        action, memory = algo.eval_action(p, o.reshape(1, -1), k, True, **s, memory=memory)
        return action[0], memory

    step = jax.jit(env.step)
    key, reset_key = jax.random.split(key)
    obs, env_state = env.reset(reset_key, env_params)
    states, rewards, total = [env_state], [], 0.0
    for _ in range(max_steps):
        key, act_key, step_key = jax.random.split(key, 3)
        extra = {} if stats is None else {"obs_stats": stats}
        action, memory = act(params, obs, act_key, extra, memory)
        obs, next_state, reward, terminated, truncated, _ = step(
            step_key, env_state, action, env_params
        )
        total += float(reward)
        rewards.append(total)
        if bool(terminated) or bool(truncated):
            break
        env_state = next_state
        states.append(env_state)
    Visualizer(env, env_params, states, np.asarray(rewards[: len(states)])).animate(path)
    return {"path": str(path), "frames": len(states), "return": total}
