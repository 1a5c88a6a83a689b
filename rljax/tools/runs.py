"""A finished (or running) training run, loaded back from its directory: its configuration from
``config.json`` and a checkpoint's state, placed on any mesh.

    loaded = load_run("runs/ppo-CartPole-v1-...", step=None, mesh="data=1,model=1")
    loaded.algo, loaded.sharded, loaded.state, loaded.step, loaded.run

Nothing in the run directory is written or locked: a run may be loaded while it trains.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from rljax.errors import ConfigError
from rljax.run.config import RunConfig
from rljax.run.resume import config_from_dict, read_run_config
from rljax.run.sharded import config_type_of, registered_names


@dataclasses.dataclass
class LoadedRun:
    run_dir: Path
    algorithm: str  # registered name ("ppo", "dqn", ...)
    algo_config: Any
    run: RunConfig  # the run's configuration, with the mesh it was loaded on
    algo: Any  # the Algorithm, built for the loading mesh's replicas
    sharded: Any  # ShardedRun on the loading mesh
    state: Any  # the checkpoint's state, placed on that mesh
    step: int  # the checkpoint's update
    steps: list[int]  # every checkpoint step in the run


def read_run(run_dir: str | Path, verb: str) -> tuple[str, Any, RunConfig]:
    """``(algorithm, algo config, run config)`` of ``run_dir``; one ``ConfigError`` for a
    missing or damaged directory ("cannot <verb> ...")."""
    saved = read_run_config(run_dir, verb)
    algorithm = saved["algorithm"]
    if algorithm not in registered_names():
        raise ConfigError(
            f"cannot {verb} {str(run_dir)!r}: its algorithm {algorithm!r} is not registered "
            f"(registered: {', '.join(registered_names())})"
        )
    try:
        algo_config = config_from_dict(config_type_of(algorithm), saved["algo"])
        run = RunConfig.from_dict(saved["run"])
    except (ConfigError, TypeError, ValueError) as error:
        raise ConfigError(f"cannot {verb} {str(run_dir)!r}: its config.json: {error}") from None
    return algorithm, algo_config, run


def load_run(
    run_dir: str | Path,
    step: int | None = None,
    mesh: str | None = None,
    num_devices: int | None = None,
    verb: str = "load",
) -> LoadedRun:
    """The run's checkpoint ``step`` (default: the newest valid one) on ``mesh`` (default: one
    device, ``data=1,model=1``; any mesh the devices allow: parameters are resharded on restore,
    per-replica parameters resized). ``ConfigError`` with one line, before compiling, for a
    missing or damaged run directory, no checkpoints, or an unknown ``step``."""
    import jax

    from rljax.run.checkpoint import Checkpointer, CheckpointError
    from rljax.run.resume import restore_step
    from rljax.run.sharded import ShardedRun, prepare

    run_dir = Path(run_dir)
    algorithm, algo_config, run = read_run(run_dir, verb)
    checkpoints = run_dir / "checkpoints"
    if not checkpoints.is_dir():
        raise ConfigError(f"cannot {verb} {str(run_dir)!r}: it has no checkpoints directory")
    staleness = run.parallel.max_staleness if run.parallel.actor_mesh is not None else None
    run = run.replace(
        mesh=mesh or "data=1,model=1", num_devices=num_devices, seed_axis="none", resume=None,
        actor_mesh=None, learner_mesh=None, max_staleness=0,
    )  # fmt: skip
    layout, algo = prepare(algo_config, run)
    sharded = ShardedRun(algo, layout, num_seeds=run.num_seeds, chunk_size=1)
    with Checkpointer(checkpoints, keep=None, async_save=False) as ckpt:
        steps = ckpt.steps()
        if step is None:
            step = ckpt.latest_valid_step()
            if step is None:
                raise ConfigError(f"cannot {verb} {str(run_dir)!r}: no valid checkpoint in it")
        elif step not in steps:
            raise ConfigError(
                f"cannot {verb} {str(run_dir)!r}: no checkpoint step {step}; steps: "
                f"{', '.join(map(str, steps)) or 'none'}"
            )
        try:
            if staleness is None:
                state = restore_step(ckpt, step, sharded)
            else:
                state = _restore_actor_learner(ckpt, step, sharded, staleness)
        except CheckpointError as error:
            raise ConfigError(f"cannot {verb} {str(run_dir)!r}: {error}") from None
    jax.block_until_ready(state)
    return LoadedRun(run_dir, algorithm, algo_config, run, algo, sharded, state, step, steps)


def _restore_actor_learner(ckpt, step: int, sharded, max_staleness: int):
    """An actor-learner checkpoint (``ActorLearnerState``) as the one-mesh state of ``sharded``:
    the learner's parameters and optimizer with the actors' environments, key and normalisers.
    The queued (stale) parameter versions are left behind."""
    import jax

    from rljax.run.actor_learner import ActorLearnerRun

    layout = sharded.layout
    reader = ActorLearnerRun(sharded.algo, layout, layout, max_staleness=max_staleness)
    saved, _ = ckpt.restore(step, reader.abstract_state())
    actors = saved.actor
    state = saved.learner.replace(
        env=actors.env,
        key=actors.key,
        obs_stats=actors.obs_stats,
        reward_scaling=actors.reward_scaling,
    )
    return jax.device_put(state, sharded.state_shardings)
