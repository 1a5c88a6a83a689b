"""The memory plan of an actor-learner run: one ``Plan`` for each mesh's devices.

    p = plan(PPOConfig(), RunConfig.make(actor_mesh="data=2", learner_mesh="fsdp=2,model=2",
                                         max_staleness=1, num_devices=6))
    print(p.table())   # the learner's and the actors' bytes per device, each against the budget
    p.check()          # ConfigError naming the mesh that does not fit and what to lower

A learner device holds its part of the state (parameters, optimizer and sync state) and runs the
init and learn programs. The actors may run ``K`` rollouts ahead of the learner, so beside the
learn program (whose argument is one rollout) it can also hold the next ``K`` rollouts. An actor
device holds the environments, the key chain, the observation normaliser and the ``K`` queued
parameter versions, and runs the act program. The act program takes the oldest queued version as
an argument; at its peak the device also holds the other ``K - 1`` and the learner's newest,
resharded for the queue: ``K`` versions beside the program.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel import mesh_spec_of
from rljax.run import memory
from rljax.run.config import RunConfig
from rljax.run.plan import (
    GRADIENTS,
    Plan,
    _largest,
    _param_count,
    budget_of,
    lowering_hints,
    program_bytes,
)

QUEUED = "queued parameters"
ROLLOUTS = "queued rollouts"


@dataclasses.dataclass(frozen=True)
class ActorLearnerPlan:
    """``learner`` and ``actor``: the ``Plan`` of each mesh (``role`` set); ``max_staleness``: the
    queue's length ``K``."""

    learner: Plan
    actor: Plan
    max_staleness: int

    @property
    def sides(self) -> tuple[Plan, Plan]:
        return self.learner, self.actor

    @property
    def total(self) -> int:
        """Bytes the busiest device of either mesh needs."""
        return max(side.total for side in self.sides)

    @property
    def fits(self) -> bool:
        return all(side.fits for side in self.sides)

    def as_dict(self) -> dict[str, Any]:
        return {
            "layout": "actor-learner",
            "max_staleness": self.max_staleness,
            "total": self.total,
            "fits": self.fits,
            "learner": self.learner.as_dict(),
            "actor": self.actor.as_dict(),
        }

    def table(self) -> str:
        head = (
            f"actor-learner layout: learner mesh {self.learner.mesh}, actor mesh "
            f"{self.actor.mesh}, {self.max_staleness} queued parameter version(s)"
        )
        return "\n".join([head, self.learner.table(), self.actor.table()])

    def message(self) -> str:
        """One line per mesh over budget: what it needs by part, the budget, what to lower."""
        h = memory.human
        lines = []
        for side in self.sides:
            if side.fits:
                continue
            parts = side.parts()
            parts = ", ".join(f"{n} {h(b)}" for n, b in parts.items() if b and n != GRADIENTS)
            flag = f"--{side.role}-mesh"
            lower = ", ".join(side.hints) or "the sizes"
            lines.append(
                f"the {side.role} devices need {h(side.total)} each on {flag} {side.mesh} (the "
                f"{side.peak} program; {parts}) but {side.budget_source} allows "
                f"{h(side.budget or 0)}; lower {lower}, or give {flag} more devices"
            )
        return "; ".join(lines)

    def check(self) -> ActorLearnerPlan:
        if not self.fits:
            raise ConfigError(self.message())
        return self


def _parts(tree) -> dict[str, int]:
    """Per-device bytes of ``tree``'s leaves (``ShapeDtypeStruct`` with shardings) by part."""
    leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
    return memory.bytes_by_part((p, x.shape, x.dtype, x.sharding) for p, x in leaves)


def _with_hints(side: Plan, config, k: int) -> Plan:
    if side.fits:
        return side
    staleness = ("--max-staleness",) if k else ()  # each queued version or rollout is a copy
    return dataclasses.replace(side, hints=lowering_hints(side, config) + staleness)


