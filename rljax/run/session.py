"""``Session``: one ``train`` call's pieces (mesh, algorithm, run directory, run log,
checkpointer, printing) from validation to release; ``rljax.run.training`` runs the loop.

    session = Session(PPOConfig(), RunConfig.make(mesh="data=2"), print)  # validates only
    session.compile(console)   # the chunk (and evaluation) programs; the memory plan checked
    session.open()             # creates and locks the run directory; run log, checkpointer
    ...
    session.close()            # on every exit path: closes, then releases the directory
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax

from rljax.errors import ConfigError, TrainingError
from rljax.parallel import mesh_spec_of
from rljax.run import compile_cache, memory
from rljax.run.actor_learner import (
    ActorLearnerRun,
    LearnerEvaluation,
    is_actor_learner,
    prepare_actor_learner,
    validate_actor_learner,
)
from rljax.run.config import RunConfig
from rljax.run.evaluation import Evaluation
from rljax.run.plan import plan_of
from rljax.run.plan_actor_learner import plan_actor_learner
from rljax.run.resume import (
    check_compatible,
    describe_changes,
    read_config_file,
    read_run_config,
    restore_step,
    resume_record,
)
from rljax.run.run_dir import RunDirectory, safe_name
from rljax.run.run_log import NullRunLog, RunLog, default_run_name
from rljax.run.sharded import (
    ShardedRun,
    algorithm_name,
    prepare,
    registered_names,
    resolve_algorithm,
)


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
            self.sharded = ShardedRun(
                self.algo, self.layout, run.num_seeds, chunk, run.parallel.seed_group
            )
            if run.evaluation.eval_every:
                self.evaluation = Evaluation(self.sharded, run.evaluation.eval_episodes, run.seed)
        cache = compile_cache.use(run.parallel.compile_cache)
        key = jax.random.key(run.seed)
        what = f"the update chunk ({chunk} updates)"
        what += " and the evaluation" if self.evaluation is not None else ""
        with console.compiling(what):
            self.sharded.compile(key)
            if self.evaluation is not None:
                self.sharded.compile_seconds["eval"] = self.evaluation.compile(key)
        seconds = self.sharded.compile_seconds
        parts = ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items())
        cached = f"; compilation cache {cache}" if cache else ""
        console.line(f"compiled in {sum(seconds.values()):.1f} s ({parts}){cached}")
        if self.actor_layout is None:
            self.plan = plan_of(self.sharded, self.name, run).check()
        else:
            self.plan = plan_actor_learner(self.sharded, self.name, run).check()

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
