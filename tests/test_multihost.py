"""Multi-process training on jax.distributed: 2 processes x 2 CPU devices via rljax.launch.

One run equals the same mesh in one process; checkpoints move between 2 processes and 1; DQN
runs too. (Launcher failure handling, kills and timeouts: tests/test_launch.py.)
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import chex
import jax
import numpy as np
import pytest

from rljax import PPO, PPOConfig
from rljax.parallel import make_mesh
from rljax.run.checkpoint import Checkpointer
from rljax.run.resume import abstract_state
from rljax.run.run_log import read_metrics
from rljax.run.sharded import ShardedRun

CONFIG = PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 16 * 2, num_minibatches=2)
PPO_ARGS = [
    "ppo",
    "--mesh", "data=2,model=2",
    "--num-envs", "8",
    "--num-steps", "16",
    "--num-minibatches", "2",
    "--log-every", "1",
    "--checkpoint-every", "1",
    "--checkpoint-min-seconds", "0",
    "--eval-every", "0",
    "--no-measure-comm",
]  # fmt: skip


def launch(*train_args, processes=2, timeout=400):
    """``python -m rljax.launch -n processes --devices-per-process 4/processes -- train ...``."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    command = [
        sys.executable, "-m", "rljax.launch",
        "-n", str(processes), "--devices-per-process", str(4 // processes), "--cpu",
        "--timeout", str(timeout), "--", "train", *train_args,
    ]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout + 60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("multihost")
    args = ["--total-timesteps", str(CONFIG.total_timesteps)]
    out = launch(*PPO_ARGS, *args, "--runs-dir", str(runs), "--run-name", "mp")
    return runs / "mp", out


def test_two_processes_equal_one_process_with_the_same_mesh(two_process_run):
    run_dir, out = two_process_run
    assert "[p0] rljax ppo" in out and "2 process(es)" in out
    assert "[p1] rljax ppo" not in out  # only process 0 prints progress
    config = json.loads((run_dir / "config.json").read_text())
    assert config["processes"] == 2 and config["mesh"]["spec"] == "data=2,model=2"

    single = ShardedRun(PPO(CONFIG, replicas=2), make_mesh("data=2,model=2"), chunk_size=1)
    state = single.init(jax.random.key(0))
    expected = []
    for _ in range(CONFIG.num_updates):
        state, metrics = single.run_chunk(state, 1)
        expected.append(jax.device_get(metrics))
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2]
    for row, metrics in zip(rows, expected, strict=True):
        for name in ("loss", "episode_return", "entropy", "grad_norm"):
            np.testing.assert_allclose(row[name], metrics[name][0], rtol=1e-5, atol=1e-5)
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        step, restored, meta = ckpt.restore_latest(abstract_state(single))
    assert step == 2 and meta["mesh"]["spec"] == "data=2,model=2"
    chex.assert_trees_all_close(
        jax.device_get(restored.params), jax.device_get(state.params), atol=1e-5, rtol=1e-5
    )


def test_checkpoints_move_between_two_processes_and_one(two_process_run, tmp_path):
    run_dir, _ = two_process_run
    copy = tmp_path / "mp"
    subprocess.run(["cp", "-r", str(run_dir), str(copy)], check=True)
    # Written by 2 processes, continued by 1 (4 devices in one process) ...
    longer = ["--total-timesteps", str(CONFIG.total_timesteps + 128)]
    env = {**os.environ, "JAX_NUM_CPU_DEVICES": "4"}
    command = [sys.executable, "-m", "rljax", "train", "ppo", "--resume", str(copy), *longer]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resumed from update 2" in result.stdout
    # ... and its checkpoint continued by 2 processes again.
    longer = ["--total-timesteps", str(CONFIG.total_timesteps + 256)]
    out = launch("ppo", "--resume", str(copy), *longer)
    assert "resumed from update 3" in out
    rows = read_metrics(copy / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3, 4]
    assert all(np.isfinite(r["loss"]) for r in rows)


def test_dqn_runs_on_two_processes(tmp_path):
    dqn_args = [
        "dqn",
        "--mesh", "data=2,model=2",
        "--num-envs", "4",
        "--steps-per-update", "8",
        "--total-timesteps", str(4 * 8 * 3),
        "--buffer-size", "64",
        "--batch-size", "8",
        "--learning-starts", "32",
        "--train-frequency", "4",
        "--q-widths", "16", "16",
        "--log-every", "3",
        "--eval-every", "0",
        "--no-measure-comm",
    ]  # fmt: skip
    launch(*dqn_args, "--runs-dir", str(tmp_path), "--run-name", "dqn")
    rows = read_metrics(Path(tmp_path) / "dqn" / "metrics.jsonl")
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert rows[-1]["optimizer_steps"] > 0 and np.isfinite(rows[-1]["loss"])


def _children_by_process_id(launcher_pid: int) -> dict[int, int]:
    """{RLJAX_PROCESS_ID: pid} of the launcher's children."""
    import psutil

    found = {}
    for child in psutil.Process(launcher_pid).children():
        process_id = child.environ().get("RLJAX_PROCESS_ID")
        if process_id is not None:
            found[int(process_id)] = child.pid
    return found


@pytest.mark.parametrize(
    "signals",
    [[(1, signal.SIGTERM)], [(0, signal.SIGINT), (1, signal.SIGTERM)]],
    ids=["one-process", "both-0.5s-apart"],
)
def test_a_signal_to_one_process_stops_all_after_the_same_update(tmp_path, signals):
    # Before: the signalled process saved while its peer ran the next chunk; their collectives
    # paired up wrongly and both died with garbage, without a checkpoint.
    env = {k: v for k, v in os.environ.items() if k != "JAX_NUM_CPU_DEVICES"}
    many = ["--total-timesteps", str(8 * 16 * 5000), "--checkpoint-every", "100000"]
    command = [
        sys.executable, "-m", "rljax.launch", "-n", "2", "--devices-per-process", "2", "--cpu",
        "--timeout", "300", "--", "train", *PPO_ARGS, *many,
        "--runs-dir", str(tmp_path), "--run-name", "stop",
    ]  # fmt: skip
    launcher = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        lines = []
        for line in launcher.stdout:  # wait until training runs (the first chunk is done)
            lines.append(line)
            if "[p0]   update" in line:
                break
        pids = _children_by_process_id(launcher.pid)
        for i, (process_id, signum) in enumerate(signals):
            if i:
                time.sleep(0.5)
            os.kill(pids[process_id], signum)
        out, err = launcher.communicate(timeout=300)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    out = "".join(lines) + out
    assert launcher.returncode == 0, out[-3000:] + err[-3000:]
    first_id, first_signal = signals[0]
    expected = (
        first_signal.name if first_id == 0 else f"{first_signal.name} (received by process 1)"
    )
    stopped = re.search(rf"\[p0\] {re.escape(expected)}: stopped after update (\d+)/5000", out)
    assert stopped, out[-3000:]
    update = int(stopped.group(1))
    run_dir = tmp_path / "stop"
    steps = sorted(int(p.name) for p in (run_dir / "checkpoints").iterdir() if p.name.isdigit())
    assert steps == [update]  # one checkpoint, written by both processes together
    assert read_metrics(run_dir / "metrics.jsonl")[-1]["update"] == update
    single = ShardedRun(PPO(CONFIG, replicas=2), make_mesh("data=2,model=2"), chunk_size=1)
    with Checkpointer(run_dir / "checkpoints") as ckpt:
        step, restored, _ = ckpt.restore_latest(abstract_state(single))
    assert step == update
    assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(restored.params))
