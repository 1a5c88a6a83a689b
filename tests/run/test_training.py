"""train() takes configs, algorithm instances and classes; a subclass trains as itself."""

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

import rljax
from rljax import PPO, ConfigError, DQNConfig, PPOConfig, RunConfig, train
from rljax.errors import TrainingError
from rljax.run.checkpoint import Checkpointer
from rljax.run.loop import Hook
from rljax.run.run_log import read_metrics
from rljax.run.sharded import ShardedRun, prepare


@dataclasses.dataclass(frozen=True)
class KLPPOConfig(PPOConfig):
    """PPO with a penalty on the approximate KL to the rollout policy."""

    kl_coef: float = 0.5


class KLPPO(PPO):
    config_type = KLPPOConfig  # KLPPO (the class) builds KLPPOConfig() by default

    def loss(self, params, batch, hparams):
        loss, aux = super().loss(params, batch, hparams)
        penalty = self.config.kl_coef * aux["approx_kl"]
        return loss + penalty, {**aux, "kl_penalty": penalty}


SMALL = KLPPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2)
SMALL_PPO = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2)


def test_subclass_instance_trains_as_itself_and_user_hooks_get_rows(tmp_path):
    seen = []
    run = RunConfig.make(
        mesh="data=2,model=2", runs_dir=str(tmp_path), run_name="kl", log_every=1, quiet=True,
        eval_every=0,
    )  # fmt: skip
    result = train(KLPPO(SMALL), run, hooks=[lambda info: seen.extend(info.rows)])
    assert result.updates_done == 2
    assert [r["update"] for r in seen] == [1, 2]
    assert all("kl_penalty" in r and jnp.isfinite(r["kl_penalty"]) for r in seen)
    assert all("kl_penalty" in r for r in result.metrics)
    config = json.loads((tmp_path / "kl" / "config.json").read_text())
    assert config["algorithm"].endswith("test_training.KLPPO")
    assert config["algo"]["kl_coef"] == 0.5
    assert "communication" not in config  # measure_comm is off by default


def test_a_config_picks_its_registered_algorithm_and_instances_are_rebuilt_for_the_mesh():
    _, algo = prepare(KLPPO(SMALL), RunConfig.make(mesh="data=2,model=2"))
    assert type(algo) is KLPPO and algo.replicas == 2 and algo.config is SMALL
    _, algo = prepare(KLPPO, RunConfig.make(mesh="data=2"))
    assert type(algo) is KLPPO and algo.config == KLPPOConfig()
    _, algo = prepare(dataclasses.replace(PPOConfig(), num_envs=8), RunConfig())
    assert type(algo) is PPO


def test_an_unregistered_config_type_asks_for_the_instance(tmp_path):
    with pytest.raises(ConfigError, match="pass the algorithm instance"):
        train(SMALL, RunConfig.make(runs_dir=str(tmp_path), run_name="x"))
    assert not (tmp_path / "x").exists()


def test_rljax_train_is_the_function():
    assert rljax.train is train and callable(rljax.train)


def test_sharded_run_builds_a_config_or_class_for_its_layout(mesh4):
    run = ShardedRun(SMALL_PPO, mesh4, chunk_size=1)
    assert type(run.algo) is PPO and run.algo.replicas == 2 and run.algo.config is SMALL_PPO
    assert type(ShardedRun(KLPPO, mesh4, chunk_size=1).algo) is KLPPO
    with pytest.raises(ConfigError, match="num_envs=3 is not divisible"):
        ShardedRun(dataclasses.replace(SMALL_PPO, num_envs=3), mesh4)


THREE = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 3, num_minibatches=2)


