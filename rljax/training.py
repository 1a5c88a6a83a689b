"""The host loop: compile once, run jitted chunks, and between chunks log, guard and checkpoint.

``train(algo_config, RunConfig(...))`` is the whole job. Between chunks it only moves metrics to
the host, writes ``metrics.jsonl``, prints progress, checks for non-finite values and saves
orbax checkpoints (``rljax.run.checkpoint``); the training maths stays in the jitted chunk.

* Checkpoints: every ``checkpoint_every`` updates (at chunk ends) and at the end, the whole
  training state (parameters, optimizer and sync state, environment states and observations,
  replay buffer, RNG keys, counters) plus JSON metadata (configs, mesh, replicas, versions,
  env steps). ``resume=<run dir>`` continues from the newest valid checkpoint: same mesh gives
  bitwise the same result as an uninterrupted run; other meshes: see ``rljax.resume``.
* Non-finite guard: a NaN/Inf loss or gradient norm in any update, or non-finite parameters after
  a chunk, stop the run with ``TrainingError`` naming the update and the quantity; the last good
  checkpoint is never overwritten (``Checkpointer.save`` refuses non-finite states too). With
  ``on_nonfinite="rollback"`` the run instead restores the last good checkpoint, replaces the RNG
  key by a fresh split, and continues, at most ``max_rollbacks`` times.
* SIGINT/SIGTERM: the current chunk finishes, a checkpoint is saved, and ``train`` returns with
  ``interrupted=True`` after printing how to resume.
"""

from __future__ import annotations

import dataclasses
import shutil
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rljax.diagnostics import comm_bytes_per_update, communication, describe
from rljax.errors import ConfigError, TrainingError
from rljax.evaluation import Evaluator
from rljax.parallel import mesh_spec_of
from rljax.parallel.rules import prepend_axis, rules_with
from rljax.resume import (
    abstract_state,
    check_compatible,
    read_run_config,
    resize_replicas,
)
from rljax.run_log import NullRunLog, RunLog, default_run_name, plot_learning_curve
from rljax.runner import (
    RunConfig,
    ShardedRun,
    algorithm_name,
    prepare,
    replicate,
    rules_for,
)

GUARDED_METRICS = ("loss", "grad_norm")


@dataclasses.dataclass
class TrainResult:
    state: Any
    metrics: list[dict[str, Any]]  # rows of this call (a resumed run: from the resumed update on)
    run_dir: Path
    compile_seconds: dict[str, float]
    steps_per_second: float
    updates_done: int
    interrupted: bool = False
    resumed_from: int | None = None
    rollbacks: int = 0


class _StopSignals:
    """SIGINT/SIGTERM set a flag instead of killing the process (main thread only)."""

    def __init__(self):
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _rows(metrics, first_update: int, env_steps_per_update: int, num_seeds: int, comm=None):
    metrics = jax.tree.map(_to_host, metrics)
    rows = []
    for i in range(len(metrics["episode_return"])):
        update = first_update + i + 1
        row = {"update": update, "env_steps": update * env_steps_per_update}
        for name, values in metrics.items():
            value = np.asarray(values[i])
            row[name] = value.mean() if num_seeds > 1 else value
        if comm is not None:
            row.update(comm_bytes_per_update(comm, row["optimizer_steps"], row["syncs"]))
        if num_seeds > 1:
            row["episode_return_per_seed"] = np.asarray(metrics["episode_return"][i])
        rows.append(row)
    return rows


def _to_host(x):
    """A replicated (possibly multi-process) array as numpy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        return np.asarray(x.addressable_data(0))
    return np.asarray(x)


def _first_nonfinite(rows) -> tuple[int, str] | None:
    for row in rows:
        for name in GUARDED_METRICS:
            if name in row and not np.all(np.isfinite(row[name])):
                return row["update"], name
    return None


@jax.jit
def _params_finite(params) -> jax.Array:
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(params)]
    return jnp.all(jnp.stack(leaves))


def _fresh_keys(state, salt: int):
    """The state's RNG key(s) replaced by a fresh split (rollback after a non-finite update)."""
    fold = lambda k: jax.random.fold_in(k, 0x5EED + salt)  # noqa: E731
    key = state.key
    key = jax.vmap(fold)(key) if key.ndim else fold(key)
    return state.replace(key=key)


