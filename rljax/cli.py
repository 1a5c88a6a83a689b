"""The ``rljax`` command (also ``python -m rljax``).

    rljax train ppo --env CartPole-v1 --mesh data=2,model=2 --num-devices 4
    rljax train ppo --preset minatar --lr 1e-3       # a named preset, flags override it
    rljax train ppo --resume runs/<name>             # continue a stopped run
    rljax sweep ppo --lr 1e-4,3e-4 --ent-coef 0,0.01 --seeds 0,1,2
    rljax plan ppo --mesh data=2,model=2 --num-devices 4   # compile only: memory per device
    rljax eval runs/<name> --episodes 64             # a checkpoint evaluated again
    rljax presets                                    # the named presets
    rljax launch -n 2 --devices-per-process 2 --cpu -- train ppo --mesh data=2,model=2

``rljax train <algo>`` has one subcommand per registered algorithm (``rljax.algos.ALGORITHMS``);
every field of the algorithm config, ``RunConfig`` and ``DistributedConfig`` is a flag under its
own name, listed in groups by ``--help`` (``rljax.cli_flags``). With ``--resume`` the saved run's
configuration is the default and flags may change only what ``rljax.run.resume`` allows (total
steps, mesh, logging, ...); with ``--preset`` the preset's values are. Integer flags take
integer-valued literals (``--total-timesteps 5e5``). A flag that does not parse, invalid values,
an existing run directory (without ``--overwrite``) or one in use by another run stop with one
``error:`` line before anything is written or compiled (exit 2); a run stopped by non-finite
values or with nothing to resume exits 1; SIGINT/SIGTERM during training save a checkpoint and
exit 0, before the first chunk they print one line and exit 130/143 (a fresh run's directory
removed). ``rljax sweep`` is ``rljax.run.sweep.sweep_groups``; ``rljax launch`` is
``rljax.launch.main``. ``rljax plan <algo>`` (or ``rljax train <algo> --dry-run``) takes the train
flags, compiles without running and prints ``rljax.run.plan``'s memory plan, writing nothing; a
plan over ``--memory-per-device`` (or the device's own limit) ends with one ``error:`` line naming
the figures and a mesh that would fit (exit 2), as the same check does before a run trains.
"""

from __future__ import annotations

import contextlib
import dataclasses
import decimal
import io
import math
import re
import sys
import warnings
from typing import Literal, get_args, get_origin

import tyro

from rljax import presets
from rljax.algos import ALGORITHMS
from rljax.cli_flags import command_type as command_type  # re-exported
from rljax.cli_flags import dry_run_of, flags_of, from_command, to_command
from rljax.distributed import exit_process, initialize
from rljax.errors import ConfigError, TrainingError
from rljax.run.config import RunConfig
from rljax.run.resume import config_from_dict, read_run_config
from rljax.run.sharded import config_type_of, registered_names

