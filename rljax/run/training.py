"""``train()``: the whole job, one ``Loop`` with the hooks of ``rljax.run.hooks``.

``train(PPOConfig(...), RunConfig.make(...))``, ``train(PPO(config))`` or ``train(MyPPO)``:
validate, build, compile once, then run jitted chunks; between chunks the hooks move metrics to
the host, write ``metrics.jsonl``, print progress, evaluate, check for non-finite values and save
orbax checkpoints (``rljax.run.checkpoint``); the training maths stays in the jitted chunk. Extra
hooks: ``train(..., hooks=[Hook(fn, every=10), fn, ...])`` (a plain function runs every chunk).

* Checkpoints: every ``checkpoint_every`` updates (at chunk ends, at most one per
  ``checkpoint_min_seconds`` of wall clock) and at the end, the whole
  training state (parameters, optimizer and sync state, environment states and observations,
  replay buffer, RNG keys, counters) plus JSON metadata (configs, mesh, replicas, versions,
  env steps). ``resume=<run dir>`` continues from the newest valid checkpoint: same mesh gives
  bitwise the same result as an uninterrupted run; other meshes: see ``rljax.run.resume``.
* Non-finite guard: a NaN/Inf loss or gradient norm in any update, or any non-finite floating
  array of the state (parameters, optimizer state, replay priorities, ...) after a chunk, stop
  the run with ``TrainingError`` naming the update and the quantity (its state path); the last
  good checkpoint is never overwritten (``Checkpointer.save`` refuses non-finite states too). With
  ``on_nonfinite="rollback"`` the run instead restores the last good checkpoint, replaces the RNG
  key by a fresh split, and continues, at most ``max_rollbacks`` times.
* SIGINT/SIGTERM: the current chunk finishes, a checkpoint is saved, and ``train`` returns with
  ``interrupted=True`` after printing how to resume. Before the first chunk (compiling,
  restoring) they raise ``Interrupted`` (a ``KeyboardInterrupt``) and a fresh run's directory is
  removed; a resumed run's is kept.
* Output (``rljax.run.progress``): a line as compiling starts and one when it ends, a progress
  line per chunk with steps/s and an ETA (a ticker estimates it during long chunks), then a final
  evaluation (when evaluation is on, also after a stop) and a closing summary: wall and compile
  time, both throughputs, final training and evaluation returns, where every file is. The same
  figures are ``TrainResult.summary`` and ``<run_dir>/summary.json``.
* Memory (``rljax.run.plan``): the programs compile before the run directory is touched; their
  memory plan (bytes per device by part, from XLA's memory analysis) goes into ``config.json``
  (``memory_plan``; a resume's record), and a plan over ``--memory-per-device`` (or the device's
  own limit) stops the run there with ``ConfigError`` naming the figures and a mesh that fits
  (the actor-learner layout: one plan per mesh, ``rljax.run.plan_actor_learner``).
* The run directory (``rljax.run.run_dir``): a fresh run never modifies an existing one
  (``ConfigError``; ``overwrite=True`` replaces it after validation), ``run.lock`` keeps a second
  run or resume out while this one is alive, and is released on every exit path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax

from rljax.diagnostics import communication, describe
from rljax.errors import Interrupted
from rljax.parallel import mesh_spec_of
from rljax.run import hooks as builtin
from rljax.run.config import RunConfig
from rljax.run.loop import Loop
from rljax.run.plots import plot_learning_curve
from rljax.run.progress import Console, Progress, format_summary, run_summary, write_summary
from rljax.run.run_log import read_metrics
from rljax.run.session import Session


@dataclasses.dataclass
class TrainResult:
    """What ``train`` returns. Throughput (env steps of all seeds, one definition each, the same
    as the console, ``metrics.jsonl`` and ``summary.json``): ``steps_per_second`` is wall clock
    (seconds since the loop started, host work included), ``compiled_steps_per_second`` counts
    only the seconds inside compiled chunks. ``summary``: the closing figures (also in
    ``<run_dir>/summary.json``); ``metrics``: this call's rows (a resumed run: from the resumed
    update on), read from ``metrics.jsonl`` on each access, so the loop itself keeps only the
    last rows (``recent_rows``) and its memory stays flat however long the run."""

    state: Any
    run_dir: Path
    compile_seconds: dict[str, float]
    steps_per_second: float
    updates_done: int
    interrupted: bool = False
    resumed_from: int | None = None
    rollbacks: int = 0
    compiled_steps_per_second: float = 0.0
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    metrics_path: Path | None = None
    recent_rows: list[dict[str, Any]] = dataclasses.field(default_factory=list, repr=False)

    @property
    def metrics(self) -> list[dict[str, Any]]:
        """One dict per update of this call (from ``metrics.jsonl``; a process that writes no
        log: the retained ``recent_rows``)."""
        if self.metrics_path is None or not Path(self.metrics_path).exists():
            return list(self.recent_rows)
        first = self.resumed_from or 0
        return [r for r in read_metrics(self.metrics_path) if r.get("update", 0) > first]


def train(algorithm, run: RunConfig | None = None, *, hooks=(), progress=print) -> TrainResult:
    """Validate, build, compile and run to ``total_timesteps``; see the module doc.

    ``algorithm``: a registered algorithm's config, an algorithm instance (rebuilt as its own
    class for the mesh) or class (default config). ``hooks``: ``Hook``s or functions of a
    ``ChunkInfo`` (every chunk), run after the built-in ones (``Hook(..., first=True)``: before).
    Raises ``ConfigError`` (bad input, an existing run directory, a locked one: before anything
    is written or compiled), ``TrainingError`` (non-finite values, nothing valid to resume) and
    ``Interrupted`` (SIGINT/SIGTERM before the first chunk finished, or after the loop).
    """
    session = Session(algorithm, run or RunConfig(), progress)  # validation: nothing written
    interrupted = None
    try:
        with _sigterm_interrupts():
            t_begin = time.perf_counter()
            console = _console(session)
            session.compile(console)  # over the memory budget: ConfigError, nothing written
            session.open()
            return _train(session, hooks, console, t_begin)
    except KeyboardInterrupt as error:  # Ctrl-C (or SIGTERM) outside the loop's own handling
        interrupted = error
    finally:
        outcome = session.close(interrupted=interrupted is not None)
    signum = getattr(interrupted, "signum", signal.SIGINT)
    when = "before the first chunk finished" if not session.started else "after training started"
    raise Interrupted(f"{signal.Signals(signum).name} {when}; {outcome}".rstrip("; "), signum)


@contextlib.contextmanager
def _sigterm_interrupts():
    """SIGTERM raises ``Interrupted`` like Ctrl-C while ``train`` is outside its loop (which
    handles both itself), so the run directory and its lock are released."""

    def handle(signum, _frame):
        raise Interrupted("SIGTERM", signum)

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, handle)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _console(s: Session) -> Console:
    """The run's console (every message through it: it clears a redrawn status line first),
    after the opening line."""
    run, cfg = s.run, s.config
    printing = s.primary and not run.logging.quiet
    console = Console(s.say if printing else None, tty=s.say is print and sys.stdout.isatty())
    if printing:
        s.say = console.line
    where = f"mesh {mesh_spec_of(s.mesh)}"
    if s.actor_layout is not None:
        where = (
            f"actor mesh {mesh_spec_of(s.actor_layout.mesh)} + learner mesh {where[5:]}, "
            f"max staleness {run.parallel.max_staleness}"
        )
    s.say(
        f"rljax {s.name} on {cfg.env}: {where} ({jax.default_backend()}, "
        f"{jax.process_count()} process(es)), {run.num_seeds} seed(s), {cfg.num_updates} updates "
        f"x {cfg.env_steps_per_update} steps"
    )
    return console


def _train(s: Session, user_hooks, console: Console, t_begin: float) -> TrainResult:
    run, cfg, say = s.run, s.config, s.say
    resume = run.checkpointing.resume  # Session.open found a checkpoint to resume from
    key = jax.random.key(run.seed)

    loop = Loop(s.sharded, cfg.num_updates, cfg.env_steps_per_update, clock_origin=t_begin)
    guard = builtin.NonFiniteGuard(s)
    signals = builtin.StopSignals()
    metrics_only = {"reads_state": False}  # the next chunk may run while they do
    loop.add_hook(guard, **metrics_only)  # reads the chunk's own NaN/inf counts
    loop.add_hook(signals, **metrics_only)
    if run.logging.measure_comm:
        comm = communication(s.algo, s.layout)
        s.log.write_extra("communication", comm)
        say("communication per optimizer step per device (bytes): " + describe(comm))
        loop.add_hook(builtin.comm_bytes(comm), **metrics_only)
    if s.evaluation is not None:  # also at the end: the last row is evaluated
        loop.add_hook(builtin.evaluate(s.evaluation), every=run.evaluation.eval_every, at_end=True)
    loop.add_hook(builtin.log_metrics(s.log), **metrics_only)
    loop.add_hook(builtin.poll_checkpoints(s.ckpt), **metrics_only)
    save = builtin.SaveCheckpoint(s)
    every = run.checkpointing.checkpoint_every
    loop.add_hook(save, every=every, at_end=True, skip=save.too_soon)
    progress = Progress(console, loop)  # after the save: its steps/s includes that host work
    loop.add_hook(progress, **metrics_only)
    for hook in user_hooks:
        loop.add_hook(hook)

    resumed_from = None
    if resume:
        done, state = s.restore_latest()
        resumed_from = s.last_saved = done
        s.log.truncate(done)  # rows written after that checkpoint are recomputed
        say(f"resumed from update {done} ({done * cfg.env_steps_per_update:,} env steps)")
    elif s.transfer is not None:
        from rljax.tools.transfer import load_params

        params = load_params(s.transfer)
        done, state = 0, s.sharded.init(key, params)
        say(f"initialised {len(params)} parameters from {s.transfer.source} ({s.transfer.part})")
    else:
        done, state = 0, s.sharded.init(key)
    s.last_save_time = time.monotonic()  # compiled and restored: the time floor starts here
    s.started = True  # from here SIGINT/SIGTERM finish the chunk and save (StopSignals)
    with signals, progress:  # also over the last save: a late signal must not split the processes
        state = loop.run(state, start=done)
        s.ckpt.wait()
    if loop.stop_reason is not None:
        say(
            f"{loop.stop_reason}: stopped after update {loop.update}/{cfg.num_updates}; "
            f"checkpoint saved in {s.ckpt.directory}. Resume with:\n  {s.resume_command()}"
        )
    files = {}
    if s.primary:
        plot_learning_curve(s.log.metrics_path, s.log.plot_path, f"{s.name} {cfg.env}")
        files = {
            "config": s.log.config_path,
            "metrics": s.log.metrics_path,
            "learning curve": s.log.plot_path,
            "summary": s.run_dir / "summary.json",
            "checkpoints": s.ckpt.directory,
        }
    summary = run_summary(
        loop,
        wall_seconds=time.perf_counter() - t_begin,
        compile_seconds=s.sharded.compile_seconds,
        evaluation=s.evaluation,
        files=files,
        stop_reason=loop.stop_reason,
    )
    if s.primary:
        write_summary(s.run_dir / "summary.json", summary)
    console.line(format_summary(summary))
    return TrainResult(
        state,
        s.run_dir,
        s.sharded.compile_seconds,
        loop.steps_per_second(),
        loop.update,
        interrupted=loop.stop_reason is not None,
        resumed_from=resumed_from,
        rollbacks=guard.rollbacks,
        compiled_steps_per_second=loop.compiled_steps_per_second(),
        summary=summary,
        metrics_path=s.log.metrics_path if s.primary else None,
        recent_rows=list(loop.rows),
    )
