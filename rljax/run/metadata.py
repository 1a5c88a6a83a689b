"""What a run records about itself besides arrays: package versions, provenance (command line,
start time, rljax version, git commit), and a readable diff of two saved metadata dicts."""

from __future__ import annotations

import datetime
import functools
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Iterable

_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "gymnax", "rljax")


def package_versions() -> dict[str, str | None]:
    """Versions of the packages a resumed run should match, plus ``python`` (None: missing)."""
    versions: dict[str, str | None] = {}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["python"] = platform.python_version()
    return versions


def rljax_version() -> str | None:
    """The installed rljax's version (None when it runs from a source tree without metadata)."""
    try:
        return importlib.metadata.version("rljax")
    except importlib.metadata.PackageNotFoundError:
        return None


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the checkout rljax's source is tracked in; None when it is not
    in one (an installed wheel), git is missing or slow (2 s), or anything else fails."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", _PACKAGE_DIR, *args],
            capture_output=True, text=True, timeout=2, check=False,
        )  # fmt: skip

    try:
        tracked = git("ls-files", "--error-unmatch", "__init__.py")  # not a venv inside a repo
        if tracked.returncode != 0:
            return None
        head = git("rev-parse", "HEAD")
    except (OSError, subprocess.SubprocessError):
        return None
    commit = head.stdout.strip()
    return commit if head.returncode == 0 and commit else None


def utc_now() -> str:
    """``"2026-12-03T11:53:52Z"``."""
    now = datetime.datetime.now(datetime.UTC)
    return now.isoformat(timespec="seconds").replace("+00:00", "Z")


def command_line() -> str:
    """This process's command line (``sys.argv``), shell-quoted; ``python -m rljax`` for
    rljax's ``__main__``."""
    argv = list(sys.argv)
    if argv and os.path.abspath(argv[0]) == os.path.join(_PACKAGE_DIR, "__main__.py"):
        argv[0:1] = ["python", "-m", "rljax"]
    return shlex.join(argv)


def provenance() -> dict:
    """What ``config.json`` records about a fresh run's start: ``command_line``, ``started``
    (ISO UTC), ``rljax_version``, ``git_commit`` (None outside a git checkout)."""
    return {
        "command_line": command_line(),
        "started": utc_now(),
        "rljax_version": rljax_version(),
        "git_commit": git_commit(),
    }


_MISSING = object()


def _normalise(value):
    """Tuples as lists, as they come back from JSON."""
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normalise(v) for v in value]
    return value


def _lookup(tree, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return _MISSING
        tree = tree[part]
    return tree


def _show(value) -> str:
    if value is _MISSING:
        return "<missing>"
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError):
        return repr(value)


def _diff(path: str, saved, current, out: list[str]) -> None:
    if isinstance(saved, dict) and isinstance(current, dict):
        for key in sorted(set(saved) | set(current), key=str):
            sub = f"{path}.{key}" if path else str(key)
            _diff(sub, saved.get(key, _MISSING), current.get(key, _MISSING), out)
    elif saved is _MISSING and current is _MISSING:
        return
    elif saved is _MISSING or current is _MISSING or saved != current:
        out.append(f"{path or '<root>'}: {_show(saved)} -> {_show(current)}")


def compare_metadata(
    saved: dict, current: dict, fields_that_must_match: Iterable[str] | None = None
) -> list[str]:
    """Differences between two metadata dicts as ``"algo.num_envs: 4 -> 8"`` lines (sorted).

    ``fields_that_must_match`` are dotted paths (``"algo.num_envs"``, or ``"algo"`` for a whole
    section, compared leaf by leaf); None compares everything. Tuples equal lists (JSON).
    """
    saved, current = _normalise(saved), _normalise(current)
    out: list[str] = []
    if fields_that_must_match is None:
        _diff("", saved, current, out)
    else:
        for field in fields_that_must_match:
            _diff(field, _lookup(saved, field), _lookup(current, field), out)
    return sorted(set(out))
