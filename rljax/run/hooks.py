"""The host-loop concerns of ``train()``, each a hook of ``rljax.run.loop.Loop``.

``train`` adds them in this order (user hooks after them, or in front with ``first=True``):

    NonFiniteGuard(session)                every chunk: NaN/Inf -> TrainingError or rollback
    StopSignals()                          every chunk: SIGINT/SIGTERM -> loop.request_stop
    comm_bytes(comm)                       every chunk: bytes communicated per update (rows)
    evaluate(evaluation)                   every eval_every updates and at the end (also after
                                           a stop): eval_* on the last row
    log_metrics(log)                       every chunk: metrics.jsonl / TensorBoard / wandb
    poll_checkpoints(ckpt)                 every chunk: the previous save becomes durable
    SaveCheckpoint(session)                every checkpoint_every updates (at most one per
                                           checkpoint_min_seconds), at the end, on stop
    Progress(console, loop)                every chunk: one line (rljax.run.progress; entered,
                                           a ticker estimates progress during a chunk)

and after the loop, when it was stopped, prints how to resume, then the closing summary.

``session`` is the ``rljax.run.session.Session`` of the run (checkpointer, run log, printing).
"""

from __future__ import annotations

import re
import signal
import threading
import time
import warnings

import jax
import numpy as np

from rljax.diagnostics import comm_bytes_per_update
from rljax.errors import TrainingError
from rljax.run import integrity
from rljax.run.loop import ChunkInfo
from rljax.run.progress import Progress  # noqa: F401  (a built-in hook, defined with the console)

GUARDED_METRICS = ("loss", "grad_norm")


# -- non-finite values ----------------------------------------------------------------------------
def first_nonfinite(rows) -> tuple[int, str] | None:
    for row in rows:
        for name in GUARDED_METRICS:
            if name in row and not np.all(np.isfinite(row[name])):
                return row["update"], name
    return None


def dotted(keystr: str) -> str:
    """``".buffer.priorities"`` / ``"['params']['actor']"`` (``keystr``) -> ``buffer.priorities``
    / ``params.actor``."""
    return re.sub(r"\['([^']*)'\]|\[(\d+)\]", r".\1\2", keystr).lstrip(".")


def nonfinite_state(state) -> list[tuple[str, str]]:
    """``(path, "<n> of <size> values")`` of every floating leaf of ``state`` (parameters,
    optimizer and sync state, environments, replay priorities, ...) holding NaN/Inf; one
    compiled reduction, its result the same on every process."""
    return split_entries(integrity.nonfinite_leaves(state))


def split_entries(entries: list[str]) -> list[tuple[str, str]]:
    """``"<path> (<n> of <size> values)"`` entries -> ``(dotted path, "<n> of <size> values")``."""
    out = []
    for entry in entries:
        path, _, count = entry.partition(" (")
        out.append((dotted(path), count.rstrip(")")))
    return out


def params_finite(params) -> bool:
    """Whether every floating leaf of ``params`` (or any state tree) is finite."""
    return not nonfinite_state(params)


def fresh_keys(state, salt: int):
    """The state's RNG key(s) replaced by a fresh split (rollback after a non-finite update)."""
    fold = lambda k: jax.random.fold_in(k, 0x5EED + salt)  # noqa: E731
    key = state.key
    key = jax.vmap(fold)(key) if key.ndim else fold(key)
    return state.replace(key=key)


class NonFiniteGuard:
    """A NaN/Inf loss, gradient norm or any floating array of the state (parameters, optimizer
    state, replay priorities, ...): ``TrainingError`` naming the update and the quantity (its
    state path, e.g. ``buffer.priorities``) (``on_nonfinite="stop"``), or roll back to the last
    valid checkpoint with fresh keys (``"rollback"``, at most ``max_rollbacks`` times;
    ``loop.rewind``). Runs before anything is logged or saved, so bad rows and states never reach
    disk."""

    def __init__(self, session):
        self.s = session
        self.rollbacks = 0

    def __call__(self, info: ChunkInfo) -> None:
        problem = first_nonfinite(info.rows)
        if problem is None:
            bad = split_entries(info.nonfinite_state())  # counted by the chunk program
            if bad:
                paths = [path for path, _ in bad]
                under_params = all(p == "params" or p.startswith("params.") for p in paths)
                quantity = "parameters" if under_params else paths[0]
                shown = [f"{path} ({count})" for path, count in bad[:3]]
                more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
                detail = f" in {', '.join(shown)}{more}"
                if bad[0][0] == quantity and len(bad) == 1:
                    detail = f" ({bad[0][1]})"
                problem = (info.update, quantity, detail)
        if problem is None:
            return
        faults = self.s.run.faults
        if faults.on_nonfinite == "rollback" and self.rollbacks < faults.max_rollbacks:
            self.rollbacks += 1
            info.loop.rewind(*self._rollback(problem))
            return
        raise TrainingError(self._message(problem))

    def _message(self, problem) -> str:
        update, quantity, *detail = problem
        s = self.s
        where = (
            f"the last good checkpoint (update {s.last_saved}) in {s.ckpt.directory} is "
            f"untouched; resume with: {s.resume_command()}"
            if s.last_saved
            else "no checkpoint had been written yet"
        )
        what = f"non-finite {quantity} (NaN/Inf) at update {update}{''.join(detail)}"
        return f"{what}; stopped. {where}"

    def _rollback(self, problem):
        update, quantity, *_ = problem
        s = self.s
        s.ckpt.wait()
        if s.ckpt.latest_valid_step() is None:
            raise TrainingError(
                f"non-finite {quantity} (NaN/Inf) at update {update} and no checkpoint to roll "
                "back to"
            )
        with warnings.catch_warnings():
            warnings.simplefilter("default")
            done, state = s.restore_latest()
        state = fresh_keys(state, self.rollbacks)
        with s.sharded.layout.active():
            state = jax.device_put(state, s.sharded.state_shardings)
        s.log.truncate(done)
        s.say(
            f"non-finite {quantity} at update {update}: rolled back to update {done} with a "
            f"fresh RNG split ({self.rollbacks}/{s.run.faults.max_rollbacks})"
        )
        return done, state


