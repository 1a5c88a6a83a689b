"""PPO on two meshes: actors roll out with parameters at most ``K`` learner updates old, the
learner learns; the design is in ``docs/architecture.md`` ("Actor-learner layout").

    layouts, algo = prepare_actor_learner(PPOConfig(), RunConfig.make(
        num_devices=8, mesh=None, actor_mesh="data=2", learner_mesh="fsdp=2,model=3",
        max_staleness=1))
    run = ActorLearnerRun(algo, *layouts, max_staleness=1, chunk_size=10)
    state = run.init(jax.random.key(0))         # ActorLearnerState: one pytree, two meshes
    state, metrics = run.run_chunk(state, 10)   # 10 updates, each an act and a learn program

``ActorLearnerRun`` has the interface ``Loop``, evaluation and checkpoints use from
``ShardedRun``, so ``train()`` runs it with every hook.
"""

from __future__ import annotations

import functools
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax.sharding import PartitionSpec as P

from rljax.algos.ppo import PPO, Experience
from rljax.errors import ConfigError
from rljax.parallel import Layout, set_num_cpu_devices
from rljax.parallel.actor_learner import mesh_sizes, reshard, split_layouts
from rljax.parallel.mesh import DEFAULT_MESH
from rljax.run import compile_cache, integrity, memory
from rljax.run.config import RunConfig, check_num_devices, validate_run
from rljax.run.evaluation import Evaluation
from rljax.run.sharded import check_layout, resolve_algorithm, rules_for

# The learner's part of the PPO state has no environments; the actors' part no optimizer.
ACTOR_ONLY = ("env", "key", "obs_stats", "reward_scaling")


@struct.dataclass
class ActorLearnerState:
    """The whole training state, one pytree over two meshes (checkpointed as one).

    ``learner``: a ``PPOState`` on the learner mesh with ``params``, ``opt_state``, ``sync``,
    ``update_step`` (= the parameters' version: learner updates applied), ``hparams``; its
    actor-only fields are ``None``. ``actor``: a ``PPOState`` on the actor mesh with ``env``,
    ``key``, ``obs_stats``, ``reward_scaling``, ``update_step`` (rollouts made), ``hparams``;
    no parameters or optimizer. ``queue``: ``K`` parameter versions on the actor mesh, oldest
    first, the behaviour policies of the next ``K`` rollouts; ``versions``: their versions
    (``int32`` scalars, replicated on the actor mesh)."""

    learner: Any
    actor: Any
    queue: tuple
    versions: tuple


def is_actor_learner(run: RunConfig) -> bool:
    p = run.parallel
    return p.actor_mesh is not None or p.learner_mesh is not None


def validate_actor_learner(algo_cls, config, run: RunConfig) -> None:
    """Every ``ConfigError`` of the actor-learner flags that needs no devices."""
    p = run.parallel
    if (p.actor_mesh is None) != (p.learner_mesh is None):
        given, missing = (
            ("--actor-mesh", "--learner-mesh") if p.learner_mesh is None
            else ("--learner-mesh", "--actor-mesh")
        )  # fmt: skip
        raise ConfigError(
            f"{given} needs {missing} as well: the actor-learner layout splits the devices into "
            "both meshes, e.g. --actor-mesh data=2 --learner-mesh fsdp=2,model=3"
        )
    if p.max_staleness < 0:
        raise ConfigError(
            f"max_staleness must be >= 0 (0: synchronous, K: rollouts made with parameters at "
            f"most K learner updates old), got {p.max_staleness}"
        )
    if p.actor_mesh is None:
        if p.max_staleness:
            raise ConfigError("--max-staleness applies to the actor-learner layout only; give "
                              "--actor-mesh and --learner-mesh")  # fmt: skip
        return
    if p.mesh != DEFAULT_MESH:
        raise ConfigError(
            f"--mesh {p.mesh!r} cannot be combined with --actor-mesh/--learner-mesh (the "
            "actor-learner layout has one mesh per role); drop --mesh"
        )
    if not issubclass(algo_cls, PPO) or getattr(config, "recurrent", "none") != "none":
        what = "recurrent PPO" if issubclass(algo_cls, PPO) else algo_cls.__name__
        raise ConfigError(
            f"the actor-learner layout (--actor-mesh/--learner-mesh) supports feed-forward PPO "
            f"only, not {what}"
        )
    if run.num_seeds > 1 or p.seed_axis != "none":
        raise ConfigError("the actor-learner layout runs one seed (num_seeds=1, no seed_axis)")
    if getattr(config.sync, "strategy", "allreduce") != "allreduce":
        raise ConfigError(
            f"the actor-learner layout needs replicated parameters (sync strategy allreduce), "
            f"got {config.sync.strategy!r}"
        )
    if run.faults.on_nonfinite == "rollback":
        raise ConfigError("the actor-learner layout stops on non-finite values "
                          "(on_nonfinite='stop'); rollback is not available")  # fmt: skip
    if p.num_devices is not None:
        mesh_sizes(p.actor_mesh, p.learner_mesh, p.num_devices)


