"""Step integrity without orbax: manifests and their verification, unfinished saves, layout
records, non-finite leaves of every kind of array."""

import json
import zlib

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rljax.parallel import make_mesh
from rljax.run.integrity import (
    COUNT_IF_FLAGGED,
    FORMAT_VERSION,
    MANIFEST_NAME,
    agree,
    file_crc32,
    is_primary,
    is_prng_key,
    layout_mismatch,
    layout_record,
    newest_valid_step,
    nonfinite_counts,
    nonfinite_leaves,
    read_manifest,
    step_files,
    unfinished_saves,
    verify_step,
    write_manifest,
)


def make_step(directory, step, manifest=True):
    step_dir = directory / str(step)
    (step_dir / "state" / "d").mkdir(parents=True)
    (step_dir / "state" / "d" / "data").write_bytes(bytes(range(256)) * 8)
    (step_dir / "metadata").mkdir()
    (step_dir / "metadata" / "metadata").write_text('{"env_steps": 1}')
    if manifest:
        write_manifest(step_dir, step)
    return step_dir


def test_manifest_records_every_file_and_verifies(tmp_path):
    step_dir = make_step(tmp_path, 7)
    data = step_dir / "state" / "d" / "data"
    assert step_files(step_dir) == ["metadata/metadata", "state/d/data"]
    assert file_crc32(data) == zlib.crc32(data.read_bytes())
    raw = json.loads((step_dir / MANIFEST_NAME).read_text())
    assert (raw["format"], raw["step"]) == (FORMAT_VERSION, 7)
    assert read_manifest(step_dir) == {
        "metadata/metadata": {"size": 16, "crc32": file_crc32(step_dir / "metadata/metadata")},
        "state/d/data": {"size": 2048, "crc32": file_crc32(data)},
    }
    assert not (step_dir / (MANIFEST_NAME + ".tmp")).exists()
    assert verify_step(step_dir) is None


def test_verify_names_what_is_wrong(tmp_path):
    assert verify_step(tmp_path / "3") == "missing (no step directory)"
    assert verify_step(make_step(tmp_path, 4, manifest=False)).startswith("unfinished (no ")
    step_dir = make_step(tmp_path, 5)
    data = step_dir / "state" / "d" / "data"
    original = data.read_bytes()
    flipped = bytearray(original)
    flipped[100] ^= 0x01
    data.write_bytes(bytes(flipped))
    assert verify_step(step_dir) == "damaged (file state/d/data fails its crc32 check)"
    data.write_bytes(original[:1000])
    assert verify_step(step_dir) == (
        "damaged (file state/d/data has 1000 bytes, 2048 were written)"
    )
    data.unlink()
    assert verify_step(step_dir) == "damaged (missing file state/d/data)"
    (step_dir / MANIFEST_NAME).write_text("{not json")
    assert verify_step(step_dir).startswith(f"damaged (unreadable {MANIFEST_NAME}: ")


def test_newest_valid_step_skips_unfinished_and_damaged(tmp_path):
    make_step(tmp_path, 3)
    make_step(tmp_path, 4, manifest=False)
    (tmp_path / "6.orbax-checkpoint-tmp-1234").mkdir()
    (tmp_path / "1.orbax-checkpoint-tmp").mkdir()
    assert sorted(unfinished_saves(tmp_path)) == [
        (1, tmp_path / "1.orbax-checkpoint-tmp"),
        (6, tmp_path / "6.orbax-checkpoint-tmp-1234"),
    ]
    step, skipped = newest_valid_step(tmp_path, [3, 4])
    assert step == 3
    assert [s for s, _ in skipped] == [6, 4]
    assert skipped[0][1] == "unfinished save (temporary directory 6.orbax-checkpoint-tmp-1234)"
    assert skipped[1][1].startswith("unfinished (no ")
    assert newest_valid_step(tmp_path / "absent", []) == (None, [])
    assert unfinished_saves(tmp_path / "absent") == []


def test_layout_record_and_mismatch(mesh4):
    state = {
        "w": jax.device_put(np.zeros((8, 4), np.float32), NamedSharding(mesh4, P("data"))),
        "k": jax.device_put(jax.random.key(0), NamedSharding(mesh4, P())),
        "n": jnp.arange(3),  # one device, no NamedSharding: no spec
    }
    record = layout_record(state)
    assert record["format"] == FORMAT_VERSION
    assert record["mesh"] == {"data": 2, "fsdp": 1, "model": 2}
    assert record["leaves"] == [
        {"path": "['k']", "shape": [], "dtype": "key<fry>", "spec": []},
        {"path": "['n']", "shape": [3], "dtype": "int32", "spec": None},
        {"path": "['w']", "shape": [8, 4], "dtype": "float32", "spec": ["data"]},
    ]
    assert layout_record({"n": jnp.arange(3)})["mesh"] is None
    assert layout_mismatch(json.loads(json.dumps(record)), state) == []
    other = {
        "w": jax.ShapeDtypeStruct((8, 2), np.float32),
        "k": jax.ShapeDtypeStruct((), np.uint32),
        "extra": jax.ShapeDtypeStruct((1,), np.float32),
    }
    assert layout_mismatch(record, other) == [
        "['k']: saved key<fry>[], requested uint32[]",
        "['w']: saved float32[8, 4], requested float32[8, 2]",
        "missing in checkpoint: ['extra']",
        "not in abstract_state: ['n']",
    ]


