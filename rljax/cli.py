"""The ``rljax`` command (also ``python -m rljax``).

    rljax train ppo --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    rljax train dqn --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    rljax train ppo --resume runs/<name>             # continue a stopped run
    rljax launch -n 2 --devices-per-process 2 --cpu -- train ppo --mesh data=2,model=2

``rljax train <algo>`` has one subcommand per registered algorithm (``rljax.algos.ALGORITHMS``);
every field of the algorithm config and of ``RunConfig`` is a flag under its own name
(``--help`` lists them with their defaults). With ``--resume`` the saved run's configuration is
the default and flags may change only what ``rljax.run.resume`` allows (total steps, mesh,
logging, ...). Integer flags take integer-valued literals (``--total-timesteps 5e5``). Invalid
values, an existing run directory (without ``--overwrite``) or one in use by another run stop
with one ``error:`` line before anything is written or compiled (exit 2); a run stopped by
non-finite values or with nothing to resume exits 1; SIGINT/SIGTERM during training save a
checkpoint and exit 0, before the first chunk they print one line and exit 130/143 (a fresh
run's directory removed). ``rljax launch`` is ``rljax.launch.main``.
"""

from __future__ import annotations

import dataclasses
import decimal
import functools
import sys
import warnings
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


# Integer flags also take integer-valued literals: --total-timesteps 5e5 is 500000.
INTEGERS = tyro.constructors.ConstructorRegistry()


def parse_int(text: str) -> int:
    """``"500000"``, ``"5e5"``, ``"1_000"``, ``"2.0e3"`` -> int; a non-integer value (``"2.5"``)
    or a non-number raises ``ValueError`` (tyro reports it naming the flag)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        value = decimal.Decimal(text.strip())
    except decimal.InvalidOperation:
        value = None
    if value is None or not value.is_finite() or value.adjusted() > 100:
        raise ValueError(f"{text!r} is not an integer")
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not an integer (exact integers like 500000 or 5e5 are)")
    return int(value)


@INTEGERS.primitive_rule
def _integer_rule(info: tyro.constructors.PrimitiveTypeInfo):
    if info.type is not int:
        return None
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1,
        metavar="INT",
        instance_from_str=lambda args: parse_int(args[0]),
        is_instance=lambda x: isinstance(x, int) and not isinstance(x, bool),
        str_from_instance=lambda x: [str(x)],
    )


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


def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """Every warning of a CLI run (stale lock taken over, damaged checkpoint skipped, damaged
    metrics lines dropped, a library's) as one ``warning: <message>`` line, no source lines."""
    print("warning: " + " ".join(str(message).split()), file=sys.stderr)


def train_main(argv: list[str]) -> int:
    """``rljax train ...``: parse, join a multi-process job if asked, train; the exit code."""
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        return _train_main(argv)


def _train_main(argv: list[str]) -> int:
    try:
        resume = _resume_defaults(argv)
        if resume is None:
            commands = {name: command_type(name) for name in registered_names()}
            command = tyro.extras.subcommand_cli_from_dict(
                commands,
                args=argv,
                prog="rljax train",
                config=(tyro.conf.OmitArgPrefixes,),
                registry=INTEGERS,
            )
        else:
            command_cls, default = resume
            command = tyro.cli(
                command_cls,
                args=argv[1:],
                default=default,
                prog=f"rljax train {argv[0]}",
                config=(tyro.conf.OmitArgPrefixes,),
                registry=INTEGERS,
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
    except KeyboardInterrupt as error:  # before the first chunk or after the loop; one line
        print(f"interrupted: {error}" if str(error) else "interrupted", file=sys.stderr)
        return 128 + getattr(error, "signum", 2)
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
