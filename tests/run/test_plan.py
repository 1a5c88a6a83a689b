"""The memory plan: figures from the compiled programs, the budget check and its message."""

import dataclasses
import json
import re

import jax
import pytest

from rljax import ConfigError, PPOConfig, RunConfig, train
from rljax.parallel import parse_mesh_spec
from rljax.run import memory
from rljax.run.plan import GRADIENTS, plan, plan_of
from rljax.run.sharded import ShardedRun, prepare

TINY = PPOConfig(
    num_envs=8, num_steps=8, total_timesteps=8 * 8 * 2, update_epochs=1, num_minibatches=1
)
RUN = RunConfig.make(mesh="data=2,model=2", eval_every=0, quiet=True)


@pytest.fixture(scope="module")
def compiled():
    """``(ShardedRun compiled on data=2,model=2, its Plan)``: one compile for the module."""
    layout, algo = prepare(TINY, RUN)
    sharded = ShardedRun(algo, layout, 1, chunk_size=2)
    sharded.compile(jax.random.key(0))
    return sharded, plan_of(sharded, "ppo", RUN)


def test_the_figures_are_the_compiled_programs_memory_analysis(compiled):
    sharded, p = compiled
    for name in ("init", "chunk"):
        analysis = sharded.compiled[name].memory_analysis()
        figures = p.programs[name]
        assert figures["temp"] == analysis.temp_size_in_bytes
        assert figures["argument"] == analysis.argument_size_in_bytes
        assert figures["output"] == analysis.output_size_in_bytes
        assert figures["alias"] == analysis.alias_size_in_bytes
    chunk = p.programs["chunk"]
    assert p.temporaries == chunk["temp"] > 0 and p.total == max(
        p.programs["init"]["total"], chunk["total"]
    )
    # The chunk's arguments are the (per-device) state plus its int32 trip count.
    assert sum(p.state.values()) + 4 == chunk["argument"]
    # ... and the state figures are what a real initialised state holds on one device.
    state = sharded.init(jax.random.key(0))
    device = sharded.mesh.devices.flat[0]

    def on_device(tree) -> int:
        return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
                   if s.device == device)  # fmt: skip

    assert p.state["parameters"] == on_device(state.params) == p.gradients
    assert p.state["optimizer state"] == on_device(state.opt_state)
    assert p.param_count == sum(x.size for x in jax.tree.leaves(state.params))
    biggest = max(
        (s.data.nbytes, x.shape) for x in jax.tree.leaves(state) for s in x.addressable_shards
        if s.device == device and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
    )  # fmt: skip
    assert p.largest["bytes_per_device"] == biggest[0]
    assert tuple(p.largest["shape"]) == biggest[1] and p.largest["path"].startswith("params")
    table = p.table()
    assert f"parameters: {p.param_count:,}" in table and "mesh data=2,model=2 (4 devices)" in table
    assert "activations/temporaries" in table and "budget: none known" in table
    assert p.as_dict()["bytes_per_device"]["temporaries"] == p.temporaries


def test_state_parts_on_data2_model2_against_one_device(compiled):
    _, p = compiled
    layout, algo = prepare(TINY, RunConfig.make(mesh="data=1", eval_every=0))
    one = memory.state_bytes(algo, layout)  # traced only
    assert p.state["environments"] * 2 == one["environments"]  # the batch halves on data=2
    for part in ("parameters", "optimizer state"):  # split layers halve, heads and biases not
        assert one[part] / 2 < p.state[part] < one[part]


def test_over_budget_one_message_with_the_figures_and_a_mesh_that_fits(compiled):
    sharded, p = compiled
    tight = plan_of(sharded, "ppo", RUN.replace(memory_per_device=str(p.total - 1)))
    assert not tight.fits and tight.suggestion is not None
    with pytest.raises(ConfigError) as info:
        tight.check()
    message = str(info.value)
    assert "\n" not in message
    assert re.match(r"this run needs [\d.]+ kB per device on mesh data=2,model=2 \(the \w+ "
                    r"program; ", message)  # fmt: skip
    assert "parameters " in message and f"{GRADIENTS} " in message
    assert re.search(r"but --memory-per-device allows [\d.]+ kB", message)
    spec = re.search(r"a mesh that would fit: --mesh (\S+) \(about [\d.]+ kB per device\)$",
                     message).group(1)  # fmt: skip
    assert parse_mesh_spec(spec) != parse_mesh_spec("data=2,model=2")
    assert tight.suggestion[1] <= p.total - 1
    hopeless = plan_of(sharded, "ppo", RUN.replace(memory_per_device="1B"))
    assert hopeless.suggestion is None
    assert re.search(r"no mesh of the 8 device\(s\) fits: lower .*--num-envs", hopeless.message())
    assert hopeless.as_dict()["fits"] is False and tight.as_dict()["suggested_mesh"] == spec


@pytest.mark.parametrize("text, expected", [
    ("16GB", 16 * 10**9), ("512MiB", 512 * 2**20), ("2e9", 2 * 10**9), ("1.5 GiB", 3 * 2**29),
    ("100kB", 100_000), (4096, 4096), ("7", 7),
])  # fmt: skip
def test_memory_per_device_takes_sizes(text, expected):
    assert memory.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["lots", "16 GBB", "-1GB", "0", "0.5", "nan", ""])
def test_a_bad_memory_per_device_is_one_error_before_compiling(text):
    with pytest.raises(ConfigError, match=r"memory_per_device=.*: expected a size .* 16GB"):
        plan(TINY, RunConfig.make(memory_per_device=text))


def test_a_run_over_its_budget_stops_before_anything_is_written(tmp_path):
    run = RunConfig.make(mesh="data=2", eval_every=0, quiet=True, memory_per_device="20kB",
                         runs_dir=str(tmp_path / "runs"), run_name="big")  # fmt: skip
    expected = r"^this run needs .* but --memory-per-device allows 20\.0 kB; (a mesh|no mesh)"
    with pytest.raises(ConfigError, match=expected):
        train(dataclasses.replace(TINY, actor_widths=(256, 256)), run)
    assert not (tmp_path / "runs" / "big").exists()


def test_config_json_records_the_plan_and_a_resume_may_change_the_budget(tmp_path):
    run = RunConfig.make(mesh="data=2", eval_every=0, quiet=True, log_every=2,
                         runs_dir=str(tmp_path), run_name="r")  # fmt: skip
    train(TINY, run)
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    fresh = config["memory_plan"]
    assert fresh["mesh"].startswith("data=2") and fresh["budget"] is None and fresh["fits"]
    assert fresh["bytes_per_device"]["temporaries"] > 0 and fresh["param_count"] > 0
    longer = dataclasses.replace(TINY, total_timesteps=2 * TINY.total_timesteps)
    result = train(longer, run.replace(resume=str(tmp_path / "r"), memory_per_device="16GB"))
    assert result.resumed_from == 2 and result.updates_done == 4
    config = json.loads((tmp_path / "r" / "config.json").read_text())
    assert config["memory_plan"] == fresh  # the original start's record is kept as it was
    (record,) = config["resumes"]
    assert record["memory_plan"]["budget"] == 16 * 10**9
    assert record["changed"]["run.parallel.memory_per_device"]["new"] == "16GB"
