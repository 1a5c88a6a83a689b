"""What a run records about itself besides arrays: package versions, and a readable diff of two
saved metadata dicts."""

from __future__ import annotations

import importlib.metadata
import json
import platform
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
