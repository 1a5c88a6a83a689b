"""Training-state checkpoints on orbax: async saves, keep-last-k, exact and elastic resume.

    ckpt = Checkpointer(run_dir / "checkpoints", keep=3)
    ckpt.save(step, state, {"config": ..., "mesh": ..., "versions": package_versions()})
    ...
    ckpt.wait()                                          # the last async save is durable
    step, state, meta = ckpt.restore_latest(abstract_of(state_like, shardings_on_new_mesh))
    ckpt.close()

Layout of one step, ``<directory>/<step>/``: orbax's ``state/`` (the arrays, OCDBT/zarr),
``metadata/`` (the caller's JSON), ``layout/`` (leaf paths, shapes, dtypes, saved partition specs)
and ``rljax_manifest.json`` (size and crc32 of every other file in the step). The manifest is
written once orbax has committed the step (renamed its temporary directory) and the save is
durable; a step without one was interrupted, and a step whose files disagree with it is damaged.
Both are skipped by ``latest_valid_step``/``restore_latest`` with a ``CheckpointWarning``.

Typed PRNG keys are stored as their ``key_data`` (uint32) and re-wrapped on restore with the
implementation named by the abstract dtype, so the files do not depend on orbax's key support.
Old steps are pruned by this module, not orbax, and only after the newer step's manifest is
written: a crash can never leave fewer valid steps behind than before the save began.

Multi-process: every process calls every method (orbax synchronises the saves); process 0 writes
manifests and decides which step is valid, and its answer is broadcast so all processes agree.
The checkpoint directory must be on a filesystem every process sees (local or network-mounted).
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import platform
import re
import shutil
import warnings
import zlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec

MANIFEST_NAME = "rljax_manifest.json"
FORMAT_VERSION = 1
_ITEM_STATE, _ITEM_METADATA, _ITEM_LAYOUT = "state", "metadata", "layout"
# Orbax writes a step into "<step>.orbax-checkpoint-tmp*" and renames it when committed.
_TMP_DIR = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")
_CRC_CHUNK = 16 << 20
_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "gymnax", "rljax")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be written or read; the message says which step and why."""


class NonFiniteStateError(CheckpointError):
    """``save`` refused a state with NaN/inf in a floating leaf (the message names the leaves)."""


class CheckpointWarning(UserWarning):
    """A damaged or unfinished step was skipped."""


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


def _is_key(x) -> bool:
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


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


def _key_data_abstract(leaf) -> tuple[jax.ShapeDtypeStruct, Any]:
    """``key<impl>[S]`` -> (``uint32[S, *key_shape]`` with the same sharding, impl)."""
    impls = []

    def unwrap(k):
        impls.append(jax.random.key_impl(k))
        return jax.random.key_data(k)

    data = jax.eval_shape(unwrap, jax.ShapeDtypeStruct(leaf.shape, leaf.dtype))
    # A NamedSharding's spec leaves the trailing key axes replicated, so it fits as it is.
    return jax.ShapeDtypeStruct(data.shape, data.dtype, sharding=leaf.sharding), impls[0]


def _spec_json(sharding) -> list | None:
    if not isinstance(sharding, NamedSharding):
        return None
    return [list(a) if isinstance(a, tuple) else a for a in sharding.spec]


def _layout(state) -> dict:
    leaves, _ = jax.tree_util.tree_flatten_with_path(state)
    meshes = [
        x.sharding.mesh
        for _, x in leaves
        if isinstance(getattr(x, "sharding", None), NamedSharding)
    ]
    return {
        "format": FORMAT_VERSION,
        "mesh": {str(a): int(n) for a, n in meshes[0].shape.items()} if meshes else None,
        "leaves": [
            {
                "path": jax.tree_util.keystr(path),
                "shape": list(np.shape(x)),
                "dtype": str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype),
                "spec": _spec_json(getattr(x, "sharding", None)),
            }
            for path, x in leaves
        ],
    }


def _layout_mismatch(saved: dict, abstract) -> list[str]:
    requested = {leaf["path"]: leaf for leaf in _layout(abstract)["leaves"]}
    stored = {leaf["path"]: leaf for leaf in saved["leaves"]}
    problems = [f"missing in checkpoint: {p}" for p in requested if p not in stored]
    problems += [f"not in abstract_state: {p}" for p in stored if p not in requested]
    for path in requested.keys() & stored.keys():
        want, have = requested[path], stored[path]
        if (want["shape"], want["dtype"]) != (have["shape"], have["dtype"]):
            problems.append(
                f"{path}: saved {have['dtype']}{have['shape']}, requested "
                f"{want['dtype']}{want['shape']}"
            )
    return sorted(problems)


@functools.lru_cache(maxsize=32)
def _nonfinite_counter(out_sharding):
    def count(leaves):
        return jnp.stack([jnp.count_nonzero(~jnp.isfinite(x)) for x in leaves])

    return jax.jit(count, out_shardings=out_sharding)