def prepare_actor_learner(algorithm, run: RunConfig) -> tuple[tuple[Layout, Layout], Any]:
    """``((actor layout, learner layout), algorithm)`` after every check (``ConfigError``
    before compiling): the flags, both meshes' divisibility, the memory of the learner."""
    algo_cls, config = resolve_algorithm(algorithm)
    validate_actor_learner(algo_cls, config, run)
    check_num_devices(run.parallel.num_devices)
    if run.parallel.num_devices is not None:
        set_num_cpu_devices(run.parallel.num_devices)
    p = run.parallel
    actor, learner = split_layouts(p.actor_mesh, p.learner_mesh, rules_for(run))
    validate_run(run, learner)
    for layout in (actor, learner):
        algo_cls.validate(config, layout.shards("batch"), layout.shards("mlp"))
    algo = algo_cls(config, replicas=learner.shards("replica"))
    for layout in (actor, learner):
        check_layout(algo, layout)
    memory.check(algo, learner, 1)
    return (actor, learner), algo


class ActorLearnerRun:
    """PPO over an actor and a learner layout; ``run_chunk`` dispatches, per update, the actor
    program (a rollout with the oldest queued parameters) and the learner program (GAE + SGD),
    resharding parameters and rollouts between the meshes."""

    num_seeds = 1

    def __init__(
        self, algo: PPO, actor: Layout, learner: Layout, max_staleness: int = 0,
        chunk_size: int = 25,
    ):  # fmt: skip
        self.algo, self.actor_layout, self.layout = algo, actor, learner
        self.mesh = learner.mesh
        self.max_staleness, self.chunk_size = max_staleness, chunk_size
        specs = algo.state_specs()
        self.full_shardings = learner.shardings(specs)
        self.learner_shardings = learner.shardings(specs.replace(**dict.fromkeys(ACTOR_ONLY)))
        self.actor_shardings = actor.shardings(specs.replace(params=None, opt_state=None, sync={}))
        self.params_shardings = actor.shardings(specs.params)
        self.state_shardings = ActorLearnerState(
            self.learner_shardings,
            self.actor_shardings,
            (self.params_shardings,) * max_staleness,
            (actor.replicated(),) * max_staleness,
        )
        jit, init_jit = compile_cache.jit_for(self.mesh), compile_cache.jit_for(self.mesh, "init")
        # One jit for both signatures; compile() replaces _init_jit with the key-only program.
        self._init_jit = self._init_params_jit = init_jit(
            algo.init, out_shardings=self.full_shardings
        )
        abstract = self.abstract_state()
        acted = jax.eval_shape(self._act, abstract.actor, abstract.learner.params, jnp.int32(0))
        exp_specs = experience_specs(acted[1])
        self.exp_on_actors = actor.shardings(exp_specs)
        self.exp_on_learner = learner.shardings(exp_specs)
        # Each program takes its side's state and returns the next one: donated, so a device
        # holds one copy of the parameters and optimizer state, not two.
        self._act_jit = jit(
            self._act,
            out_shardings=(self.actor_shardings, self.exp_on_actors, actor.replicated()),
            donate_argnums=0,
        )
        self._learn_jit = jit(
            self._learn, out_shardings=(self.learner_shardings, learner.replicated()),
            donate_argnums=0,
        )  # fmt: skip
        # One program (per chunk length): eager stacking would wait for every update.
        self._stack = jax.jit(functools.partial(_stack, size=chunk_size))
        self._count_learner = jax.jit(integrity.nonfinite_counts)
        self._count_actor = jax.jit(integrity.nonfinite_counts)
        self.compile_seconds: dict[str, float] = {}
        self.compiled: dict[str, Any] = {}

    # -- the two programs -------------------------------------------------------------------------
    def _act(self, actor, params, version):
        actor, experience, metrics = self.algo.act(actor, params)
        actor = actor.replace(update_step=actor.update_step + 1)
        return actor, experience, {**metrics, "policy_version": version}

    def _learn(self, learner, experience, act_metrics):
        version = learner.update_step  # the update about to be applied uses this rollout
        learner, metrics = self.algo.learn(learner, experience)
        staleness = version - act_metrics["policy_version"]
        return learner, {**metrics, **act_metrics, "staleness": staleness}

    # -- state ------------------------------------------------------------------------------------
    def _split(self, state) -> ActorLearnerState:
        """A full PPO state (learner mesh) -> the actor-learner state."""
        learner = state.replace(**dict.fromkeys(ACTOR_ONLY))
        actor = reshard(state.replace(params=None, opt_state=None, sync={}), self.actor_shardings)
        k = self.max_staleness
        queue = tuple(reshard(state.params, self.params_shardings) for _ in range(k))
        version = reshard(jnp.int32(0), self.actor_layout.replicated())
        return ActorLearnerState(learner, actor, queue, (version,) * k)

    def init(self, key: jax.Array, params: dict | None = None) -> ActorLearnerState:
        """The state ``ShardedRun.init`` makes, split between the meshes: every queued version
        is the initial parameters (version 0)."""
        with self.layout.active():
            state = self._init_jit(key) if not params else self._init_params_jit(key, params)
        return self._split(state)

    def abstract_state(self, key: jax.Array | None = None) -> ActorLearnerState:
        key = jax.random.key(0) if key is None else key
        full = jax.eval_shape(self.algo.init, key)
        specs = ActorLearnerState(
            full.replace(**dict.fromkeys(ACTOR_ONLY)),
            full.replace(params=None, opt_state=None, sync={}),
            (full.params,) * self.max_staleness,
            (jax.ShapeDtypeStruct((), jnp.int32),) * self.max_staleness,
        )
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            specs,
            self.state_shardings,
        )

    def learner_view(self, state: ActorLearnerState):
        """The learner's ``PPOState`` with the actors' ``obs_stats`` (evaluation, export)."""
        stats = state.actor.obs_stats
        if stats is not None:
            stats = reshard(stats, self.full_shardings.obs_stats)
        return state.learner.replace(obs_stats=stats)

    @functools.cached_property
    def floating_paths(self) -> list[tuple[str, int]]:
        return [(name, x.size) for name, x in integrity.floating_leaves(self.abstract_state())]

    # -- running ----------------------------------------------------------------------------------
    def compile(self, key: jax.Array) -> None:
        abstract = self.abstract_state(key)
        version = jax.ShapeDtypeStruct((), jnp.int32, sharding=self.actor_layout.replicated())
        params = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            abstract.learner.params, self.params_shardings,
        )  # fmt: skip
        t0 = time.perf_counter()
        with self.layout.active():
            self._init_jit = self._init_jit.lower(key).compile()
        t1 = time.perf_counter()
        with self.actor_layout.active():
            self._act_jit = self._act_jit.lower(abstract.actor, params, version).compile()
        t2 = time.perf_counter()
        exp, metrics = self._act_jit.out_info[1:]
        on_learner = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            (exp, metrics), (self.exp_on_learner, self._replicated_like(metrics)),
        )  # fmt: skip
        with self.layout.active():
            self._learn_jit = self._learn_jit.lower(abstract.learner, *on_learner).compile()
        t3 = time.perf_counter()
        self.compile_seconds = {"init": t1 - t0, "act": t2 - t1, "learn": t3 - t2}
        self.compiled = {"init": self._init_jit, "act": self._act_jit, "learn": self._learn_jit}

    def _replicated_like(self, tree):
        return jax.tree.map(lambda _: self.layout.replicated(), tree)

    def step(self, state: ActorLearnerState) -> tuple[ActorLearnerState, dict]:
        """One update: dispatch the rollout with the oldest queued parameters (the learner's own
        with K = 0), queue the learner's current parameters, dispatch the learning step. Nothing
        waits here: with K >= 1 the next call's rollout runs while this learning step does."""
        learner, actor, queue, versions = state.learner, state.actor, state.queue, state.versions
        targets = (self.params_shardings, self.actor_layout.replicated())
        if self.max_staleness == 0:
            behaviour, version = reshard((learner.params, learner.update_step), targets)
        else:
            behaviour, version = queue[0], versions[0]
        with self.actor_layout.active():  # first: it needs nothing the learner is computing
            actor, experience, act_metrics = self._act_jit(actor, behaviour, version)
        if self.max_staleness:
            current = reshard((learner.params, learner.update_step), targets)
            queue, versions = (*queue[1:], current[0]), (*versions[1:], current[1])
        experience, act_metrics = reshard(
            (experience, act_metrics), (self.exp_on_learner, self._replicated_like(act_metrics))
        )
        with self.layout.active():
            learner, metrics = self._learn_jit(learner, experience, act_metrics)
        return ActorLearnerState(learner, actor, queue, versions), metrics

    def run_chunk(self, state, num_updates: int):
        state, metrics, _ = self.run_chunk_checked(state, num_updates)
        return state, metrics

    def run_chunk_checked(self, state, num_updates: int):
        """``num_updates`` updates -> ``(state, metrics [chunk_size], nonfinite [L])`` as
        ``ShardedRun``; metrics gain ``policy_version`` and ``staleness`` per update and the
        chunk's ``staleness_mean`` / ``staleness_max`` (the same on each of its rows)."""
        if not 0 < num_updates <= self.chunk_size:
            raise ValueError(f"num_updates must be in [1, {self.chunk_size}], got {num_updates}")
        rows = []
        for _ in range(num_updates):
            state, metrics = self.step(state)
            rows.append(metrics)
        with self.layout.active():
            metrics = self._stack(rows)
            learner_counts = self._count_learner(state.learner)
        with self.actor_layout.active():
            actor_counts = self._count_actor((state.actor, state.queue, state.versions))
        return state, metrics, _Counts((learner_counts, actor_counts))


