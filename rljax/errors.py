"""One exception type for every invalid user input, raised before anything is compiled."""


class ConfigError(ValueError):
    """Invalid configuration: the message says what was wrong and what is allowed."""