def test_nonfinite_leaves_of_every_kind_of_array(mesh4):
    w = np.ones((8, 4), np.float32)
    w[0, :3] = np.nan
    state = {
        "sharded": jax.device_put(w, NamedSharding(mesh4, P("data"))),
        "single": jnp.array([1.0, jnp.inf]),  # SingleDeviceSharding
        "other_device": jax.device_put(jnp.array([-jnp.inf]), jax.devices()[5]),
        "host": np.array([np.nan, 1.0], np.float16),
        "finite": jnp.zeros(4),
        "ints": jnp.arange(3),
        "key": jax.random.key(1),
        "scalar": 1.5,
    }
    assert is_prng_key(state["key"]) and not is_prng_key(state["single"])
    assert sorted(nonfinite_leaves(state)) == [
        "['host'] (1 of 2 values)",
        "['other_device'] (1 of 1 values)",
        "['sharded'] (3 of 32 values)",
        "['single'] (1 of 2 values)",
    ]
    assert nonfinite_leaves({"a": jnp.ones(3)}) == []


def test_nonfinite_counts_on_one_device_match_numpy():
    # On a 1-device mesh the counts come from one prefix sum over the concatenated leaves; the
    # leaves' order, an empty leaf, bfloat16 and integer/key leaves (not counted) all matter.
    # The values are concatenated in a common dtype before one finiteness test: the largest
    # finite float16 and bfloat16 values must stay finite there.
    nan, inf = np.nan, np.inf
    state = {
        "a": jnp.array([[1.0, nan], [inf, 2.0]]),
        "b": jnp.zeros((0, 3)),
        "c": jnp.array([nan, -inf, nan], jnp.bfloat16),
        "d": jnp.arange(3),
        "e": jnp.ones((5,)),
        "f": jax.random.key(0),
        "g": jnp.array(nan),
        "h": jnp.array([jnp.finfo(jnp.float16).max, inf], jnp.float16),
        "i": jnp.array([jnp.finfo(jnp.bfloat16).max, 1.0], jnp.bfloat16),
    }
    expected = [2, 0, 3, 0, 1, 1, 0]
    with jax.set_mesh(make_mesh("data=1,model=1")):
        counted = jax.jit(nonfinite_counts)(state)
        jaxpr = str(jax.make_jaxpr(nonfinite_counts)(state))
        assert "cumsum" in jaxpr and jaxpr.count("is_finite") == 1  # the one-device path
    np.testing.assert_array_equal(counted, expected)
    np.testing.assert_array_equal(jax.jit(nonfinite_counts)(state), expected)  # per leaf
    assert "cumsum" not in str(jax.make_jaxpr(nonfinite_counts)(state))


def test_nonfinite_counts_of_large_leaves_match_numpy():
    # Past COUNT_IF_FLAGGED values a leaf is counted only when its sum is not finite: NaN alone,
    # +inf alone, -inf alone, all three, and finite float16 values whose sum overflows.
    n = COUNT_IF_FLAGGED + 7
    rng = np.random.default_rng(0)

    def leaf(bad, dtype=np.float32):
        x = rng.standard_normal(n).astype(dtype)
        for value, count in bad:
            x[rng.choice(n, count, replace=False)] = value
        return x

    host = {
        "nan": leaf([(np.nan, 3)]),
        "pos_inf": leaf([(np.inf, 1)]),
        "neg_inf": leaf([(-np.inf, 2)], np.float16),
        "all": leaf([(np.nan, 5), (np.inf, 4), (-np.inf, 6)]),
        "finite": np.full(n, np.finfo(np.float16).max, np.float16),
        "small": np.array([np.nan, 1.0], np.float32),
    }
    expected = [3, 1, 2, 15, 0, 1]  # nonfinite_counts' order: the state's sorted keys
    expected = [dict(zip(host, expected, strict=True))[k] for k in sorted(host)]
    state = jax.tree.map(jnp.asarray, host)
    np.testing.assert_array_equal(jax.jit(nonfinite_counts)(state), expected)
    assert "cond" in str(jax.make_jaxpr(nonfinite_counts)(state))


def test_single_process_agreement():
    assert is_primary()
    assert agree(5) == 5 and agree(-1) == -1
