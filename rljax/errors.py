"""One exception type for every invalid user input, raised before anything is compiled."""

import os
import re


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


class RunWriteError(TrainingError):
    """A file of the run directory could not be written (full disk, I/O error); the message
    names the file and the cause, and what is still intact."""


def describe_os_error(error: BaseException) -> str:
    """The cause of a failed write in one line: ``"No space left on device (errno 28)"`` for the
    first ``OSError`` in ``error``'s chain, else the first line of the message (bounded)."""
    seen, e = set(), error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno is not None:
            return f"{e.strerror or os.strerror(e.errno)} (errno {e.errno})"
        e = e.__cause__ or e.__context__
    text = str(error).strip()
    code = re.search(r"os_error_code='?(\d+)", text)  # tensorstore's (orbax's) I/O errors
    if code:
        number = int(code.group(1))
        return f"{os.strerror(number)} (errno {number})"
    first = text.splitlines()[0] if text else type(error).__name__
    return first if len(first) <= 300 else first[:297] + "..."


_RLJAX_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn_from_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first caller outside rljax, so the warning shows the
    user's line (or none), never rljax's source."""
    import sys
    import warnings

    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_RLJAX_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, category, stacklevel=level)
