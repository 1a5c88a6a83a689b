"""Replay buffer: numpy ring references, valid-only n-step windows, shards on their devices,
PER frequencies and importance weights against hand-computed probabilities."""

import contextlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from rljax.buffers import (
    ReplayBuffer,
    add,
    buffer_logical_specs,
    init_buffer,
    replay,
    sample,
    update_priorities,
)
from rljax.errors import ConfigError
from rljax.parallel import Layout, make_mesh

ADD = jax.jit(add)
SAMPLE = jax.jit(sample, static_argnames=("batch_size", "n_step"))
UPDATE = jax.jit(update_priorities, static_argnames=("alpha", "eps"))
SAMPLE_MANY = jax.jit(jax.vmap(sample, in_axes=(None, 0, None, None, None)), static_argnums=(2, 3))


def item_spec(num_envs):
    return {
        "obs": jax.ShapeDtypeStruct((num_envs, 2), jnp.float32),
        "t": jax.ShapeDtypeStruct((num_envs,), jnp.int32),
    }


def make_item(t, num_envs):
    """Env row r at step t: obs (t, 100 r), t."""
    rows = np.arange(num_envs)
    obs = np.stack([np.full(num_envs, t), 100.0 * rows], -1).astype(np.float32)
    return {"obs": obs, "t": np.full(num_envs, t, np.int32)}


def numpy_ring(count, num_envs, ring):
    """The reference contents after ``count`` adds (zeros where nothing was written)."""
    obs = np.zeros((num_envs, ring, 2), np.float32)
    t = np.zeros((num_envs, ring), np.int32)
    for step in range(count):
        item = make_item(step, num_envs)
        obs[:, step % ring], t[:, step % ring] = item["obs"], item["t"]
    return {"obs": obs, "t": t}


def valid_mask(count, ring, n_step):
    """[K] bool: physical positions where an n_step window may start."""
    size = min(count, ring)
    logical = (np.arange(ring) - (count - size)) % ring
    return logical <= size - n_step


def placed(buffer, mesh):
    """``buffer`` put on ``mesh`` with the shardings its logical specs ask for."""
    return jax.device_put(buffer, Layout(mesh).shardings(buffer_logical_specs(buffer)))


def filled(num_envs, capacity, count, prioritized=False, mesh=None):
    buffer = init_buffer(item_spec(num_envs), capacity, prioritized)
    if mesh is not None:
        buffer = placed(buffer, mesh)
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        for step in range(count):
            buffer = ADD(buffer, make_item(step, num_envs))
    return buffer


def with_priorities(buffer, priority, mesh=None):
    buffer = buffer.replace(priority=jnp.asarray(priority, jnp.float32))
    return placed(buffer, mesh) if mesh is not None else buffer


def check_windows(s, count, num_envs, ring, n_step):
    """Every sampled start is valid and its window equals the numpy ring's."""
    ref = numpy_ring(count, num_envs, ring)
    index = np.asarray(s.index)
    rows, starts = index[:, 0], index[:, 1]
    assert valid_mask(count, ring, n_step)[starts].all()
    steps = (starts[:, None] + np.arange(n_step)) % ring
    for name in ("obs", "t"):
        np.testing.assert_array_equal(np.asarray(s.window[name]), ref[name][rows[:, None], steps])
    # Consecutive, oldest first: windows never cross the write pointer.
    np.testing.assert_array_equal(np.diff(np.asarray(s.window["t"]), axis=1), 1)
    return index


def test_wrap_around_overwrites_the_oldest_like_a_numpy_ring():
    num_envs, capacity = 2, 8  # K = 4
    buffer = init_buffer(item_spec(num_envs), capacity)
    for step in range(10):
        buffer = ADD(buffer, make_item(step, num_envs))
        ref = numpy_ring(step + 1, num_envs, 4)
        np.testing.assert_array_equal(buffer.data["obs"], ref["obs"])
        np.testing.assert_array_equal(buffer.data["t"], ref["t"])
    assert int(buffer.count) == 10
    # Positions 0..3 hold steps 8, 9, 6, 7: steps 0..5 were overwritten.
    np.testing.assert_array_equal(buffer.data["t"][1], [8, 9, 6, 7])
    assert buffer.data["obs"].shape == (2, 4, 2) and buffer.priority.shape == (2, 4)


