"""Gradient synchronisation strategies, one module each, found by name.

Every module in this package that registers a ``Strategy`` subclass (``@register``) is imported
here, so adding a strategy means adding its module. Bytes per strategy: ``docs/sync.md``.
"""

from __future__ import annotations

import importlib
import pkgutil

from rljax.errors import ConfigError
from rljax.parallel.sync.base import (
    Strategy,
    SyncConfig,
    register,
    registered,
    tree_norm,
)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

STRATEGIES = tuple(registered())


def strategy_for(config: SyncConfig) -> Strategy:
    validate_sync(config)
    return registered()[config.strategy](config)


def validate_sync(config: SyncConfig) -> None:
    strategies = registered()
    if config.strategy not in strategies:
        raise ConfigError(
            f"sync strategy {config.strategy!r} unknown; choose from {tuple(strategies)}"
        )
    strategies[config.strategy].validate(config)


def validate_layout(config: SyncConfig, layout) -> None:
    """``config``'s strategy on ``layout`` (a ``rljax.parallel.Layout``): a strategy that does not
    compose with parameters split over ``fsdp`` is one ``ConfigError`` naming the alternatives."""
    validate_sync(config)
    fsdp = layout.mesh.shape.get("fsdp", 1)
    if fsdp > 1 and layout.shards("embed") > 1:
        if not registered()[config.strategy].composes_with_fsdp:
            ok = [n for n, cls in registered().items() if cls.composes_with_fsdp]
            raise ConfigError(
                f"sync strategy {config.strategy!r} does not compose with fsdp={fsdp} "
                f"(parameters, gradients and moments split over fsdp); with fsdp use "
                f"{', '.join(ok)}, or keep {config.strategy!r} on a mesh without fsdp "
                f"(e.g. data={layout.mesh.shape['data'] * fsdp},model={layout.mesh.shape['model']})"
            )


__all__ = [
    "STRATEGIES",
    "Strategy",
    "SyncConfig",
    "register",
    "registered",
    "strategy_for",
    "tree_norm",
    "validate_layout",
    "validate_sync",
]
