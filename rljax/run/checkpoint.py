"""Training-state checkpoints on orbax: async saves, keep-last-k, exact and elastic resume.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, state, {"config": ..., "mesh": ...})   # any JSON metadata
    ...
    ckpt.wait()                                          # the last async save is durable
    step, state, meta = ckpt.restore_latest(abstract_of(state_like, shardings_on_new_mesh))
    ckpt.close()

The on-disk layout of a step, and what makes it valid, is described in ``rljax.run.integrity``.
Multi-process: every process calls every method; the checkpoint directory must be on a filesystem
every process sees (local or network-mounted).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from rljax.errors import RunWriteError, TrainingError, describe_os_error, warn_from_caller
from rljax.run import integrity
from rljax.run.integrity import FORMAT_VERSION, MANIFEST_NAME, agree, is_primary, is_prng_key

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "CheckpointError",
    "CheckpointWarning",
    "CheckpointWriteError",
    "Checkpointer",
    "NonFiniteStateError",
    "abstract_of",
]

_ITEM_STATE, _ITEM_METADATA, _ITEM_LAYOUT = "state", "metadata", "layout"


class CheckpointError(TrainingError):
    """A checkpoint cannot be written or read; the message says which step and why (a
    ``TrainingError``: the CLI prints it as one ``error:`` line)."""


class CheckpointWriteError(CheckpointError, RunWriteError):
    """Writing a step failed (full disk, I/O error): the message names the step, the directory
    and the cause, and the newest valid step, which the failed save left intact."""


class NonFiniteStateError(CheckpointError):
    """``save`` refused a state with NaN/inf in a floating leaf (the message names the leaves)."""


class CheckpointWarning(UserWarning):
    """A damaged or unfinished step was skipped."""


def _warn(message: str) -> None:
    warn_from_caller(message, CheckpointWarning)


integrity.quiet_orbax_save_errors()


def abstract_of(tree, shardings=None):
    """``jax.ShapeDtypeStruct`` with sharding for every leaf of ``tree`` (arrays or abstract).

    ``shardings`` (same structure) replaces the leaves' own shardings, e.g. the ``NamedSharding``
    of every leaf on the mesh to restore onto.
    """
    if shardings is None:
        return jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree
        )
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


# -- typed PRNG keys: stored as key_data, re-wrapped with the abstract dtype's implementation ---


def _key_data_abstract(leaf) -> tuple[jax.ShapeDtypeStruct, Any]:
    """``key<impl>[S]`` -> (``uint32[S, *key_shape]`` with the same sharding, impl)."""
    impls = []

    def unwrap(k):
        impls.append(jax.random.key_impl(k))
        return jax.random.key_data(k)

    data = jax.eval_shape(unwrap, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    # A NamedSharding's spec leaves the trailing key axes replicated, so it fits as it is.
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding), impls[0]


def _storable_abstract(leaves: list) -> tuple[list, dict[int, Any]]:
    """Abstract leaves as orbax restores them (keys as key data), and ``{index: key impl}``."""
    impls, storable = {}, []
    for i, leaf in enumerate(leaves):
        if is_prng_key(leaf):
            data, impls[i] = _key_data_abstract(leaf)
            storable.append(data)
        else:
            storable.append(jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding))
    return storable, impls


# -- orbax's raw-bytes telemetry leaks --------------------------------------------------------


def _disable_raw_bytes_telemetry() -> None:
    """Stop orbax from polling TensorStore's I/O counters around every array save.

    Orbax (0.12) calls ``ts_utils.get_tensorstore_raw_bytes`` before and after each save to log
    the raw bytes written; it reads them with ``tensorstore.experimental_collect_matching_metrics``,
    which (tensorstore 0.1.86) leaks every value list it returns: ~20 KB of memory per checkpoint
    save that is never freed, so memory grows with the length of a run. The counters only feed
    an INFO log line and ``jax.monitoring`` events; with the probe returning 0 orbax skips both.
    Process-wide and idempotent; a no-op if a future orbax no longer has the function.
    """
    try:
        from orbax.checkpoint._src.serialization import tensorstore_utils
    except ImportError:
        return
    if hasattr(tensorstore_utils, "get_tensorstore_raw_bytes"):
        tensorstore_utils.get_tensorstore_raw_bytes = _no_raw_bytes


def _no_raw_bytes(*_args, **_kwargs) -> int:
    return 0


class Checkpointer:
    """Orbax ``CheckpointManager`` over one directory: async saves, keep the last ``keep`` steps
    (None: all), manifest-verified restores. ``async_save=False`` makes ``save`` block.

    Old steps are pruned here, not by orbax, and only after the newer step's manifest is written:
    a crash never leaves fewer valid steps than before the save. With several processes, orbax
    synchronises the saves; process 0 writes manifests and decides which step is valid.
    """

    def __init__(self, directory, keep: int | None = 3, async_save: bool = True):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be a positive int or None (keep all), got {keep!r}")
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.async_save = async_save
        _disable_raw_bytes_telemetry()
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=async_save, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._pending: int | None = None  # saved, not yet durable + manifested
        self._known_damaged: set[int] = set()  # newer steps left behind by an abandoned run
        self._closed = False
        # What a CheckpointWriteError adds at its end (e.g. how to resume the run).
        self.error_hint: Callable[[], str] | None = None

    # -- writing -----------------------------------------------------------------------------

    def save(self, step: int, state, metadata: dict, *, known_finite: bool = False) -> None:
        """Write ``state`` (any pytree of arrays, typed keys allowed) and JSON ``metadata``;
        ``known_finite``: the caller has counted the state's NaN/inf values (none), so the
        check below does not run again.

        Returns once the arrays are copied to host (async) or written (sync). Raises
        ``NonFiniteStateError`` naming every floating leaf with NaN/inf, and ``CheckpointError``
        if ``step`` already holds a valid checkpoint; nothing is written or deleted then.
        A damaged or unfinished checkpoint at ``step`` is replaced (with a warning).
        """
        self._check_open()
        step = int(step)
        try:
            metadata_text = json.dumps(metadata)
        except (TypeError, ValueError) as e:
            raise TypeError(f"checkpoint metadata must be JSON-serialisable: {e}") from None
        bad = [] if known_finite else integrity.nonfinite_leaves(state)
        if bad:
            raise NonFiniteStateError(
                f"refusing to save step {step} to {self.directory}: non-finite values (NaN/inf) "
                f"in {len(bad)} leaf/leaves: " + "; ".join(bad) + ". The previous checkpoints "
                "are untouched."
            )
        self._finish_pending()
        self._clear_step_for_save(step)
        storable = jax.tree.map(lambda x: jax.random.key_data(x) if is_prng_key(x) else x, state)
        args = ocp.args.Composite(
            **{
                _ITEM_STATE: ocp.args.StandardSave(storable),
                _ITEM_METADATA: ocp.args.JsonSave(json.loads(metadata_text)),
                _ITEM_LAYOUT: ocp.args.JsonSave(integrity.layout_record(state)),
            }
        )
        try:
            self._manager.save(step, args=args, force=True)
        except Exception as e:
            raise self._write_error(step, e) from e
        self._pending = step
        if not self.async_save:
            self._finish_pending()

    def wait(self) -> None:
        """Block until the last save is durable, its manifest written and old steps pruned."""
        self._check_open()
        self._finish_pending()

    def poll(self) -> None:
        """Without blocking: if the last async save has finished, make it durable now (manifest,
        pruning), so that a run killed later keeps it. Process 0 decides for every process."""
        self._check_open()
        if self._pending is None:
            return
        if agree(0 if self._manager.is_saving_in_progress() else 1):
            self._finish_pending()

    def _finish_pending(self) -> None:
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise self._write_error(step, e) from e
        if step is None:
            return
        try:
            if is_primary():
                integrity.write_manifest(self._step_dir(step), step)
        except OSError as e:
            raise self._write_error(step, e) from e
        integrity.barrier(f"rljax_checkpoint_manifest_{step}")
        self._prune(step)

    def _write_error(self, step: int | None, error: BaseException) -> CheckpointWriteError:
        """One line: the step, the directory, the cause, the newest valid step (untouched: a
        step without its manifest is never chosen) and ``error_hint``."""
        try:
            intact, _ = integrity.newest_valid_step(
                self.directory, [s for s in self._manager.all_steps() if s != step]
            )
        except Exception:  # the message must not fail in its turn
            intact = None
        kept = (
            f"the checkpoint at step {intact} is intact"
            if intact is not None
            else "no earlier checkpoint exists"
        )
        hint = self.error_hint() if self.error_hint is not None and intact is not None else ""
        which = f"checkpoint step {step}" if step is not None else "a checkpoint"
        return CheckpointWriteError(
            f"could not write {which} to {self.directory}: {describe_os_error(error)}; {kept}"
            + (f"; {hint}" if hint else "")
        )

    def _prune(self, newest: int) -> None:
        """Keep ``newest`` and the ``keep - 1`` steps before it; steps after it (left by an
        abandoned run) stay until overwritten. Unfinished temporary dirs before it go too."""
        if self.keep is None:
            return
        older = sorted(s for s in self._manager.all_steps() if s < newest)
        for old in older[: max(0, len(older) - (self.keep - 1))]:
            self._manager.delete(old)
        if is_primary():
            for tmp_step, path in integrity.unfinished_saves(self.directory):
                if tmp_step < newest:
                    shutil.rmtree(path, ignore_errors=True)

    def _clear_step_for_save(self, step: int) -> None:
        """Refuse to overwrite a valid ``step`` or to save behind a valid newer step (that would
        fork the run's history: ``restore_latest`` would pick the newer one); replace a damaged
        ``step``. Decided by process 0."""
        step_dir = self._step_dir(step)
        exists = step in self._manager.all_steps() or step_dir.exists()
        problem = integrity.verify_step(step_dir) if exists and is_primary() else None
        newer_valid = -1
        if is_primary():
            for newer in sorted((s for s in self._manager.all_steps() if s > step), reverse=True):
                if newer not in self._known_damaged:
                    if integrity.verify_step(self._step_dir(newer)) is None:
                        newer_valid = newer
                        break
                    self._known_damaged.add(newer)
        newer_valid = agree(newer_valid)
        if newer_valid >= 0:
            raise CheckpointError(
                f"cannot save step {step} to {self.directory}: it already holds a valid newer "
                f"step {newer_valid}, which restore_latest would prefer. Resume from the latest "
                "step, or delete the newer steps first"
            )
        # 0: free, 1: damaged (replace), 2: valid (refuse).
        verdict = agree(0 if not exists else (1 if problem else 2))
        if verdict == 2:
            raise CheckpointError(
                f"checkpoint step {step} already exists in {self.directory} and is valid; "
                "refusing to overwrite it (delete it, or resume from the latest step instead)"
            )
        if verdict == 1:
            if is_primary():
                _warn(f"replacing damaged checkpoint step {step} in {self.directory} ({problem})")
            if step in self._manager.all_steps():
                self._manager.delete(step)
            elif is_primary():
                shutil.rmtree(step_dir, ignore_errors=True)
            integrity.barrier(f"rljax_checkpoint_clear_{step}")

    # -- reading -----------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """Committed steps, ascending (an async save still in flight is not listed)."""
        self._check_open()
        steps = set(self._manager.all_steps())
        if self._pending is not None and self._manager.is_saving_in_progress():
            steps.discard(self._pending)
        return sorted(steps)

    def latest_valid_step(self, abstract_state=None) -> int | None:
        """Newest step whose files match its manifest; None if there is none.

        Newer damaged or unfinished steps are skipped with a ``CheckpointWarning`` naming the
        step and the reason. With ``abstract_state``, the chosen step must also hold a state of
        that structure, shapes and dtypes (``CheckpointError`` otherwise: an older step would not
        fit either, so nothing is skipped for that).
        """
        step, _ = self._find_valid()
        if step is not None and abstract_state is not None:
            self._check_layout(step, abstract_state)
        return step

    def _find_valid(self) -> tuple[int | None, list[str]]:
        """(newest valid step, reasons for every newer step skipped); warns once per skip."""
        self._check_open()
        self._finish_pending()
        self._manager.reload()
        chosen, tried = None, []
        if is_primary():
            chosen, skipped = integrity.newest_valid_step(self.directory, self._manager.all_steps())
            for step, problem in skipped:
                tried.append(f"step {step}: {problem}")
                _warn(f"skipping checkpoint step {step} in {self.directory}: {problem}")
        chosen = agree(-1 if chosen is None else chosen)
        return (None if chosen < 0 else chosen), tried

    def restore(self, step: int, abstract_state) -> tuple[Any, dict]:
        """``(state, metadata)`` of ``step``, every array placed as ``abstract_state`` says.

        ``abstract_state``: pytree of ``jax.ShapeDtypeStruct`` (or arrays) with ``.sharding``,
        e.g. ``NamedSharding``s on the current mesh; it may differ from the mesh the step was
        written on (elastic restore). Raises ``CheckpointError`` if the step is missing,
        damaged, or holds a differently shaped state.
        """
        self._check_open()
        self._finish_pending()
        step = int(step)
        if step not in self._manager.all_steps():
            self._manager.reload()
        if step not in self._manager.all_steps():
            raise CheckpointError(
                f"no checkpoint step {step} in {self.directory}; steps: {self.steps()}"
            )
        problem = integrity.verify_step(self._step_dir(step)) if is_primary() else None
        if agree(1 if problem else 0):
            raise CheckpointError(f"checkpoint step {step} in {self.directory} is {problem}")
        return self._restore_verified(step, abstract_state)

    def restore_latest(self, abstract_state) -> tuple[int, Any, dict]:
        """``(step, state, metadata)`` of the newest valid step, skipping damaged ones with a
        warning. Raises ``CheckpointError`` listing what was tried if no valid step exists."""
        step, tried = self._find_valid()
        if step is None:
            if not is_primary():
                detail = "see the warnings of process 0"
            else:
                detail = "; ".join(tried) if tried else "no checkpoint steps"
            raise CheckpointError(f"no valid checkpoint in {self.directory}: {detail}")
        state, metadata = self._restore_verified(step, abstract_state)
        return step, state, metadata

    def read_metadata(self, step: int) -> dict:
        """The JSON metadata saved with ``step``."""
        return self._read_json(int(step), _ITEM_METADATA)

    def _restore_verified(self, step: int, abstract_state) -> tuple[Any, dict]:
        for path, leaf in jax.tree_util.tree_flatten_with_path(abstract_state)[0]:
            if getattr(leaf, "sharding", None) is None:
                raise ValueError(
                    f"abstract_state leaf {jax.tree_util.keystr(path)} has no sharding; build it "
                    "with jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec)) "
                    "or rljax.run.checkpoint.abstract_of(...)"
                )
        self._check_layout(step, abstract_state)
        leaves, treedef = jax.tree.flatten(abstract_state)
        storable, impls = _storable_abstract(leaves)
        args = ocp.args.Composite(
            **{
                _ITEM_STATE: ocp.args.StandardRestore(jax.tree.unflatten(treedef, storable)),
                _ITEM_METADATA: ocp.args.JsonRestore(),
            }
        )
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:
            raise CheckpointError(
                f"reading checkpoint step {step} in {self.directory} failed: {e}"
            ) from e
        # Rebuilt on the caller's treedef: the same node types, whatever orbax hands back.
        values = jax.tree.leaves(restored[_ITEM_STATE])
        if len(values) != len(leaves):
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory}: restored {len(values)} arrays, "
                f"abstract_state has {len(leaves)}"
            )
        values = [
            jax.random.wrap_key_data(x, impl=impls[i]) if i in impls else x
            for i, x in enumerate(values)
        ]
        return jax.tree.unflatten(treedef, values), restored[_ITEM_METADATA]

    def _check_layout(self, step: int, abstract_state) -> None:
        problems = integrity.layout_mismatch(self._read_json(step, _ITEM_LAYOUT), abstract_state)
        if problems:
            shown = "; ".join(problems[:20]) + (" ..." if len(problems) > 20 else "")
            raise CheckpointError(
                f"checkpoint step {step} in {self.directory} holds a different state structure "
                f"than abstract_state ({len(problems)} difference(s)): {shown}"
            )

    def _read_json(self, step: int, item: str) -> dict:
        self._check_open()
        try:
            return self._manager.restore(
                step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()})
            )[item]
        except Exception as e:
            raise CheckpointError(
                f"cannot read {item} of checkpoint step {step} in {self.directory}: {e}"
            ) from e

    # -- lifetime ----------------------------------------------------------------------------

    def _step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def _check_open(self) -> None:
        if self._closed:
            raise CheckpointError(f"Checkpointer for {self.directory} is closed")

    def close(self) -> None:
        """Finish the last save (durable, manifest, pruning) and release orbax's threads."""
        if self._closed:
            return
        try:
            self._finish_pending()
        finally:
            self._closed = True
            self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
