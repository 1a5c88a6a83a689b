"""Failed writes (full disk, I/O error), injected: one ``error:`` line naming the file and the
cause, never a traceback; the previous checkpoint stays valid, and a resume repairs what the
failure tore."""

import builtins
import errno
import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest

from rljax import PPOConfig, RunConfig, train
from rljax.cli import main
from rljax.errors import RunWriteError
from rljax.run import integrity, run_log
from rljax.run.checkpoint import Checkpointer
from rljax.run.run_log import read_metrics

SMALL = PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 16 * 8, num_minibatches=2)
FLAGS = [
    "--num-envs", "8", "--num-steps", "16", "--num-minibatches", "2",
    "--log-every", "2", "--checkpoint-every", "4", "--checkpoint-min-seconds", "0",
    "--eval-every", "0", "--quiet",
    "--mesh", "data=2,model=2",
]  # fmt: skip
ENOSPC = f"{os.strerror(errno.ENOSPC)} (errno {errno.ENOSPC})"


def full_disk() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class FillsUp:
    """A file that takes ``lines`` more writes, then writes half of the next and raises ENOSPC
    (what a full disk does to an appended line)."""

    def __init__(self, f, lines: int):
        self._f, self._lines = f, lines

    def write(self, text):
        if self._lines == 0:
            self._f.write(text[: len(text) // 2])
            self._f.flush()
            raise full_disk()
        self._lines -= 1
        return self._f.write(text)

    def __getattr__(self, name):
        return getattr(self._f, name)


def snapshot(directory):
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(Path(directory).rglob("*"))
        if p.is_file()
    }


def latest_valid(run_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Checkpointer(Path(run_dir) / "checkpoints") as ckpt:
            return ckpt.latest_valid_step()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """8 updates, checkpoints at 4 and 8."""
    tmp_path = tmp_path_factory.mktemp("finished")
    run = RunConfig.make(
        runs_dir=str(tmp_path), run_name="done", mesh="data=2,model=2", log_every=2,
        checkpoint_every=4, checkpoint_min_seconds=0, eval_every=0, quiet=True,
    )  # fmt: skip
    train(SMALL, run)
    return tmp_path / "done"


def copy_of(run_dir, tmp_path):
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    return copy


def test_metrics_write_failure_is_one_error_and_resume_repairs_the_torn_line(
    tmp_path, monkeypatch, capsys
):
    def opens_a_filling_file(path, mode="r", *args, **kwargs):
        f = builtins.open(path, mode, *args, **kwargs)
        return FillsUp(f, lines=5) if Path(path).name == "metrics.jsonl" else f

    monkeypatch.setattr(run_log, "open", opens_a_filling_file, raising=False)
    run_dir = tmp_path / "full"
    args = ["train", "ppo", *FLAGS, "--total-timesteps", "1024", "--runs-dir", str(tmp_path)]
    assert main([*args, "--run-name", "full"]) == 1
    metrics = run_dir / "metrics.jsonl"
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: could not write {metrics}: {ENOSPC}; the checkpoint at update 4 is intact; "
        f"resume with: python -m rljax train ppo --resume {run_dir}"
    ]
    assert latest_valid(run_dir) == 4
    assert metrics.read_text().count("\n") == 5  # rows 1..5, then half of row 6
    monkeypatch.undo()

    assert main(["train", "ppo", "--resume", str(run_dir)]) == 0
    assert capsys.readouterr().err.strip().splitlines() == [
        f"warning: dropped 1 damaged line(s) of {metrics} (a torn last line from a crash or a "
        "full disk, or garbage); rows are kept up to update 4"
    ]
    assert [r["update"] for r in read_metrics(metrics)] == list(range(1, 9))
    assert latest_valid(run_dir) == 8


def test_checkpoint_write_failure_is_one_error_and_the_previous_checkpoint_stays(
    finished_run, tmp_path, monkeypatch, capsys
):
    copy = copy_of(finished_run, tmp_path)
    write_manifest = integrity.write_manifest

    def fails_at_12(step_dir, step):
        if step == 12:
            raise full_disk()
        return write_manifest(step_dir, step)

    monkeypatch.setattr(integrity, "write_manifest", fails_at_12)
    assert main(["train", "ppo", "--resume", str(copy), "--total-timesteps", "1536"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: could not write checkpoint step 12 to {copy / 'checkpoints'}: {ENOSPC}; the "
        f"checkpoint at step 8 is intact; resume with: python -m rljax train ppo --resume {copy}"
    ]
    assert latest_valid(copy) == 8


def test_config_write_failure_on_resume_is_one_error_and_changes_nothing(
    finished_run, tmp_path, monkeypatch, capsys
):
    copy = copy_of(finished_run, tmp_path)
    before = snapshot(copy)

    def disk_full_for_config(path, mode="r", *args, **kwargs):
        if Path(path).name == ".config.json.tmp":
            raise full_disk()
        return builtins.open(path, mode, *args, **kwargs)

    monkeypatch.setattr(run_log, "open", disk_full_for_config, raising=False)
    assert main(["train", "ppo", "--resume", str(copy), "--total-timesteps", "2048"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: could not write {copy / 'config.json'}: {ENOSPC}; the checkpoint at update 8 "
        f"is intact; resume with: python -m rljax train ppo --resume {copy}"
    ]
    assert snapshot(copy) == before  # config.json as it was, no temporary file, no lock


def test_run_log_write_failures_raise_run_write_error_and_keep_config(tmp_path, monkeypatch):
    log = run_log.RunLog(tmp_path / "r")
    log.write_config(algorithm="ppo", algo={"lr": 1.0}, run={})
    original = (tmp_path / "r" / "config.json").read_text()
    log.error_hint = lambda: "nothing else was lost"

    def no_space(*args, **kwargs):
        raise full_disk()

    monkeypatch.setattr(run_log.os, "fsync", no_space)
    with pytest.raises(RunWriteError) as info:
        log.write_extra("communication", {"data": 1})
    assert str(info.value) == (
        f"could not write {tmp_path / 'r' / 'config.json'}: {ENOSPC}; nothing else was lost"
    )
    assert (tmp_path / "r" / "config.json").read_text() == original
    assert json.loads(original)["algo"] == {"lr": 1.0}
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["config.json", "metrics.jsonl"]
    log.close()
