"""The run directory's lifecycle: checked names, a lock, never destroyed by accident.

    check_run_name(name); check_runs_dir(runs_dir); check_seed(seed)    # ConfigError, no writes
    run_dir = RunDirectory(path, fresh=True, overwrite=False)
    run_dir.open()        # create (or clear, with overwrite) and take <dir>/run.lock
    ...
    run_dir.close(discard=False)    # release the lock; discard: remove what this run created

Rules:

* A fresh run never modifies an existing, non-empty run directory: it stops with a
  ``ConfigError`` suggesting ``--resume <dir>`` or a new ``--run-name``; ``overwrite=True`` is the
  explicit opt-in, and the old contents are removed only after every validation passed and the
  lock is held.
* ``run.lock`` (JSON: pid, host, start time), created with ``O_CREAT | O_EXCL``, makes a second
  run or resume of the same directory fail at once naming the holder. A lock whose pid is no
  longer alive on this host is stale: one ``RunDirWarning`` and it is taken over. A lock from
  another host is never taken over (remove the file by hand if that run is gone).
* ``close(discard=True)`` (an interrupt before the first chunk finished) removes what a fresh
  run wrote (the directory itself when this run created it); a resumed run's directory is never
  touched beyond its lock.

With several processes only process 0 creates the lock (``primary``); the others only read.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import socket
from pathlib import Path

from rljax.errors import ConfigError, warn_from_caller

LOCK_NAME = "run.lock"
MAX_NAME_LENGTH = 128
_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
SEED_LIMIT = 2**32


class RunDirWarning(UserWarning):
    """A stale run lock was taken over."""


def _warn(message: str) -> None:
    warn_from_caller(message, RunDirWarning)


# -- checks before anything is written ------------------------------------------------------------
def check_run_name(name: str) -> None:
    """A run name is one path component of letters, digits, ``.``, ``_`` and ``-``, not starting
    with ``.``, 1 to ``MAX_NAME_LENGTH`` characters."""
    if not isinstance(name, str) or not _NAME.fullmatch(name) or len(name) > MAX_NAME_LENGTH:
        raise ConfigError(
            f"invalid run_name {name!r}: use 1 to {MAX_NAME_LENGTH} letters, digits, '.', '_' "
            "or '-', not starting with '.' (one directory name under runs_dir; put the parent "
            "in --runs-dir)"
        )


def safe_name(name: str) -> str:
    """``name`` with every character a run name may not have replaced by ``-``, bounded."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", name).lstrip(".") or "run"
    return name[-MAX_NAME_LENGTH:].lstrip(".") or "run"


def check_seed(seed) -> None:
    """``jax.random.key`` (jax 0.10) accepts any int64 but keeps only its low 32 bits unless
    ``jax_enable_x64`` is on (so ``2**32`` is the same key as ``0`` and ``-1`` as ``2**32 - 1``),
    and raises ``OverflowError`` beyond int64: seeds are ``0 <= seed < 2**32``."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT:
        raise ConfigError(
            f"seed must be an integer with 0 <= seed < 2**32 (= {SEED_LIMIT}), got {seed!r}: "
            "jax.random.key keeps only the low 32 bits of larger seeds"
        )


def _nearest_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable_dir(path: str | Path, what: str) -> None:
    """``path`` is a directory this process can create entries in, or can be created."""
    path = Path(path)
    existing = _nearest_existing(path)
    if not existing.is_dir():
        where = "" if existing == Path(os.path.abspath(path)) else f" ({existing} is a file)"
        raise ConfigError(f"{what} {str(path)!r} is not a directory{where}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{what} {str(path)!r} is not writable: no write permission on {existing}, or a "
            "read-only filesystem"
        )


# -- the lock -------------------------------------------------------------------------------------
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    except (OverflowError, ValueError):
        return False
    return True


def read_lock(path: Path) -> dict | None:
    """The holder ``{"pid", "host", "started"}`` of a lock file; ``{}`` when unreadable (being
    written, or damaged); ``None`` when there is no lock."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def describe_holder(holder: dict) -> str:
    if not holder:
        return "an unknown process (unreadable lock file)"
    started = f", started {holder['started']}" if holder.get("started") else ""
    return f"pid {holder.get('pid')} on {holder.get('host')}{started}"


