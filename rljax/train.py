"""Command line for training.

    python -m rljax.train ppo --env CartPole-v1 --mesh data=2,model=2 --num-devices 4


Every field of the algorithm config and of ``RunConfig`` is a flag (``--help`` lists them with
their defaults). Invalid values stop with one ``error:`` line before anything is compiled.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Annotated

import tyro

from rljax.algos import DQNConfig, PPOConfig
from rljax.errors import ConfigError
from rljax.runner import RunConfig, train


@dataclasses.dataclass(frozen=True)
class PPOCommand:
    """Train PPO on a discrete-action gymnax environment."""

    algo: Annotated[PPOConfig, tyro.conf.arg(name="")] = PPOConfig()
    run: Annotated[RunConfig, tyro.conf.arg(name="")] = RunConfig()


@dataclasses.dataclass(frozen=True)
class DQNCommand:
    """Train DQN (Double/dueling/n-step/prioritized switches) on a discrete-action gymnax env."""

    algo: Annotated[DQNConfig, tyro.conf.arg(name="")] = DQNConfig()
    run: Annotated[RunConfig, tyro.conf.arg(name="")] = RunConfig()


COMMANDS = {"ppo": PPOCommand, "dqn": DQNCommand}


def main(argv: list[str] | None = None) -> int:
    command = tyro.extras.subcommand_cli_from_dict(
        COMMANDS, args=argv, config=(tyro.conf.OmitArgPrefixes,)
    )
    try:
        train(command.algo, command.run)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
