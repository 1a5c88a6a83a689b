"""Whether a checkpoint step on disk can be trusted: manifests, crc32s, layout records, NaN checks.

Layout of one step, ``<directory>/<step>/``: orbax's ``state/`` (the arrays, OCDBT/zarr; typed PRNG
keys as their uint32 ``key_data``), ``metadata/`` (the caller's JSON), ``layout/`` (the layout
record: mesh shape, and every leaf's path, shape, dtype and saved partition spec) and
``rljax_manifest.json`` (size and crc32 of every other file in the step). The manifest is written
once orbax has committed the step (renamed its temporary directory ``<step>.orbax-checkpoint-tmp*``)
and the save is durable: a step without one was interrupted, and a step whose files disagree with
it is damaged.

Multi-process: process 0 verifies steps and ``agree`` broadcasts its verdict, so every process
takes the same decision before a collective orbax call.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import zlib
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from rljax.parallel.mesh import shape_record, traced_on_one_device

MANIFEST_NAME = "rljax_manifest.json"
FORMAT_VERSION = 1
_TMP_DIR = re.compile(r"^(\d+)\.orbax-checkpoint-tmp")
_CRC_CHUNK = 16 << 20


# -- files and manifests ----------------------------------------------------------------------


def file_crc32(path: Path) -> int:
    """The crc32 of the file at ``path``, read in 16 MiB chunks."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def step_files(step_dir: Path) -> list[str]:
    """Paths (relative to ``step_dir``, sorted) of every file in the step but its manifest."""
    return sorted(
        str(p.relative_to(step_dir))
        for p in step_dir.rglob("*")
        if p.is_file() and p.name != MANIFEST_NAME
    )


def write_manifest(step_dir: Path, step: int) -> None:
    """Record the size and crc32 of every file of ``step_dir`` in its manifest, atomically
    (written to a temporary file, fsynced, renamed)."""
    files = {
        name: {"size": (step_dir / name).stat().st_size, "crc32": file_crc32(step_dir / name)}
        for name in step_files(step_dir)
    }
    manifest = {"format": FORMAT_VERSION, "step": step, "files": files}
    tmp = step_dir / (MANIFEST_NAME + ".tmp")
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MANIFEST_NAME)


def read_manifest(step_dir: Path) -> dict[str, dict[str, int]]:
    """The manifest's files, ``{relative path: {"size": bytes, "crc32": int}}``.

    Raises ``OSError`` (missing, unreadable), ``ValueError`` (not JSON) or ``KeyError``/
    ``TypeError`` (not a manifest).
    """
    return dict(json.loads((step_dir / MANIFEST_NAME).read_text())["files"])


