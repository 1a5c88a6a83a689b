"""On-device replay buffer, one ring per environment, sharded along ``data``; uniform or PER.

    buffer = init_buffer(item, capacity, prioritized=True)   # item: one env step, leaves [B, ...]
    buffer = add(buffer, item)                                # every step
    s = sample(buffer, key, batch_size, n_step=3, beta=0.4)   # s.window leaves [N@data, 3, ...]
    buffer = update_priorities(buffer, s.index, td_error, alpha=0.6)

Layout. ``B = num_envs`` environments are stepped in lockstep; every stored leaf is
``[B@data, K, ...]`` with ``K = capacity // B``: row ``b`` is the ring of environment ``b`` and all
rows hold the same number of items. ``count`` items have been written per row; the write position
is ``count % K``; with ``size = min(count, K)`` the oldest item (logical index 0) sits at physical
position ``(count - size) % K`` and logical index ``j`` at ``(count - size + j) % K``. A data shard
owns whole rows, so ``add``, ``sample`` and ``update_priorities`` never move buffer data between
devices (the only collectives are scalar pmin/pmax).

Valid windows. ``sample(..., n_step)`` returns ``n_step`` consecutive items of one row, oldest
first. Start ``j`` is valid iff ``0 <= j <= size - n_step``, so a window never starts in the last
``n_step - 1`` written items of its row and never crosses the write pointer; ``M = B * (size -
n_step + 1)`` windows are valid in the whole buffer. Windows may cross episode boundaries (the
learner cuts them with the stored done flags). Sampling before ``size >= n_step`` is the caller's
error (DQN's ``learning_starts`` prevents it); the result is then garbage but finite: indices in
range, probabilities and weights without NaN or inf.

Sharding. Under ``jax.set_mesh`` with a ``data`` axis of size ``D > 1`` (the mesh axis the
``batch`` rule names), ``sample`` and ``update_priorities`` run their per-shard body in
``jax.shard_map`` (manual over ``data`` only; ``model`` stays automatic and the buffer is
replicated over it). Shard ``d`` draws ``N / D`` samples from its own ``B / D`` rows with key
``fold_in(key, d)``; without a mesh, or with ``D == 1``, the same body runs once with ``d = 0``.
The random stream therefore depends on ``D``, the sampling distribution does not (uniform), or
only through the per-shard normalisation below (PER). ``sample.index[:, 0]`` is the *global*
env row; as the sample stays ``[N@data]``, each index lives on the shard that owns its row, so
``update_priorities`` scatters locally (an index whose row is not owned by the shard holding it,
i.e. a reordered sample, is ignored).

Prioritized replay (proportional, Schaul et al. 2016). The stored priority of an item is
``(|td| + eps) ** alpha``; new items get ``max_priority``, a running maximum of every priority
written (initially 1.0), kept identical on all shards by a pmax, so it does not depend on ``D``.
Within shard ``d`` the valid windows' priorities ``p_i`` (invalid starts masked to exactly 0,
total ``S_d``) are flattened to ``L = rows * K`` entries in blocks of ``~sqrt(L)`` and sampled by
stratified segments: of the ``n = N / D`` draws, draw ``j`` takes ``u = (j + U_j) / n * S_d`` and
the block whose cumulative-sum interval contains ``u``, then an entry of that block with an
independent uniform over the block's own cumsum. The probability of entry ``i`` is exactly
``p_i / S_d`` either way; the two levels keep float32 rounding of the interval boundaries at
``eps * S_d / sqrt(L)`` instead of ``eps * S_d`` (a one-level float32 cumsum of 1e6 priorities
near 1 has boundaries rounded by ~0.06, even non-monotone, as XLA's cumsum is a parallel scan).
Across shards the batch is stratified by shard, so the actual probability of drawing item ``i``
of shard ``d`` is ``q_i = (1 / D) * p_i / S_d``; it equals the global ``p_i / S`` when the shards
hold equal priority mass, and approximates it when they hold similar mass. ``sample.probability``
is this ``q_i`` and the importance weights use it:
``w_i = (M * q_i) ** -beta / max_k (M * q_k) ** -beta = (q_min / q_i) ** beta``, the maximum over
all valid windows of the whole buffer (``q_min`` via a pmin over shards), so ``w <= 1``. For a
uniform buffer ``probability = 1 / M`` and ``weight = 1``.

Cost per call: an ``O(rows * K)`` masked cumsum (two levels) over the shard's priorities per
``sample``, then ``O(n log(rows * K))`` binary search; ``update_priorities`` is an ``O(n)`` scatter
plus an ``O(n log n)`` sort of the ``n`` indices to make duplicates deterministic (the last
occurrence in the batch wins; XLA's scatter leaves the order of duplicate writes unspecified).
No sum-tree: on an accelerator a cumsum over 1e4..1e6 entries is one fast parallel scan, cheaper
than a log-depth chain of dependent gathers, and flat arrays are trivially jittable, vmappable and
shardable. A uniform buffer never reads or writes ``priority`` (``prioritized`` is static).

``count`` is int32: at most 2**31 - 1 adds per row.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel.rules import constrain, mesh_axis
from rljax.rng import index_from_bits, uniform_from_bits


@struct.dataclass
class ReplayBuffer:
    """Every leaf of ``data`` is ``[B@data, K, ...]``; ``priority`` is ``[B@data, K]``."""

    data: Any
    count: jax.Array  # int32 []: items written per env row; write position = count % K
    priority: jax.Array  # float32 [B@data, K]: p**alpha (all ones, never read, when uniform)
    max_priority: jax.Array  # float32 []: running max of stored priorities (new items get it)
    prioritized: bool = struct.field(pytree_node=False, default=False)

    @property
    def num_envs(self) -> int:
        return self.priority.shape[-2]

    @property
    def ring_size(self) -> int:
        """``K``: items kept per env row."""
        return self.priority.shape[-1]


@struct.dataclass
class Sample:
    """``N = batch_size`` windows; every leaf ``[N@data, ...]``."""

    window: Any  # item pytree, leaves [N@data, n_step, ...], oldest first
    index: jax.Array  # int32 [N@data, 2]: (global env row, ring position) of the window's start
    weight: jax.Array  # float32 [N@data]: normalised importance weight (ones when uniform)
    probability: jax.Array  # float32 [N@data]: probability q_i with which the start was drawn


def init_buffer(item, capacity: int, prioritized: bool = False) -> ReplayBuffer:
    """An empty buffer for ``item`` (one env step: leaves ``[B, ...]``, arrays or
    ``ShapeDtypeStruct``s) holding ``capacity`` items in all, ``capacity // B`` per env row."""
    leaves = jax.tree.leaves(item)
    if not leaves:
        raise ConfigError("replay buffer item has no array leaves")
    if any(len(x.shape) == 0 for x in leaves):
        raise ConfigError(
            "every leaf of a replay buffer item needs a leading num_envs axis [B, ...]"
        )
    num_envs = leaves[0].shape[0]
    if any(x.shape[0] != num_envs for x in leaves):
        raise ConfigError(
            f"replay buffer item leaves disagree on num_envs (leading axis): "
            f"{sorted({x.shape[0] for x in leaves})}"
        )
    if capacity < num_envs or capacity % num_envs:
        raise ConfigError(
            f"replay capacity={capacity} must be a positive multiple of num_envs={num_envs} "
            f"(one ring of capacity // num_envs items per environment)"
        )
    ring = capacity // num_envs

    def empty(x):
        return constrain(jnp.zeros((num_envs, ring, *x.shape[1:]), x.dtype), "batch")

    data = jax.tree.map(empty, item)
    priority = constrain(jnp.ones((num_envs, ring), jnp.float32), "batch")
    return ReplayBuffer(
        data, jnp.zeros((), jnp.int32), priority, jnp.ones((), jnp.float32), prioritized
    )


