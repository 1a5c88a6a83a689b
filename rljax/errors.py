"""One exception type for every invalid user input, raised before anything is compiled."""


class ConfigError(ValueError):
    """Invalid configuration: the message says what was wrong and what is allowed."""


class TrainingError(RuntimeError):
    """Training stopped (e.g. a non-finite loss); the message names the update and the quantity,
    and where the last good checkpoint is."""
