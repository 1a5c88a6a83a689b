"""The ``rljax`` command (also ``python -m rljax``).

    rljax train ppo --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    rljax train dqn --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    rljax train ppo --resume runs/<name>             # continue a stopped run
    rljax launch -n 2 --devices-per-process 2 --cpu -- train ppo --mesh data=2,model=2

``rljax train <algo>`` has one subcommand per registered algorithm (``rljax.algos.ALGORITHMS``);
every field of the algorithm config and of ``RunConfig`` is a flag under its own name
(``--help`` lists them with their defaults). With ``--resume`` the saved run's configuration is
the default and flags may change only what ``rljax.run.resume`` allows (total steps, mesh,
logging, ...). Invalid values stop with one ``error:`` line before anything is compiled (exit 2);
a run stopped by non-finite values or with nothing to resume exits 1; SIGINT/SIGTERM save a
checkpoint and exit 0. ``rljax launch`` is ``rljax.launch.main``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Annotated

import tyro

from rljax.distributed import DistributedConfig, exit_process, initialize
from rljax.errors import ConfigError, TrainingError
from rljax.run.config import RunConfig
from rljax.run.resume import config_from_dict, read_run_config
from rljax.run.sharded import config_type_of, registered_names

USAGE = """usage: rljax {train,launch} ...

  rljax train {%s} [flags]    train an algorithm (rljax train ppo --help: every flag)
  rljax launch -n N [options] -- train ...   run N cooperating processes on this machine
"""


@functools.cache
def command_type(name: str) -> type:
    """``rljax train <name>``'s flags: the algorithm config, ``RunConfig`` and distributed
    settings, all flat."""
    config_type = config_type_of(name)
    flat = tyro.conf.arg(name="")
    cls = dataclasses.make_dataclass(
        f"{name.capitalize()}Command",
        [
            ("algo", Annotated[config_type, flat], dataclasses.field(default=config_type())),
            ("run", Annotated[RunConfig, flat], dataclasses.field(default=RunConfig())),
            ("distributed", DistributedConfig, dataclasses.field(default=DistributedConfig())),
        ],
        frozen=True,
    )
    summary = (config_type.__doc__ or "").strip().splitlines()
    cls.__doc__ = f"Train {name}" + (f": {summary[0]}" if summary else ".")
    return cls


def _resume_defaults(argv: list[str]):
    """With ``--resume DIR``: (command type, defaults from DIR/config.json), else None."""
    if "--resume" not in argv or not argv or argv[0] not in registered_names():
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
    command = command_type(argv[0])
    run = RunConfig.from_dict(saved["run"]).replace(resume=run_dir)
    algo = config_from_dict(config_type_of(argv[0]), saved["algo"])
    return command, command(algo=algo, run=run)


def train_main(argv: list[str]) -> int:
    """``rljax train ...``: parse, join a multi-process job if asked, train; the exit code."""
    try:
        resume = _resume_defaults(argv)
        if resume is None:
            commands = {name: command_type(name) for name in registered_names()}
            command = tyro.extras.subcommand_cli_from_dict(
                commands, args=argv, prog="rljax train", config=(tyro.conf.OmitArgPrefixes,)
            )
        else:
            command_cls, default = resume
            command = tyro.cli(
                command_cls,
                args=argv[1:],
                default=default,
                prog=f"rljax train {argv[0]}",
                config=(tyro.conf.OmitArgPrefixes,),
            )
        # Joins a multi-process job when flags or the environment (rljax launch, SLURM, TPU pod
        # with --auto) say so; before anything touches JAX.
        initialize(command.distributed)
        from rljax.run.training import train  # after parsing: --help stays fast

        train(command.algo, command.run)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except TrainingError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    """``rljax train ...`` / ``rljax launch ...``. With ``argv`` the exit code is returned;
    without (the console script, ``python -m rljax``) the process exits with it, at once after a
    failure in a multi-process job (``rljax.distributed.exit_process``)."""
    if argv is None:
        exit_process(main(sys.argv[1:]))
    argv = list(argv)
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    if command == "train":
        return train_main(rest)
    if command == "launch":
        from rljax.launch import main as launch_main

        return launch_main(rest)
    usage = USAGE % ",".join(registered_names())
    if command in ("-h", "--help"):
        print(usage, end="")
        return 0
    what = f"unknown command {command!r}" if command else "no command given"
    print(f"{usage}error: {what}; expected train or launch", file=sys.stderr)
    return 2