def add(buffer: ReplayBuffer, item) -> ReplayBuffer:
    """Write ``item`` (leaves ``[B@data, ...]``) at position ``count % K`` of every row."""
    num_envs, ring = buffer.num_envs, buffer.ring_size
    for d, x in zip(jax.tree.leaves(buffer.data), jax.tree.leaves(item), strict=True):
        if x.shape != (num_envs, *d.shape[2:]):
            raise ConfigError(
                f"replay add: item leaf of shape {x.shape} does not match the buffer's "
                f"{(num_envs, *d.shape[2:])} ([num_envs, ...])"
            )
    position = buffer.count % ring

    def write(stored, x):
        x = jnp.expand_dims(x.astype(stored.dtype), 1)
        return constrain(jax.lax.dynamic_update_slice_in_dim(stored, x, position, axis=1), "batch")

    data = jax.tree.map(write, buffer.data, item)
    priority = buffer.priority
    if buffer.prioritized:
        new = jnp.broadcast_to(buffer.max_priority, (num_envs,)).astype(priority.dtype)
        priority = write(priority, new)
    return buffer.replace(data=data, priority=priority, count=buffer.count + 1)


def _per_shard(body, axis: str | tuple[str, ...] | None, in_specs, out_specs):
    """``body(shard_index, *args)`` under shard_map over ``axis``, or directly as shard 0."""
    if axis is None:
        return functools.partial(body, 0)

    def manual(*args):
        return body(jax.lax.axis_index(axis), *args)

    names = set(axis) if isinstance(axis, tuple) else {axis}
    return jax.shard_map(manual, in_specs=in_specs, out_specs=out_specs, axis_names=names)