class RunLock:
    """``<dir>/run.lock``, created atomically; a stale one (dead pid on this host) is taken
    over with a warning."""

    def __init__(self, directory: Path):
        self.path = Path(directory) / LOCK_NAME
        self.held = False
        self._content = ""

    def acquire(self) -> None:
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._take_over_if_stale()
                continue
            except OSError as error:
                raise ConfigError(f"cannot create {self.path}: {error.strerror or error}") from None
            self._content = json.dumps(
                {
                    "pid": os.getpid(),
                    "host": socket.gethostname(),
                    "started": datetime.datetime.now().isoformat(timespec="seconds"),
                }
            )
            with os.fdopen(fd, "w") as f:
                f.write(self._content + "\n")
            self.held = True
            return
        self._raise_held(read_lock(self.path) or {})

    def live_holder(self) -> dict | None:
        """The holder of the lock unless there is none or it is stale (its pid is not alive on
        this host); ``{}`` for an unreadable lock."""
        holder = read_lock(self.path)
        if holder is None:
            return None
        pid = holder.get("pid")
        stale = (
            holder.get("host") == socket.gethostname()
            and isinstance(pid, int)
            and pid != os.getpid()
            and not _alive(pid)
        )
        return None if stale else holder

    def _take_over_if_stale(self) -> None:
        holder = read_lock(self.path)
        if holder is None:
            return  # released meanwhile: try again
        if self.live_holder() is not None:
            self._raise_held(holder)
        _warn(
            f"taking over the stale lock {self.path} of {describe_holder(holder)} "
            "(no such process: that run ended without releasing it)"
        )
        self.path.unlink(missing_ok=True)

    def _raise_held(self, holder: dict) -> None:
        raise ConfigError(
            f"run directory {str(self.path.parent)!r} is in use by {describe_holder(holder)} "
            f"({self.path}); wait for that run to end, or choose another --run-name. If no run "
            "is using it (e.g. it ran on another host and was killed), remove the lock file"
        )

    def release(self) -> None:
        if not self.held:
            return
        self.held = False
        try:  # only our own lock (a directory removed and reused meanwhile keeps its new lock)
            if self.path.read_text().strip() == self._content:
                self.path.unlink()
        except OSError:
            pass


# -- the directory --------------------------------------------------------------------------------
class RunDirectory:
    """One run's directory: opened (created or cleared, locked) after validation, closed on
    every exit path."""

    def __init__(self, path, *, fresh: bool, overwrite: bool = False, primary: bool = True):
        self.path = Path(path)
        self.fresh = fresh
        self.overwrite = overwrite
        self.primary = primary
        self.lock = RunLock(self.path)
        self.created = False  # this run made the directory (else: it existed, empty or cleared)

    def check(self) -> None:
        """``ConfigError`` if opening would modify an existing run (nothing is written)."""
        if not self.primary:
            return
        holder = self.lock.live_holder() if self.path.is_dir() else None
        if holder is not None:
            self.lock._raise_held(holder)  # a run is using it: never overwritten
        if self.fresh:
            if self.path.exists() and not self.path.is_dir():
                raise ConfigError(f"run directory {str(self.path)!r} exists and is a file")
            if not self.overwrite and self._has_contents():
                raise ConfigError(self._exists_message())
        else:
            if not self.path.is_dir():
                raise ConfigError(f"cannot resume {str(self.path)!r}: not a directory")
            check_writable_dir(self.path, "run directory")

    def _has_contents(self) -> bool:
        return self.path.is_dir() and any(p.name != LOCK_NAME for p in self.path.iterdir())

    def _exists_message(self) -> str:
        return (
            f"run directory {str(self.path)!r} already exists and a fresh run never modifies it: "
            f"continue it with --resume {self.path}, choose a new --run-name, or pass "
            "--overwrite to replace it (train(): RunConfig resume=..., run_name=... or "
            "overwrite=True)"
        )

    def open(self) -> None:
        """Check, create (or clear with ``overwrite``) and lock; process 0 only."""
        self.check()
        if not self.primary:
            return
        if self.fresh:
            try:
                self.path.mkdir(parents=True)
                self.created = True
            except FileExistsError:
                pass
            except OSError as error:
                raise ConfigError(
                    f"cannot create run directory {str(self.path)!r}: {error.strerror or error}"
                ) from None
        self.lock.acquire()
        if self.fresh and self._has_contents():  # written by someone between check and lock
            if not self.overwrite:
                self.lock.release()
                raise ConfigError(self._exists_message())
            self._clear()

    def _clear(self) -> None:
        for entry in self.path.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()

    def close(self, discard: bool = False) -> bool:
        """Release the lock; with ``discard`` a fresh run's files are removed first (the
        directory too when this run created it). True when something was removed."""
        removed = False
        try:
            if discard and self.fresh and self.lock.held:
                if self.created:
                    shutil.rmtree(self.path, ignore_errors=True)
                else:
                    self._clear()
                removed = True
        finally:
            self.lock.release()
        return removed
