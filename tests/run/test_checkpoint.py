"""Checkpoints: bitwise-exact and elastic restores, keep-last-k, refusal of NaN states, and
fallback over damaged steps."""

import contextlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import rljax
from rljax.parallel import make_mesh
from rljax.run.checkpoint import (
    MANIFEST_NAME,
    Checkpointer,
    CheckpointError,
    CheckpointWarning,
    NonFiniteStateError,
    abstract_of,
)
from rljax.run.metadata import compare_metadata, package_versions


@struct.dataclass
class TrainState:
    w: jax.Array  # [8@data, 4]
    v: jax.Array  # [4, 8@model]
    key: jax.Array  # typed key [], replicated
    keys: jax.Array  # typed rbg keys [4@data]
    count: jax.Array  # int32 []
    opt: Any  # optax adam state for {"w": [8@data, 4]}: NamedTuples inside a tuple
    extra: dict  # {"half": bfloat16 [4@model]}


def make_state(seed: int, mesh) -> TrainState:
    """Host-built values (no compilation) placed with ``shardings(mesh)``."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    w[0, 0], w[0, 1] = -0.0, np.float32(1e-45)  # bit patterns `==` would not distinguish
    opt = optax.adam(1e-3).init({"w": np.zeros((8, 4), np.float32)})
    opt = jax.tree.map(
        lambda x: (
            np.asarray(rng.standard_normal(np.shape(x)), np.float32)
            if np.ndim(x)
            else np.int32(seed)
        ),
        opt,
    )
    state = TrainState(
        w=w,
        v=rng.standard_normal((4, 8)).astype(np.float32),
        key=jax.random.key(seed),
        keys=jax.random.split(jax.random.key(seed + 100, impl="rbg"), 4),
        count=np.int32(seed),
        opt=opt,
        extra={"half": rng.standard_normal(4).astype(jax.numpy.bfloat16)},
    )
    return jax.device_put(state, shardings(mesh, state))


def shardings(mesh, like) -> TrainState:
    def ns(*spec):
        return NamedSharding(mesh, P(*spec))

    return TrainState(
        w=ns("data"),
        v=ns(None, "model"),
        key=ns(),
        keys=ns("data"),
        count=ns(),
        opt=jax.tree.map(lambda x: ns("data") if np.ndim(x) else ns(), like.opt),
        extra={"half": ns("model")},
    )


def host_bits(x):
    """Exact contents: raw bytes and dtype name (typed keys through their key data)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        return str(x.dtype), np.asarray(jax.random.key_data(x)).tobytes()
    return str(x.dtype), np.asarray(x).tobytes()


def assert_bitwise_equal(restored, expected):
    assert jax.tree.structure(restored) == jax.tree.structure(expected)
    got, want = jax.tree.leaves(restored), jax.tree.leaves(expected)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape
        assert host_bits(a) == host_bits(b)


def assert_shardings(restored, requested):
    for a, s in zip(jax.tree.leaves(restored), jax.tree.leaves(requested), strict=True):
        assert a.sharding == s, (a.sharding, s)


METADATA = {
    "algo": {"env": "CartPole-v1", "num_envs": 4, "lr": 2.5e-4},
    "mesh": {"shape": (2, 2), "axes": ["data", "model"]},
    "env_steps": 1024,
}


def save_steps(directory, mesh, steps, **kwargs):
    states = {}
    with Checkpointer(directory, async_save=False, **kwargs) as ckpt:
        for step in steps:
            states[step] = make_state(step, mesh)
            ckpt.save(step, states[step], {**METADATA, "env_steps": step})
    return states


def test_plain_single_device_pytree_round_trip(tmp_path):
    """Arrays made without a NamedSharding (``jnp.ones(3)`` on one device) save and restore."""
    state = {
        "a": jnp.ones(3),
        "b": jnp.arange(4),
        "nested": (jnp.full((2, 2), 0.5, jnp.bfloat16), jax.random.key(3)),
    }
    assert isinstance(state["a"].sharding, jax.sharding.SingleDeviceSharding)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(1, state, {"env_steps": 1})
        ckpt.wait()
        step, restored, metadata = ckpt.restore_latest(abstract_of(state))
        bad = {**state, "a": state["a"].at[1].set(jnp.nan)}
        with pytest.raises(NonFiniteStateError, match=r"\['a'\] \(1 of 3 values\)"):
            ckpt.save(2, bad, {})
        assert ckpt.steps() == [1]
    assert (step, metadata) == (1, {"env_steps": 1})
    assert_bitwise_equal(restored, state)
    assert_shardings(restored, jax.tree.map(lambda x: x.sharding, state))