class _Session:
    """One ``train`` call's mutable pieces: mesh, algorithm, run log, checkpointer."""

    def __init__(self, algo_config, run: RunConfig, progress):
        self.algo_config, self.run = algo_config, run
        self.name = algorithm_name(algo_config)
        saved = read_run_config(run.resume) if run.resume else None
        if saved is not None:
            check_compatible(saved, self.name, algo_config, run)
        self.mesh, self.algo = prepare(algo_config, run)  # every ConfigError before any write
        self.primary = jax.process_index() == 0
        self.say = progress if (self.primary and not run.quiet) else (lambda *a, **k: None)
        if run.resume:
            self.run_dir = Path(run.resume)
        else:
            name = run.run_name or default_run_name(self.name, algo_config.env)
            self.run_dir = Path(run.runs_dir) / name
        checkpoints = self.run_dir / "checkpoints"
        if not run.resume and self.primary and checkpoints.exists():
            shutil.rmtree(checkpoints)  # a fresh run replaces an earlier run of the same name
        self.log = (
            RunLog(
                self.run_dir,
                append=bool(run.resume),
                tensorboard=run.tensorboard,
                wandb_project=run.wandb_project if run.wandb else None,
            )
            if self.primary
            else NullRunLog()
        )
        self.log.write_config(
            algorithm=self.name,
            algo=algo_config,
            run=run,
            mesh=self._mesh_info(),
            backend=jax.default_backend(),
            jax_version=jax.__version__,
            processes=jax.process_count(),
        )
        from rljax.run.checkpoint import Checkpointer  # orbax: imported when a run starts

        self.ckpt = Checkpointer(checkpoints, keep=run.keep_checkpoints)
        chunk = min(run.log_every, algo_config.num_updates)
        self.sharded = ShardedRun(self.algo, self.mesh, run.num_seeds, chunk, rules_for(run))
        self.evaluate = None
        if run.eval_every:
            evaluator = Evaluator(self.algo, run.eval_episodes)
            fn = jax.vmap(evaluator) if run.num_seeds > 1 else evaluator
            self.evaluate = jax.jit(fn)
            self.eval_key = jax.random.fold_in(jax.random.key(run.seed), 0xE7A1)

    def _eval_key(self, update: int):
        key = jax.random.fold_in(self.eval_key, update)
        if self.run.num_seeds > 1:
            key = jax.random.split(key, self.run.num_seeds)
        return replicate(self.mesh, key)

    def compile_evaluation(self, key: jax.Array) -> None:
        """Compile the evaluator ahead of time, so no compile lands inside the timed loop."""
        if self.evaluate is None:
            return
        t0 = time.perf_counter()
        params = self.sharded.abstract_state(key).params
        with self.sharded.layout.active():
            self.evaluate = self.evaluate.lower(params, self._eval_key(0)).compile()
        self.sharded.compile_seconds["eval"] = time.perf_counter() - t0

    def evaluation(self, state, update: int) -> dict[str, float]:
        """Greedy evaluation after ``update``; the key depends only on the seed and the update."""
        with self.sharded.layout.active():
            result = self.evaluate(state.params, self._eval_key(update))
        return {k: float(np.mean(_to_host(v))) for k, v in result.items()}

    def _mesh_info(self) -> dict:
        return {
            "spec": mesh_spec_of(self.mesh),
            "axis_names": list(self.mesh.axis_names),
            "shape": dict(self.mesh.shape),
            "devices": int(self.mesh.devices.size),
        }

    def metadata(self, updates_done: int) -> dict:
        from rljax.run.checkpoint import package_versions

        return {
            "algorithm": self.name,
            "algo": dataclasses.asdict(self.algo_config),
            "run": dataclasses.asdict(self.run),
            "mesh": self._mesh_info(),
            "replicas": self.algo.replicas,
            "num_seeds": self.run.num_seeds,
            "update": updates_done,
            "env_steps": updates_done * self.algo_config.env_steps_per_update,
            "versions": package_versions(),
        }

    def save(self, state, updates_done: int) -> None:
        self.ckpt.save(updates_done, state, self.metadata(updates_done))

    def restore_latest(self):
        """``(update, state)`` of the newest valid checkpoint, placed on the current mesh."""
        step = self.ckpt.latest_valid_step()
        if step is None:
            raise TrainingError(
                f"cannot resume {self.run_dir}: no valid checkpoint in {self.ckpt.directory} "
                "(nothing was started from scratch)"
            )
        saved_replicas = self.ckpt.read_metadata(step).get("replicas", self.algo.replicas)
        if saved_replicas == self.algo.replicas:
            state, _ = self.ckpt.restore(step, abstract_state(self.sharded))
            return step, state
        # Another data size: restore the old replica layout (replica axis unsharded), then
        # average it over the old replicas and place it on the new ones.
        rules = rules_with(rules_for(self.run), replica=None)
        old_algo = self.algo.rebuild(replicas=saved_replicas)
        old_run = ShardedRun(
            old_algo, self.mesh, self.run.num_seeds, self.sharded.chunk_size, rules
        )
        old_state, _ = self.ckpt.restore(step, abstract_state(old_run))
        specs = old_algo.state_specs()
        if self.run.num_seeds > 1:
            specs = prepend_axis(specs, "seed")
        resize = jax.jit(
            lambda s: resize_replicas(s, specs, self.algo.replicas),
            out_shardings=self.sharded.state_shardings,
        )
        with self.sharded.layout.active():
            return step, resize(old_state)

    def close(self) -> None:
        try:
            self.ckpt.close()
        finally:
            self.log.close()


