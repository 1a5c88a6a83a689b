"""One exception type for every invalid user input, raised before anything is compiled."""


class ConfigError(ValueError):
    """Invalid configuration: the message says what was wrong and what is allowed."""


class TrainingError(RuntimeError):
    """Training stopped (e.g. a non-finite loss); the message names the update and the quantity,
    and where the last good checkpoint is."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM outside the training loop (compiling, restoring, plotting); the message
    says what happened to the run directory. ``signum``: the signal."""

    def __init__(self, message: str = "", signum: int = 2):
        super().__init__(message)
        self.signum = signum
