import pytest

from rljax import PPOConfig, RunConfig, train

CONFIG = PPOConfig(
    num_envs=4, num_steps=32, total_timesteps=4 * 32 * 6, num_minibatches=2, normalize_obs=True
)


@pytest.fixture(scope="package")
def trained(tmp_path_factory):
    """6 PPO updates (normalize_obs) on data=2 (2 replicas), evaluated (4 episodes) and
    checkpointed every 3."""
    runs = tmp_path_factory.mktemp("trained")
    run = RunConfig.make(
        runs_dir=str(runs), run_name="r", mesh="data=2", checkpoint_every=3, eval_every=3,
        checkpoint_min_seconds=0, eval_episodes=4, log_every=3, quiet=True, measure_comm=False,
    )  # fmt: skip
    return train(CONFIG, run)
