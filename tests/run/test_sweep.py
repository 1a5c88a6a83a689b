"""Sweeps in one jit: members on the seed axis of ShardedRun, run by the same Loop as train."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from rljax import PPO, ConfigError, PPOConfig, RunConfig
from rljax.parallel import make_mesh
from rljax.run.sharded import ShardedRun
from rljax.run.sweep import settings_of, sweep

TINY = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 4, num_minibatches=2)


def test_sweep_equals_the_settings_run_one_by_one(tmp_path):
    grid = {"lr": [2.5e-4, 3e-3], "ent_coef": [0.0, 0.05]}
    run = RunConfig.make(runs_dir=str(tmp_path), run_name="sweep", quiet=True, log_every=4)
    result = sweep(TINY, grid, seeds=[0, 5], run=run)
    assert result.returns.shape == (4, 4, 2) and len(result.settings) == 4
    mesh = make_mesh("data=1,model=1")
    for i, setting in [(0, result.settings[0]), (3, result.settings[3])]:
        single = ShardedRun(PPO(dataclasses.replace(TINY, **setting)), mesh, chunk_size=4)
        for j, seed in enumerate([0, 5]):
            _, metrics = single.run_chunk(single.init(jax.random.key(seed)), 4)
            np.testing.assert_allclose(
                result.returns[:, i, j], metrics["episode_return"], rtol=1e-5, atol=1e-5
            )
    rows = (tmp_path / "sweep" / "lr=0.003,ent_coef=0.05" / "metrics.jsonl").read_text()
    assert len(rows.splitlines()) == 4
    assert "| 0.003 | 0.05 |" in (tmp_path / "sweep" / "summary.md").read_text()
    assert (tmp_path / "sweep" / "sweep.png").stat().st_size > 1000


@pytest.mark.parametrize(
    "grid, message",
    [
        ({"learning_rate": [1e-3]}, "sweep field 'learning_rate' is not a PPOConfig field"),
        ({"num_envs": [4, 8]}, "sweep field 'num_envs' cannot be swept in one jit"),
        ({"lr": []}, "sweep field 'lr' has no values"),
        ({"lr": ["fast"]}, "value 'fast' is not a number"),
        ({}, "empty sweep grid"),
        ({"lr": [-1.0]}, "lr (learning rate) must be > 0, got -1.0"),
    ],
)
def test_bad_sweep_specs_are_rejected(grid, message):
    with pytest.raises(ConfigError) as info:
        settings_of(TINY, grid)
    assert message in str(info.value)


CLI_TINY = [
    "--num-envs", "4", "--num-steps", "8", "--total-timesteps", "64", "--update-epochs", "1",
    "--log-every", "2", "--eval-every", "0", "--quiet",
]  # fmt: skip


def test_cli_sweep_runs_float_lists_vmapped_and_other_lists_as_groups(tmp_path):
    from rljax.cli import main

    args = ["sweep", "ppo", "--lr", "1e-3,3e-3", "--activation", "tanh,relu", "--seeds", "0"]
    assert main([*args, *CLI_TINY, "--runs-dir", str(tmp_path), "--run-name", "s"]) == 0
    sweep_dir = tmp_path / "s"
    report = json.loads((sweep_dir / "results.json").read_text())
    assert [(r["activation"], r["lr"]) for r in report["rows"]] == [
        ("tanh", 1e-3),
        ("tanh", 3e-3),
        ("relu", 1e-3),
        ("relu", 3e-3),
    ]
    assert report["seeds"] == [0]
    table = (sweep_dir / "results.md").read_text().splitlines()
    assert table[0] == "| activation | lr | final return mean | std | steps/s |"
    assert len(table) == 2 + 4 and table[2].startswith("| tanh | 0.001 |")
    for group in ("activation-tanh", "activation-relu"):  # one compiled program each
        assert (sweep_dir / group / "summary.md").exists()
        assert (sweep_dir / group / "lr=0.003" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    "args, message",
    [
        (["--lr", "1e-3,fast"], "error: --lr: 'fast' is not a number"),
        (["--num-envs", "4,2.5"], "error: --num-envs: '2.5' is not an integer"),
        (["--activation", "tanh,sigmoid"], "error: --activation: 'sigmoid' is not one of"),
        (["--lr", "1e-3,-1"], "error: lr (learning rate) must be > 0, got -1.0"),
        (
            ["--num-minibatches", "2,3", "--seeds", "0,1"],
            "error: num_minibatches",
        ),  # group 2 only: 32 % 3
        (["--seed", "1"], "error: rljax sweep takes --seeds 0,1,2 (a list), not --seed"),
        (["--eval-every", "0,5"], "error: --eval-every cannot take a list in a sweep"),
        (["--seeds", "0"], "error: a sweep group needs at least 2 members"),
        (["--lr", "1e-3,1e-3"], "error: --lr: '1e-3,1e-3' repeats a value"),
    ],
)
def test_cli_sweep_bad_values_are_one_error_before_anything_is_written(
    tmp_path, capsys, args, message
):
    from rljax.cli import main

    assert main(["sweep", "ppo", *args, *CLI_TINY, "--runs-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    assert list(tmp_path.iterdir()) == []
