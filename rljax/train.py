"""Command line for training.

    python -m rljax.train ppo --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    python -m rljax.train dqn --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    python -m rljax.train ppo --resume runs/<name>             # continue a stopped run
    python -m rljax.launch -n 2 --devices-per-process 2 --cpu -- train ppo --mesh data=2,model=2

Every field of the algorithm config and of ``RunConfig`` is a flag (``--help`` lists them with
their defaults). With ``--resume`` the saved run's configuration is the default and flags may
change only what ``rljax.resume`` allows (total steps, mesh, logging). Invalid values stop with
one ``error:`` line before anything is compiled (exit 2); a run stopped by non-finite values or
with nothing to resume exits 1; SIGINT/SIGTERM save a checkpoint and exit 0.
"""

from __future__ import annotations

import dataclasses
import sys
import types
from typing import Annotated

import tyro

from rljax.algos import ALGORITHMS, DQNConfig, PPOConfig
from rljax.distributed import DistributedConfig, exit_process, initialize
from rljax.errors import ConfigError, TrainingError
from rljax.resume import config_from_dict, read_run_config
from rljax.runner import RunConfig


@dataclasses.dataclass(frozen=True)
class PPOCommand:
    """Train PPO on a discrete-action gymnax environment."""

    algo: Annotated[PPOConfig, tyro.conf.arg(name="")] = PPOConfig()
    run: Annotated[RunConfig, tyro.conf.arg(name="")] = RunConfig()
    distributed: DistributedConfig = DistributedConfig()


@dataclasses.dataclass(frozen=True)
class DQNCommand:
    """Train DQN (Double/dueling/n-step/prioritized switches) on a discrete-action gymnax env."""

    algo: Annotated[DQNConfig, tyro.conf.arg(name="")] = DQNConfig()
    run: Annotated[RunConfig, tyro.conf.arg(name="")] = RunConfig()
    distributed: DistributedConfig = DistributedConfig()


COMMANDS = {"ppo": PPOCommand, "dqn": DQNCommand}


def _resume_defaults(argv: list[str]):
    """With ``--resume DIR``: (command type, defaults from DIR/config.json), else None."""
    if "--resume" not in argv or not argv or argv[0] not in COMMANDS:
        return None
    index = argv.index("--resume")
    if index + 1 >= len(argv):
        return None  # tyro reports the missing value
    run_dir = argv[index + 1]
    saved = read_run_config(run_dir)
    if saved.get("algorithm") != argv[0]:
        raise ConfigError(
            f"cannot resume {run_dir!r} as {argv[0]}: it is a {saved.get('algorithm')} run"
        )
    command = COMMANDS[argv[0]]
    algo_cls = ALGORITHMS[argv[0]].config_type
    run = dataclasses.replace(config_from_dict(RunConfig, saved["run"]), resume=run_dir)
    default = command(algo=config_from_dict(algo_cls, saved["algo"]), run=run)
    return command, default


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        resume = _resume_defaults(argv)
        if resume is None:
            command = tyro.extras.subcommand_cli_from_dict(
                COMMANDS, args=argv, config=(tyro.conf.OmitArgPrefixes,)
            )
        else:
            command_type, default = resume
            command = tyro.cli(
                command_type,
                args=argv[1:],
                default=default,
                prog=f"python -m rljax.train {argv[0]}",
                config=(tyro.conf.OmitArgPrefixes,),
            )
        # Joins a multi-process job when flags or the environment (rljax.launch, SLURM, TPU pod
        # with --distributed.auto) say so; before anything touches JAX.
        initialize(command.distributed)
        from rljax.training import train  # after parsing: --help stays fast

        train(command.algo, command.run)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


class _CallableModule(types.ModuleType):
    """Importing this module sets the attribute ``rljax.train`` to it, shadowing the function
    ``rljax.train`` (= ``rljax.training.train``); calling the module calls that function, so
    ``from rljax import train`` works either way."""

    def __call__(self, *args, **kwargs):
        from rljax.training import train

        return train(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


if __name__ == "__main__":
    # Exits at once on failure: with several processes, JAX's exit barrier would otherwise wait
    # for peers that wait for this process (rljax.distributed.exit_process).
    exit_process(main())