def test_round_trip_is_bitwise_exact_with_requested_shardings(mesh4, tmp_path):
    state = make_state(7, mesh4)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(7, state, METADATA)
        ckpt.wait()
        requested = shardings(mesh4, state)
        restored, metadata = ckpt.restore(7, abstract_of(state, requested))
    assert isinstance(restored, TrainState)
    assert isinstance(restored.opt[0], optax.ScaleByAdamState)
    # Typed keys again, each with its implementation.
    assert (restored.key.dtype, restored.keys.dtype) == (state.key.dtype, state.keys.dtype)
    assert str(restored.keys.dtype) == "key<rbg>"
    assert_bitwise_equal(restored, state)
    assert_shardings(restored, requested)
    assert metadata == {**METADATA, "mesh": {"shape": [2, 2], "axes": ["data", "model"]}}


@pytest.fixture(scope="module")
def written_on_2x2(tmp_path_factory, mesh4):
    directory = tmp_path_factory.mktemp("elastic") / "ckpt"
    return directory, save_steps(directory, mesh4, [3])[3]


@pytest.mark.parametrize("spec", ["data=1,model=4", "data=4,model=1", "data=1,model=1"])
def test_elastic_restore_onto_another_mesh(written_on_2x2, spec):
    directory, saved = written_on_2x2
    mesh = make_mesh(spec)
    requested = shardings(mesh, saved)
    with Checkpointer(directory) as ckpt:
        step, restored, metadata = ckpt.restore_latest(abstract_of(saved, requested))
    assert (step, metadata["env_steps"]) == (3, 3)
    assert_bitwise_equal(restored, saved)
    assert_shardings(restored, requested)
    assert restored.w.sharding.mesh.devices.size == mesh.devices.size
    # w [8, 4] on P("data"): each shard holds 8 / data rows.
    assert restored.w.addressable_shards[0].data.shape == (8 // mesh.shape["data"], 4)


def test_keep_last_k_async_and_steps(mesh4, tmp_path):
    directory = tmp_path / "ckpt"
    with Checkpointer(directory, keep=2, async_save=True) as ckpt:
        states = {}
        for step in (10, 20, 30):
            states[step] = make_state(step, mesh4)
            ckpt.save(step, states[step], {"env_steps": step})
        # Pruning waits until the newest step is durable: with 30 possibly still in flight,
        # 10 is kept although keep=2.
        assert (directory / "10").is_dir() and (directory / "20").is_dir()
        ckpt.wait()
        assert ckpt.steps() == [20, 30]
        assert sorted(p.name for p in directory.iterdir() if p.name.isdigit()) == ["20", "30"]
        assert all((directory / s / MANIFEST_NAME).is_file() for s in ("20", "30"))
        restored, metadata = ckpt.restore(20, abstract_of(states[20]))
        assert_bitwise_equal(restored, states[20])
        assert metadata == {"env_steps": 20}


def test_async_save_is_safe_against_donating_the_state(mesh4, tmp_path):
    state = make_state(5, mesh4)
    expected = jax.tree.map(host_bits, state)
    bump = jax.jit(lambda s: s.replace(w=s.w + 1.0, v=s.v * 2.0), donate_argnums=0)
    with Checkpointer(tmp_path / "ckpt", async_save=True) as ckpt:
        ckpt.save(5, state, {})
        # Donation may reuse the saved buffers while the write runs (jax 0.10 donates here;
        # jax 0.11 may keep them alive while the save holds them): either way the copy is exact.
        new_state = bump(state)
        ckpt.wait()
        restored, _ = ckpt.restore(5, abstract_of(new_state))
    assert jax.tree.map(host_bits, restored) == expected


def test_nonfinite_state_refused_naming_the_leaf(mesh4, tmp_path):
    directory = tmp_path / "ckpt"
    good = save_steps(directory, mesh4, [1])[1]
    manifest = (directory / "1" / MANIFEST_NAME).read_bytes()
    w = np.asarray(good.w).copy()
    w[2, 3], w[5, 0] = np.nan, np.inf
    mu = np.asarray(good.opt[0].mu["w"]).copy()
    mu[0, 0] = -np.inf
    bad = good.replace(
        w=jax.device_put(w, good.w.sharding),
        opt=(good.opt[0]._replace(mu={"w": jax.device_put(mu, good.w.sharding)}), *good.opt[1:]),
    )
    with Checkpointer(directory) as ckpt:
        with pytest.raises(NonFiniteStateError) as info:
            ckpt.save(2, bad, {})
        message = str(info.value)
        assert ".w (2 of 32 values)" in message
        assert ".opt[0].mu['w'] (1 of 32 values)" in message
        assert ".v" not in message and "step 2" in message
        assert ckpt.steps() == [1]
        step, restored, _ = ckpt.restore_latest(abstract_of(good))
    assert step == 1
    assert_bitwise_equal(restored, good)
    assert (directory / "1" / MANIFEST_NAME).read_bytes() == manifest
    assert sorted(p.name for p in directory.iterdir() if p.name[0].isdigit()) == ["1"]


def _largest_data_file(step_dir):
    """The biggest array-data file orbax wrote (OCDBT data under state/ocdbt.process_0/d/)."""
    files = [p for p in (step_dir / "state").glob("ocdbt.process_*/d/*") if p.is_file()]
    assert files, "orbax's on-disk layout changed: no OCDBT data files"
    return max(files, key=lambda p: p.stat().st_size)


def assert_attributed_here(record):
    """Each CheckpointWarning is one plain line attributed to the caller in this file, so that
    its printout shows no line of rljax's source."""
    found = [w for w in record if issubclass(w.category, CheckpointWarning)]
    assert [(w.filename, "\n" in str(w.message)) for w in found] == [(__file__, False)]


@pytest.mark.parametrize("damage", ["truncate", "delete", "bit_flip", "no_manifest"])
def test_damaged_newest_step_is_skipped_with_a_warning(mesh4, tmp_path, damage):
    directory = tmp_path / "ckpt"
    states = save_steps(directory, mesh4, [1, 2])
    victim = _largest_data_file(directory / "2")
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
        reason = "bytes"
    elif damage == "bit_flip":  # orbax itself would read this back without an error
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        reason = "crc32"
    elif damage == "delete":
        victim.unlink()
        reason = "missing file state/"
    else:  # killed after orbax committed the step, before the save was confirmed durable
        (directory / "2" / MANIFEST_NAME).unlink()
        reason = "unfinished"
    abstract = abstract_of(states[1])
    with Checkpointer(directory) as ckpt:  # a restarted run
        with pytest.warns(CheckpointWarning, match=f"step 2 .*{reason}") as record:
            assert ckpt.latest_valid_step() == 1
        assert_attributed_here(record)
        with pytest.warns(CheckpointWarning, match="step 2"):
            step, restored, metadata = ckpt.restore_latest(abstract)
        assert (step, metadata["env_steps"]) == (1, 1)
        assert_bitwise_equal(restored, states[1])
        with pytest.raises(CheckpointError, match=f"step 2 .*{reason}"):
            ckpt.restore(2, abstract)
        # The resumed run reaches step 2 again: the damaged step is replaced, not refused.
        with pytest.warns(CheckpointWarning, match="replacing damaged checkpoint step 2") as record:
            ckpt.save(2, states[2], {"env_steps": 2})
        assert_attributed_here(record)
        ckpt.wait()
        step, restored, _ = ckpt.restore_latest(abstract)
    assert step == 2
    assert_bitwise_equal(restored, states[2])


def test_warnings_skip_the_frames_of_rljax_callers(tmp_path):
    """Called from rljax's own code (the training loop), a warning points past it."""
    state = {"a": jnp.ones(3)}
    with Checkpointer(tmp_path / "ckpt", async_save=False) as ckpt:
        ckpt.save(1, state, {})
        ckpt.save(2, state, {})
    (tmp_path / "ckpt" / "2" / MANIFEST_NAME).unlink()
    inside_rljax: dict = {}
    caller = "def latest(ckpt):\n    return ckpt.latest_valid_step()\n"
    exec(compile(caller, str(Path(rljax.__file__).parent / "caller.py"), "exec"), inside_rljax)
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        with pytest.warns(CheckpointWarning, match="step 2 .*unfinished") as record:
            assert inside_rljax["latest"](ckpt) == 1
    assert_attributed_here(record)


def test_unfinished_temporary_directory_is_reported(mesh4, tmp_path):
    directory = tmp_path / "ckpt"
    save_steps(directory, mesh4, [1])
    (directory / "2.orbax-checkpoint-tmp").mkdir()  # what a save killed mid-write leaves
    with Checkpointer(directory) as ckpt:
        with pytest.warns(CheckpointWarning, match="step 2 .*unfinished save"):
            assert ckpt.latest_valid_step() == 1


def test_nothing_valid_raises_listing_what_was_tried(mesh4, tmp_path):
    directory = tmp_path / "ckpt"
    states = save_steps(directory, mesh4, [1, 2])
    abstract = abstract_of(states[1])
    with Checkpointer(tmp_path / "empty") as ckpt:
        assert ckpt.latest_valid_step() is None
        with pytest.raises(CheckpointError, match="no valid checkpoint .*no checkpoint steps"):
            ckpt.restore_latest(abstract)
    _largest_data_file(directory / "1").unlink()
    (directory / "2" / MANIFEST_NAME).unlink()
    with Checkpointer(directory) as ckpt:
        with pytest.warns(CheckpointWarning):
            with pytest.raises(CheckpointError) as info:
                ckpt.restore_latest(abstract)
    assert "step 2: unfinished" in str(info.value)
    assert "step 1: damaged (missing file state/" in str(info.value)


def test_wrong_structure_and_misuse_raise_clear_errors(mesh4, tmp_path):
    directory = tmp_path / "ckpt"
    state = save_steps(directory, mesh4, [1])[1]
    with Checkpointer(directory) as ckpt:
        wider = abstract_of(state).replace(
            v=jax.ShapeDtypeStruct((4, 16), np.float32, sharding=state.v.sharding)
        )
        with pytest.raises(
            CheckpointError, match=r"\.v: saved float32\[4, 8\], requested float32\[4, 16\]"
        ):
            ckpt.restore_latest(wider)
        with pytest.raises(CheckpointError, match=r"\.v: saved"):
            ckpt.latest_valid_step(wider)
        unsharded = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
        with pytest.raises(ValueError, match="has no sharding"):
            ckpt.restore(1, unsharded)
        with pytest.raises(CheckpointError, match="step 1 already exists .* valid"):
            ckpt.save(1, state, {})
        with pytest.raises(CheckpointError, match="cannot save step 0 .* valid newer step 1"):
            ckpt.save(0, state, {})
        other_impl = abstract_of(state).replace(
            keys=jax.ShapeDtypeStruct((4,), jax.random.key(0).dtype, sharding=state.keys.sharding)
        )
        with pytest.raises(
            CheckpointError, match=r"\.keys: saved key<rbg>\[4\], requested key<fry>"
        ):
            ckpt.restore(1, other_impl)
        with pytest.raises(TypeError, match="JSON"):
            ckpt.save(2, state, {"bad": object()})
        assert ckpt.steps() == [1]


def test_metadata_round_trip_and_compare(mesh4, tmp_path):
    directory = tmp_path / "ckpt"
    versions = package_versions()
    saved = {**METADATA, "versions": versions}
    with Checkpointer(directory, async_save=False) as ckpt:
        ckpt.save(4, make_state(4, mesh4), saved)
        assert ckpt.read_metadata(4) == json.loads(json.dumps(saved))
        assert compare_metadata(ckpt.read_metadata(4), saved) == []  # tuple (2, 2) == [2, 2]
    current = {
        "algo": {"env": "CartPole-v1", "num_envs": 8, "lr": 2.5e-4, "gamma": 0.99},
        "mesh": {"shape": [1, 4], "axes": ["data", "model"]},
        "env_steps": 0,
    }
    assert compare_metadata(saved, current, ["algo", "mesh.axes"]) == [
        "algo.gamma: <missing> -> 0.99",
        "algo.num_envs: 4 -> 8",
    ]
    assert compare_metadata(saved, current, ["algo.env", "mesh.shape", "seed"]) == [
        "mesh.shape: [2, 2] -> [1, 4]",
    ]
    assert compare_metadata({"a": {"b": "x"}}, {"a": {"b": "y"}}) == ['a.b: "x" -> "y"']
    assert set(versions) == {
        "jax",
        "jaxlib",
        "flax",
        "optax",
        "orbax-checkpoint",
        "gymnax",
        "rljax",
        "python",
    }
    assert versions["orbax-checkpoint"] == importlib.metadata.version("orbax-checkpoint")
    assert versions["jax"] == jax.__version__
    assert versions["python"] == platform.python_version()


TENSORSTORE_ENOSPC = (
    'RESOURCE_EXHAUSTED: Error writing local file "ckpt/2.orbax-checkpoint-tmp/state/_sharding": '
    "Failed to write 14807 bytes to file 5: No space left on device [os_error_code='28']"
)


@pytest.mark.parametrize("where", ["save", "background"])
def test_failed_save_is_one_write_error_and_the_previous_step_stays_valid(
    tmp_path, monkeypatch, where
):
    """What orbax raises on a full disk (a tensorstore ``ValueError``), at ``save`` or from the
    background write: ``CheckpointWriteError`` (a ``TrainingError``: one CLI line) naming the
    step, the directory and the cause; the step before stays the newest valid one."""
    from rljax.errors import TrainingError
    from rljax.run.checkpoint import CheckpointWriteError

    state = {"a": jnp.ones(3)}
    with Checkpointer(tmp_path / "ckpt") as ckpt:
        ckpt.save(1, state, {})
        ckpt.wait()
        ckpt.error_hint = lambda: "resume with: rljax train ppo --resume r"
        manager = type(ckpt._manager)
        save, wait, started = manager.save, manager.wait_until_finished, []

        def save_fails(self, *args, **kwargs):
            if where == "save":
                raise ValueError(TENSORSTORE_ENOSPC)
            started.append(save(self, *args, **kwargs))

        def background_write_fails(self):
            wait(self)
            if started:  # the error of the save in flight, raised once
                started.clear()
                raise ValueError(TENSORSTORE_ENOSPC)

        monkeypatch.setattr(manager, "save", save_fails)
        monkeypatch.setattr(manager, "wait_until_finished", background_write_fails)
        with pytest.raises(CheckpointWriteError) as info:
            ckpt.save(2, state, {})
            ckpt.wait()
        monkeypatch.undo()
        assert isinstance(info.value, TrainingError)
        assert str(info.value) == (
            f"could not write checkpoint step 2 to {tmp_path / 'ckpt'}: No space left on device "
            "(errno 28); the checkpoint at step 1 is intact; resume with: rljax train ppo "
            "--resume r"
        )
    with pytest.warns(CheckpointWarning) if where == "background" else contextlib.nullcontext():
        with Checkpointer(tmp_path / "ckpt") as ckpt:
            assert ckpt.latest_valid_step() == 1


def test_orbax_logged_tracebacks_of_a_failed_save_are_dropped():
    """orbax logs a failed background save's traceback (absl, asyncio) before the same error
    reaches the caller as one ``CheckpointWriteError``: those records are filtered out."""
    import logging
    import sys

    from rljax.run.integrity import _SAVE_ERROR_FILTER

    try:
        raise ValueError("RESOURCE_EXHAUSTED")
    except ValueError:
        exc_info = sys.exc_info()
    orbax_file = "/site-packages/orbax/checkpoint/_src/futures/future.py"
    record = logging.LogRecord("absl", logging.ERROR, orbax_file, 1, "raised", (), exc_info)
    assert not _SAVE_ERROR_FILTER.filter(record)
    for name in ("absl", "asyncio"):
        assert _SAVE_ERROR_FILTER in logging.getLogger(name).filters
    other = logging.LogRecord("absl", logging.ERROR, __file__, 1, "other", (), exc_info)
    assert _SAVE_ERROR_FILTER.filter(other)
    warning = logging.LogRecord("absl", logging.WARNING, orbax_file, 1, "slow", (), None)
    assert _SAVE_ERROR_FILTER.filter(warning)