USAGE = """usage: rljax {train,plan,sweep,eval,compare,export,compress,presets,launch} ...

  rljax train {%(algos)s} [flags]    train an algorithm (rljax train ppo --help: every flag)
  rljax plan {%(algos)s} [train flags]   compile only: parameters and memory per device
  rljax sweep {%(algos)s} --lr 1e-4,3e-4 --seeds 0,1 [train flags]   a grid of settings
  rljax eval RUN_DIR [--step N] [--episodes 32]   evaluate a checkpoint again (IQM, CIs)
  rljax compare 'runs/a-*' 'runs/b-*'   IQM, CIs, profiles, curves over seeds and runs
  rljax export RUN_DIR OUT_DIR     a standalone policy (rljax.load_policy, jax.export)
  rljax compress RUN_DIR --int8 --bf16 --prune 0.5 0.9   smaller policies, evaluated
  rljax presets                    the named presets (--preset NAME)
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


def parse_float(text: str) -> float:
    """``"3e-4"`` -> 0.0003; a non-number raises ``ValueError`` naming what is allowed."""
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number (e.g. 0.5 or 3e-4)") from None


@INTEGERS.primitive_rule
def _number_rule(info: tyro.constructors.PrimitiveTypeInfo):
    if info.type is int:
        parse, metavar = parse_int, "INT"
    elif info.type is float:
        parse, metavar = parse_float, "FLOAT"
    else:
        return None
    return tyro.constructors.PrimitiveConstructorSpec(
        nargs=1,
        metavar=metavar,
        instance_from_str=lambda args: parse(args[0]),
        is_instance=lambda x: isinstance(x, info.type) and not isinstance(x, bool),
        str_from_instance=lambda x: [str(x)],
    )


# -- parsing --------------------------------------------------------------------------------------
_BOX = re.compile(r"^[\s│╭╰─┃━]*|[\s│╮╯─┃━]*$")


def one_line(text: str, prog: str) -> str:
    """tyro's boxed error as one line: the first section, and the flag's metavar when tyro
    showed it (what values are allowed)."""
    sections: list[list[str]] = [[]]
    for raw in text.splitlines():
        if raw.lstrip().startswith(("╭", "╰")):
            continue
        if set(raw.strip()) <= set("│─- ") and raw.count("─") + raw.count("-") >= 3:
            sections.append([])
            continue
        line = _BOX.sub("", raw)
        if line:
            sections[-1].append(line)
    sections = [s for s in sections if s]
    if "╭" not in text:  # ASCII boxes (no UTF-8 stdout): the title is a section of its own
        sections = sections[1:]
    if not sections:
        return f"could not parse the flags (see {prog} --help)"
    message = " ".join(sections[0])
    for section in sections[1:]:
        if section[0].startswith("Argument helptext") and len(section) > 1:
            usage = section[1]
            flag = usage.split()[0]
            if flag in message and usage not in message:
                message = f"{message} (allowed: {usage})"
        elif section[0].startswith(("Perhaps you meant", "Similar")) and len(section) > 1:
            message += f"; perhaps you meant {section[1].split()[0]}"
    message = message.replace("Error parsing ", "").rstrip(".")
    message = message[:1].lower() + message[1:]
    if message.startswith("unrecognized options"):
        message += f" (see {prog} --help)"
    return message


SWEEP_HELP = (
    "Sweep {algo}: the train flags, where a comma list (--lr 1e-4,3e-4, --num-envs 4,8) sweeps "
    "an algorithm flag: sweepable floats ({floats}) as vmapped members of one compiled program, "
    "other flags as separate compiled groups run one after another; --seeds 0,1,2 (default 0) "
    "gives each setting's seeds. Writes results.md and results.json in the sweep directory."
)


PLAN_HELP = (
    "Plan {algo}: the train flags; compiles the run without running it and prints the parameter "
    "count and the bytes per device of parameters, optimizer state, gradients and temporaries "
    "(XLA's memory analysis), the largest array and the budget (--memory-per-device, or the "
    "device's own limit). Writes nothing; exit 2 when the run would not fit."
)


def parse(algorithm: str, args: list[str], default, command: str = "train") -> object:
    """tyro's parse of ``rljax train <algorithm>`` flags; a parse error raises ``ConfigError``
    with one line (--help prints and exits 0 as usual)."""
    prog = f"rljax {command} {algorithm}"
    description = None
    if command == "sweep":
        floats = ", ".join(ALGORITHMS[algorithm].sweepable())
        description = SWEEP_HELP.format(algo=algorithm, floats=floats)
    elif command == "plan":
        description = PLAN_HELP.format(algo=algorithm)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(
                command_type(algorithm),
                args=args,
                default=default,
                prog=prog,
                description=description,
                config=(tyro.conf.OmitArgPrefixes,),
                registry=INTEGERS,
            )
    except SystemExit as exit_:
        if not exit_.code:
            raise
        raise ConfigError(one_line(captured.getvalue(), prog)) from None


def _flag_value(argv: list[str], flag: str) -> str | None:
    """The value given to ``flag`` (``--flag V`` or ``--flag=V``; the last one wins)."""
    value = None
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


# Flags renamed since they were first released: old -> (new, what the new one sets).
RENAMED_FLAGS = {
    "--num-cpu-devices": ("--num-devices", "CPU devices emulated in each process"),
    "--gru-width": ("--recurrent-width", "the width of either recurrent cell, GRU or LSTM"),
}


def _check_algorithm(argv: list[str], command: str) -> str:
    names = registered_names()
    if not argv or argv[0] in ("-h", "--help"):
        raise ConfigError(f"rljax {command} needs an algorithm: {', '.join(names)}")
    if argv[0] not in names:
        raise ConfigError(f"unknown algorithm {argv[0]!r}; expected one of {', '.join(names)}")
    for old, (new, what) in RENAMED_FLAGS.items():
        if old in argv or any(a.startswith(f"{old}=") for a in argv):
            raise ConfigError(f"{old} is now {new} ({what})")
    return argv[0]


def defaults(algorithm: str, argv: list[str]):
    """The command's defaults: a saved run's configuration (``--resume DIR``), a preset's
    (``--preset NAME``) or the configs' own."""
    run_dir, preset = _flag_value(argv, "--resume"), _flag_value(argv, "--preset")
    if run_dir is not None and preset is not None:
        raise ConfigError("--preset cannot be combined with --resume (the run keeps its settings)")
    if run_dir is not None:
        saved = read_run_config(run_dir)
        if saved.get("algorithm") != algorithm:
            raise ConfigError(
                f"cannot resume {run_dir!r} as {algorithm}: it is a {saved.get('algorithm')} run"
            )
        run = RunConfig.from_dict(saved["run"]).replace(resume=run_dir)
        algo = config_from_dict(config_type_of(algorithm), saved["algo"])
        return to_command(algorithm, algo, run)
    algo = config_type_of(algorithm)()
    if preset is not None:
        algo = dataclasses.replace(algo, **presets.get_preset(preset, algorithm).algo)
    return to_command(algorithm, algo, RunConfig(), preset=preset)


