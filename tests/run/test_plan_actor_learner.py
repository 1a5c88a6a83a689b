"""The actor-learner memory plan: each mesh's figures from its compiled programs and its part of
the state, the queued parameter versions on the actors, and the budget check per mesh."""

import re

import jax
import pytest

from rljax import ConfigError, PPOConfig, RunConfig
from rljax.cli import main
from rljax.parallel.actor_learner import reshard
from rljax.run.actor_learner import ActorLearnerRun, prepare_actor_learner
from rljax.run.plan_actor_learner import QUEUED, ROLLOUTS, plan_actor_learner

TINY = PPOConfig(
    num_envs=4, num_steps=8, total_timesteps=4 * 8 * 4, num_minibatches=2, update_epochs=1,
    actor_widths=(32, 32), critic_widths=(32, 32),
)  # fmt: skip
RUN = RunConfig.make(
    actor_mesh="data=2", learner_mesh="data=1,model=2", max_staleness=2, log_every=4,
    eval_every=0, quiet=True,
)  # fmt: skip
FLAGS = [
    "--num-envs", "4", "--num-steps", "8", "--total-timesteps", "128", "--num-minibatches", "2",
    "--update-epochs", "1", "--actor-widths", "32", "32", "--critic-widths", "32", "32",
    "--actor-mesh", "data=2", "--learner-mesh", "data=1,model=2", "--max-staleness", "2",
    "--log-every", "4", "--eval-every", "0",
]  # fmt: skip


@pytest.fixture(scope="module")
def compiled():
    """``(ActorLearnerRun compiled, its ActorLearnerPlan, an initialised state)``."""
    (actor, learner), algo = prepare_actor_learner(TINY, RUN)
    al_run = ActorLearnerRun(algo, actor, learner, max_staleness=2, chunk_size=4)
    al_run.compile(jax.random.key(0))
    return al_run, plan_actor_learner(al_run, "ppo", RUN), al_run.init(jax.random.key(0))


def on_device(tree, device) -> int:
    return sum(s.data.nbytes for x in jax.tree.leaves(tree) for s in x.addressable_shards
               if s.device == device)  # fmt: skip


def test_each_mesh_has_its_programs_and_its_part_of_the_state(compiled):
    al_run, p, state = compiled
    learner, actor = p.learner, p.actor
    assert (learner.role, learner.mesh) == ("learner", "data=1,model=2")
    assert (actor.role, actor.mesh) == ("actor", "data=2,model=1")
    assert set(learner.programs) == {"init", "learn"} and set(actor.programs) == {"act"}
    for side in (learner, actor):
        for name, figures in side.programs.items():
            analysis = al_run.compiled[name].memory_analysis()
            assert figures["temp"] == analysis.temp_size_in_bytes
            assert figures["argument"] == analysis.argument_size_in_bytes
    # The learner's part: the parameters and the optimizer, no environments.
    lead = al_run.layout.mesh.devices.flat[0]
    assert learner.state["parameters"] == on_device(state.learner.params, lead) > 0
    assert learner.state["optimizer state"] == on_device(state.learner.opt_state, lead)
    assert "environments" not in learner.state and learner.gradients > 0
    # Beside learn the learner may hold the K = 2 rollouts the actors ran ahead.
    fresh = al_run.init(jax.random.key(1))
    _, experience, metrics = al_run.compiled["act"](fresh.actor, fresh.queue[0], fresh.versions[0])
    rollout = reshard((experience, metrics), (al_run.exp_on_learner, al_run.layout.replicated()))
    assert learner.state[ROLLOUTS] == 2 * on_device(rollout, lead) > 0
    assert learner.total == max(
        learner.programs["init"]["total"],
        learner.programs["learn"]["total"] + 2 * on_device(rollout, lead),
    )
    # The actors' part: environments and K = 2 queued parameter versions, no optimizer.
    first = al_run.actor_layout.mesh.devices.flat[0]
    assert actor.state["environments"] == on_device(state.actor.env, first) > 0
    assert actor.state[QUEUED] == on_device(state.queue, first) > 0
    assert actor.state[QUEUED] == 2 * on_device(state.queue[0], first)
    assert "optimizer state" not in actor.state and actor.gradients == 0
    # act takes one version (its arguments: the actor state, one version, the version number);
    # beside it the device holds the other and the learner's newest.
    act = actor.programs["act"]
    one_version = on_device(state.queue[0], first)
    assert act["argument"] == on_device(state.actor, first) + one_version + 4
    assert actor.total == act["total"] + 2 * one_version
    # Both programs donate their side's state: a device holds one copy of it.
    assert act["alias"] == on_device(state.actor, first) > 0
    assert (
        learner.programs["learn"]["alias"]
        >= learner.state["parameters"] + learner.state["optimizer state"]
    )
    assert p.total == max(learner.total, actor.total) and p.fits
    assert learner.param_count == sum(x.size for x in jax.tree.leaves(state.learner.params))
    figures = p.as_dict()
    assert figures["layout"] == "actor-learner" and figures["max_staleness"] == 2
    assert figures["actor"]["bytes_per_device"]["state"][QUEUED] == actor.state[QUEUED]
    table = p.table()
    assert "learner mesh data=1,model=2, actor mesh data=2,model=1" in table
    assert "memory plan (actor devices)" in table and "(act program)" in table
    assert "(the act program and what is queued beside it)" in table
    peak = "learn program and what is queued beside it" if learner.peak == "learn" else "init"
    assert f"(the {peak}" in table.split("memory plan (actor")[0]


def test_the_mesh_over_its_budget_is_named_with_what_to_lower(compiled):
    al_run, p, _ = compiled
    between = (p.actor.total + p.learner.total) // 2
    low, high = sorted([p.actor, p.learner], key=lambda side: side.total)
    tight = plan_actor_learner(al_run, "ppo", RUN.replace(memory_per_device=str(between)))
    assert not tight.fits and [s.fits for s in (tight.learner, tight.actor)] == [
        side is low for side in (p.learner, p.actor)
    ]
    with pytest.raises(ConfigError) as info:
        tight.check()
    message = str(info.value)
    assert "\n" not in message and message.count("; lower") == 1
    flag = f"--{high.role}-mesh {high.mesh}"
    assert re.match(rf"the {high.role} devices need [\d.]+ kB each on {flag} \(the \w+ program",
                    message)  # fmt: skip
    assert re.search(r"but --memory-per-device allows [\d.]+ kB; lower ", message)
    both = plan_actor_learner(al_run, "ppo", RUN.replace(memory_per_device="1B"))
    message = both.message()
    assert "the learner devices need" in message and "the actor devices need" in message
    assert "--max-staleness" in message.split("the actor devices")[1]


def test_rljax_plan_prints_both_meshes_and_an_over_budget_run_exits_2(capsys):
    assert main(["plan", "ppo", *FLAGS]) == 0
    out = capsys.readouterr().out
    assert "memory plan (learner devices)" in out and "memory plan (actor devices)" in out
    assert main(["plan", "ppo", *FLAGS, "--memory-per-device", "1kB"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: the learner devices need")
