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


def test_exported_artifacts_run_without_rljax(exported, tmp_path):
    np.save(tmp_path / "obs.npy", OBS)
    script = tmp_path / "no_rljax.py"
    script.write_text(NO_RLJAX)
    result = subprocess.run(
        [sys.executable, str(script), str(exported), str(tmp_path / "obs.npy"),
         str(tmp_path / "actions.npy")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    greedy, sampled = np.load(tmp_path / "actions.npy")
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
