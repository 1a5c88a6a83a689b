"""``--init-from``: a new run starts from exactly the requested parameters of another run (another
mesh here), the heads stay fresh with ``torso``, the optimizer restarts; a mismatch is one error
listing every mismatched shape, with nothing written."""

import chex
import jax
import numpy as np
import pytest

from rljax import DQN, PPO, DQNConfig, PPOConfig
from rljax.algos.base import flat_leaves
from rljax.cli import main
from rljax.run.sharded import ShardedRun
from rljax.tools.runs import load_run
from rljax.tools.transfer import is_head, load_params, plan_transfer

TARGET = PPOConfig(num_envs=4, num_steps=32, total_timesteps=4 * 32 * 2, num_minibatches=2)


def flat(params):
    return {p: np.asarray(x) for p, x in flat_leaves(params).items()}


@pytest.mark.parametrize("part", ["all", "torso"])
def test_exactly_the_requested_parameters_are_copied(trained, mesh4, part):
    target = ShardedRun(PPO(TARGET, replicas=2), mesh4, chunk_size=1)  # another mesh
    plan = plan_transfer(str(trained.run_dir), part, target.algo)
    copied = load_params(plan)
    assert set(copied) == set(plan.paths)
    assert any(is_head(p) for p in copied) == (part == "all")
    source = load_run(trained.run_dir)
    source = flat(jax.device_get(source.algo.acting_params(source.state.params)))
    fresh = flat(jax.device_get(target.init(jax.random.key(5)).params))
    state = target.init(jax.random.key(5), copied)
    started = flat(jax.device_get(state.params))
    assert started.keys() == fresh.keys()
    for path, value in started.items():
        expected = source[path] if path in plan.paths else fresh[path]
        np.testing.assert_array_equal(value, expected, err_msg=path)
    assert state.params["params"]["actor"]["dense_0"]["kernel"].sharding.spec[1] == "model"
    adam = state.opt_state  # restarted: zero moments, zero count
    assert all(float(np.abs(x).max()) == 0 for x in jax.tree.leaves(adam) if np.size(x))


def test_dqn_target_network_starts_from_the_same_parameters():
    dqn = DQN(DQNConfig(num_envs=4, buffer_size=64, batch_size=8, learning_starts=8))
    bias = np.full((2,), 0.5, np.float32)
    state = dqn.init(jax.random.key(0), {"q_head/bias": bias})
    np.testing.assert_array_equal(state.params["params"]["q_head"]["bias"], bias)
    chex.assert_trees_all_equal(state.params, state.target_params)


def test_a_mismatch_lists_every_shape_and_writes_nothing(trained, tmp_path, capsys):
    args = ["train", "ppo", "--env", "Acrobot-v1", "--init-from", str(trained.run_dir),
            "--runs-dir", str(tmp_path), "--run-name", "x", "--total-timesteps", "512"]  # fmt: skip
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 parameter(s) do not match" in err, err
    assert "actor/dense_0/kernel: source (4, 64), this run (6, 64)" in err
    assert "policy_head/kernel: source (64, 2), this run (64, 3)" in err
    assert "--init-part torso leaves the heads out" in err
    assert main([*args, "--init-part", "torso"]) == 2
    assert "2 parameter(s) do not match" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    assert main([*args[:-4], "--init-from", str(tmp_path / "none")]) == 2
    assert "no such run directory" in capsys.readouterr().err
