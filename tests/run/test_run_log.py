"""What a run leaves on disk: metrics.jsonl rows (with evaluation), TensorBoard, wandb (stubbed)."""

import dataclasses
import struct
import sys
import types

import numpy as np
import pytest

from rljax import ConfigError, PPOConfig, RunConfig, train
from rljax.run.run_log import RunLog, read_metrics

TINY = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2)


def read_scalars(event_file):
    """TFRecord framing: length (u64), crc (u32), payload, crc (u32); payloads are Events."""
    from tensorboardX.proto import event_pb2

    scalars, data = {}, event_file.read_bytes()
    offset = 0
    while offset < len(data):
        (length,) = struct.unpack("<Q", data[offset : offset + 8])
        event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
        offset += 12 + length + 4
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


class FakeWandbRun:
    """Records what ``RunLog`` sends to ``wandb`` (wandb itself is optional and not installed)."""

    def __init__(self, **init_kwargs):
        self.init_kwargs, self.logged, self.finished = init_kwargs, [], False
        self.config_data = {}
        self.config = types.SimpleNamespace(update=lambda data, **_: self.config_data.update(data))

    def log(self, data, step):
        self.logged.append((step, data))

    def finish(self):
        self.finished = True


def test_tensorboard_wandb_and_evaluation_rows(tmp_path, monkeypatch):
    wandb_runs = []
    fake_wandb = types.ModuleType("wandb")
    fake_wandb.init = lambda **kwargs: wandb_runs.append(FakeWandbRun(**kwargs)) or wandb_runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    config = dataclasses.replace(TINY, total_timesteps=4 * 16 * 6)
    run = RunConfig.make(
        runs_dir=str(tmp_path),
        run_name="tb",
        log_every=2,
        eval_every=3,
        eval_episodes=4,
        tensorboard=True,
        wandb=True,
        quiet=True,
        measure_comm=False,
    )
    result = train(config, run)
    (wandb_run,) = wandb_runs
    assert wandb_run.init_kwargs["mode"] == "offline"
    assert wandb_run.init_kwargs["dir"] == str(tmp_path / "tb")
    assert wandb_run.config_data["algo"]["env"] == "CartPole-v1" and wandb_run.finished
    assert [step for step, _ in wandb_run.logged] == [64 * u for u in range(1, 7)]
    assert [data["loss"] for _, data in wandb_run.logged] == [r["loss"] for r in result.metrics]
    evaluated = [r["update"] for r in result.metrics if "eval_return" in r]
    assert evaluated == [4, 6]  # first chunk end at or after each multiple of eval_every
    assert set(result.compile_seconds) == {"init", "chunk", "eval"}  # none inside the timed loop
    (event_file,) = (tmp_path / "tb" / "tensorboard").glob("events.out.tfevents.*")
    scalars = read_scalars(event_file)
    assert [step for step, _ in scalars["episode_return"]] == [64 * u for u in range(1, 7)]
    assert [step for step, _ in scalars["eval_return"]] == [64 * 4, 64 * 6]
    np.testing.assert_allclose(
        [v for _, v in scalars["loss"]], [r["loss"] for r in result.metrics], rtol=1e-6
    )


def test_missing_wandb_is_one_clear_message_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    run = RunConfig.make(runs_dir=str(tmp_path), run_name="w", wandb=True, quiet=True)
    with pytest.raises(ConfigError, match=r"--wandb needs wandb: pip install"):
        train(TINY, run)
    assert not (tmp_path / "w").exists()


def test_rerun_with_same_name_replaces_metrics(tmp_path):
    for _ in range(2):
        log = RunLog(tmp_path / "same")
        log.append([{"update": 1, "env_steps": 8}])
        log.close()
    assert len(read_metrics(tmp_path / "same" / "metrics.jsonl")) == 1
    log = RunLog(tmp_path / "same", append=True)
    log.append([{"update": 2, "env_steps": 16}])
    log.close()
    assert [r["update"] for r in read_metrics(tmp_path / "same" / "metrics.jsonl")] == [1, 2]


def test_torn_and_garbage_metrics_lines_are_skipped_and_dropped_on_truncate(tmp_path):
    from rljax.run.run_log import RunLogWarning

    log = RunLog(tmp_path / "r")
    log.append([{"update": u, "env_steps": 8 * u} for u in (1, 2, 3)])
    log.close()
    path = tmp_path / "r" / "metrics.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0] + "\x00garbage\n" + "".join(lines[1:]) + '{"update": 4, "env_st')
    assert [r["update"] for r in read_metrics(path)] == [1, 2, 3]  # no JSONDecodeError
    log = RunLog(tmp_path / "r", append=True)
    with pytest.warns(RunLogWarning, match=r"dropped 2 damaged line\(s\) of .*metrics.jsonl"):
        log.truncate(2)
    log.append([{"update": 3, "env_steps": 24}])
    log.close()
    assert path.read_text().splitlines() == [
        '{"update": 1, "env_steps": 8}',
        '{"update": 2, "env_steps": 16}',
        '{"update": 3, "env_steps": 24}',
    ]