def _nonfinite_leaves(state) -> list[str]:
    """Paths (with counts) of floating leaves holding NaN/inf. One compiled reduction per mesh;
    its replicated result is the same on every process, so all processes refuse together."""
    groups: dict[Any, list[tuple[str, Any]]] = {}
    bad = []
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        dtype = getattr(x, "dtype", None)
        if dtype is None or _is_key(x) or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        name = jax.tree_util.keystr(path)
        if not isinstance(x, jax.Array):
            count = int(np.count_nonzero(~np.isfinite(np.asarray(x))))
            if count:
                bad.append(f"{name} ({count} of {np.size(x)} values)")
            continue
        sharding = x.sharding
        group = sharding.mesh if isinstance(sharding, NamedSharding) else sharding.device_set
        groups.setdefault(group, []).append((name, x))
    for group, items in groups.items():
        out = (
            NamedSharding(group, PartitionSpec()) if isinstance(group, jax.sharding.Mesh) else None
        )
        counts = np.asarray(_nonfinite_counter(out)([x for _, x in items]))
        bad += [
            f"{name} ({int(c)} of {x.size} values)"
            for (name, x), c in zip(items, counts, strict=True)
            if c
        ]
    return bad


def _file_crc32(path: Path) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _step_files(step_dir: Path) -> list[str]:
    return sorted(
        str(p.relative_to(step_dir))
        for p in step_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    )


def _primary() -> bool:
    return jax.process_index() == 0