def train(algo_config, run: RunConfig | None = None, progress=print) -> TrainResult:
    """Validate, build, compile and run to ``total_timesteps``, logging between chunks.

    Raises ``ConfigError`` (bad input, before anything is written or compiled) and
    ``TrainingError`` (non-finite values, nothing valid to resume).
    """
    run = run or RunConfig()
    session = _Session(algo_config, run, progress)
    try:
        return _train(session)
    finally:
        session.close()


def _train(s: _Session) -> TrainResult:
    run, cfg, say = s.run, s.algo_config, s.say
    say(
        f"rljax {s.name} on {cfg.env}: mesh {mesh_spec_of(s.mesh)} ({jax.default_backend()}, "
        f"{jax.process_count()} process(es)), {run.num_seeds} seed(s), {cfg.num_updates} updates "
        f"x {cfg.env_steps_per_update} steps"
    )
    if run.resume and s.ckpt.latest_valid_step() is None:  # fail before compiling
        raise TrainingError(
            f"cannot resume {s.run_dir}: no valid checkpoint in {s.ckpt.directory} "
            "(nothing was started from scratch)"
        )
    key = jax.random.key(run.seed)
    s.sharded.compile(key)
    s.compile_evaluation(key)
    say(f"compiled in {sum(s.sharded.compile_seconds.values()):.1f} s")
    comm = None
    if run.measure_comm:
        comm = communication(s.algo, s.sharded.layout)
        s.log.write_extra("communication", comm)
        say("communication per optimizer step per device (bytes): " + describe(comm))

    resumed_from = None
    if run.resume:
        done, state = s.restore_latest()
        resumed_from = done
        s.log.truncate(done)  # rows written after that checkpoint are recomputed
        say(f"resumed from update {done} ({done * cfg.env_steps_per_update:,} env steps)")
    else:
        done, state = 0, s.sharded.init(key)
    num_updates, per_update, seeds = cfg.num_updates, cfg.env_steps_per_update, run.num_seeds
    start, last_saved, rollbacks, injected = done, done, 0, False
    all_rows: list[dict] = []
    t_start = time.perf_counter()
    with _StopSignals() as stop:
        while done < num_updates:
            count = min(s.sharded.chunk_size, num_updates - done)
            state, metrics = s.sharded.run_chunk(state, count)
            metrics = jax.tree.map(lambda m, n=count: m[:n], metrics)
            if run.debug_nonfinite_at and not injected and done < run.debug_nonfinite_at:
                if run.debug_nonfinite_at <= done + count:
                    state, injected = _poison(s, state), True
            rows = _rows(metrics, done, per_update, seeds, comm)  # waits for the chunk
            problem = _first_nonfinite(rows)
            if problem is None and not bool(_to_host(_params_finite(state.params))):
                problem = (done + count, "parameters")
            if problem is not None:
                if run.on_nonfinite == "rollback" and rollbacks < run.max_rollbacks:
                    rollbacks += 1
                    done, state = _rollback(s, problem, rollbacks)
                    all_rows = [r for r in all_rows if r["update"] <= done]
                    continue
                raise TrainingError(_nonfinite_message(s, problem, last_saved))
            if s.evaluate is not None and (done + count) // run.eval_every > done // run.eval_every:
                rows[-1].update(s.evaluation(state, done + count))
            s.ckpt.poll()  # the previous checkpoint becomes durable as soon as it is written
            s.log.append(rows)
            all_rows.extend(rows)
            done += count
            elapsed = time.perf_counter() - t_start
            sps = (done - start) * per_update * seeds / max(elapsed, 1e-9)
            recent = np.mean([r["episode_return"] for r in rows])
            last = rows[-1]
            evaluated = f"  eval {last['eval_return']:8.1f}" if "eval_return" in last else ""
            say(
                f"  update {done:>6}/{num_updates}  env steps {done * per_update:>10,}  "
                f"{sps:>10,.0f} steps/s  return {recent:8.1f}{evaluated}"
            )
            if stop.received or done - last_saved >= run.checkpoint_every or done == num_updates:
                s.save(state, done)
                last_saved = done
            if stop.received:
                s.ckpt.wait()
                say(
                    f"{stop.received}: stopped after update {done}/{num_updates}; checkpoint "
                    f"saved in {s.ckpt.directory}. Resume with:\n  python -m rljax.train "
                    f"{s.name} --resume {s.run_dir}"
                )
                break
    s.ckpt.wait()
    elapsed = time.perf_counter() - t_start
    steps_per_second = (done - start) * per_update * seeds / max(elapsed, 1e-9)
    if s.primary:
        plot_learning_curve(s.log.metrics_path, s.log.plot_path, f"{s.name} {cfg.env}")
        say(f"wrote {s.log.config_path}\n      {s.log.metrics_path}\n      {s.log.plot_path}")
    return TrainResult(
        state,
        all_rows,
        s.run_dir,
        s.sharded.compile_seconds,
        steps_per_second,
        done,
        interrupted=bool(stop.received),
        resumed_from=resumed_from,
        rollbacks=rollbacks,
    )