def _cdf(p: jax.Array) -> jax.Array:
    """Cumulative sums of ``p >= 0`` along the last axis, exactly flat over zero entries.

    XLA's cumsum is a parallel scan whose rounding can make it decrease; a running max over sums
    kept only at positive entries is monotone and gives zero-priority entries (invalid starts) an
    interval of width exactly 0, so they can never be drawn.
    """
    return jax.lax.cummax(jnp.where(p > 0, jnp.cumsum(p, axis=-1), 0.0), axis=p.ndim - 1)


def _search_right(lookup, length: int, u: jax.Array) -> jax.Array:
    """First ``i`` with ``lookup(i) > u`` (``length`` if none) for a nondecreasing ``lookup``:
    ``jnp.searchsorted(cdf, u, side="right")`` as ``O(len(u) log length)`` binary search.

    Written out because jnp.searchsorted (jax 0.10) fails inside shard_map on device-varying
    inputs, and to search a different row of a 2-d table per query.
    """
    # zeros_like/full_like keep u's device-variance type, which the loop carry must match.
    lo = jnp.zeros_like(u, jnp.int32)
    hi = jnp.full_like(u, length, jnp.int32)

    def halve(_, bounds):  # the answer lies in [lo, hi]
        lo, hi = bounds
        mid = (lo + hi) // 2
        right = lookup(jnp.minimum(mid, length - 1)) <= u
        active = lo < hi
        return jnp.where(active & right, mid + 1, lo), jnp.where(active & ~right, mid, hi)

    # A rolled loop: unrolled, XLA's compile time grows to seconds.
    return jax.lax.fori_loop(0, length.bit_length(), halve, (lo, hi))[0]


def _below(x: jax.Array, limit: jax.Array) -> jax.Array:
    """``x`` clipped to be strictly below ``limit`` (keeps a draw off the end despite rounding)."""
    return jnp.minimum(x, jnp.nextafter(limit, jnp.zeros_like(limit)))