def _stack(rows: list[dict], size: int) -> dict:
    """Per-update scalar metrics -> ``[size]`` arrays (zeros past ``len(rows)``), plus the
    chunk's ``staleness_mean`` and ``staleness_max``."""
    n = len(rows)
    out = {}
    for name in rows[0]:
        column = jnp.stack([r[name] for r in rows])
        out[name] = jnp.zeros((size,), column.dtype).at[:n].set(column)
    staleness = out["staleness"][:n].astype(jnp.float32)
    out["staleness_mean"] = jnp.zeros((size,)).at[:n].set(staleness.mean())
    out["staleness_max"] = jnp.zeros((size,)).at[:n].set(staleness.max())
    return out


def experience_specs(experience: Experience) -> Experience:
    """Logical specs of an ``Experience``: ``[T, B@batch, ...]`` leaves, ``last_obs [B@batch,
    D]``, the key replicated."""
    time_major = lambda _: P(None, "batch")  # noqa: E731
    return Experience(
        rollout=jax.tree.map(time_major, experience.rollout),
        reward=P(None, "batch"),
        next_values=P(None, "batch"),
        last_obs=P("batch"),
        key=P(),
    )


class _Counts:
    """NaN/inf counts of the learner's and the actors' leaves, concatenated when the loop reads
    them (``np.asarray``): the two live on different meshes."""

    def __init__(self, parts):
        self.parts = parts

    def __array__(self, dtype=None, copy=None):
        out = np.concatenate([np.asarray(p) for p in self.parts])
        return out if dtype is None else out.astype(dtype)


class LearnerEvaluation(Evaluation):
    """Greedy evaluation of the learner's parameters (with the actors' ``obs_stats``) on the
    learner mesh."""

    def __init__(self, run: ActorLearnerRun, num_envs: int, seed: int, greedy: bool = True):
        self.al = run
        super().__init__(_LearnerSide(run), num_envs, seed, greedy)

    def __call__(self, state: ActorLearnerState, update: int) -> dict[str, float]:
        return super().__call__(self.al.learner_view(state), update)


class _LearnerSide:
    """What ``Evaluation`` reads of a run, for the learner's side of an ``ActorLearnerRun``."""

    num_seeds = 1

    def __init__(self, run: ActorLearnerRun):
        self.run, self.algo, self.layout, self.mesh = run, run.algo, run.layout, run.mesh

    def abstract_state(self, key=None):
        abstract = self.run.abstract_state(key)
        stats = jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            abstract.actor.obs_stats, self.run.full_shardings.obs_stats,
        )  # fmt: skip
        return abstract.learner.replace(obs_stats=stats)