def _agree(value: int) -> int:
    """Process 0's ``value`` on every process (decisions that lead to collective orbax calls)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(value)))


def _barrier(name: str) -> None:
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


class Checkpointer:
    """Orbax ``CheckpointManager`` over one directory: async saves, keep the last ``keep`` steps,
    manifest-verified restores (see the module docstring for the on-disk layout)."""

    def __init__(self, directory, keep: int | None = 3, async_save: bool = True):
        if keep is not None and (not isinstance(keep, int) or keep < 1):
            raise ValueError(f"keep must be a positive int or None (keep all), got {keep!r}")
        self.directory = Path(directory).absolute()
        self.keep = keep
        self.async_save = async_save
        # Orbax keeps every step (no max_to_keep): pruning waits for the newer step's manifest.
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=async_save, create=True)
        self._manager = ocp.CheckpointManager(self.directory, options=options)
        self._pending: int | None = None  # saved, not yet durable + manifested
        self._known_damaged: set[int] = set()  # newer steps left behind by an abandoned run
        self._closed = False

    # -- writing -----------------------------------------------------------------------------

    def save(self, step: int, state, metadata: dict) -> None:
        """Write ``state`` (any pytree of arrays, typed keys allowed) and JSON ``metadata``.

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
        bad = _nonfinite_leaves(state)
        if bad:
            raise NonFiniteStateError(
                f"refusing to save step {step} to {self.directory}: non-finite values (NaN/inf) "
                f"in {len(bad)} leaf/leaves: " + "; ".join(bad) + ". The previous checkpoints "
                "are untouched."
            )
        self._finish_pending()
        self._clear_step_for_save(step)
        layout = _layout(state)
        storable = jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, state)
        args = ocp.args.Composite(
            **{
                _ITEM_STATE: ocp.args.StandardSave(storable),
                _ITEM_METADATA: ocp.args.JsonSave(json.loads(metadata_text)),
                _ITEM_LAYOUT: ocp.args.JsonSave(layout),
            }
        )
        self._manager.save(step, args=args, force=True)
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
        finished = _agree(0 if self._manager.is_saving_in_progress() else 1)
        if finished:
            self._finish_pending()

    def _finish_pending(self) -> None:
        step, self._pending = self._pending, None
        try:
            self._manager.wait_until_finished()
        except Exception as e:
            raise CheckpointError(f"saving checkpoint step {step} failed: {e}") from e
        if step is None:
            return
        if _primary():
            self._write_manifest(step)
        _barrier(f"rljax_checkpoint_manifest_{step}")
        self._prune(step)

    def _write_manifest(self, step: int) -> None:
        step_dir = self._step_dir(step)
        files = {
            name: {"size": (step_dir / name).stat().st_size, "crc32": _file_crc32(step_dir / name)}
            for name in _step_files(step_dir)
        }
        manifest = {"format": FORMAT_VERSION, "step": step, "files": files}
        tmp = step_dir / (MANIFEST_NAME + ".tmp")
        with open(tmp, "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, step_dir / MANIFEST_NAME)

    def _prune(self, newest: int) -> None:
        """Keep ``newest`` and the ``keep - 1`` steps before it; steps after it (left by an
        abandoned run) stay until overwritten. Unfinished temporary dirs before it go too."""
        if self.keep is None:
            return
        older = sorted(s for s in self._manager.all_steps() if s < newest)
        for old in older[: max(0, len(older) - (self.keep - 1))]:
            self._manager.delete(old)
        if _primary():
            for path, tmp_step in self._tmp_dirs():
                if tmp_step < newest:
                    shutil.rmtree(path, ignore_errors=True)

    def _clear_step_for_save(self, step: int) -> None:
        """Refuse to overwrite a valid ``step`` or to save behind a valid newer step (that would
        fork the run's history: ``restore_latest`` would pick the newer one); replace a damaged
        ``step``. Decided by process 0."""
        step_dir = self._step_dir(step)
        exists = step in self._manager.all_steps() or step_dir.exists()
        problem = self._verify(step) if exists and _primary() else None
        newer_valid = -1
        if _primary():
            for newer in sorted((s for s in self._manager.all_steps() if s > step), reverse=True):
                if newer not in self._known_damaged:
                    if self._verify(newer) is None:
                        newer_valid = newer
                        break
                    self._known_damaged.add(newer)
        newer_valid = _agree(newer_valid)
        if newer_valid >= 0:
            raise CheckpointError(
                f"cannot save step {step} to {self.directory}: it already holds a valid newer "
                f"step {newer_valid}, which restore_latest would prefer. Resume from the latest "
                "step, or delete the newer steps first"
            )
        # 0: free, 1: damaged (replace), 2: valid (refuse).
        verdict = _agree(0 if not exists else (1 if problem else 2))
        if verdict == 2:
            raise CheckpointError(
                f"checkpoint step {step} already exists in {self.directory} and is valid; "
                "refusing to overwrite it (delete it, or resume from the latest step instead)"
            )
        if verdict == 1:
            if _primary():
                warnings.warn(
                    f"replacing damaged checkpoint step {step} in {self.directory} ({problem})",
                    CheckpointWarning,
                    stacklevel=3,
                )
            if step in self._manager.all_steps():
                self._manager.delete(step)
            elif _primary():
                shutil.rmtree(step_dir, ignore_errors=True)
            _barrier(f"rljax_checkpoint_clear_{step}")

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
        if _primary():
            unfinished = {s: p for p, s in self._tmp_dirs()}
            candidates = sorted(set(self._manager.all_steps()) | set(unfinished), reverse=True)
            for step in candidates:
                if step in unfinished and step not in self._manager.all_steps():
                    problem = f"unfinished save (temporary directory {unfinished[step].name})"
                else:
                    problem = self._verify(step)
                if problem is None:
                    chosen = step
                    break
                tried.append(f"step {step}: {problem}")
                warnings.warn(
                    f"skipping checkpoint step {step} in {self.directory}: {problem}",
                    CheckpointWarning,
                    stacklevel=3,
                )
        chosen = _agree(-1 if chosen is None else chosen)
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
        problem = self._verify(step) if _primary() else None
        if _agree(1 if problem else 0):
            raise CheckpointError(f"checkpoint step {step} in {self.directory} is {problem}")
        return self._restore_verified(step, abstract_state)

    def restore_latest(self, abstract_state) -> tuple[int, Any, dict]:
        """``(step, state, metadata)`` of the newest valid step, skipping damaged ones with a
        warning. Raises ``CheckpointError`` listing what was tried if no valid step exists."""
        step, tried = self._find_valid()
        if step is None:
            if not _primary():
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
                    "or rljax.checkpoint.abstract_of(...)"
                )
        self._check_layout(step, abstract_state)
        leaves, treedef = jax.tree.flatten(abstract_state)
        impls, storable = {}, []
        for i, leaf in enumerate(leaves):
            if _is_key(leaf):
                data, impls[i] = _key_data_abstract(leaf)
                storable.append(data)
            else:
                storable.append(
                    jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
                )
        abstract_storable = jax.tree.unflatten(treedef, storable)
        args = ocp.args.Composite(
            **{
                _ITEM_STATE: ocp.args.StandardRestore(abstract_storable),
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
        layout = self._read_json(step, _ITEM_LAYOUT)
        problems = _layout_mismatch(layout, abstract_state)
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

    # -- integrity ---------------------------------------------------------------------------

    def _step_dir(self, step: int) -> Path:
        return self.directory / str(step)

    def _tmp_dirs(self) -> list[tuple[Path, int]]:
        if not self.directory.exists():
            return []
        found = []
        for path in self.directory.iterdir():
            match = _TMP_DIR.match(path.name)
            if match and path.is_dir():
                found.append((path, int(match.group(1))))
        return found

    def _verify(self, step: int) -> str | None:
        """None if every file of ``step`` matches its manifest, else why not."""
        step_dir = self._step_dir(step)
        manifest_path = step_dir / MANIFEST_NAME
        if not step_dir.is_dir():
            return "missing (no step directory)"
        if not manifest_path.exists():
            return f"unfinished (no {MANIFEST_NAME}: the save was interrupted before it finished)"
        try:
            files = json.loads(manifest_path.read_text())["files"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            return f"damaged (unreadable {MANIFEST_NAME}: {e})"
        for name, expected in sorted(files.items()):
            path = step_dir / name
            if not path.is_file():
                return f"damaged (missing file {name})"
            size = path.stat().st_size
            if size != expected["size"]:
                return f"damaged (file {name} has {size} bytes, {expected['size']} were written)"
            if _file_crc32(path) != expected["crc32"]:
                return f"damaged (file {name} fails its crc32 check)"
        return None

    # -- lifetime ----------------------------------------------------------------------------

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