def _proportional(p: jax.Array, key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]:
    """``n`` stratified draws of an index of ``p: [L]`` with probability ``p_i / S``.

    Two levels of ``~sqrt(L)`` blocks: a float32 cumsum over all ``L`` entries would store every
    boundary at the magnitude of ``S`` (at ``L = 1e6`` its rounding is the size of a typical
    priority). Draw ``j`` picks a block with ``u = (j + U_j) / n * S`` over the block totals
    (stratified), then an entry of that block with an independent uniform over the block's own
    cumsum, so boundaries are accurate to ``eps * S / sqrt(L)``. Returns ``(index [n], S)``.
    """
    length = p.shape[0]
    width = 1 << max(math.isqrt(length - 1), 1).bit_length()  # power of two >= sqrt(L)
    blocks = jnp.pad(p, (0, -length % width)).reshape(-1, width)
    inner = _cdf(blocks)  # [L / width, width]
    outer = _cdf(inner[:, -1])  # [L / width]
    total = outer[-1]
    segment_u, inner_u = uniform_from_bits(jax.random.bits(key, (2, n)))
    u = (jnp.arange(n) + segment_u) / n * total
    block = jnp.minimum(
        _search_right(lambda i: outer[i], outer.shape[0], _below(u, total)), outer.shape[0] - 1
    )
    block_total = inner[block, -1]
    v = _below(inner_u * block_total, block_total)
    entry = jnp.minimum(_search_right(lambda i: inner[block, i], width, v), width - 1)
    return jnp.minimum(block * width + entry, length - 1), total


def _check_split(what: str, n: int, axis: str | None, shards: int, num_envs: int) -> None:
    if num_envs % shards:
        raise ConfigError(
            f"replay buffer num_envs={num_envs} is not divisible by the size {shards} of the mesh "
            f"axis {axis!r} its rows are sharded over"
        )
    if n < 1:
        raise ConfigError(f"{what}={n} must be >= 1")
    if n % shards:
        raise ConfigError(
            f"{what}={n} is not divisible by the size {shards} of the mesh axis {axis!r} the "
            f"replay buffer is sharded over; use a multiple of {shards}"
        )


def sample(
    buffer: ReplayBuffer,
    key: jax.Array,
    batch_size: int,
    n_step: int = 1,
    beta: float | jax.Array = 1.0,
) -> Sample:
    """``batch_size`` windows of ``n_step`` consecutive items from valid starts (see module doc).

    Uniform, or proportional to priority (stratified, per data shard) for a prioritized buffer;
    ``beta`` is the importance-weight exponent. Result leaves ``[N@data, ...]``.
    """
    ring = buffer.ring_size
    if not 1 <= n_step <= ring:
        raise ConfigError(f"n_step={n_step} must be in [1, capacity // num_envs = {ring}]")
    axis, shards = mesh_axis("batch")
    _check_split("batch_size", batch_size, axis, shards, buffer.num_envs)
    per_shard = batch_size // shards
    prioritized = buffer.prioritized

    def body(shard, data, priority, count, key, beta):
        rows = priority.shape[0]
        size = jnp.minimum(count, ring)
        oldest = count - size  # physical position (mod K) of logical index 0
        starts = jnp.maximum(size - n_step + 1, 1)  # valid starts per row (>= 1: no 0-division)
        key = jax.random.fold_in(key, shard)
        if prioritized:
            valid = jnp.mod(jnp.arange(ring) - oldest, ring) <= size - n_step  # [K]
            p = jnp.where(valid, priority, 0.0).reshape(-1)
            flat, total = _proportional(p, key, per_shard)
            row, position = flat // ring, flat % ring
            safe_total = jnp.where(total > 0, total, 1.0)
            probability = p[flat] / safe_total / shards
            local_min = jnp.min(jnp.where(p > 0, p, jnp.inf)) / safe_total / shards
            q_min = local_min if axis is None else jax.lax.pmin(local_min, axis)
            # (M q)^-beta / max_k (M q_k)^-beta; q_min <= q always, the minimum only guards the
            # "nothing valid" case (q_min = inf).
            ratio = jnp.minimum(q_min, probability) / jnp.where(probability > 0, probability, 1.0)
            weight = jnp.where(probability > 0, ratio**beta, 1.0).astype(jnp.float32)
        else:
            flat = index_from_bits(jax.random.bits(key, (per_shard,)), rows * starts)
            row = flat // starts
            position = (oldest + flat % starts) % ring
            probability = jnp.full((per_shard,), 1.0 / (shards * rows * starts), jnp.float32)
            weight = jnp.ones((per_shard,), jnp.float32)
        steps = (position[:, None] + jnp.arange(n_step, dtype=jnp.int32)) % ring  # [n, n_step]
        window = jax.tree.map(lambda x: x[row[:, None], steps], data)
        index = jnp.stack([row + shard * rows, position], axis=-1).astype(jnp.int32)
        return Sample(window, index, weight, probability.astype(jnp.float32))

    batch, scalar = PartitionSpec(axis), PartitionSpec()
    run = _per_shard(body, axis, (batch, batch, scalar, scalar, scalar), batch)
    out = run(buffer.data, buffer.priority, buffer.count, key, jnp.asarray(beta, jnp.float32))
    return jax.tree.map(lambda x: constrain(x, "batch"), out)