def verify_step(step_dir: Path) -> str | None:
    """None if every file of the step in ``step_dir`` matches its manifest, else why not
    (``"missing ..."``, ``"unfinished ..."`` or ``"damaged ..."``)."""
    if not step_dir.is_dir():
        return "missing (no step directory)"
    if not (step_dir / MANIFEST_NAME).exists():
        return f"unfinished (no {MANIFEST_NAME}: the save was interrupted before it finished)"
    try:
        files = read_manifest(step_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"damaged (unreadable {MANIFEST_NAME}: {e})"
    for name, expected in sorted(files.items()):
        path = step_dir / name
        if not path.is_file():
            return f"damaged (missing file {name})"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"damaged (file {name} has {size} bytes, {expected['size']} were written)"
        if file_crc32(path) != expected["crc32"]:
            return f"damaged (file {name} fails its crc32 check)"
    return None


def unfinished_saves(directory: Path) -> list[tuple[int, Path]]:
    """``(step, temporary directory)`` of every save orbax has not committed in ``directory``."""
    if not directory.exists():
        return []
    found = []
    for path in directory.iterdir():
        match = _TMP_DIR.match(path.name)
        if match and path.is_dir():
            found.append((int(match.group(1)), path))
    return found


def newest_valid_step(directory: Path, committed) -> tuple[int | None, list[tuple[int, str]]]:
    """Newest step of ``directory`` that verifies, among ``committed`` (orbax's steps) and the
    unfinished saves, and ``(step, problem)`` for every newer one skipped, newest first."""
    unfinished = dict(unfinished_saves(directory))
    committed = set(committed)
    skipped = []
    for step in sorted(committed | set(unfinished), reverse=True):
        if step not in committed:
            problem = f"unfinished save (temporary directory {unfinished[step].name})"
        else:
            problem = verify_step(directory / str(step))
        if problem is None:
            return step, skipped
        skipped.append((step, problem))
    return None, skipped


# -- layout record ----------------------------------------------------------------------------


def _spec_json(sharding) -> list | None:
    if not isinstance(sharding, NamedSharding):
        return None
    return [list(a) if isinstance(a, tuple) else a for a in sharding.spec]


def layout_record(state) -> dict:
    """JSON record of ``state`` (arrays or abstract): format, mesh shape (``{axis: size}``, None
    without a ``NamedSharding``) and per leaf its path, shape, dtype and partition spec."""
    leaves, _ = jax.tree_util.tree_flatten_with_path(state)
    meshes = [
        x.sharding.mesh
        for _, x in leaves
        if isinstance(getattr(x, "sharding", None), NamedSharding)
    ]
    return {
        "format": FORMAT_VERSION,
        "mesh": shape_record(meshes[0]) if meshes else None,
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


def layout_mismatch(saved: dict, abstract) -> list[str]:
    """Sorted differences between a saved ``layout_record`` and the pytree ``abstract``: leaves
    missing on either side, and leaves whose shape or dtype differ. Specs may differ."""
    requested = {leaf["path"]: leaf for leaf in layout_record(abstract)["leaves"]}
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


# -- non-finite values ------------------------------------------------------------------------


def is_prng_key(x) -> bool:
    """Whether ``x`` (array or abstract) holds typed PRNG keys."""
    return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def floating_leaves(state) -> list[tuple[str, Any]]:
    """``(path, leaf)`` of every floating leaf of ``state`` (arrays or abstract), keys excluded:
    the leaves ``nonfinite_counts`` counts, in the same order."""
    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        dtype = getattr(x, "dtype", None)
        if dtype is None or is_prng_key(x) or not jnp.issubdtype(dtype, jnp.inexact):
            continue
        out.append((jax.tree_util.keystr(path), x))
    return out


# Up to this many values on one device, nonfinite_counts concatenates the leaves (below).
CONCATENATED_COUNT_MAX = 2**20


def nonfinite_counts(state) -> jax.Array:
    """NaN/inf values per ``floating_leaves(state)`` leaf, ``int32 [L]`` (traceable: the chunk
    program computes it on its final state, so the guard needs no extra call)."""
    leaves = [x for _, x in floating_leaves(state)]
    if not leaves:
        return jnp.zeros((0,), jnp.int32)
    sizes = [x.size for x in leaves]
    if len(leaves) > 1 and traced_on_one_device() and sum(sizes) <= CONCATENATED_COUNT_MAX:
        # One device, a small state: the values concatenated in a dtype every leaf converts to
        # exactly (NaN and inf stay NaN and inf), tested once, and one prefix sum read at the
        # leaves' ends: a handful of kernels instead of one or two per leaf (PPO's CartPole state
        # has 40 floating leaves). On a real mesh the concatenation would gather sharded leaves.
        common = jnp.result_type(*(x.dtype for x in leaves))
        bad = ~jnp.isfinite(jnp.concatenate([x.reshape(-1).astype(common) for x in leaves]))
        total = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(bad, dtype=jnp.int32)])
        ends = np.cumsum(sizes)
        return total[ends] - total[ends - np.asarray(sizes)]
    return jnp.stack([_count_nonfinite(x) for x in leaves])


# Leaves past this many values are counted only when their sum is not finite (below).
COUNT_IF_FLAGGED = 2**16