def parse_train(argv: list[str], command: str = "train"):
    """``rljax train <algo> [flags]`` -> (algorithm, algo config, RunConfig, DistributedConfig)."""
    algorithm, *configs, _ = parse_command(argv, command)
    return (algorithm, *configs)


def parse_command(argv: list[str], command: str = "train"):
    """``parse_train``'s tuple and whether ``--dry-run`` was given."""
    algorithm = _check_algorithm(argv, command)
    parsed = parse(algorithm, argv[1:], defaults(algorithm, argv[1:]), command)
    return (algorithm, *from_command(algorithm, parsed), dry_run_of(parsed))


# -- commands -------------------------------------------------------------------------------------
def _one_line_warning(message, category, filename, lineno, file=None, line=None):
    """Every warning of a CLI run (stale lock taken over, damaged checkpoint skipped, damaged
    metrics lines dropped, a library's) as one ``warning: <message>`` line, no source lines."""
    print("warning: " + " ".join(str(message).split()), file=sys.stderr)


def _guarded(body) -> int:
    """Run ``body()`` with one-line warnings and errors; the exit code."""
    with warnings.catch_warnings():
        warnings.showwarning = _one_line_warning
        try:
            body()
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


def train_main(argv: list[str], command: str = "train") -> int:
    """``rljax train ...``: parse, join a multi-process job if asked, train (``rljax plan`` or
    ``--dry-run``: print the memory plan instead); the exit code."""

    def body():
        _, algo, run, distributed, dry_run = parse_command(argv, command)
        # Joins a multi-process job when flags or the environment (rljax launch, SLURM, TPU pod
        # with --auto) say so; before anything touches JAX.
        initialize(distributed)
        if dry_run or command == "plan":
            from rljax.run.plan import plan

            result = plan(algo, run)
            print(result.table())
            result.check()
            return
        from rljax.run.training import train  # after parsing: --help stays fast

        train(algo, run)

    return _guarded(body)


def plan_main(argv: list[str]) -> int:
    """``rljax plan <algo> [train flags]``: the memory plan, nothing trained or written."""
    return train_main(argv, "plan")


def _is_listable(kind) -> bool:
    return kind in (int, float, str) or get_origin(kind) is Literal


def _split_lists(algorithm: str, argv: list[str]):
    """``argv`` with comma lists of scalar algorithm flags cut out -> (argv with each list's
    first value, {field: [values]}), and the ``--seeds`` list."""
    flags = {f"--{f.name.replace('_', '-')}": f for f in flags_of(algorithm)}
    out, lists, seeds = [], {}, [0]
    i = 0
    while i < len(argv):
        arg, value, used = argv[i], argv[i + 1] if i + 1 < len(argv) else None, 2
        if arg.startswith("--") and "=" in arg:
            (arg, value), used = arg.split("=", 1), 1
        if arg in ("--seed", "--num-seeds"):
            raise ConfigError(f"rljax sweep takes --seeds 0,1,2 (a list), not {arg}")
        if arg == "--seeds" and value is not None:
            seeds = _values(arg, value, int)
        elif arg in flags and value is not None and "," in value and arg != "--mesh":
            flag = flags[arg]
            if flag.path[0] != "algo" or not _is_listable(flag.type):
                raise ConfigError(
                    f"{arg} cannot take a list in a sweep; lists are for the algorithm's "
                    "number, string and choice flags"
                )
            lists[flag.name] = _values(arg, value, flag.type)
            out += [arg, value.split(",")[0]]
        else:  # passed on to tyro token by token (boolean flags take no value)
            out.append(argv[i])
            used = 1
        i += used
    return out, lists, seeds


