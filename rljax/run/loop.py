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
``update`` are dropped from ``loop.rows``. A stop requested by a hook makes the ``at_end`` hooks
after it in the order fire in the same pass (so an end-of-run evaluation lands on the row before
it is logged). Errors are exceptions (``TrainingError``).

Pipelining: when the sharded run counts the state's NaN/inf values in the chunk program
(``run_chunk_checked``) and no hook that reads the state fires at a chunk's boundary, the next chunk
is dispatched before that chunk's metrics reach the host, so the device never waits for the hooks.
A hook declares ``reads_state=False`` when it only reads rows, metrics and the loop (the built-in
guard, signals, logging, polling and progress do); every other hook (the default, and the
evaluation and checkpoint hooks) makes the loop wait at its boundaries, because the next chunk
consumes (donates) the state. A boundary run this way has the next chunk in flight while its hooks
run: a stop request there ends the loop one chunk later (the in-flight chunk finishes and its
boundary runs the ``at_end`` hooks), and ``rewind``/``replace_state`` there drop the in-flight
chunk and continue from the new state. ``Loop(..., pipeline=False)`` turns it off.

Memory stays flat: ``loop.rows`` keeps only the last ``keep_rows`` rows (a ``deque``); the whole
run's rows are what ``log_metrics`` streamed to ``metrics.jsonl``.