def _count_nonfinite(x) -> jax.Array:
    """NaN/inf values in ``x``, ``int32 []``. On CPU, XLA writes the tested values out before it
    reduces them: one int32 copy of every leaf, all live together at the chunk's end (a 10M-
    parameter state on one device needed 117.5 instead of 78.4 MiB of temporaries). So a large
    leaf is counted only if its sum, which reads the leaf in place, is not finite. A NaN or inf
    always makes the sum NaN or inf; finite values whose sum overflows only cost the count.
    (Not max and min: XLA's CPU reductions may drop a NaN, openxla/xla#21461.) Elsewhere XLA
    fuses the count into its reduction, and a conditional would wait for its predicate on the
    host."""
    count = lambda x: jnp.count_nonzero(~jnp.isfinite(x)).astype(jnp.int32)  # noqa: E731
    if x.size <= COUNT_IF_FLAGGED or jax.default_backend() != "cpu":
        return count(x)
    return jax.lax.cond(jnp.isfinite(jnp.sum(x)), lambda x: jnp.int32(0), count, x)


def describe_nonfinite(named_sizes, counts) -> list[str]:
    """``"<path> (<n> of <size> values)"`` for each ``(path, size)`` whose count is nonzero."""
    return [
        f"{name} ({int(c)} of {size} values)"
        for (name, size), c in zip(named_sizes, counts, strict=True)
        if c
    ]


@functools.lru_cache(maxsize=32)
def _nonfinite_counter(out_sharding):
    return jax.jit(nonfinite_counts, out_shardings=out_sharding)


def nonfinite_leaves(state) -> list[str]:
    """``"<path> (<n> of <size> values)"`` for every floating leaf of ``state`` holding NaN/inf.

    One compiled reduction per mesh (or per device set, for arrays without a ``NamedSharding``);
    a mesh's result is replicated, the same on every process, so all processes refuse together.
    """
    groups: dict[Any, list[tuple[str, Any]]] = {}
    bad = []
    for name, x in floating_leaves(state):
        if not isinstance(x, jax.Array):
            count = int(np.count_nonzero(~np.isfinite(np.asarray(x))))
            if count:
                bad.append(f"{name} ({count} of {np.size(x)} values)")
            continue
        sharding = x.sharding
        # device_set is a (unhashable) set: a frozenset keys single-device arrays' group.
        group = (
            sharding.mesh if isinstance(sharding, NamedSharding) else frozenset(sharding.device_set)
        )
        groups.setdefault(group, []).append((name, x))
    for group, items in groups.items():
        out = (
            NamedSharding(group, PartitionSpec()) if isinstance(group, jax.sharding.Mesh) else None
        )
        counts = np.asarray(_nonfinite_counter(out)([x for _, x in items]))
        bad += describe_nonfinite([(name, x.size) for name, x in items], counts)
    return bad


# -- multi-process agreement ------------------------------------------------------------------


def is_primary() -> bool:
    """Whether this is process 0, the one that verifies steps and writes manifests."""
    return jax.process_index() == 0


def agree(value: int) -> int:
    """Process 0's ``value`` on every process (decisions that lead to collective orbax calls)."""
    if jax.process_count() == 1:
        return value
    from jax.experimental import multihost_utils

    return int(multihost_utils.broadcast_one_to_all(np.int64(value)))


def barrier(name: str) -> None:
    """Wait until every process reaches the barrier ``name`` (no-op with one process)."""
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


# -- failed saves ---------------------------------------------------------------------------------
class _OrbaxSaveErrorFilter(logging.Filter):
    """Drops orbax's logged tracebacks of a failed background save (absl's "ERROR: ...
    raised an exception", asyncio's "exception was never retrieved"): the same error reaches
    the caller of ``wait``/``save``/``poll`` as one ``CheckpointWriteError``."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        if "orbax" in (record.pathname or "") and record.exc_info:
            return False
        tb = record.exc_info[2] if record.exc_info else None
        while tb is not None:
            if "orbax" in tb.tb_frame.f_code.co_filename:
                return False
            tb = tb.tb_next
        return True


_SAVE_ERROR_FILTER = _OrbaxSaveErrorFilter()


def quiet_orbax_save_errors() -> None:
    """Install ``_OrbaxSaveErrorFilter`` on the ``absl`` and ``asyncio`` loggers (once)."""
    for name in ("absl", "asyncio"):
        logging.getLogger(name).addFilter(_SAVE_ERROR_FILTER)  # a second add is a no-op
