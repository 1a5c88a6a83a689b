"""``rljax export`` and ``rljax.load_policy``: the exported policy acts as the checkpoint's, and
its jax.export artifacts give the same actions in a process that cannot import rljax."""

import json
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import PPOConfig, RunConfig, train
from rljax.cli import main
from rljax.run.evaluation import obs_stats_of
from rljax.tools.export import ExportArgs, export_run
from rljax.tools.runs import load_run

OBS = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32) * [1.0, 2.0, 0.2, 2.0]


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    out = tmp_path_factory.mktemp("export") / "policy"
    export_run(ExportArgs(run_dir=str(trained.run_dir), out_dir=str(out)))
    return out


def test_loaded_policy_acts_as_the_checkpoint(trained, exported):
    loaded = load_run(trained.run_dir)
    params = loaded.algo.acting_params(loaded.state.params)
    stats = obs_stats_of(loaded.state)
    assert stats is not None  # normalize_obs: the statistics travel with the policy
    policy = rljax.load_policy(exported)
    meta = json.loads((exported / "policy.json").read_text())
    assert (meta["algorithm"], meta["env"], meta["step"], meta["obs_dim"]) == (
        "ppo", "CartPole-v1", 6, 4,
    )  # fmt: skip
    obs, key = jnp.asarray(OBS), jax.random.key(3)
    expected = loaded.algo.eval_action(params, obs, key, True, obs_stats=stats)
    np.testing.assert_array_equal(policy.act(obs), expected)
    sampled = loaded.algo.eval_action(params, obs, key, False, obs_stats=stats)
    np.testing.assert_array_equal(policy.act(obs, key), sampled)


NO_RLJAX = textwrap.dedent(
    """
    import sys

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name == "rljax" or name.startswith("rljax."):
                raise ImportError("rljax is blocked in this process")

    sys.meta_path.insert(0, Blocked())
    try:
        import rljax  # noqa: F401
    except ImportError:
        pass
    else:
        raise SystemExit("rljax imported")
    import jax, numpy as np
    from jax import export

    folder, obs = sys.argv[1], np.load(sys.argv[2])
    greedy = export.deserialize(open(f"{folder}/greedy.jaxexport", "rb").read())
    sample = export.deserialize(open(f"{folder}/sample.jaxexport", "rb").read())
    key = jax.random.key_data(jax.random.key(3))
    np.save(sys.argv[3], np.stack([greedy.call(obs), sample.call(obs, key)]))
    """
)


def without_rljax(script_text, exported, obs, tmp_path):
    """What ``script_text`` saves when it runs the artifacts in ``exported`` on ``obs`` in a
    process that cannot import rljax."""
    np.save(tmp_path / "obs.npy", np.asarray(obs))
    script = tmp_path / "no_rljax.py"
    script.write_text(script_text)
    result = subprocess.run(
        [sys.executable, str(script), str(exported), str(tmp_path / "obs.npy"),
         str(tmp_path / "actions.npy")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    return np.load(tmp_path / "actions.npy")


def test_exported_artifacts_run_without_rljax(exported, tmp_path):
    greedy, sampled = without_rljax(NO_RLJAX, exported, OBS, tmp_path)
    policy = rljax.load_policy(exported)
    np.testing.assert_array_equal(greedy, policy.act(jnp.asarray(OBS)))
    np.testing.assert_array_equal(sampled, policy.act(jnp.asarray(OBS), jax.random.key(3)))


def test_an_existing_output_is_one_error_and_stays_as_it_was(trained, exported, capsys):
    before = {p.name: p.read_bytes() for p in exported.iterdir()}
    assert main(["export", str(trained.run_dir), str(exported), "--step", "3"]) == 2
    assert (
        capsys.readouterr().err
        == f"error: {str(exported)!r} exists and is not empty; pass --overwrite\n"
    )
    assert {p.name: p.read_bytes() for p in exported.iterdir()} == before
    assert main(["export", str(trained.run_dir), str(exported.parent / "x"), "--step", "4"]) == 2
    assert "no checkpoint step 4" in capsys.readouterr().err
    assert not (exported.parent / "x").exists()


GRU = PPOConfig(
    env="CartPole-v1-po",
    recurrent="gru",
    recurrent_width=8,
    actor_widths=(8,),
    critic_widths=(8,),
    num_envs=4,
    num_steps=16,
    num_minibatches=2,
    total_timesteps=4 * 16 * 2,
)

RECURRENT_NO_RLJAX = NO_RLJAX.replace(
    "np.save(sys.argv[3], np.stack([greedy.call(obs), sample.call(obs, key)]))",
    """memory = np.zeros((obs.shape[0], 8), np.float32)
actions, memory = greedy.call(obs, memory)   # a second step from the first's memory
again, memory = greedy.call(obs, memory)
sampled, _ = sample.call(obs, memory, key)   # from the memory after both steps
np.save(sys.argv[3], np.stack([actions, again, sampled]))""",
)


@pytest.fixture(scope="module")
def recurrent_exported(tmp_path_factory):
    runs = tmp_path_factory.mktemp("gru")
    run = RunConfig.make(
        runs_dir=str(runs), run_name="gru", mesh="data=1", eval_every=0, log_every=1,
        checkpoint_min_seconds=0, quiet=True, measure_comm=False,
    )  # fmt: skip
    result = train(GRU, run)
    out = runs / "policy"
    export_run(ExportArgs(run_dir=str(result.run_dir), out_dir=str(out)))
    return result, out


def test_a_recurrent_policy_exports_with_its_memory(recurrent_exported, tmp_path):
    result, exported = recurrent_exported
    loaded = load_run(result.run_dir)
    params = loaded.algo.acting_params(loaded.state.params)
    policy = rljax.load_policy(exported)
    meta = json.loads((exported / "policy.json").read_text())
    assert (meta["algorithm"], meta["env"], meta["memory_shape"]) == ("ppo", "CartPole-v1-po", [8])
    obs = jnp.asarray(OBS[:, :2])  # the partially observed CartPole: position and angle
    start = policy.initial_memory(len(obs))
    np.testing.assert_array_equal(start, np.zeros((len(obs), 8), np.float32))
    with pytest.raises(ValueError, match="memory=initial_memory"):
        policy.act(obs)
    # Two steps: the second acts from the memory the first returned, as the checkpoint's does.
    key = jax.random.key(3)
    memory, expected_memory = start, loaded.algo.eval_memory(len(obs))
    for _ in range(2):
        action, memory = policy.act(obs, memory=memory)
        expected, expected_memory = loaded.algo.eval_action(
            params, obs, key, True, memory=expected_memory
        )
        np.testing.assert_array_equal(action, expected)
        np.testing.assert_allclose(memory, expected_memory, rtol=1e-6)
    assert np.abs(np.asarray(memory)).max() > 0  # the GRU moved
    sampled, _ = policy.act(obs, key, memory=memory)
    expected, _ = loaded.algo.eval_action(params, obs, key, False, memory=memory)
    np.testing.assert_array_equal(sampled, expected)

    # The artifacts, in a process that cannot import rljax, give the same actions.
    first, second, sampled = without_rljax(RECURRENT_NO_RLJAX, exported, obs, tmp_path)
    memory = start
    for got in (first, second):
        action, memory = policy.act(obs, memory=memory)
        np.testing.assert_array_equal(got, action)
    np.testing.assert_array_equal(sampled, policy.act(obs, key, memory=memory)[0])