def _poison(s: _Session, state):
    """Fault injection for tests (``debug_nonfinite_at``): NaN parameters."""
    shardings = s.sharded.state_shardings.params
    poison = jax.jit(lambda p: jax.tree.map(lambda x: x * jnp.nan, p), out_shardings=shardings)
    with s.sharded.layout.active():
        return state.replace(params=poison(state.params))


def _nonfinite_message(s: _Session, problem, last_saved: int) -> str:
    update, quantity = problem
    where = (
        f"the last good checkpoint (update {last_saved}) in {s.ckpt.directory} is untouched; "
        f"resume with: python -m rljax.train {s.name} --resume {s.run_dir}"
        if last_saved
        else "no checkpoint had been written yet"
    )
    return f"non-finite {quantity} (NaN/Inf) at update {update}; stopped. {where}"


def _rollback(s: _Session, problem, rollbacks: int):
    update, quantity = problem
    s.ckpt.wait()
    step = s.ckpt.latest_valid_step()
    if step is None:
        raise TrainingError(
            f"non-finite {quantity} (NaN/Inf) at update {update} and no checkpoint to roll back to"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("default")
        done, state = s.restore_latest()
    state = _fresh_keys(state, rollbacks)
    with s.sharded.layout.active():
        state = jax.device_put(state, s.sharded.state_shardings)
    s.log.truncate(done)
    s.say(
        f"non-finite {quantity} at update {update}: rolled back to update {done} with a fresh "
        f"RNG split ({rollbacks}/{s.run.max_rollbacks})"
    )
    return done, state


def replicated(mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


__all__ = ["ConfigError", "TrainResult", "TrainingError", "train"]
