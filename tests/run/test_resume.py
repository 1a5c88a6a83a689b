"""Checkpoints: exact resume after SIGKILL, SIGTERM, elastic restore, NaN guard, damage, mismatch.

Process behaviour is tested with real subprocesses of the CLI; the rest in-process.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import PPO, ConfigError, Hook, PPOConfig, RunConfig, train
from rljax.cli import main
from rljax.errors import TrainingError
from rljax.parallel import make_mesh
from rljax.parallel.sync import SyncConfig
from rljax.run.checkpoint import Checkpointer, CheckpointWarning
from rljax.run.loop import TIMING_COLUMNS
from rljax.run.resume import abstract_state
from rljax.run.run_log import read_metrics
from rljax.run.sharded import ShardedRun
from tests.run.kill import kill_after_checkpoint
from tests.run.trees import host_state

SMALL = PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 16 * 8, num_minibatches=2)


def cli(*args, devices=2):
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": str(devices), "PYTHONUNBUFFERED": "1"}
    return [sys.executable, "-m", "rljax", "train", *args], env


def restored(run_dir, config, mesh_spec, replicas):
    """The newest checkpoint of ``run_dir`` restored for ``config`` on ``mesh_spec``."""
    run = ShardedRun(PPO(config, replicas=replicas), make_mesh(mesh_spec))
    with Checkpointer(Path(run_dir) / "checkpoints") as ckpt:
        step, state, meta = ckpt.restore_latest(abstract_state(run))
    return step, host_state(state), meta


# -- processes ------------------------------------------------------------------------------------
# UPDATES of 2048 env steps, a checkpoint every 30; the kill lands once checkpoint 30 is on disk.
# With 60 updates a fast host (AMD EPYC, 2026-12-07) logged all 60 before checkpoint 30's
# asynchronous save was complete, so 120 updates now follow it.
UPDATES = 150
KILL_ARGS = [
    "ppo",
    "--num-envs", "16",
    "--num-steps", "128",
    "--total-timesteps", str(16 * 128 * UPDATES),
    "--log-every", "10",
    "--checkpoint-every", "30",
    "--checkpoint-min-seconds", "0",
    "--mesh", "data=2",
]  # fmt: skip


def test_sigkill_after_checkpoint_then_resume_is_bitwise_identical(tmp_path):
    command, env = cli(*KILL_ARGS, "--runs-dir", str(tmp_path), "--run-name", "full")
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)

    command, env = cli(*KILL_ARGS, "--runs-dir", str(tmp_path), "--run-name", "killed")
    kill_after_checkpoint(command, env, tmp_path / "killed", 30)
    killed_rows = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert 30 <= len(killed_rows) < UPDATES
    with Checkpointer(tmp_path / "killed" / "checkpoints") as ckpt:
        newest = ckpt.latest_valid_step()  # 30, or a later one saved before the kill landed
    assert newest is not None and 30 <= newest < UPDATES

    command, env = cli("ppo", "--resume", str(tmp_path / "killed"))
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"resumed from update {newest}" in result.stdout

    config = PPOConfig(num_envs=16, num_steps=128, total_timesteps=16 * 128 * UPDATES)
    step_a, full, _ = restored(tmp_path / "full", config, "data=2,model=1", 2)
    step_b, resumed, meta = restored(tmp_path / "killed", config, "data=2,model=1", 2)
    assert step_a == step_b == UPDATES and meta["env_steps"] == UPDATES * 2048
    chex.assert_trees_all_equal(resumed, full)  # parameters, optimizer, envs, keys: bitwise
    rows_full = read_metrics(tmp_path / "full" / "metrics.jsonl")
    rows_resumed = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert [r["update"] for r in rows_resumed] == list(range(1, UPDATES + 1))  # none lost/doubled
    assert untimed(rows_resumed) == untimed(rows_full)  # all but wall time and steps/s


def untimed(rows):
    return [{k: v for k, v in r.items() if k not in TIMING_COLUMNS} for r in rows]


def test_sigterm_finishes_the_chunk_saves_and_exits_zero(tmp_path):
    args = [*KILL_ARGS, "--total-timesteps", str(16 * 128 * 400), "--checkpoint-every", "1000"]
    command, env = cli(*args, "--runs-dir", str(tmp_path), "--run-name", "term")
    pipe = subprocess.PIPE
    proc = subprocess.Popen(command, env=env, stdout=pipe, stderr=pipe, text=True)
    for line in proc.stdout:  # wait until training is under way
        if "update" in line and "steps/s" in line:
            break
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "SIGTERM: stopped after update" in out and "--resume" in out
    with Checkpointer(tmp_path / "term" / "checkpoints") as ckpt:
        steps = ckpt.steps()
    assert len(steps) == 1 and 10 <= steps[0] < 400 and steps[0] % 10 == 0
    rows = read_metrics(tmp_path / "term" / "metrics.jsonl")
    assert [r["update"] for r in rows] == list(range(1, steps[0] + 1))


# -- in-process -----------------------------------------------------------------------------------
def run_small(tmp_path, name, config=SMALL, hooks=(), **run):
    options = dict(
        mesh="data=2,model=2",
        log_every=2,
        checkpoint_every=4,
        checkpoint_min_seconds=0,
        quiet=True,
        measure_comm=False,
    )
    run = RunConfig.make(runs_dir=str(tmp_path), run_name=name, **(options | run))
    return train(config, run, hooks=hooks)


def resume(config, run_dir, mesh="data=2,model=2", **run):
    options = dict(mesh=mesh, resume=str(run_dir), quiet=True, measure_comm=False)
    return train(config, RunConfig.make(**(options | run)))


def nan_parameters_after(update: int) -> Hook:
    """Fault injection: NaN parameters after the chunk that contains ``update`` (once), ahead
    of the built-in hooks (``first=True``) so the non-finite guard sees them at once."""
    injected = []

    def poison(info):
        if injected or not info.first_update < update <= info.update:
            return
        injected.append(info.update)
        sharded = info.loop.sharded
        nan = jax.jit(
            lambda p: jax.tree.map(lambda x: x * jnp.nan, p),
            out_shardings=sharded.state_shardings.params,
        )
        with jax.set_mesh(sharded.mesh):
            info.loop.replace_state(info.state.replace(params=nan(info.state.params)))

    return Hook(poison, first=True)


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory):
    """8 updates on data=2,model=2 with checkpoints at 4 and 8."""
    tmp_path = tmp_path_factory.mktemp("saved")
    result = run_small(tmp_path, "base")
    return tmp_path / "base", host_state(result.state)


@pytest.mark.parametrize("mesh", ["data=1,model=4", "data=4,model=1", "data=1,model=1"])
def test_elastic_restore_onto_other_meshes_continues(saved_run, mesh, tmp_path):
    run_dir, final = saved_run
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    replicas = make_mesh(mesh).shape["data"]
    step, state, _ = restored(copy, SMALL, mesh, replicas)
    assert step == 8
    chex.assert_trees_all_equal(state.params, final.params)  # exact on the new layout
    chex.assert_trees_all_equal(state.env, final.env)
    longer = dataclasses.replace(SMALL, total_timesteps=SMALL.total_timesteps * 2)
    result = resume(longer, copy, mesh, log_every=4)
    assert result.resumed_from == 8 and result.updates_done == 16
    assert [r["update"] for r in read_metrics(copy / "metrics.jsonl")] == list(range(1, 17))


def test_per_replica_state_is_averaged_when_the_data_size_changes(tmp_path):
    config = dataclasses.replace(SMALL, sync=SyncConfig("local_sgd", period=3))
    first = run_small(tmp_path, "local", config)  # replicas=2
    params = jax.device_get(first.state.params)
    longer = dataclasses.replace(config, total_timesteps=config.total_timesteps + 8 * 16 * 2)
    result = resume(longer, tmp_path / "local", "data=4", log_every=2)
    assert result.updates_done == 10
    step, state, _ = restored_local(tmp_path / "local", longer)
    assert step == 10
    kernel = np.asarray(state.params["params"]["actor"]["dense_0"]["kernel"])
    assert kernel.shape[0] == 4  # four replicas now
    old = np.asarray(params["params"]["actor"]["dense_0"]["kernel"])
    assert old.shape[0] == 2 and not np.allclose(kernel[0], old[0])  # trained on from the mean


def restored_local(run_dir, config):
    return restored(run_dir, config, "data=4,model=1", 4)


def test_nonfinite_parameters_stop_the_run_and_keep_the_last_good_checkpoint(tmp_path):
    with pytest.raises(TrainingError) as info:
        run_small(tmp_path, "nan", hooks=[nan_parameters_after(5)])
    message = str(info.value)
    assert "non-finite parameters (NaN/Inf) at update 6" in message
    assert "last good checkpoint (update 4)" in message and "--resume" in message
    with Checkpointer(tmp_path / "nan" / "checkpoints") as ckpt:
        assert ckpt.steps() == [4] and ckpt.latest_valid_step() == 4


def test_nonfinite_loss_is_named_with_its_update(tmp_path):
    pattern = r"non-finite (loss|grad_norm|parameters) \(NaN/Inf\) at update \d+"
    with pytest.raises(TrainingError, match=pattern):
        run_small(tmp_path, "lr", dataclasses.replace(SMALL, lr=1e38, max_grad_norm=1e38))


def test_rollback_policy_restores_and_continues_with_fresh_keys(tmp_path):
    hooks = [nan_parameters_after(5)]
    result = run_small(tmp_path, "rb", hooks=hooks, on_nonfinite="rollback")
    assert result.rollbacks == 1 and result.updates_done == 8
    rows = read_metrics(tmp_path / "rb" / "metrics.jsonl")
    assert [r["update"] for r in rows] == list(range(1, 9))
    assert all(np.isfinite(r["loss"]) for r in rows)


def test_damaged_newest_checkpoint_falls_back_with_a_warning(saved_run, tmp_path):
    run_dir, _ = saved_run
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    step_dir = copy / "checkpoints" / "8"
    data_files = [p for p in step_dir.rglob("*") if p.is_file() and p.stat().st_size > 64]
    victim = max(data_files, key=lambda p: p.stat().st_size)
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    with pytest.warns(CheckpointWarning, match="step 8"):
        result = resume(SMALL, copy)
    assert result.resumed_from == 4 and result.updates_done == 8
    for manifest in (copy / "checkpoints").rglob("rljax_manifest.json"):
        manifest.unlink()
    with pytest.warns(CheckpointWarning), pytest.raises(TrainingError, match="no valid checkpoint"):
        resume(SMALL, copy)


def test_incompatible_resume_lists_the_differing_fields(saved_run, capsys):
    run_dir, _ = saved_run
    other = dataclasses.replace(SMALL, env="Acrobot-v1", actor_widths=(32, 32))
    with pytest.raises(ConfigError) as info:
        train(other, RunConfig.make(mesh="data=2,model=2", resume=str(run_dir), quiet=True))
    message = str(info.value)
    assert 'algo.env: "CartPole-v1" -> "Acrobot-v1"' in message
    assert "algo.actor_widths: [64, 64] -> [32, 32]" in message
    assert main(["train", "dqn", "--resume", str(run_dir)]) == 2
    assert "it is a ppo run" in capsys.readouterr().err
    assert main(["train", "ppo", "--resume", str(run_dir), "--num-envs", "16"]) == 2
    assert "algo.num_envs: 8 -> 16" in capsys.readouterr().err
    rows = json.loads((run_dir / "config.json").read_text())
    assert rows["algo"]["env"] == "CartPole-v1"  # nothing written by the refused attempts


# -- resume records, defaults, nothing to train, damaged files ------------------------------------
def copy_run(run_dir, tmp_path, name="copy"):
    copy = tmp_path / name
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    return copy


def snapshot(directory):
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(Path(directory).rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("total", [SMALL.total_timesteps, SMALL.total_timesteps // 2])
def test_resume_with_nothing_left_to_train_is_one_message_and_changes_nothing(
    saved_run, total, capsys
):
    run_dir, _ = saved_run
    before = snapshot(run_dir)
    args = ["train", "ppo", "--resume", str(run_dir), "--total-timesteps", str(total)]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"error: {run_dir} is already at 8 updates (1,024 env steps) and total_timesteps={total} "
        f"asks for {total // 128}; nothing changed; pass --total-timesteps above 1024 (at least "
        "1152: one update is 128 env steps) to train longer"
    ]
    assert snapshot(run_dir) == before  # config.json, metrics, checkpoints; no lock left


def test_fresh_config_records_provenance_and_no_resumes(saved_run):
    data = json.loads((saved_run[0] / "config.json").read_text())
    assert data["resumes"] == []
    prov = data["provenance"]
    assert set(prov) == {"command_line", "started", "rljax_version", "git_commit"}
    assert prov["started"].endswith("Z") and prov["command_line"]
    commit = prov["git_commit"]  # the tests run from a git checkout (or a copy without .git)
    assert commit is None or (len(commit) == 40 and int(commit, 16) >= 0)


def test_resume_records_accumulate_and_missing_fields_take_defaults(saved_run):
    from rljax.run.resume import (
        effective_config,
        incompatibilities,
        read_config_file,
        resume_record,
    )

    data = read_config_file(saved_run[0])
    del data["algo"]["ent_coef"]  # a field added to PPOConfig after the run was saved
    del data["run"]["logging"]["tensorboard"]
    run = RunConfig.from_dict(data["run"])
    assert incompatibilities(data, "ppo", SMALL, run) == []  # the defaults: nothing differs
    assert incompatibilities(data, "ppo", dataclasses.replace(SMALL, ent_coef=0.5), run) == [
        "algo.ent_coef: 0.01 -> 0.5"
    ]

    def sections(total):
        config = dataclasses.replace(SMALL, total_timesteps=total)
        return {"algo": dataclasses.asdict(config), "run": dataclasses.asdict(run), "mesh": {}}

    first = resume_record(data, sections(2048), PPOConfig, 8)
    assert first["defaults"] == {"algo.ent_coef": 0.01, "run.logging.tensorboard": False}
    assert first["changed"]["algo.total_timesteps"] == {"old": 1024, "new": 2048}
    assert first["from_update"] == 8 and first["command_line"]
    data["resumes"] = [first]
    second = resume_record(data, sections(4096), PPOConfig, 16)
    assert second["changed"]["algo.total_timesteps"] == {"old": 2048, "new": 4096}
    assert second["defaults"] == {}  # the first record made them explicit
    effective = effective_config({**data, "resumes": [first, second]})
    assert effective["algo"]["total_timesteps"] == 4096 and effective["algo"]["ent_coef"] == 0.01
    assert data["algo"]["total_timesteps"] == 1024  # the original is kept as it was


def test_a_run_saved_before_a_field_was_renamed_resumes_under_the_new_name(saved_run, tmp_path):
    from rljax.run.resume import effective_config, read_run_config

    copy = copy_run(saved_run[0], tmp_path)
    path = copy / "config.json"
    data = json.loads(path.read_text())
    data["algo"]["gru_width"] = data["algo"].pop("recurrent_width")  # as written before the rename
    path.write_text(json.dumps(data))
    effective = read_run_config(copy)
    assert "gru_width" not in effective["algo"] and effective["algo"]["recurrent_width"] == 128
    longer = dataclasses.replace(SMALL, total_timesteps=SMALL.total_timesteps + 2 * 128)
    result = resume(longer, copy)
    assert result.resumed_from == 8 and result.updates_done == 10
    record = json.loads(path.read_text())["resumes"][0]
    assert record["defaults"] == {}
    assert {k for k in record["changed"] if k.startswith("algo.")} == {"algo.total_timesteps"}
    # a resume record written under the old name (the field took its default then) applies too
    old_record = {"defaults": {"algo.gru_width": 32}, "changed": {}}
    assert effective_config({**data, "resumes": [old_record]})["algo"]["recurrent_width"] == 32


DAMAGE = {
    "truncated": lambda text: text[: len(text) // 2],
    "garbage": lambda text: "\x00\x01 not json",
    "not an object": lambda text: "[1, 2]",
    "no algo section": lambda text: json.dumps({"algorithm": "ppo", "run": {}}),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_config_json_is_one_error_naming_the_file(saved_run, tmp_path, damage, capsys):
    copy = copy_run(saved_run[0], tmp_path)
    path = copy / "config.json"
    path.write_text(DAMAGE[damage](path.read_text()))
    before = snapshot(copy)
    assert main(["train", "ppo", "--resume", str(copy), "--total-timesteps", "2048"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: cannot resume {str(copy)!r}: {path} is damaged (")
    assert "nothing was changed" in line
    with pytest.raises(ConfigError, match="config.json is damaged"):
        resume(SMALL, copy)
    assert snapshot(copy) == before


def test_cli_resume_after_damage_warns_in_plain_lines_and_repairs_metrics(
    saved_run, tmp_path, capsys
):
    """A damaged newest checkpoint, a torn last line and a garbage line in metrics.jsonl, and a
    config field the saved run lacks: the resume goes on from update 4, every warning is one
    ``warning:`` line, the rows are 1..8 once each and the record names the default."""
    copy = copy_run(saved_run[0], tmp_path)
    victim = max(
        (p for p in (copy / "checkpoints" / "8").rglob("*") if p.is_file()),
        key=lambda p: p.stat().st_size,
    )
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    metrics = copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines(keepends=True)
    metrics.write_text("".join(lines[:3]) + "garbage\n" + "".join(lines[3:]) + '{"update": 9, "lo')
    config = json.loads((copy / "config.json").read_text())
    del config["algo"]["ent_coef"]
    (copy / "config.json").write_text(json.dumps(config))

    assert main(["train", "ppo", "--resume", str(copy)]) == 0
    err = capsys.readouterr().err.strip().splitlines()
    assert all(line.startswith("warning: ") for line in err), err
    assert any("skipping checkpoint step 8" in line for line in err)
    assert any(f"dropped 2 damaged line(s) of {metrics}" in line for line in err)
    assert [r["update"] for r in read_metrics(metrics)] == list(range(1, 9))
    saved = json.loads((copy / "config.json").read_text())
    assert "ent_coef" not in saved["algo"]  # the original stays as it was
    (record,) = saved["resumes"]
    assert record["from_update"] == 4 and record["defaults"] == {"algo.ent_coef": 0.01}


@pytest.mark.parametrize(
    "failure", [FileNotFoundError("git"), subprocess.TimeoutExpired("git", 2)], ids=str
)
def test_git_commit_is_none_when_git_is_missing_or_hangs(monkeypatch, failure):
    from rljax.run import metadata

    def run(*args, **kwargs):
        raise failure

    monkeypatch.setattr(metadata.subprocess, "run", run)
    metadata.git_commit.cache_clear()
    try:
        assert metadata.git_commit() is None
        assert metadata.provenance()["git_commit"] is None
    finally:
        metadata.git_commit.cache_clear()