Throughput, one definition each (``env steps`` = updates of this loop x ``env_steps_per_update``
x seeds): ``steps_per_second()`` is wall clock, env steps / seconds since ``run`` started, host
work (hooks, evaluation, checkpoints) included; ``compiled_steps_per_second()`` is env steps /
seconds spent inside compiled chunks (the call until its metrics reach the host). Every row gets
``wall_time`` (seconds since ``clock_origin``, default the start of ``run``) and
``steps_per_second`` (wall clock, at the end of its chunk).
"""

from __future__ import annotations

import collections
import dataclasses
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

HookFn = Callable[["ChunkInfo"], None]
TIMING_COLUMNS = ("wall_time", "steps_per_second")  # row columns that differ between equal runs


@dataclasses.dataclass(frozen=True)
class Hook:
    """``fn(info)`` every ``every`` updates (None: only at the end), optionally at the end;
    ``first``: before the hooks added so far (e.g. a hook that replaces the state, so that the
    non-finite guard checks what it produced); ``reads_state=False``: ``fn`` never reads
    ``info.state``, so the next chunk may already run (see the module doc); ``skip(update)``:
    asked once at a cadence boundary (never at the end), True passes this one by (e.g. a
    checkpoint younger than a time floor), so a skipped state reader does not hold the next
    chunk back. With several processes it must answer the same on each."""

    fn: HookFn
    every: int | None = 1
    at_end: bool = False
    first: bool = False
    reads_state: bool = True  # False: only rows/metrics/loop; the next chunk may run meanwhile
    skip: Callable[[int], bool] | None = None  # skip(update): not due at this cadence boundary

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
    checked: tuple[Any, np.ndarray] | None = None  # (chunk's state, its NaN/inf counts [L])

    def nonfinite_state(self) -> list[str]:
        """``"<path> (<n> of <size> values)"`` of the current state's floating leaves holding
        NaN/inf: from the counts the chunk program computed, or (a hook replaced the state, or
        the run has no counts) one compiled reduction."""
        from rljax.run import integrity

        if self.counted:
            return integrity.describe_nonfinite(self.loop.sharded.floating_paths, self.checked[1])
        return integrity.nonfinite_leaves(self.state)

    @property
    def counted(self) -> bool:
        """Whether ``checked`` holds the NaN/inf counts of the current state (no hook replaced
        it)."""
        return self.checked is not None and self.checked[0] is self.loop.state

    @property
    def state(self):
        """The current state (after any ``replace_state`` by an earlier hook)."""
        in_flight = self.loop.in_flight
        if in_flight is not None and self.loop.state is in_flight.source:
            raise RuntimeError(
                f"a hook read info.state at update {self.update}, but it was added with "
                "reads_state=False and the next chunk already consumes this state; add it with "
                "reads_state=True (the default)"
            )
        return self.loop.state

    @property
    def num_updates(self) -> int:
        return self.loop.num_updates


class Loop:
    """Chunks of ``sharded_run`` from ``start`` to ``num_updates`` with hooks; see module doc."""

    def __init__(
        self,
        sharded_run,
        num_updates: int,
        env_steps_per_update: int = 1,
        *,
        keep_rows: int = 1000,
        clock_origin: float | None = None,
        pipeline: bool = True,
    ):
        """``keep_rows``: how many of the latest rows ``loop.rows`` keeps; ``clock_origin``: the
        ``time.perf_counter()`` that rows' ``wall_time`` counts from (default: ``run``'s start);
        ``pipeline``: dispatch the next chunk before the hooks where allowed (module doc)."""
        self.sharded = sharded_run
        self.num_updates = num_updates
        self.env_steps_per_update = env_steps_per_update
        self.hooks: list[Hook] = []
        self.keep_rows = keep_rows
        self.rows: collections.deque[dict[str, Any]] = collections.deque(maxlen=keep_rows)
        self.state = None
        self.update = 0
        self.start_update = 0
        self.stop_reason: str | None = None
        self.clock_origin = clock_origin
        self._t_start, self._t_end = time.perf_counter(), None
        self.compiled_seconds = 0.0  # inside compiled chunks (this loop)
        self.compiled_updates = 0  # updates those chunks ran (rewound ones included)
        self.chunk: tuple[int, int, float] | None = None  # (first, count, start) while one runs
        self._counts_nonfinite = hasattr(sharded_run, "run_chunk_checked")  # guard reads no state
        self.pipeline = pipeline and self._counts_nonfinite
        self.in_flight: _Chunk | None = None  # dispatched during the current hooks
        self.pipelined_chunks = 0  # boundaries whose hooks ran with the next chunk in flight
        self._rewound = False
        self._replaced = False
        self._skips: dict[int, bool] = {}  # id(hook) -> skip, at update _skips_at (see _due)
        self._skips_at: int | None = None

    # -- hooks and control --------------------------------------------------------------------
    def add_hook(
        self,
        fn: HookFn | Hook,
        every: int | None = 1,
        *,
        at_end: bool = False,
        first: bool = False,
        reads_state: bool = True,
        skip: Callable[[int], bool] | None = None,
    ) -> Hook:
        hook = fn if isinstance(fn, Hook) else Hook(fn, every, at_end, first, reads_state, skip)
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
        self.state, self._replaced = state, True

    def rewind(self, update: int, state) -> None:
        """Continue from ``state`` after ``update`` (<= the current update); skips the rest of
        this chunk's hooks and forgets the rows after ``update``."""
        self.state, self.update, self._rewound = state, update, True
        kept = (r for r in self.rows if r["update"] <= update)
        self.rows = collections.deque(kept, maxlen=self.keep_rows)

    # -- running ------------------------------------------------------------------------------
    def env_steps_done(self) -> int:
        """Environment steps (all seeds) of this loop's updates so far."""
        seeds = self.sharded.num_seeds
        return (self.update - self.start_update) * self.env_steps_per_update * seeds

    def wall_seconds(self) -> float:
        """Seconds since ``run`` started (to its end, once it has returned)."""
        return (self._t_end or time.perf_counter()) - self._t_start

    def steps_per_second(self) -> float:
        """Wall-clock throughput: env steps (all seeds) / seconds since ``run`` started."""
        return self.env_steps_done() / max(self.wall_seconds(), 1e-9)

    def compiled_steps_per_second(self) -> float:
        """Compiled-loop throughput: env steps (all seeds) / seconds inside compiled chunks."""
        steps = self.compiled_updates * self.env_steps_per_update * self.sharded.num_seeds
        return steps / self.compiled_seconds if self.compiled_seconds > 0 else 0.0

    def seconds_per_update(self) -> float | None:
        """Measured seconds of one update inside a compiled chunk (None before the first)."""
        return self.compiled_seconds / self.compiled_updates if self.compiled_updates else None

    def run(self, state, start: int = 0):
        """Run updates ``start .. num_updates`` (or until a stop request); the final state."""
        self.state, self.update, self.start_update = state, start, start
        self._t_start, self._t_end = time.perf_counter(), None
        if self.clock_origin is None:
            self.clock_origin = self._t_start
        busy_until = self._t_start  # when the device finished the previous chunk (as seen here)
        chunk = self._dispatch(self.state, start) if start < self.num_updates else None
        while chunk is not None:
            if self._may_pipeline(chunk):
                self.in_flight = self._dispatch(chunk.state, chunk.first + chunk.count)
            self.chunk = (chunk.first, chunk.count, max(chunk.t_dispatch, busy_until))
            metrics = jax.tree.map(lambda m, n=chunk.count: to_host(m)[:n], chunk.metrics)
            now = time.perf_counter()  # waits above: the chunk is done
            self.compiled_seconds += now - self.chunk[2]
            self.compiled_updates += chunk.count
            busy_until, self.chunk = now, None
            self.state, self.update = chunk.state, chunk.first + chunk.count
            info = ChunkInfo(
                self, chunk.first, self.update, metrics, self._rows(metrics, chunk.first),
                at_end=self.update >= self.num_updates or self.stop_reason is not None,
                stop_reason=self.stop_reason,
            )  # fmt: skip
            if chunk.nonfinite is not None:
                info.checked = (self.state, to_host(chunk.nonfinite))
            self.pipelined_chunks += self.in_flight is not None
            self._run_hooks(info)
            chunk, self.in_flight = self.in_flight, None
            if self._rewound or self._replaced:
                chunk = None  # in flight from a state that is no longer the run's: dropped
            if chunk is None and self.update < self.num_updates and self.stop_reason is None:
                chunk = self._dispatch(self.state, self.update)
        self._t_end = time.perf_counter()
        return self.state

    def _dispatch(self, state, first: int) -> _Chunk:
        """Start the chunk of updates ``first+1 ..`` (asynchronously: returns futures)."""
        count = min(self.sharded.chunk_size, self.num_updates - first)
        t0 = time.perf_counter()
        if self.chunk is None:  # the progress ticker sees it from here (a call may block)
            self.chunk = (first, count, t0)
        if self._counts_nonfinite:
            out, metrics, nonfinite = self.sharded.run_chunk_checked(state, count)
        else:
            (out, metrics), nonfinite = self.sharded.run_chunk(state, count), None
        return _Chunk(first, count, t0, state, out, metrics, nonfinite)

    def _may_pipeline(self, chunk: _Chunk) -> bool:
        """Whether the chunk after ``chunk`` may start before ``chunk``'s hooks: there is one,
        no stop is pending and no hook that reads the state fires at ``chunk``'s boundary."""
        end = chunk.first + chunk.count
        if not self.pipeline or end >= self.num_updates or self.stop_reason is not None:
            return False
        return not any(h.reads_state and self._due(h, chunk.first, end) for h in self.hooks)

    def _due(self, hook: Hook, first_update: int, update: int) -> bool:
        """Whether ``hook`` fires on its cadence at the boundary after ``update`` (its ``skip``
        asked once per boundary: the pipelining decision and the hook run agree)."""
        if not hook.fires(first_update, update):
            return False
        if hook.skip is None:
            return True
        if self._skips_at != update:  # one boundary's answers at a time
            self._skips_at, self._skips = update, {}
        if id(hook) not in self._skips:
            self._skips[id(hook)] = bool(hook.skip(update))
        return not self._skips[id(hook)]

    def _run_hooks(self, info: ChunkInfo) -> None:
        self._rewound = self._replaced = False
        fired = set()
        for index, hook in enumerate(list(self.hooks)):
            if self.stop_reason is not None and self.in_flight is None:  # this is the end
                info.at_end, info.stop_reason = True, self.stop_reason
            if self._due(hook, info.first_update, info.update) or (hook.at_end and info.at_end):
                fired.add(index)
                hook.fn(info)
                if self._rewound:
                    return
        if self.stop_reason is not None and self.in_flight is None:  # the end came early
            info.at_end, info.stop_reason = True, self.stop_reason
            for index, hook in enumerate(list(self.hooks)):
                if hook.at_end and index not in fired:
                    hook.fn(info)
        self.rows.extend(info.rows)

    def _rows(self, metrics, first_update: int) -> list[dict[str, Any]]:
        seeds = self.sharded.num_seeds
        rows = []
        now = {
            "wall_time": time.perf_counter() - self.clock_origin,
            "steps_per_second": self.steps_per_second(),
        }
        for i in range(len(metrics["episode_return"])):
            update = first_update + i + 1
            row = {"update": update, "env_steps": update * self.env_steps_per_update, **now}
            for name, values in metrics.items():
                value = np.asarray(values[i])
                row[name] = value.mean() if seeds > 1 else value
            if seeds > 1:
                row["episode_return_per_seed"] = np.asarray(metrics["episode_return"][i])
            rows.append(row)
        return rows


@dataclasses.dataclass
class _Chunk:
    """A dispatched chunk: updates ``first+1 .. first+count``; its outputs are futures."""

    first: int
    count: int
    t_dispatch: float
    source: Any  # the state it was dispatched with (consumed: donated)
    state: Any
    metrics: Any
    nonfinite: Any


def to_host(x) -> np.ndarray:
    """A replicated (possibly multi-process) array as numpy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)