# -- stop signals ---------------------------------------------------------------------------------
class StopSignals:
    """While entered, SIGINT/SIGTERM are recorded (not raised); as a hook, a received signal
    requests a stop (the loop finishes the chunk, ``SaveCheckpoint`` saves).

    With several processes the stop is agreed at every chunk boundary: each process contributes
    the signal it received (if any), and all stop after the same update when any of them got
    one, so their collectives (the next chunk, the checkpoint save) keep pairing up. A signal
    that reaches one process only, or several at different times, stops the whole job cleanly.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in self.SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, _frame):
        self.received = self.received or signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def __call__(self, info: ChunkInfo) -> None:
        reason = self.agreed()
        if reason:
            info.loop.request_stop(reason)

    def agreed(self) -> str | None:
        """The stop reason every process sees: this process's signal, else the first other
        process's (``'SIGTERM (received by process 1)'``); None when no process got one. A
        collective with several processes (every process must call it at the same point)."""
        if jax.process_count() == 1:
            return self.received
        from jax.experimental import multihost_utils

        # The flag is read once, before the exchange, so that every process combines the same
        # values even if a signal arrives during it (it then counts at the next boundary).
        mine = signal.Signals[self.received].value if self.received else 0
        signums = np.asarray(multihost_utils.process_allgather(np.int32(mine))).ravel()
        if mine:
            return self.received
        for index, signum in enumerate(signums):
            if signum:
                return f"{signal.Signals(int(signum)).name} (received by process {index})"
        return None


# -- rows -----------------------------------------------------------------------------------------
def comm_bytes(comm: dict):
    """Bytes communicated per device per update by mesh axis (``communication()``'s numbers
    times the update's optimizer steps and synchronisations) as ``comm_bytes_<axis>``."""

    def hook(info: ChunkInfo) -> None:
        for row in info.rows:
            row.update(comm_bytes_per_update(comm, row["optimizer_steps"], row["syncs"]))

    return hook


def evaluate(evaluation):
    """``evaluation(state, update)`` (``rljax.run.evaluation.Evaluation``) on the last row (add
    with ``every=eval_every, at_end=True``: the run's last row is always evaluated)."""

    def hook(info: ChunkInfo) -> None:
        info.rows[-1].update(evaluation(info.state, info.update))

    return hook


def log_metrics(log):
    """The chunk's rows to ``log`` (``RunLog``: metrics.jsonl, TensorBoard, wandb)."""

    def hook(info: ChunkInfo) -> None:
        log.append(info.rows)

    return hook


# -- checkpoints ----------------------------------------------------------------------------------
def poll_checkpoints(ckpt):
    """The previous checkpoint becomes durable (manifest) as soon as it is written."""

    def hook(info: ChunkInfo) -> None:
        ckpt.poll()

    return hook


class SaveCheckpoint:
    """Save the state (add with ``every=checkpoint_every, at_end=True, skip=too_soon``: also at
    the end and after a stop request); a state already saved at this update is not saved
    again."""

    def __init__(self, session):
        self.s = session

    def too_soon(self, update: int) -> bool:
        """A periodic save younger than ``checkpoint_min_seconds`` after the last one (process
        0's clock decides for every process: the save is collective)."""
        floor = self.s.run.checkpointing.checkpoint_min_seconds
        young = time.monotonic() - self.s.last_save_time < floor
        return bool(integrity.agree(int(young)))

    def __call__(self, info: ChunkInfo) -> None:
        if self.s.last_saved != info.update:
            known = info.counted and not info.checked[1].any()  # the guard saw the counts
            self.s.save(info.state, info.update, known_finite=known)
