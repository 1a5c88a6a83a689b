"""The run directory is never destroyed by accident; bad run-level input is one clear message.

Every test checks the message and that nothing was written (or lost). Only two runs compile
(the finished run of the module fixture and one ``overwrite``); interrupts are injected into
``ShardedRun.compile``.
"""

import os
import socket
import subprocess
import sys
import warnings

import pytest

from rljax import ConfigError, PPOConfig, RunConfig, train
from rljax.cli import main
from rljax.errors import Interrupted
from rljax.run import run_dir as run_dir_module
from rljax.run.run_dir import LOCK_NAME, RunDirectory, RunDirWarning, RunLock, check_run_name
from rljax.run.run_log import read_metrics
from rljax.run.session import Session
from rljax.run.sharded import ShardedRun

TINY = PPOConfig(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 2, num_minibatches=2)
OPTIONS = dict(log_every=2, checkpoint_every=2, checkpoint_min_seconds=0, eval_every=0, quiet=True)
CLI_TINY = ["--num-envs", "4", "--num-steps", "8", "--total-timesteps", "64", "--eval-every", "0"]


def snapshot(path):
    """Every file under ``path``: relative name -> bytes."""
    return {
        str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
    }


def tiny_run(runs_dir, name, **run):
    return RunConfig.make(runs_dir=str(runs_dir), run_name=name, **(OPTIONS | run))


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished run (2 updates, checkpoint at 2): its runs_dir and directory."""
    runs = tmp_path_factory.mktemp("runs")
    result = train(TINY, tiny_run(runs, "done"))
    assert result.updates_done == 2
    return runs, runs / "done"


@pytest.fixture
def interrupt_compile(monkeypatch):
    def compile(self, key):
        raise KeyboardInterrupt

    monkeypatch.setattr(ShardedRun, "compile", compile)


@pytest.fixture
def interrupt_after_opening(monkeypatch):
    """Compiling skipped; SIGINT right after the run directory is created (or taken) and locked."""
    real_open = RunDirectory.open

    def open_(self):
        real_open(self)
        raise KeyboardInterrupt

    monkeypatch.setattr(Session, "compile", lambda self, console: None)
    monkeypatch.setattr(RunDirectory, "open", open_)


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


# -- an existing run is never modified by a fresh run ---------------------------------------------
def test_a_fresh_run_never_modifies_an_existing_run_directory(finished, capsys):
    runs, done = finished
    before = snapshot(done)
    assert "checkpoints/2/manifest.json" in before or any("checkpoints" in k for k in before)
    assert not (done / LOCK_NAME).exists()  # released at the normal end
    with pytest.raises(ConfigError, match=r"already exists .* --resume .*done.* --run-name"):
        train(TINY, tiny_run(runs, "done"))
    code = main(["train", "ppo", *CLI_TINY, "--runs-dir", str(runs), "--run-name", "done"])
    assert code == 2
    err = one_error_line(capsys)
    assert err.startswith("error: run directory") and f"--resume {done}" in err
    assert "--overwrite" in err
    assert snapshot(done) == before


def test_overwrite_replaces_the_old_run_only_after_validation(finished, tmp_path):
    runs, done = finished
    old = tmp_path / "old"
    subprocess.run(["cp", "-r", str(done), str(old)], check=True)
    (old / "notes.txt").write_text("from the earlier run")
    before = snapshot(old)
    bad = PPOConfig(num_envs=4, num_steps=8, total_timesteps=64, lr=-1.0)
    with pytest.raises(ConfigError, match="learning rate"):
        train(bad, tiny_run(tmp_path, "old", overwrite=True))
    assert snapshot(old) == before  # validation failed: nothing removed
    result = train(TINY, tiny_run(tmp_path, "old", overwrite=True, checkpoint_every=1))
    assert result.updates_done == 2 and not (old / "notes.txt").exists()
    assert sorted(p.name for p in (old / "checkpoints").iterdir() if p.name.isdigit()) == ["2"]
    assert [r["update"] for r in read_metrics(old / "metrics.jsonl")] == [1, 2]
    assert not (old / LOCK_NAME).exists()


def test_periodic_checkpoints_wait_for_the_time_floor_and_the_end_always_saves(tmp_path):
    cadence = dict(log_every=1, checkpoint_every=1)
    train(TINY, tiny_run(tmp_path, "floor", **cadence, checkpoint_min_seconds=3600))
    train(TINY, tiny_run(tmp_path, "every", **cadence))  # floor 0 (OPTIONS)
    found = {name: (tmp_path / name / "checkpoints").iterdir() for name in ("floor", "every")}
    saved = {name: sorted(p.name for p in dirs if p.name.isdigit()) for name, dirs in found.items()}
    assert saved == {"floor": ["2"], "every": ["1", "2"]}


# -- run names ------------------------------------------------------------------------------------
BAD_NAMES = ["../escape", "a/b", "..", ".", "", "/abs/path", ".hidden", "a b", "x" * 129, "a\\b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_run_names_are_one_safe_path_component(tmp_path, name):
    runs = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"invalid run_name .*letters, digits, '\.', '_' or '-'"):
        train(TINY, tiny_run(runs, name))
    assert list(tmp_path.iterdir()) == []  # nothing written, inside runs_dir or outside


def test_run_name_error_through_the_cli_and_good_names(tmp_path, capsys):
    code = main(["train", "ppo", "--runs-dir", str(tmp_path), "--run-name", "../escape"])
    assert code == 2
    assert one_error_line(capsys).startswith("error: invalid run_name '../escape'")
    assert list(tmp_path.iterdir()) == [] and not (tmp_path.parent / "escape").exists()
    for good in ("demo-ppo-cartpole", "a", "run_1.2", "x" * 128, "-x"):
        check_run_name(good)
    assert run_dir_module.safe_name("tests.x.<locals>.My PPO") == "tests.x.-locals-.My-PPO"


# -- the lock -------------------------------------------------------------------------------------
def write_lock(directory, pid, host=None):
    directory.mkdir(parents=True, exist_ok=True)
    text = f'{{"pid": {pid}, "host": "{host or socket.gethostname()}", "started": "then"}}'
    (directory / LOCK_NAME).write_text(text)


def test_a_run_in_progress_keeps_a_second_run_and_a_resume_out(finished, tmp_path, capsys):
    runs, done = finished
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        # a fresh run with the same name, started while another process holds the directory
        write_lock(tmp_path / "busy", other.pid)
        with pytest.raises(ConfigError, match=rf"in use by pid {other.pid} on "):
            train(TINY, tiny_run(tmp_path, "busy"))
        with pytest.raises(ConfigError, match=rf"in use by pid {other.pid}"):  # not even this
            train(TINY, tiny_run(tmp_path, "busy", overwrite=True))
        assert [p.name for p in (tmp_path / "busy").iterdir()] == [LOCK_NAME]
        # a resume of a run that is still training
        before = snapshot(done)
        write_lock(done, other.pid)
        locked = snapshot(done)
        code = main(["train", "ppo", "--resume", str(done), "--quiet"])
        assert code == 2
        err = one_error_line(capsys)
        assert f"is in use by pid {other.pid} on {socket.gethostname()}" in err
        assert snapshot(done) == locked
    finally:
        other.kill()
        other.wait()
        (done / LOCK_NAME).unlink(missing_ok=True)
    assert snapshot(done) == before


def test_lock_is_atomic_and_a_stale_one_is_taken_over_with_one_warning(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    with pytest.raises(ConfigError, match=rf"in use by pid {os.getpid()}"):
        RunLock(tmp_path).acquire()  # O_EXCL: the holder is this live process
    first.release()
    assert not (tmp_path / LOCK_NAME).exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(tmp_path / "stale", dead.pid)
    directory = RunDirectory(tmp_path / "stale", fresh=True)
    with pytest.warns(RunDirWarning) as caught:
        directory.open()
    assert len(caught) == 1
    assert f"taking over the stale lock {tmp_path / 'stale' / LOCK_NAME} of pid {dead.pid}" in str(
        caught[0].message
    )
    assert f'"pid": {os.getpid()}' in (tmp_path / "stale" / LOCK_NAME).read_text()
    directory.close()
    assert list((tmp_path / "stale").iterdir()) == []
    # another host's lock is never taken over: its pid means nothing here
    write_lock(tmp_path / "remote", dead.pid, host="elsewhere.invalid")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ConfigError, match="on elsewhere.invalid.*remove the lock file"):
            RunDirectory(tmp_path / "remote", fresh=True).open()


def test_the_lock_is_released_when_training_fails(tmp_path, monkeypatch):
    def compile(self, key):
        raise RuntimeError("compiler crashed")

    monkeypatch.setattr(ShardedRun, "compile", compile)
    with pytest.raises(RuntimeError, match="compiler crashed"):
        train(TINY, tiny_run(tmp_path, "crash"))
    assert not (tmp_path / "crash" / LOCK_NAME).exists()


# -- runs_dir -------------------------------------------------------------------------------------
def test_runs_dir_that_is_a_file_is_one_error(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a directory")
    for runs in (afile, afile / "below"):
        with pytest.raises(ConfigError, match=r"runs_dir .* is not a directory"):
            train(TINY, tiny_run(runs, "x"))
    code = main(["train", "ppo", "--runs-dir", str(afile), "--run-name", "x"])
    assert code == 2
    assert one_error_line(capsys) == f"error: runs_dir {str(afile)!r} is not a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]
    assert afile.read_text() == "not a directory"


def test_unwritable_runs_dir_is_one_error(tmp_path, capsys):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("permissions are not enforced for this user (root)")
        for runs in (locked, locked / "sub"):
            with pytest.raises(ConfigError, match=r"is not writable: no write permission on"):
                train(TINY, tiny_run(runs, "x"))
        code = main(["train", "ppo", "--runs-dir", str(locked / "sub"), "--run-name", "x"])
        assert code == 2
        assert "read-only filesystem" in one_error_line(capsys)
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


# -- seed -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [2**70, 2**32, -1])
def test_seed_out_of_range_is_one_error(tmp_path, seed):
    with pytest.raises(ConfigError, match=r"seed must be an integer with 0 <= seed < 2\*\*32"):
        train(TINY, tiny_run(tmp_path, "s", seed=seed))
    assert list(tmp_path.iterdir()) == []


def test_seed_out_of_range_through_the_cli(tmp_path, capsys):
    code = main(["train", "ppo", "--seed", str(2**70), "--runs-dir", str(tmp_path)])
    assert code == 2
    err = one_error_line(capsys)
    assert err.startswith("error: seed must be an integer with 0 <= seed < 2**32")
    assert f"got {2**70}" in err and "jax.random.key" in err
    assert list(tmp_path.iterdir()) == []
    run_dir_module.check_seed(2**32 - 1)


# -- Ctrl-C before the first chunk ----------------------------------------------------------------
def test_ctrl_c_while_compiling_writes_nothing(tmp_path, interrupt_compile):
    # the programs compile (and their memory plan is checked) before the directory is made
    match = r"SIGINT before the first chunk finished; nothing was written to "
    with pytest.raises(Interrupted, match=match):
        train(TINY, tiny_run(tmp_path, "fresh"))
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_after_opening_removes_a_fresh_runs_directory(tmp_path, interrupt_after_opening):
    with pytest.raises(Interrupted, match=r"SIGINT before the first chunk finished; removed"):
        train(TINY, tiny_run(tmp_path, "fresh"))
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_through_the_cli_is_one_line_and_exit_130(tmp_path, interrupt_after_opening, capsys):
    code = main(["train", "ppo", *CLI_TINY, "--runs-dir", str(tmp_path), "--run-name", "c"])
    assert code == 130
    err = one_error_line(capsys)
    assert (
        err == f"interrupted: SIGINT before the first chunk finished; removed {tmp_path / 'c'}"
        " (nothing was trained)"
    )
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_while_resuming_keeps_the_run(finished, interrupt_compile, capsys):
    runs, done = finished
    before = snapshot(done)
    longer = ["--total-timesteps", "128"]  # the run is finished at 64
    code = main(["train", "ppo", "--resume", str(done), "--quiet", *longer])
    assert code == 130
    err = one_error_line(capsys)
    assert err.startswith(f"interrupted: SIGINT before the first chunk finished; {done} is kept")
    after = snapshot(done)
    assert set(after) == set(before)  # nothing removed, the lock released
    assert {k: v for k, v in after.items() if k != "config.json"} == {
        k: v for k, v in before.items() if k != "config.json"
    }


def test_read_only_runs_dir_is_one_error_even_where_permissions_are_not_enforced(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(run_dir_module.os, "access", lambda path, mode: False)  # EROFS, 0o500
    with pytest.raises(ConfigError, match=r"not writable: .*or a read-only filesystem"):
        train(TINY, tiny_run(tmp_path / "runs", "x"))
    assert list(tmp_path.iterdir()) == []


def test_a_stale_lock_is_one_warning_line_from_the_cli(finished, interrupt_after_opening, capsys):
    runs, done = finished
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(done, dead.pid)
    longer = ["--total-timesteps", "128"]  # the run is finished at 64
    assert main(["train", "ppo", "--resume", str(done), "--quiet", *longer]) == 130
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and lines[1].startswith("interrupted: SIGINT")
    assert lines[0].startswith(f"warning: taking over the stale lock {done / LOCK_NAME} of pid")
    assert not (done / LOCK_NAME).exists()
