"""RunConfig groups and flat names; every bad input stops with one clear message before anything
is compiled."""

import dataclasses
import subprocess
import sys

import pytest

from rljax import ConfigError, PPOConfig, RunConfig
from rljax.cli import main
from rljax.parallel import make_mesh, parse_mesh_spec, set_num_cpu_devices
from rljax.run.config import (
    CheckpointConfig,
    ParallelConfig,
    resumable_fields,
)
from rljax.run.sharded import prepare


def error_of(config=None, run=None):
    with pytest.raises(ConfigError) as info:
        prepare(config or PPOConfig(), run or RunConfig())
    return str(info.value)


def test_non_positive_learning_rate():
    assert "lr (learning rate) must be > 0, got -0.001" in error_of(PPOConfig(lr=-1e-3))
    assert "lr (learning rate) must be > 0, got 0.0" in error_of(PPOConfig(lr=0.0))


def test_negative_checkpoint_time_floor():
    message = error_of(run=RunConfig.make(checkpoint_min_seconds=-1.0))
    assert "checkpoint_min_seconds must be >= 0 (0: save every checkpoint_every updates)" in message


def test_num_envs_not_divisible_by_data():
    message = error_of(PPOConfig(num_envs=6), RunConfig.make(mesh="data=4,model=1"))
    assert "num_envs=6 is not divisible by the 4 data-parallel shards" in message


def test_minibatches_not_dividing_batch():
    message = error_of(PPOConfig(num_envs=4, num_steps=10, num_minibatches=3))
    assert "num_minibatches=3 does not divide the batch num_envs*num_steps=40" in message


def test_unknown_environment_lists_known_ones():
    message = error_of(PPOConfig(env="CartPole-v0"))
    assert "unknown environment 'CartPole-v0'" in message
    assert "CartPole-v1" in message and "Breakout-MinAtar" in message


def test_mesh_bigger_than_devices_states_both():
    message = error_of(run=RunConfig.make(mesh="data=4,model=4"))
    assert "mesh 'data=4,model=4' needs 16 devices but only 8 are available" in message


def test_width_not_divisible_by_model_names_layer():
    message = error_of(PPOConfig(actor_widths=(63, 64)), RunConfig.make(mesh="data=1,model=2"))
    assert "actor/dense_0: width 63 is not divisible by the model axis size 2" in message


def test_mesh_spec_errors():
    with pytest.raises(ConfigError, match="bad entry 'pipe=2'"):
        parse_mesh_spec("data=2,pipe=2")
    with pytest.raises(ConfigError, match="at most one axis may be -1"):
        parse_mesh_spec("data=-1,model=-1")
    assert parse_mesh_spec("model=2") == {"data": 1, "fsdp": 1, "stage": 1, "model": 2}
    shape = {"data": 4, "fsdp": 1, "stage": 1, "model": 2}
    assert dict(make_mesh("data=-1,model=2").shape) == shape
    shape = {"data": 1, "fsdp": 4, "stage": 1, "model": 2}
    assert dict(make_mesh("fsdp=-1,model=2").shape) == shape


def test_emulating_devices_after_jax_started_says_so():
    set_num_cpu_devices(8)  # what we already have: fine
    with pytest.raises(ConfigError, match="already initialised with 8 cpu device"):
        set_num_cpu_devices(4)


def test_seed_axis_needs_divisible_seeds():
    message = error_of(run=RunConfig.make(mesh="data=2", num_seeds=3, seed_axis="data"))
    assert "num_seeds (3) divisible by the data axis size 2" in message


def test_cli_prints_one_error_line_and_writes_nothing(tmp_path, capsys):
    code = main(["train", "ppo", "--lr", "-1", "--runs-dir", str(tmp_path), "--run-name", "bad"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.strip() == "error: lr (learning rate) must be > 0, got -1.0"
    assert not (tmp_path / "bad").exists()


def test_cli_subprocess_has_no_traceback(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "rljax",
            "train",
            "ppo",
            "--env",
            "Nope-v0",
            "--num-devices",
            "2",
            "--runs-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith("error: unknown environment 'Nope-v0'")


def test_config_is_frozen_and_typed():
    assert dataclasses.is_dataclass(PPOConfig)
    with pytest.raises(dataclasses.FrozenInstanceError):
        PPOConfig().lr = 1.0  # type: ignore[misc]


def test_make_routes_flat_names_to_their_groups():
    run = RunConfig.make(mesh="data=2,model=2", eval_every=0, resume="runs/x", seed=3)
    assert run.parallel == ParallelConfig(mesh="data=2,model=2")
    assert run.evaluation.eval_every == 0 and run.checkpointing == CheckpointConfig(resume="runs/x")
    assert run.seed == 3 and run.logging.measure_comm is False  # HLO accounting only when asked
    assert run.replace(num_seeds=4).flat()["num_seeds"] == 4
    assert RunConfig.make(parallel=ParallelConfig(mesh="data=4")).parallel.mesh == "data=4"
    with pytest.raises(ConfigError, match="RunConfig has no field 'debug_nonfinite_at'"):
        RunConfig.make(debug_nonfinite_at=5)


def test_saved_configs_load_nested_and_flat():
    run = RunConfig.make(mesh="data=2", log_every=7, on_nonfinite="rollback")
    assert RunConfig.from_dict(dataclasses.asdict(run)) == run
    old = {"mesh": "data=2", "log_every": 7, "on_nonfinite": "rollback", "debug_nonfinite_at": 0}
    assert RunConfig.from_dict(old) == run  # an older run's flat `run` section


def test_resumable_fields_come_from_field_metadata():
    free = resumable_fields(RunConfig)
    assert {"parallel.mesh", "logging.log_every", "checkpointing.resume", "seed"} <= free
    assert "num_seeds" not in free and "parallel.seed_axis" not in free


def test_too_many_emulated_devices_is_one_error_before_jax_creates_them(tmp_path, capsys):
    runs = tmp_path / "runs"
    args = ["train", "ppo", "--num-devices", "100000", "--runs-dir", str(runs)]
    assert main(args) == 2  # JAX already runs here: the bound is checked before that matters
    err = capsys.readouterr().err.strip()
    assert err == "error: num_devices=100000 emulated CPU devices: allowed are 1 to 1024 (they " \
        "share this host's cores and memory)"  # fmt: skip
    assert not runs.exists()
    from rljax.distributed import DistributedConfig, initialize

    with pytest.raises(ConfigError, match=r"num_devices=100000 .* allowed are 1 to 1024"):
        initialize(DistributedConfig(num_cpu_devices=100000))


def test_a_seed_group_that_does_not_divide_a_devices_seeds():
    message = error_of(run=RunConfig.make(mesh="data=2", num_seeds=12, seed_axis="data",
                                          seed_group=4))  # fmt: skip
    assert "seed_group=4 must be 0 (auto) or divide the 6 seeds each device trains" in message
