"""The one host loop: run compiled chunks to the end; between chunks, hooks.

    loop = Loop(sharded_run, num_updates, env_steps_per_update=512)
    loop.add_hook(lambda info: print(info.update, info.rows[-1]["loss"]), every=50)
    loop.add_hook(save, every=100, at_end=True)
    state = loop.run(state)

A chunk is ``min(chunk_size, remaining)`` updates in one compiled call. After it the loop moves
its metrics to the host (``info.metrics``: numpy ``[updates, (S,)]``; ``info.rows``: one dict per
update, seed means plus ``episode_return_per_seed`` when ``S > 1``) and calls every hook whose
cadence fires: ``every=N`` fires at a chunk boundary whose update count crosses a multiple of
``N`` (``first_update // N < update // N``); ``at_end=True`` also fires once when the loop ends,
at ``num_updates`` or after a stop request. Hooks run in the order they were added
(``first=True`` puts one in front); each receives a ``ChunkInfo``.

Control, all through the loop (no exceptions as control flow):
``loop.request_stop(reason)`` ends the loop after this chunk's hooks (then the ``at_end`` hooks
that have not run for this chunk run, with ``info.stop_reason`` set); ``loop.replace_state(s)``
swaps the state seen by later hooks and the next chunk; ``loop.rewind(update, state)`` continues
from an earlier point (rollback): the rest of this chunk's hooks are skipped and the rows after
``update`` are dropped from ``loop.rows``. Errors are exceptions (``TrainingError``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

HookFn = Callable[["ChunkInfo"], None]


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(info)`` every ``every`` updates (None: only at the end), optionally at the end;
    ``first``: before the hooks added so far (e.g. a hook that replaces the state, so that the
    non-finite guard checks what it produced)."""

    fn: HookFn
    every: int | None = 1
    at_end: bool = False
    first: bool = False

    def fires(self, first_update: int, update: int) -> bool:
        return bool(self.every) and first_update // self.every < update // self.every


@dataclasses.dataclass
class ChunkInfo:
    """What hooks see after a chunk: updates ``first_update+1 .. update`` of ``num_updates``."""

    loop: Loop
    first_update: int
    update: int
    metrics: dict[str, np.ndarray]  # host copies, [updates of the chunk, (S,)]
    rows: list[dict[str, Any]]  # one per update; hooks may add columns (evaluation, ...)
    at_end: bool = False
    stop_reason: str | None = None

    @property
    def state(self):
        """The current state (after any ``replace_state`` by an earlier hook)."""
        return self.loop.state

    @property
    def num_updates(self) -> int:
        return self.loop.num_updates


class Loop:
    """Chunks of ``sharded_run`` from ``start`` to ``num_updates`` with hooks; see module doc."""

    def __init__(self, sharded_run, num_updates: int, env_steps_per_update: int = 1):
        self.sharded = sharded_run
        self.num_updates = num_updates
        self.env_steps_per_update = env_steps_per_update
        self.hooks: list[Hook] = []
        self.rows: list[dict[str, Any]] = []  # every row of this loop's updates so far
        self.state = None
        self.update = 0
        self.start_update = 0
        self.stop_reason: str | None = None
        self._t_start = time.perf_counter()
        self._rewound = False

    # -- hooks and control --------------------------------------------------------------------
    def add_hook(
        self, fn: HookFn | Hook, every: int | None = 1, *, at_end: bool = False, first=False
    ) -> Hook:
        hook = fn if isinstance(fn, Hook) else Hook(fn, every, at_end, first)
        if hook.every is not None and hook.every < 1:
            raise ValueError(f"hook every must be >= 1 or None (only at_end), got {hook.every}")
        if hook.first:
            self.hooks.insert(0, hook)
        else:
            self.hooks.append(hook)
        return hook

    def request_stop(self, reason: str = "stop requested") -> None:
        """End after this chunk's hooks (the first reason is kept)."""
        self.stop_reason = self.stop_reason or reason

    def replace_state(self, state) -> None:
        self.state = state

    def rewind(self, update: int, state) -> None:
        """Continue from ``state`` after ``update`` (<= the current update); skips the rest of
        this chunk's hooks and forgets the rows after ``update``."""
        self.state, self.update, self._rewound = state, update, True
        self.rows = [r for r in self.rows if r["update"] <= update]

    # -- running ------------------------------------------------------------------------------
    def steps_per_second(self) -> float:
        """Environment steps (all seeds) per second since ``run`` started."""
        seeds = self.sharded.num_seeds
        steps = (self.update - self.start_update) * self.env_steps_per_update * seeds
        return steps / max(time.perf_counter() - self._t_start, 1e-9)

    def run(self, state, start: int = 0):
        """Run updates ``start .. num_updates`` (or until a stop request); the final state."""
        self.state, self.update, self.start_update = state, start, start
        self._t_start = time.perf_counter()
        while self.update < self.num_updates and self.stop_reason is None:
            first = self.update
            count = min(self.sharded.chunk_size, self.num_updates - first)
            self.state, metrics = self.sharded.run_chunk(self.state, count)
            metrics = jax.tree.map(lambda m, n=count: to_host(m)[:n], metrics)  # waits
            self.update = first + count
            info = ChunkInfo(
                self, first, self.update, metrics, self._rows(metrics, first),
                at_end=self.update >= self.num_updates,
            )  # fmt: skip
            self._run_hooks(info)
        return self.state

    def _run_hooks(self, info: ChunkInfo) -> None:
        self._rewound = False
        fired = set()
        for index, hook in enumerate(list(self.hooks)):
            if hook.fires(info.first_update, info.update) or (hook.at_end and info.at_end):
                fired.add(index)
                hook.fn(info)
                if self._rewound:
                    return
        if self.stop_reason is not None:  # the end came early: at_end hooks not yet run
            info.at_end, info.stop_reason = True, self.stop_reason
            for index, hook in enumerate(list(self.hooks)):
                if hook.at_end and index not in fired:
                    hook.fn(info)
        self.rows.extend(info.rows)

    def _rows(self, metrics, first_update: int) -> list[dict[str, Any]]:
        seeds = self.sharded.num_seeds
        rows = []
        for i in range(len(metrics["episode_return"])):
            update = first_update + i + 1
            row = {"update": update, "env_steps": update * self.env_steps_per_update}
            for name, values in metrics.items():
                value = np.asarray(values[i])
                row[name] = value.mean() if seeds > 1 else value
            if seeds > 1:
                row["episode_return_per_seed"] = np.asarray(metrics["episode_return"][i])
            rows.append(row)
        return rows


def to_host(x) -> np.ndarray:
    """A replicated (possibly multi-process) array as numpy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)