def _values(flag: str, text: str, kind) -> list:
    values = []
    for item in text.split(","):
        try:
            if get_origin(kind) is Literal:
                if item not in get_args(kind):
                    raise ValueError(f"{item!r} is not one of {', '.join(get_args(kind))}")
                values.append(item)
            elif kind is float:
                values.append(parse_float(item))
                if not math.isfinite(values[-1]):
                    raise ValueError(f"{item!r} is not finite")
            elif kind is int:
                values.append(parse_int(item))
            else:
                values.append(item)
        except ValueError as error:
            raise ConfigError(f"{flag}: {error} (a comma list, e.g. {flag} 1,2)") from None
    if len(set(values)) != len(values):
        raise ConfigError(f"{flag}: {text!r} repeats a value")
    return values


def sweep_main(argv: list[str]) -> int:
    """``rljax sweep <algo> [train flags, some as comma lists] [--seeds 0,1,2]``."""

    def body():
        algorithm = _check_algorithm(argv, "sweep")
        rest, lists, seeds = _split_lists(algorithm, argv[1:])
        if _flag_value(rest, "--resume") is not None:
            raise ConfigError("rljax sweep cannot --resume; start the sweep again")
        _, algo, run, distributed, dry_run = parse_command([algorithm, *rest], "sweep")
        if dry_run:
            raise ConfigError("rljax sweep has no --dry-run; plan one setting with rljax plan")
        if run.parallel.actor_mesh is not None or run.parallel.learner_mesh is not None:
            raise ConfigError(
                "rljax sweep runs on one mesh; the actor-learner layout (--actor-mesh/"
                "--learner-mesh) trains one setting and seed per run (rljax train)"
            )
        initialize(distributed)
        from rljax.run.sweep import sweep_groups

        sweep_groups(algo, lists, seeds, run)

    return _guarded(body)


def parse_tool(args_type, argv: list[str], prog: str):
    """tyro's parse of a tool command's dataclass (``rljax eval``, ...); one-line errors."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            return tyro.cli(args_type, args=argv, prog=prog, registry=INTEGERS)
    except SystemExit as exit_:
        if not exit_.code:
            raise
        raise ConfigError(one_line(captured.getvalue(), prog)) from None


def eval_main(argv: list[str]) -> int:
    """``rljax eval RUN_DIR [flags]`` (``rljax.tools.evaluate``)."""
    from rljax.tools.evaluate import EvalArgs, evaluate_run

    return _guarded(lambda: evaluate_run(parse_tool(EvalArgs, argv, "rljax eval")))


def export_main(argv: list[str]) -> int:
    """``rljax export RUN_DIR OUT_DIR [flags]`` (``rljax.tools.export``)."""
    from rljax.tools.export import ExportArgs, export_run

    return _guarded(lambda: export_run(parse_tool(ExportArgs, argv, "rljax export")))


def compress_main(argv: list[str]) -> int:
    """``rljax compress RUN_DIR --int8 --bf16 --prune 0.5 0.9`` (``rljax.tools.compress``)."""
    from rljax.tools.compress import CompressArgs, compress_run

    return _guarded(lambda: compress_run(parse_tool(CompressArgs, argv, "rljax compress")))


def compare_main(argv: list[str]) -> int:
    """``rljax compare 'runs/a-*' 'runs/b-*'`` (``rljax.tools.compare``)."""
    from rljax.tools.compare import CompareArgs, compare

    return _guarded(lambda: compare(parse_tool(CompareArgs, argv, "rljax compare")))


def presets_main(argv: list[str]) -> int:
    print("presets (rljax train <algo> --preset NAME; flags given after override them):")
    print(presets.describe())
    return 0


def main(argv: list[str] | None = None) -> int:
    """``rljax train|sweep|presets|launch ...``. With ``argv`` the exit code is returned;
    without (the console script, ``python -m rljax``) the process exits with it, at once after a
    failure in a multi-process job (``rljax.distributed.exit_process``)."""
    if argv is None:
        exit_process(main(sys.argv[1:]))
    argv = list(argv)
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    commands = {"train": train_main, "plan": plan_main, "sweep": sweep_main}
    commands.update(
        presets=presets_main,
        eval=eval_main,
        export=export_main,
        compress=compress_main,
        compare=compare_main,
    )
    usage = USAGE % {"algos": ",".join(registered_names())}
    if command in ("train", "plan", "sweep") and (not rest or rest[0] in ("-h", "--help")):
        print(usage, end="")
        return 0 if rest else 2
    if command in commands:
        return commands[command](rest)
    if command == "launch":
        from rljax.launch import main as launch_main

        return launch_main(rest)
    if command in ("-h", "--help"):
        print(usage, end="")
        return 0
    what = f"unknown command {command!r}" if command else "no command given"
    expected = "train, plan, sweep, eval, compare, export, compress, presets or launch"
    print(f"{usage}error: {what}; expected {expected}", file=sys.stderr)
    return 2
