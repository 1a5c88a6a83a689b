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
  own limit) stops the run there with ``ConfigError`` naming the figures and a mesh that fits.
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
from rljax.errors import ConfigError, Interrupted, TrainingError
from rljax.parallel import mesh_spec_of
from rljax.run import hooks as builtin
from rljax.run import memory
from rljax.run.actor_learner import (
    ActorLearnerRun,
    LearnerEvaluation,
    is_actor_learner,
    prepare_actor_learner,
    validate_actor_learner,
)
from rljax.run.config import RunConfig
from rljax.run.evaluation import Evaluation
from rljax.run.loop import Loop
from rljax.run.plan import plan_of
from rljax.run.plots import plot_learning_curve
from rljax.run.progress import Console, Progress, format_summary, run_summary, write_summary
from rljax.run.resume import (
    check_compatible,
    describe_changes,
    read_config_file,
    read_run_config,
    restore_step,
    resume_record,
)
from rljax.run.run_dir import RunDirectory, safe_name
from rljax.run.run_log import NullRunLog, RunLog, default_run_name, read_metrics
from rljax.run.sharded import (
    ShardedRun,
    algorithm_name,
    prepare,
    registered_names,
    resolve_algorithm,
)


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


class Session:
    """One ``train`` call's pieces: mesh, algorithm, run directory, run log, checkpointer,
    printing. Constructing it validates (nothing written); ``open`` creates and locks the run
    directory and builds the rest; ``close`` runs on every exit path."""

    def __init__(self, algorithm, run: RunConfig, progress):
        self.run = run
        self.algo_cls, self.config = resolve_algorithm(algorithm)
        self.name = algorithm_name(self.algo_cls)
        resume = run.checkpointing.resume
        saved = read_run_config(resume) if resume else None  # damaged: ConfigError
        if saved is not None:
            check_compatible(saved, self.name, self.config, run)
        self.actor_layout = None  # the actor-learner layout's actor mesh (--actor-mesh)
        validate_actor_learner(self.algo_cls, self.config, run)
        if is_actor_learner(run):
            (self.actor_layout, self.layout), self.algo = prepare_actor_learner(algorithm, run)
        else:
            self.layout, self.algo = prepare(algorithm, run)  # every ConfigError before writing
        self.transfer = None  # --init-from: what the new run copies (checked before compiling)
        init_from = run.checkpointing.init_from
        if init_from and not resume:
            from rljax.tools.transfer import plan_transfer

            self.transfer = plan_transfer(init_from, run.checkpointing.init_part, self.algo)
        self.memory = memory.estimate(self.algo, self.layout, run.num_seeds)  # checked, cached
        self.mesh = self.layout.mesh
        self.primary = jax.process_index() == 0
        quiet = run.logging.quiet
        self.say = progress if (self.primary and not quiet) else (lambda *a, **k: None)
        self.run_dir = Path(resume) if resume else self._fresh_dir()
        lg = run.logging
        self.directory = RunDirectory(
            self.run_dir, fresh=not resume, overwrite=lg.overwrite, primary=self.primary
        )
        self.directory.check()  # an existing run or a held lock: ConfigError, nothing written
        self.log = self.ckpt = None
        self.started = False  # the first chunk is under way: the run directory is kept
        self.last_saved = 0
        self.last_save_time = time.monotonic()  # the loop's start counts as a save (the floor)
        self.resume_step: int | None = None  # newest valid checkpoint, found by open()
        self.plan = None  # the compiled programs' memory plan, set by compile()
        self.opened = False  # the run directory has been created (or cleared) and locked

    def _fresh_dir(self) -> Path:
        lg = self.run.logging
        if lg.run_name is not None:
            return Path(lg.runs_dir) / lg.run_name
        name = safe_name(default_run_name(self.name, self.config.env))
        path, n = Path(lg.runs_dir) / name, 1
        while path.exists():  # a default name never collides with an earlier run
            n += 1
            path = Path(lg.runs_dir) / f"{name}-{n}"
        return path

    def open(self) -> None:
        """Create (or, with ``overwrite``, clear) and lock the run directory, then the run log
        and checkpointer; after ``compile`` (``config.json`` records the memory plan). A resume
        first finds its checkpoint (none, or nothing left to train: an error, nothing written)
        and appends a record, with its memory plan, to ``config.json``'s ``resumes`` (the
        original configuration stays as it was)."""
        run, lg = self.run, self.run.logging
        self.directory.open()
        self.opened = True
        if jax.process_count() > 1:  # process 0 has prepared the directory
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"rljax run directory {self.run_dir}")
        resume = run.checkpointing.resume
        from rljax.run.checkpoint import Checkpointer  # orbax: imported when a run starts

        checkpoints = self.run_dir / "checkpoints"
        if resume and not checkpoints.is_dir():
            raise self._nothing_to_resume(checkpoints)
        self.ckpt = Checkpointer(checkpoints, keep=run.checkpointing.keep_checkpoints)
        self.ckpt.error_hint = lambda: f"resume with: {self.resume_command()}"
        if resume:
            self.resume_step = self._resumable_step()
            saved = read_config_file(self.run_dir)  # again, now that the directory is locked
        self.log = (
            RunLog(
                self.run_dir,
                append=bool(resume),
                tensorboard=lg.tensorboard,
                wandb_project=lg.wandb_project if lg.wandb else None,
            )
            if self.primary
            else NullRunLog()
        )
        self.log.error_hint = self._write_error_hint
        sections = dict(
            algorithm=self.name,
            algo=dataclasses.asdict(self.config),
            run=dataclasses.asdict(run),
            mesh=self.mesh_info(),
            backend=jax.default_backend(),
            jax_version=jax.__version__,
            processes=jax.process_count(),
        )
        if resume:
            record = resume_record(saved, sections, type(self.config), self.resume_step)
            record["memory_plan"] = self.plan_record()
            self.log.write_config_data({**saved, "resumes": [*saved.get("resumes", []), record]})
            for name, value in record["defaults"].items():
                self.say(f"{name} is not in the saved configuration: default {value!r} taken")
            if record["changed"]:
                self.say("changed on resume: " + "; ".join(describe_changes(record)))
        else:
            from rljax.run.metadata import provenance

            self.log.write_config(
                **sections, provenance=provenance(), memory_plan=self.plan_record(), resumes=[]
            )

    def plan_record(self) -> dict | None:
        """What ``config.json`` records of the memory plan (``None`` before ``compile``)."""
        return None if self.plan is None else self.plan.as_dict()

    def compile(self, console) -> None:
        """Build and compile the chunk (and evaluation) programs, then check the memory plan
        against the budget (``ConfigError`` with the figures; nothing written yet)."""
        run = self.run
        chunk = min(run.logging.log_every, self.config.num_updates)
        self.evaluation = None
        if self.actor_layout is not None:
            staleness = run.parallel.max_staleness
            self.sharded = ActorLearnerRun(
                self.algo, self.actor_layout, self.layout, staleness, chunk
            )
            if run.evaluation.eval_every:
                episodes = run.evaluation.eval_episodes
                self.evaluation = LearnerEvaluation(self.sharded, episodes, run.seed)
        else:
            self.sharded = ShardedRun(self.algo, self.layout, run.num_seeds, chunk)
            if run.evaluation.eval_every:
                self.evaluation = Evaluation(self.sharded, run.evaluation.eval_episodes, run.seed)
        key = jax.random.key(run.seed)
        what = f"the update chunk ({chunk} updates)"
        what += " and the evaluation" if self.evaluation is not None else ""
        with console.compiling(what):
            self.sharded.compile(key)
            if self.evaluation is not None:
                self.sharded.compile_seconds["eval"] = self.evaluation.compile(key)
        seconds = self.sharded.compile_seconds
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        console.line(f"compiled in {sum(seconds.values()):.1f} s ({parts})")
        if self.actor_layout is None:  # the memory plan knows one mesh
            self.plan = plan_of(self.sharded, self.name, run).check()

    def _nothing_to_resume(self, checkpoints: Path) -> TrainingError:
        return TrainingError(
            f"cannot resume {self.run_dir}: no valid checkpoint in {checkpoints.absolute()} "
            "(nothing was started from scratch)"
        )

    def _resumable_step(self) -> int:
        """The newest valid checkpoint's update; an error (nothing written) if there is none or
        the run already has ``num_updates``."""
        step = self.ckpt.latest_valid_step()
        if step is None:
            raise self._nothing_to_resume(self.ckpt.directory)
        cfg = self.config
        if cfg.num_updates <= step:
            per_update = cfg.env_steps_per_update
            raise ConfigError(
                f"{self.run_dir} is already at {step} updates ({step * per_update:,} env steps) "
                f"and total_timesteps={cfg.total_timesteps} asks for {cfg.num_updates}; nothing "
                f"changed; pass --total-timesteps above {step * per_update} (at least "
                f"{(step + 1) * per_update}: one update is {per_update} env steps) to train longer"
            )
        return step

    def _write_error_hint(self) -> str:
        """What a failed write of the run log leaves intact, and how to go on."""
        step = self.last_saved or self.resume_step  # resume_step: before the first chunk
        if not step:
            return "no checkpoint had been written yet"
        return f"the checkpoint at update {step} is intact; resume with: {self.resume_command()}"

    def mesh_info(self) -> dict:
        info = {
            "spec": mesh_spec_of(self.mesh),
            "axis_names": list(self.mesh.axis_names),
            "shape": dict(self.mesh.shape),
            "devices": int(self.mesh.devices.size),
        }
        if self.actor_layout is not None:  # "spec" etc.: the learner's mesh
            actor = self.actor_layout.mesh
            info["actor"] = {"spec": mesh_spec_of(actor), "devices": int(actor.devices.size)}
        return info

    def resume_command(self) -> str:
        if self.name not in registered_names():  # resumed from Python, not the CLI
            return f"train(..., RunConfig.make(resume={str(self.run_dir)!r}))"
        return f"python -m rljax train {self.name} --resume {self.run_dir}"

    def metadata(self, updates_done: int) -> dict:
        from rljax.run.metadata import package_versions

        return {
            "algorithm": self.name,
            "algo": dataclasses.asdict(self.config),
            "run": dataclasses.asdict(self.run),
            "mesh": self.mesh_info(),
            "replicas": self.algo.replicas,
            "num_seeds": self.run.num_seeds,
            "update": updates_done,
            "env_steps": updates_done * self.config.env_steps_per_update,
            "versions": package_versions(),
        }

    def save(self, state, updates_done: int, known_finite: bool = False) -> None:
        self.ckpt.save(updates_done, state, self.metadata(updates_done), known_finite=known_finite)
        self.last_saved, self.last_save_time = updates_done, time.monotonic()

    def restore_latest(self):
        """``(update, state)`` of the newest valid checkpoint, placed on the current mesh (the
        first call after ``open`` of a resume: the step ``open`` found)."""
        step, self.resume_step = self.resume_step, None
        if step is None:
            step = self.ckpt.latest_valid_step()
        if step is None:
            raise TrainingError(
                f"cannot resume {self.run_dir}: no valid checkpoint in {self.ckpt.directory} "
                "(nothing was started from scratch)"
            )
        return step, restore_step(self.ckpt, step, self.sharded)

    def close(self, interrupted: bool = False) -> str:
        """Close the checkpointer and log, then release the run directory; ``interrupted``
        before the first chunk: a fresh run's files are removed. Returns what happened to the
        directory (for the interrupt message)."""
        discard = interrupted and not self.started
        try:
            try:
                if self.ckpt is not None:
                    self.ckpt.close()
            finally:
                if self.log is not None:
                    self.log.close()
        finally:
            removed = self.directory.close(discard=discard)
        if removed:
            return f"removed {self.run_dir} (nothing was trained)"
        if self.directory.fresh and not self.opened:  # stopped while compiling
            return f"nothing was written to {self.run_dir}"
        if self.directory.fresh:
            return f"resume with: {self.resume_command()}" if self.last_saved else ""
        return f"{self.run_dir} is kept; resume it again with: {self.resume_command()}"


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