def test_a_run_prints_compile_lines_progress_and_a_closing_summary_and_evaluates_at_the_end(
    tmp_path,
):
    lines = []
    run = RunConfig.make(
        runs_dir=str(tmp_path), run_name="r", log_every=2, eval_every=100, eval_episodes=4
    )
    result = train(THREE, run, progress=lines.append)
    text = "\n".join(lines)
    assert lines[1].startswith("compiling the update chunk (2 updates) and the evaluation")
    compiled = next(line for line in lines if line.startswith("compiled in "))
    assert "chunk" in compiled and "eval" in compiled  # ("still compiling" ticks may precede)
    assert "  update      2/3" in text and "ETA" in text and "\r" not in text
    rows = result.metrics  # read back from metrics.jsonl
    assert [r["update"] for r in rows] == [1, 2, 3]
    assert all(r["wall_time"] > 0 and r["steps_per_second"] > 0 for r in rows)
    assert "eval_return" in rows[-1] and "eval_return_ci" in rows[-1]  # evaluated at the end
    assert not any("eval_return" in r for r in rows[:-1])  # eval_every=100: only at the end
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary == json.loads(json.dumps(result.summary))
    assert summary["steps_per_second"] == result.steps_per_second  # one figure everywhere
    assert summary["compiled_steps_per_second"] == result.compiled_steps_per_second
    assert result.compiled_steps_per_second > result.steps_per_second
    assert summary["final_eval_return"]["episodes"] == 4
    assert summary["final_eval_return"]["update"] == 3
    assert summary["files"]["learning curve"] == str(tmp_path / "r" / "learning_curve.png")
    done = lines.index(next(line for line in lines if line.startswith("done: 3/3 updates")))
    assert f"{result.steps_per_second:,.0f} env steps/s wall clock" in lines[done]
    assert "eval return" in lines[done] and str(tmp_path / "r" / "checkpoints") in lines[done]
    assert (tmp_path / "r" / "learning_curve.png").stat().st_size > 1000


def test_a_stopped_run_is_evaluated_before_it_ends_and_quiet_prints_nothing(tmp_path):
    lines = []
    run = RunConfig.make(
        runs_dir=str(tmp_path), run_name="s", log_every=1, eval_every=100, eval_episodes=2,
        quiet=True,
    )  # fmt: skip
    stop = lambda info: info.update == 2 and info.loop.request_stop("enough")  # noqa: E731
    result = train(THREE, run, hooks=[Hook(stop, first=True)], progress=lines.append)
    assert lines == [] and result.interrupted and result.updates_done == 2
    rows = result.metrics
    assert [r["update"] for r in rows] == [1, 2] and "eval_return" in rows[-1]
    assert result.summary["stop_reason"] == "enough"


def nan_priorities_at(update: int) -> rljax.Hook:
    """Fault injection: NaN replay priorities after the chunk ending at ``update``, ahead of the
    built-in hooks (as ``--per-eps -1`` made them before validation refused it)."""

    def poison(info):
        if info.update != update:
            return
        sharded = info.loop.sharded

        def nan(state):
            return state.replace(
                buffer=state.buffer.replace(priority=state.buffer.priority * jnp.nan)
            )

        with jax.set_mesh(sharded.mesh):
            poisoned = jax.jit(nan, out_shardings=sharded.state_shardings)(info.state)
        info.loop.replace_state(poisoned)

    return rljax.Hook(poison, first=True)


def test_nonfinite_replay_priorities_stop_the_run_and_are_never_saved(tmp_path):
    config = DQNConfig(
        num_envs=4, steps_per_update=4, buffer_size=64, batch_size=8, learning_starts=16,
        train_frequency=4, target_update_interval=16, total_timesteps=4 * 4 * 4, prioritized=True,
    )  # fmt: skip
    run = RunConfig.make(mesh="data=2", runs_dir=str(tmp_path), run_name="per", log_every=1,
                         checkpoint_every=2, checkpoint_min_seconds=0, eval_every=0,
                         quiet=True)  # fmt: skip
    with pytest.raises(TrainingError) as info:
        train(config, run, hooks=[nan_priorities_at(3)])
    message = str(info.value)
    assert "non-finite buffer.priority (NaN/Inf) at update 3 (64 of 64 values)" in message
    assert "last good checkpoint (update 2)" in message
    with Checkpointer(tmp_path / "per" / "checkpoints") as ckpt:
        assert ckpt.steps() == [2] and ckpt.latest_valid_step() == 2
    assert [r["update"] for r in read_metrics(tmp_path / "per" / "metrics.jsonl")] == [1, 2]