@pytest.mark.parametrize("prioritized", [False, True])
@pytest.mark.parametrize("count", [5, 11])  # not yet wrapped / wrapped (write pointer at 3)
def test_only_written_whole_windows_are_sampled(prioritized, count):
    num_envs, capacity, ring, n_step = 2, 16, 8, 3
    buffer = filled(num_envs, capacity, count, prioritized)
    s = SAMPLE(buffer, jax.random.key(count), batch_size=512, n_step=n_step)
    index = check_windows(s, count, num_envs, ring, n_step)
    valid = valid_mask(count, ring, n_step)
    # count=5: starts at 0..2; count=11: logical 0..5 = physical 3..7, 0 (1, 2 are too new).
    expected = {0, 1, 2} if count == 5 else {3, 4, 5, 6, 7, 0}
    assert set(np.flatnonzero(valid)) == expected
    seen = {(int(r), int(p)) for r, p in index}
    assert seen == {(r, p) for r in range(num_envs) for p in expected}  # every valid start drawn
    # All priorities equal (new items get max_priority = 1): both kinds are uniform over M starts.
    num_valid = num_envs * len(expected)
    np.testing.assert_allclose(s.probability, 1.0 / num_valid, rtol=1e-6)
    np.testing.assert_array_equal(s.weight, 1.0)


@pytest.mark.parametrize("prioritized", [False, True])
def test_sampling_too_early_is_finite(prioritized):
    # Caller's error (size < n_step): garbage but well-defined.
    buffer = filled(2, 16, 1, prioritized)
    s = SAMPLE(buffer, jax.random.key(0), batch_size=512, n_step=3)
    for leaf in (s.weight, s.probability, s.window["obs"]):
        assert np.isfinite(np.asarray(leaf)).all()
    assert ((np.asarray(s.index) >= 0) & (np.asarray(s.index) < [2, 8])).all()


@pytest.fixture(scope="module", params=["data=4", "data=2,model=2"])
def sharded(request):
    """A prioritized buffer (B=8, K=8) filled past wrap-around on a 4-device mesh."""
    mesh = make_mesh(request.param)
    num_envs, capacity, count = 8, 64, 11
    spec = item_spec(num_envs)
    shardings = Layout(mesh).shardings(
        buffer_logical_specs(jax.eval_shape(lambda: init_buffer(spec, capacity, True)))
    )
    with jax.set_mesh(mesh):
        buffer = jax.jit(lambda: init_buffer(spec, capacity, True), out_shardings=shardings)()
        for step in range(count):
            buffer = ADD(buffer, make_item(step, num_envs))
    return mesh, buffer, count


def collective_sizes(hlo: str, ops=("all-gather", "all-to-all")) -> list[int]:
    """Largest element count among the shapes on every line running one of ``ops``."""
    sizes = []
    for line in hlo.splitlines():
        if any(f" {op}(" in line or f" {op}-start(" in line for op in ops):
            dims = re.findall(r"\w+\[([\d,]*)\]", line)
            sizes.append(max(int(np.prod([int(d) for d in s.split(",") if d])) for s in dims))
    return sizes


