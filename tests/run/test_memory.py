"""The memory a run needs is estimated by tracing and checked before anything is written."""

import dataclasses
import re
import time

import jax
import pytest

from rljax import ConfigError, DQNConfig, PPOConfig, RunConfig, train
from rljax.cli import main
from rljax.run import memory
from rljax.run.sharded import prepare


def test_state_figures_match_the_shards_of_a_real_initialised_state(small_run):
    run, state, _ = small_run
    estimate = memory.estimate(run.algo, run.layout, run.num_seeds)
    device = run.mesh.devices.flat[0]

    def on_device(tree) -> int:
        return sum(
            s.data.nbytes
            for x in jax.tree.leaves(tree)
            for s in x.addressable_shards
            if s.device == device and not jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key)
        )

    assert estimate.parts["parameters"] == on_device(state.params) > 0
    assert estimate.parts["optimizer state"] == on_device(state.opt_state) > 0
    assert estimate.parts["environments"] == on_device(state.env) > 0
    assert estimate.parts[memory.WORKING] > 0 and estimate.fits
    assert memory.estimate(run.algo, run.layout, run.num_seeds) is estimate  # cached
    assert re.fullmatch(r"about [\d.]+ [kM]B per device \(.*\), .* for this process's 4 CPU "
                        r"devices", estimate.describe())  # fmt: skip


def test_the_rollout_is_counted_in_the_working_memory():
    run = RunConfig.make(mesh="data=2")
    small = PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 64, num_minibatches=2)
    long = dataclasses.replace(small, num_steps=64)
    sizes = [memory.estimate(a, layout).parts[memory.WORKING] for layout, a in
             (prepare(small, run), prepare(long, run))]  # fmt: skip
    assert sizes[1] > 3 * sizes[0]


def test_a_replay_buffer_too_big_for_the_host_is_refused_before_anything_is_written(tmp_path):
    config = DQNConfig(num_envs=10, buffer_size=2 * 10**9, total_timesteps=10**6)
    run = RunConfig.make(mesh="data=1", num_seeds=16, runs_dir=str(tmp_path / "runs"),
                         run_name="big", quiet=True)  # fmt: skip
    start = time.perf_counter()
    with pytest.raises(ConfigError) as info:
        train(config, run)
    seconds = time.perf_counter() - start
    message = str(info.value)
    assert "\n" not in message
    needs = r"this run needs about [\d.]+ TB per device \(replay buffer [\d.]+ TB, "
    assert re.match(needs, message)
    assert re.search(r"but the host has [\d.]+ [GT]B available; lower --buffer-size", message)
    assert "--num-seeds" in message
    assert not (tmp_path / "runs").exists()
    assert seconds < 120  # traced, never allocated (the buffer alone is 1.5 TB)


def test_cli_one_error_line_for_a_hundred_million_envs_and_nothing_written(tmp_path, capsys):
    runs = str(tmp_path / "runs")
    args = ["train", "ppo", "--num-envs", "1e8", "--num-steps", "16", "--total-timesteps", "2e9",
            "--runs-dir", runs, "--run-name", "wide", "--eval-every", "0"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: this run needs about ")
    assert re.search(r"update working memory [\d.]+ [GT]B", err)
    assert "lower --num-envs or --num-steps" in err
    assert not (tmp_path / "runs").exists()


def test_on_an_accelerator_the_message_names_the_device_memory(monkeypatch):
    layout, algo = prepare(DQNConfig(), RunConfig.make(mesh="data=1"))
    monkeypatch.setattr(memory, "device_bytes", lambda devices: (10_000, False))
    monkeypatch.setattr(memory, "_CACHE", type(memory._CACHE)())
    with pytest.raises(ConfigError, match=r"but the device has 10\.0 kB; lower --buffer-size .*"
                                          r"or spread the batch over more devices"):  # fmt: skip
        memory.check(algo, layout)
    estimate = memory.estimate(algo, layout)
    assert not estimate.fits and estimate.needed == estimate.total > 10_000