def update_priorities(
    buffer: ReplayBuffer,
    index: jax.Array,
    td_error: jax.Array,
    alpha: float,
    eps: float = 1e-6,
) -> ReplayBuffer:
    """Set the priority at ``index`` (``[N@data, 2]`` from ``sample``) to ``(|td| + eps)**alpha``.

    ``td_error: [N@data]``. Duplicate indices: the last occurrence wins. ``max_priority`` becomes
    the running max including the written values (same on every shard). A uniform buffer is
    returned unchanged.
    """
    if not buffer.prioritized:
        return buffer
    n = index.shape[0]
    if index.shape != (n, 2) or td_error.shape != (n,):
        raise ConfigError(
            f"update_priorities: index must be [N, 2] and td_error [N], got {index.shape} and "
            f"{td_error.shape}"
        )
    axis, shards = mesh_axis("batch")
    _check_split("update_priorities batch (index.shape[0])", n, axis, shards, buffer.num_envs)

    def body(shard, priority, max_priority, index, td_error):
        rows, ring = priority.shape
        count = index.shape[0]
        new = ((jnp.abs(td_error.astype(jnp.float32)) + eps) ** alpha).astype(priority.dtype)
        row, position = index[:, 0] - shard * rows, index[:, 1]
        owned = (row >= 0) & (row < rows) & (position >= 0) & (position < ring)
        flat = jnp.where(owned, row * ring + position, rows * ring)
        # Keep only the last occurrence of each index: stable sort, last of each equal run.
        order = jnp.argsort(flat, stable=True)
        ordered = flat[order]
        last = jnp.append(ordered[1:] != ordered[:-1], True)
        keep = jnp.zeros((count,), bool).at[order].set(last) & owned
        row = jnp.where(keep, row, rows)  # out of bounds: dropped by the scatter
        priority = priority.at[row, position].set(new, mode="drop")
        local_max = jnp.max(jnp.where(keep, new, 0.0))
        written_max = local_max if axis is None else jax.lax.pmax(local_max, axis)
        return priority, jnp.maximum(max_priority, written_max)

    batch, scalar = PartitionSpec(axis), PartitionSpec()
    run = _per_shard(body, axis, (batch, scalar, batch, batch), (batch, scalar))
    priority, max_priority = run(buffer.priority, buffer.max_priority, index, td_error)
    return buffer.replace(priority=constrain(priority, "batch"), max_priority=max_priority)


def buffer_logical_specs(buffer_abstract: ReplayBuffer) -> ReplayBuffer:
    """Logical ``PartitionSpec`` of every leaf: ``P("batch")`` for data and priority, ``P()`` for
    the scalars (prepend a seed axis with ``rljax.parallel.prepend_axis``)."""
    batch = PartitionSpec("batch")
    return buffer_abstract.replace(
        data=jax.tree.map(lambda _: batch, buffer_abstract.data),
        count=PartitionSpec(),
        priority=batch,
        max_priority=PartitionSpec(),
    )