def test_buffer_rows_live_on_their_data_shard(sharded):
    mesh, buffer, count = sharded
    data_size = mesh.shape["data"]
    specs = buffer_logical_specs(buffer)
    assert specs.priority == PartitionSpec("batch") and specs.count == PartitionSpec()
    for leaf in [*jax.tree.leaves(buffer.data), buffer.priority]:
        assert leaf.sharding.spec[0] == "data"
        assert all(s.data.shape[0] == 8 // data_size for s in leaf.addressable_shards)
    np.testing.assert_array_equal(buffer.data["t"], numpy_ring(count, 8, 8)["t"])
    with jax.set_mesh(mesh):
        hlo = ADD.lower(buffer, make_item(0, 8)).compile().as_text()
    assert collective_sizes(hlo) == []  # add writes every row in place, no communication


def test_sharded_sample_and_update_stay_on_their_shard(sharded):
    mesh, buffer, count = sharded
    data_size = mesh.shape["data"]
    local_buffer_elements = (8 // data_size) * 8  # rows per shard x K
    with jax.set_mesh(mesh):
        lowered = SAMPLE.lower(buffer, jax.random.key(0), batch_size=16, n_step=3, beta=0.5)
        s = SAMPLE(buffer, jax.random.key(0), batch_size=16, n_step=3, beta=0.5)
        td = jnp.arange(16.0) - 8.0
        updated = UPDATE(buffer, s.index, td, alpha=0.5)
    sizes = collective_sizes(lowered.compile().as_text())
    assert all(size < local_buffer_elements for size in sizes), sizes
    # The check sees a gather when there is one: replicating the priorities all-gathers them.
    gather = jax.jit(lambda b: b.priority, out_shardings=NamedSharding(mesh, PartitionSpec()))
    assert max(collective_sizes(gather.lower(buffer).compile().as_text())) == 64
    assert s.index.sharding.spec[0] == "data" and s.window["obs"].sharding.spec[0] == "data"
    index = check_windows(s, count, 8, 8, 3)
    # Shard d's N/D samples come from its own rows: index i lives with row index[i, 0].
    np.testing.assert_array_equal(
        index[:, 0] // (8 // data_size), np.arange(16) // (16 // data_size)
    )
    expected = np.ones((8, 8), np.float32)
    for (row, pos), value in zip(index, (np.abs(np.asarray(td)) + 1e-6) ** 0.5, strict=True):
        expected[row, pos] = value  # in order: the last duplicate wins
    np.testing.assert_allclose(updated.priority, expected, rtol=1e-6)
    assert updated.priority.sharding.spec[0] == "data"
    np.testing.assert_allclose(updated.max_priority, expected.max(), rtol=1e-6)


def test_data1_mesh_equals_no_mesh():
    mesh = make_mesh("data=1,model=1")
    rng = np.random.default_rng(0)
    priority = rng.uniform(0.1, 2.0, (4, 8))
    plain = with_priorities(filled(4, 32, 11, True), priority)
    on_mesh = with_priorities(filled(4, 32, 11, True, mesh), priority, mesh)
    key = jax.random.key(3)
    a = SAMPLE(plain, key, batch_size=8, n_step=2, beta=0.7)
    ua = UPDATE(plain, a.index, jnp.linspace(-1, 1, 8), alpha=0.6)
    with jax.set_mesh(mesh):
        b = SAMPLE(on_mesh, key, batch_size=8, n_step=2, beta=0.7)
        ub = UPDATE(on_mesh, b.index, jnp.linspace(-1, 1, 8), alpha=0.6)
    for x, y in zip(jax.tree.leaves((a, ua)), jax.tree.leaves((b, ub)), strict=True):
        np.testing.assert_array_equal(x, y)


def sample_counts(buffer, num_keys, batch_size, mesh=None):
    keys = jax.random.split(jax.random.key(7), num_keys)
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        s = SAMPLE_MANY(buffer, keys, batch_size, 1, 1.0)
    index = np.asarray(s.index).reshape(-1, 2)
    counts = np.zeros(buffer.priority.shape)
    np.add.at(counts, (index[:, 0], index[:, 1]), 1)
    return counts, s


def assert_frequencies(counts, q):
    # Per item within 5 binomial sigmas of n q. Stratified segments have a smaller variance than
    # independent draws, so the bound is conservative (a false alarm has odds < 1e-5 per item).
    n = counts.sum()
    sigma = np.sqrt(n * q * (1 - q))
    np.testing.assert_array_less(np.abs(counts - n * q), 5 * sigma + 1e-9)


@pytest.mark.parametrize("ring", [4, 3])  # L = 8: two cdf blocks of 4; L = 6: one padded block
def test_prioritized_frequencies_match_priorities(ring):
    # One shard, all starts valid (ring full, n_step=1), priorities 1..2K: q_i = p_i / sum(p).
    p = np.arange(1.0, 2 * ring + 1).reshape(2, ring)
    buffer = with_priorities(filled(2, 2 * ring, ring, True), p)
    counts, s = sample_counts(buffer, num_keys=16, batch_size=1024)
    q = p / p.sum()
    assert_frequencies(counts, q)
    index = np.asarray(s.index)
    np.testing.assert_allclose(s.probability, q[index[..., 0], index[..., 1]], rtol=1e-6)


def test_prioritized_sampling_is_stratified_by_shard():
    # D=2: shard 0 holds rows 0-1 (priorities all 1, S_0 = 8), shard 1 rows 2-3 (1..8, S_1 = 36).
    mesh = make_mesh("data=2")
    p = np.concatenate([np.ones((2, 4)), np.arange(1.0, 9.0).reshape(2, 4)])
    buffer = with_priorities(filled(4, 16, 4, True, mesh), p, mesh)
    counts, s = sample_counts(buffer, num_keys=16, batch_size=1024, mesh=mesh)
    shard_total = np.repeat([p[:2].sum(), p[2:].sum()], 2)[:, None]
    q = 0.5 * p / shard_total
    assert_frequencies(counts, q)
    np.testing.assert_allclose(counts[:2].sum() / counts.sum(), 0.5)  # exactly N/D per shard
    global_q = p / p.sum()  # 8/44 of the mass on shard 0: rejected at > 20 sigma
    n = counts.sum()
    assert (np.abs(counts - n * global_q) / np.sqrt(n * global_q * (1 - global_q))).max() > 20
    index = np.asarray(s.index)
    np.testing.assert_allclose(s.probability, q[index[..., 0], index[..., 1]], rtol=1e-6)


@pytest.mark.parametrize("mesh_spec", [None, "data=2"])
def test_importance_weights_match_numpy(mesh_spec):
    mesh = make_mesh(mesh_spec) if mesh_spec else None
    data_size = 1 if mesh is None else 2
    num_envs, ring, count, n_step, beta = 4, 8, 11, 2, 0.4
    p = np.random.default_rng(1).uniform(0.05, 3.0, (num_envs, ring))
    buffer = with_priorities(filled(num_envs, 32, count, True, mesh), p, mesh)
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        s = SAMPLE(buffer, jax.random.key(5), batch_size=32, n_step=n_step, beta=beta)
    check_windows(s, count, num_envs, ring, n_step)
    # Reference: q_i = (1/D) p_i / S_d over valid starts, M = valid starts in the whole buffer,
    # w_i = (M q_i)^-beta / max over valid k of (M q_k)^-beta.
    valid = np.broadcast_to(valid_mask(count, ring, n_step), p.shape)
    masked = np.where(valid, p, 0.0)
    rows_per_shard = num_envs // data_size
    shard_total = masked.reshape(data_size, -1).sum(1).repeat(rows_per_shard)[:, None]
    q = masked / shard_total / data_size
    num_valid = valid.sum()
    w_all = (num_valid * q[valid]) ** -beta
    row, pos = np.asarray(s.index).T
    w = (num_valid * q[row, pos]) ** -beta / w_all.max()
    np.testing.assert_allclose(s.probability, q[row, pos], rtol=1e-5)
    np.testing.assert_allclose(s.weight, w, rtol=1e-5)
    assert (np.asarray(s.weight) <= 1.0).all()


def test_large_shard_cdf_is_monotone_and_accurate():
    # 2^18 priorities near 1 with zeros (invalid starts) and tiny entries. A one-level float32
    # cumsum has boundaries at magnitude ~2.6e5 (rounding ~0.016, XLA's parallel scan can even
    # decrease); the two-level cdf must give zeros width exactly 0 and every entry its p_i / S.
    length, width = 2**18, 512
    p = np.random.default_rng(2).uniform(0.5, 1.5, length).astype(np.float32)
    p[::97], p[5::512] = 0.0, 1e-3
    p_blocks = jnp.asarray(p).reshape(-1, width)
    inner = np.asarray(jax.jit(replay._cdf)(p_blocks), np.float64)
    outer = np.asarray(jax.jit(replay._cdf)(inner[:, -1].astype(np.float32)), np.float64)
    inner_width = np.diff(inner, axis=1, prepend=0.0)
    outer_width = np.diff(outer, prepend=0.0)
    effective = (outer_width[:, None] * inner_width / inner[:, -1:] / outer[-1]).reshape(-1)
    exact = p.astype(np.float64) / p.astype(np.float64).sum()
    assert (inner_width >= 0).all() and (outer_width >= 0).all()
    np.testing.assert_array_equal(effective[p == 0], 0.0)
    np.testing.assert_allclose(effective[p >= 0.5], exact[p >= 0.5], rtol=1e-3)
    np.testing.assert_allclose(effective[p == 1e-3], exact[p == 1e-3], rtol=0.2)
    drawn, total = jax.jit(replay._proportional, static_argnums=2)(
        jnp.asarray(p), jax.random.key(0), 4096
    )
    assert (p[np.asarray(drawn)] > 0).all()
    np.testing.assert_allclose(total, p.astype(np.float64).sum(), rtol=1e-5)


def test_update_priorities_writes_at_index_and_new_items_get_the_max():
    buffer = filled(2, 8, 4, True)  # K = 4
    index = jnp.array([[0, 1], [1, 3], [0, 1]], jnp.int32)
    td = jnp.array([0.5, -3.0, 2.0])
    updated = UPDATE(buffer, index, td, alpha=0.6, eps=0.01)
    expected = np.ones((2, 4), np.float32)
    expected[1, 3] = (3.0 + 0.01) ** 0.6
    expected[0, 1] = (2.0 + 0.01) ** 0.6  # duplicate (0, 1): the last write wins
    np.testing.assert_allclose(updated.priority, expected, rtol=1e-6)
    np.testing.assert_allclose(updated.max_priority, (3.01) ** 0.6, rtol=1e-6)
    # Lower priorities later do not lower the running max; the next item (position 0) gets it.
    lowered = UPDATE(updated, index[1:2], jnp.array([0.0]), alpha=0.6, eps=0.01)
    np.testing.assert_allclose(lowered.max_priority, (3.01) ** 0.6, rtol=1e-6)
    added = ADD(lowered, make_item(4, 2))
    np.testing.assert_allclose(added.priority[:, 0], (3.01) ** 0.6, rtol=1e-6)
    np.testing.assert_allclose(added.priority[:, 1:], np.asarray(lowered.priority)[:, 1:])
    uniform = filled(2, 8, 4)
    assert update_priorities(uniform, index, td, alpha=0.6) is uniform


def test_vmapped_seeds_on_a_mesh_equal_each_seed_alone():
    mesh = make_mesh("data=2,model=2")
    buffers = [with_priorities(filled(4, 32, 11, True), np.full((4, 8), c)) for c in (1.0, 2.0)]
    buffers[1] = buffers[1].replace(data=jax.tree.map(lambda x: x + 1, buffers[1].data))
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *buffers)
    keys = jax.random.split(jax.random.key(0), 2)
    many = jax.jit(jax.vmap(sample, in_axes=(0, 0, None, None)), static_argnums=(2, 3))
    with jax.set_mesh(mesh):
        together = many(stacked, keys, 8, 2)
        alone = [
            SAMPLE(placed(b, mesh), k, batch_size=8, n_step=2)
            for b, k in zip(buffers, keys, strict=True)
        ]
    for seed, single in enumerate(alone):
        for x, y in zip(jax.tree.leaves(together), jax.tree.leaves(single), strict=True):
            np.testing.assert_array_equal(x[seed], y)


def test_invalid_sizes_raise_config_error():
    with pytest.raises(ConfigError, match=r"capacity=10 must be a positive multiple of num_envs=4"):
        init_buffer(item_spec(4), 10)
    with pytest.raises(ConfigError, match=r"capacity=2 must be a positive multiple of num_envs=4"):
        init_buffer(item_spec(4), 2)
    buffer = jax.eval_shape(lambda: init_buffer(item_spec(8), 64, True))
    with pytest.raises(ConfigError, match=r"n_step=9 must be in \[1, .* = 8\]"):
        jax.eval_shape(lambda b: sample(b, jax.random.key(0), 8, n_step=9), buffer)
    with pytest.raises(ConfigError, match=r"does not match"):
        jax.eval_shape(add, buffer, make_item(0, 4))
    with jax.set_mesh(make_mesh("data=4")):
        with pytest.raises(ConfigError, match=r"batch_size=6 is not divisible by the size 4"):
            jax.eval_shape(lambda b: sample(b, jax.random.key(0), 6), buffer)
        index = jax.ShapeDtypeStruct((6, 2), jnp.int32)
        td = jax.ShapeDtypeStruct((6,), jnp.float32)
        with pytest.raises(ConfigError, match=r"=6 is not divisible by the size 4"):
            jax.eval_shape(lambda b, i, t: update_priorities(b, i, t, 0.6), buffer, index, td)
    assert isinstance(buffer, ReplayBuffer)