def compile_and_plan(algorithm, run: RunConfig) -> ActorLearnerPlan:
    """``rljax.run.plan.plan`` for the actor-learner layout: validate, compile, plan."""
    from rljax.run.actor_learner import ActorLearnerRun, prepare_actor_learner  # noqa: PLC0415
    from rljax.run.sharded import algorithm_name, resolve_algorithm  # noqa: PLC0415

    algo_cls, config = resolve_algorithm(algorithm)
    (actor, learner), algo = prepare_actor_learner(algorithm, run)
    chunk = min(run.logging.log_every, config.num_updates)
    al_run = ActorLearnerRun(algo, actor, learner, run.parallel.max_staleness, chunk)
    al_run.compile(jax.random.key(run.seed))
    return plan_actor_learner(al_run, algorithm_name(algo_cls), run)


def _rollout_bytes(al_run) -> int:
    """Per learner device: one rollout and its act metrics, resharded onto the learner mesh."""
    experience, metrics = al_run.compiled["act"].out_info[1:]
    replicated = al_run.layout.replicated()
    total = 0
    for leaves, shardings in (
        (jax.tree.leaves(experience), jax.tree.leaves(al_run.exp_on_learner)),
        (jax.tree.leaves(metrics), [replicated] * len(jax.tree.leaves(metrics))),
    ):
        for leaf, sharding in zip(leaves, shardings, strict=True):
            total += memory.shard_bytes(leaf.shape, leaf.dtype, sharding)
    return total


def plan_actor_learner(al_run, algorithm: str, run: RunConfig) -> ActorLearnerPlan:
    """The ``ActorLearnerPlan`` of a compiled ``ActorLearnerRun`` (``al_run.compile`` has run)."""
    abstract = al_run.abstract_state(jax.random.key(run.seed))
    programs = {name: program_bytes(c) for name, c in al_run.compiled.items()}
    config = al_run.algo.config
    params = jax.tree.leaves(abstract.learner.params)
    specs = jax.tree.leaves(
        al_run.algo.state_specs().params, is_leaf=lambda x: isinstance(x, PartitionSpec)
    )
    param_count = _param_count([(None, "params", x, s) for x, s in zip(params, specs, strict=True)])
    k = al_run.max_staleness
    params_label = memory.CATEGORIES["params"][0]
    queued = _parts({"params": abstract.queue}).get(params_label, 0)
    sides = []
    for role, layout, tree, names in (
        ("learner", al_run.layout, abstract.learner, ("init", "learn")),
        ("actor", al_run.actor_layout, abstract.actor, ("act",)),
    ):
        state = _parts(tree)
        shown = {role: tree}
        if role == "actor" and k:
            state[QUEUED] = queued
            shown["queue"] = abstract.queue
        if role == "learner" and k:
            state[ROLLOUTS] = k * _rollout_bytes(al_run)
        budget, source = budget_of(run, layout.mesh)
        flat = jax.tree_util.tree_flatten_with_path(shown)[0]
        side = Plan(
            algorithm=algorithm,
            env=str(getattr(config, "env", "")),
            mesh=mesh_spec_of(layout.mesh),
            devices=int(layout.mesh.devices.size),
            num_seeds=1,
            param_count=param_count,
            state=state,
            gradients=state.get(params_label, 0) if role == "learner" else 0,
            programs={name: programs[name] for name in names},
            largest=_largest([(path, None, leaf, None) for path, leaf in flat]),
            budget=budget,
            budget_source=source,
            compile_seconds={n: s for n, s in al_run.compile_seconds.items() if n in names},
            available_devices=jax.device_count(),
            role=role,
            update_program=names[-1],
            beside_programs=state.get(QUEUED if role == "actor" else ROLLOUTS, 0),
        )
        sides.append(_with_hints(side, config, k))
    return ActorLearnerPlan(sides[0], sides[1], k)
