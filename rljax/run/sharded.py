"""An algorithm placed on a mesh: validation, sharded init, one compiled chunk program.

    layout, algo = prepare(PPOConfig(), RunConfig.make(mesh="data=2,model=2", num_seeds=8))
    run = ShardedRun(algo, layout, num_seeds=8, chunk_size=20)
    state = run.init(jax.random.key(0))          # born sharded: jit(init, out_shardings=...)
    state, metrics = run.run_chunk(state, 20)    # 20 updates in one compiled call

``rljax.run.loop.Loop`` runs chunks to the end with hooks; ``rljax.run.training.train`` is the
whole job. The algorithm registry and the algorithm constructor are used only by the functions
under "Algorithms" below.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import time
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.algos import ALGORITHMS, Algorithm
from rljax.errors import ConfigError
from rljax.networks.zoo import check_stages
from rljax.parallel import Layout, make_mesh, set_num_cpu_devices
from rljax.parallel.rules import RULES, Rules, prepend_axis, seeds_on
from rljax.parallel.sync import validate_layout
from rljax.run import compile_cache, integrity, memory
from rljax.run.config import RunConfig, check_num_devices, check_seed_group, validate_run


# -- Algorithms: the registry, read nowhere else in rljax.run -------------------------------------
def config_type_of(name: str) -> type:
    """The config dataclass of the registered algorithm ``name`` (CLI subcommands, resume)."""
    return ALGORITHMS[name].config_type


def registered_names() -> list[str]:
    return list(ALGORITHMS)


def resolve_algorithm(spec) -> tuple[type[Algorithm], Any]:
    """``(algorithm class, config)`` of an algorithm config, instance or class.

    A config picks the registered algorithm whose config type it is exactly (a config subclass
    belongs to an algorithm subclass: pass that instance); a class gets its default config."""
    if isinstance(spec, type):
        if not issubclass(spec, Algorithm):
            raise ConfigError(
                f"{spec.__qualname__} is not an algorithm class (rljax.algos.Algorithm)"
            )
        return spec, spec.config_type()
    if isinstance(spec, Algorithm):
        return type(spec), spec.config
    if dataclasses.is_dataclass(spec):
        for algo_cls in ALGORITHMS.values():
            if type(spec) is algo_cls.config_type:
                return algo_cls, spec
        raise ConfigError(
            f"{type(spec).__qualname__} is not the config of a registered algorithm "
            f"({', '.join(ALGORITHMS)}); pass the algorithm instance instead, e.g. "
            f"train(MyAlgorithm({type(spec).__name__}(...)))"
        )
    raise ConfigError(f"cannot train {spec!r}: give an algorithm config, instance or class")


def algorithm_name(algo_cls) -> str:
    """The registry name of ``algo_cls``, or its qualified name if it is not registered."""
    for name, registered in ALGORITHMS.items():
        if algo_cls is registered:
            return name
    return f"{algo_cls.__module__}.{algo_cls.__qualname__}"


# -- Placement ------------------------------------------------------------------------------------
def rules_for(run: RunConfig) -> Rules:
    """The default rules, with the seeds on a mesh axis when ``seed_axis`` names one."""
    return seeds_on(run.parallel.seed_axis, RULES)


def as_layout(layout: Layout | Mesh) -> Layout:
    return layout if isinstance(layout, Layout) else Layout(layout)


def state_shardings(algo, layout: Layout | Mesh, num_seeds: int = 1):
    """The ``NamedSharding`` of every leaf of ``algo``'s training state (parameters, optimizer
    moments, environment batch, keys, counters) under the layout; seeds add a leading axis."""
    specs = algo.state_specs()
    if num_seeds > 1:
        specs = prepend_axis(specs, "seed")
    return as_layout(layout).shardings(specs)


def replicate(mesh: Mesh, tree):
    """Host values (the same on every process) as global arrays replicated over ``mesh``.

    With several processes (``jax.distributed``) a jitted program over the global mesh takes
    global arrays only; each process contributes its identical copy. Typed keys included."""

    def one(x):
        if isinstance(x, jax.Array) and x.is_fully_addressable is False:
            return x  # already global
        sharding = NamedSharding(mesh, PartitionSpec())
        if jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key):
            data = np.asarray(jax.random.key_data(x))
            impl = jax.random.key_impl(x)
            data = jax.make_array_from_process_local_data(sharding, data, data.shape)
            return jax.random.wrap_key_data(data, impl=impl)
        x = np.asarray(x)
        return jax.make_array_from_process_local_data(sharding, x, x.shape)

    return jax.tree.map(one, tree)


class ShardedRun:
    """An algorithm placed on a mesh: sharded init and a compiled chunk runner.

    With ``num_seeds > 1`` every leaf of the state gains a leading seed axis ``[S@seed_rule]``.
    """

    def __init__(
        self,
        algo,
        layout: Layout | Mesh,
        num_seeds: int = 1,
        chunk_size: int = 25,
        seed_group: int = 0,
    ):
        """``algo``: an algorithm instance, or a config / class (built and validated for the
        layout's replicas, as ``prepare`` does); ``layout``: a ``Layout`` (mesh and rules), or a
        mesh with the default rules; ``seed_group``: seeds a device trains at a time (0: auto,
        ``seeds_at_a_time``)."""
        self.layout = as_layout(layout)
        if not isinstance(algo, Algorithm):
            algo_cls, config = resolve_algorithm(algo)
            algo_cls.validate(config, self.layout.shards("batch"), self.layout.shards("mlp"))
            algo = algo_cls(config, replicas=self.layout.shards("replica"))
            check_layout(algo, self.layout)
        self.algo = algo
        self.mesh = mesh = self.layout.mesh
        self.num_seeds = num_seeds
        self.chunk_size = chunk_size
        devices = self.layout.shards("seed")
        check_seed_group(seed_group, num_seeds // devices)
        self.seed_group = seeds_at_a_time(seed_group, num_seeds // devices, mesh)
        groups = num_seeds // devices // self.seed_group
        self._groups = SeedGroups(devices, groups) if num_seeds > 1 and groups > 1 else None
        self.state_shardings = state_shardings(algo, self.layout, num_seeds)
        if num_seeds > 1:
            seed_mesh_axis = dict(self.layout.rules)["seed"]
            self._update = jax.vmap(algo.update, spmd_axis_name=seed_mesh_axis)
            # lax.map, not vmap: a vmapped orthogonal init becomes a batched LAPACK QR, whose
            # CPU kernel in jaxlib 0.10 can deadlock in its thread pool (seen on 2 cores).
            self._init = functools.partial(jax.lax.map, algo.init)
        else:
            self._update, self._init = algo.update, algo.init
        jit = compile_cache.jit_for(mesh)
        init_jit = self._init_jit_of = compile_cache.jit_for(mesh, "init")
        self._init_jit = init_jit(self._init_from_seed_key, out_shardings=self.state_shardings)
        self._init_params_jit = init_jit(self._init_from_params, out_shardings=self.state_shardings)
        # Metrics replicated: every process can read them (multi-host) without a gather.
        replicated = NamedSharding(mesh, PartitionSpec())
        self._chunk_jit = jit(
            self._run_updates,
            out_shardings=(self.state_shardings, replicated, replicated),
            donate_argnums=0,
        )
        self.compile_seconds: dict[str, float] = {}
        self.compiled: dict[str, Any] = {}
        self._init_members_jit = None

    def init_members(self, keys: jax.Array, hparams: dict[str, jax.Array]):
        """``num_seeds`` members from their own keys ``[S]`` and hyperparameters ``{name: [S]}``
        (sweeps): member ``i`` equals ``algo.init(keys[i])`` with ``hparams[...][i]``."""
        if self.num_seeds == 1:
            raise ValueError("init_members needs num_seeds > 1 (one member per seed axis entry)")
        if self._init_members_jit is None:

            def init(keys, hparams):
                state = self._init(keys)
                return state.replace(hparams={**state.hparams, **hparams})

            self._init_members_jit = self._init_jit_of(init, out_shardings=self.state_shardings)
        with self.layout.active():
            return self._init_members_jit(*replicate(self.mesh, (keys, hparams)))

    def _init_from_seed_key(self, key):
        if self.num_seeds > 1:
            return self._init(jax.random.split(key, self.num_seeds))
        return self._init(key)

    def _run_updates(self, state, num_updates):
        """Up to ``chunk_size`` updates; metrics ``[chunk_size, (S,)]``, rows past ``num_updates``
        are zeros. A traced trip count keeps one compiled program for every chunk length.

        With seed groups (``seed_group`` below a device's ``S/D`` seeds) the state is viewed as
        ``[K, D*G@seed, ...]``: step ``k`` of a scan runs the chunk for every device's ``k``-th
        group of ``G`` seeds, so no seed leaves its device and each seed computes what it would
        in one vmap over all ``S``."""
        groups = self._groups
        if groups is None:
            state, buffer = self._updates_of(state, num_updates)
            return state, buffer, integrity.nonfinite_counts(state)
        grouped_shardings = jax.tree.map(  # [K, D*G@seed, ...]: the state's, behind a new axis
            lambda s: NamedSharding(s.mesh, PartitionSpec(None, *s.spec)), self.state_shardings
        )
        grouped = jax.lax.with_sharding_constraint(groups.split(state), grouped_shardings)

        def one_group(_, group_state):
            return None, self._updates_of(group_state, num_updates)

        _, (state, buffer) = jax.lax.scan(one_group, None, grouped)
        state = groups.merge(state)
        buffer = jax.tree.map(lambda b: groups.merge(b.swapaxes(0, 1), axis=1), buffer)
        return state, buffer, integrity.nonfinite_counts(state)

    def _updates_of(self, state, num_updates):
        """``num_updates`` updates of ``state`` -> ``(state, metrics [chunk_size, ...])``."""
        # One trace of the update serves both the metrics' shapes and the loop body (a jit's
        # trace is cached by input types); the nested call is inlined when XLA compiles.
        update = jax.jit(self._update)
        metric_shapes = jax.eval_shape(update, state)[1]
        buffer = jax.tree.map(
            lambda m: jnp.zeros((self.chunk_size, *m.shape), m.dtype), metric_shapes
        )

        def body(i, carry):
            state, buffer = carry
            state, metrics = update(state)
            buffer = jax.tree.map(lambda b, m: b.at[i].set(m), buffer, metrics)
            return state, buffer

        return jax.lax.fori_loop(0, num_updates, body, (state, buffer))

    def init(self, key: jax.Array, params: dict | None = None):
        """The initial state from ``key`` (per seed: ``split(key, num_seeds)``); ``params``:
        one replica's parameters by path for every seed to start from (``Algorithm.init``)."""
        with self.layout.active():
            if not params:
                return self._init_jit(replicate(self.mesh, key))
            return self._init_params_jit(*replicate(self.mesh, (key, params)))

    def _init_from_params(self, key, params):
        def one(k):
            return self.algo.init(k, params)

        if self.num_seeds > 1:
            return jax.lax.map(one, jax.random.split(key, self.num_seeds))
        return one(key)

    def abstract_state(self, key: jax.Array | None = None):
        """The state as ``ShapeDtypeStruct`` leaves with shardings (ahead-of-time lowering,
        checkpoint restore targets)."""
        key = jax.random.key(0) if key is None else key
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            jax.eval_shape(self._init_from_seed_key, key),
            self.state_shardings,
        )

    def compile(self, key: jax.Array) -> None:
        """Compile init and the chunk runner ahead of time; the ``jax.stages.Compiled`` programs in
        ``compiled`` (``"init"``, ``"chunk"``), the wall seconds each added in ``compile_seconds``.

        Init compiles on a second thread while the chunk traces and compiles (XLA compiles
        without the GIL, and the chunk needs only the state's shapes), so ``"init"`` counts its
        tracing and whatever of its compile outlasts the chunk's; the two add up to the wall
        time."""
        with self.layout.active():
            t0 = time.perf_counter()
            init = self._init_jit.lower(key)
            with concurrent.futures.ThreadPoolExecutor(1) as pool:
                init_compiled = pool.submit(init.compile)
                t1 = time.perf_counter()
                chunk = self._chunk_jit.lower(self.abstract_state(key), jnp.int32(0)).compile()
                t2 = time.perf_counter()
                self._init_jit = init_compiled.result()
            t3 = time.perf_counter()
        self._chunk_jit = chunk
        self.compile_seconds = {"init": (t1 - t0) + (t3 - t2), "chunk": t2 - t1}
        self.compiled = {"init": self._init_jit, "chunk": self._chunk_jit}

    def run_chunk(self, state, num_updates: int):
        """``num_updates`` (1..chunk_size) updates in one call -> ``(state, metrics
        [chunk_size, (S,)])``; rows past ``num_updates`` are zeros (``Loop`` trims them)."""
        state, metrics, _ = self.run_chunk_checked(state, num_updates)
        return state, metrics

    def run_chunk_checked(self, state, num_updates: int):
        """``run_chunk`` plus ``nonfinite [L]``: NaN/inf counts of the new state's floating
        leaves, in the order of ``floating_paths`` (the loop's guard reads them; no second
        program runs over the state)."""
        if not 0 < num_updates <= self.chunk_size:
            raise ValueError(f"num_updates must be in [1, {self.chunk_size}], got {num_updates}")
        with self.layout.active():
            return self._chunk_jit(state, replicate(self.mesh, jnp.int32(num_updates)))

    @functools.cached_property
    def floating_paths(self) -> list[tuple[str, int]]:
        """``(path, size)`` of the state's floating leaves: what ``nonfinite`` counts."""
        return [(name, x.size) for name, x in integrity.floating_leaves(self.abstract_state())]


CPU_SEED_GROUP = 8  # seeds a CPU device trains at a time by default (see seeds_at_a_time)


def seeds_at_a_time(requested: int, seeds_per_device: int, mesh: Mesh) -> int:
    """The seed group size: ``requested``, or (0) ``CPU_SEED_GROUP`` on CPU when a device has
    more than twice that many seeds and a divisor of its seeds between half of it and it exists;
    else all of a device's seeds.

    A CPU device runs on about one core: past a few tens of seeds the batched arrays of one
    vmapped update (activations ``[S/D, 128, 64]`` per layer for PPO's defaults) leave the core's
    cache, and 1,024 CartPole seeds on two devices train at 0.6x the speed per step that groups
    of 8 reach. Accelerators want the widest batch, so they keep all seeds in one group."""
    if requested:
        return requested
    if mesh.devices.flat[0].platform != "cpu" or seeds_per_device <= 2 * CPU_SEED_GROUP:
        return seeds_per_device
    size = max(g for g in range(1, CPU_SEED_GROUP + 1) if seeds_per_device % g == 0)
    return size if 2 * size >= CPU_SEED_GROUP else seeds_per_device


@dataclasses.dataclass(frozen=True)
class SeedGroups:
    """``[S@seed, ...]`` leaves, ``S = D * K * G`` (device ``d`` holding seeds ``d*K*G ...``),
    viewed as ``[K, D*G, ...]``: row ``k`` holds every device's ``k``-th group of ``G`` seeds, so
    both views keep each seed on its device."""

    devices: int  # D: shards of the seed axis
    groups: int  # K: groups per device

    def split(self, tree):
        def one(x):
            x = x.reshape(self.devices, self.groups, -1, *x.shape[1:]).swapaxes(0, 1)
            return x.reshape(self.groups, -1, *x.shape[3:])

        return jax.tree.map(one, tree)

    def merge(self, tree, axis: int = 0):
        """The inverse of ``split`` for leaves whose ``[K, D*G]`` axes start at ``axis``."""

        def one(x):
            lead, rest = x.shape[:axis], x.shape[axis + 2 :]
            x = x.reshape(*lead, self.groups, self.devices, -1, *rest)
            x = jnp.swapaxes(x, axis, axis + 1)
            return x.reshape(*lead, -1, *rest)

        return jax.tree.map(one, tree)


def check_layout(algo, layout: Layout) -> None:
    """What the layout asks of a built algorithm: its sync strategy composes with the mesh
    (``fsdp``), and every parameter axis splits evenly over the mesh axes its logical name maps
    to (network widths and channels vs ``fsdp``/``model``), and a pipelined mesh suits the network
    (``zoo.check_stages``). ``ConfigError`` otherwise."""
    check_stages(algo.config, layout.shards("layers"), layout.shards("batch"))
    sync = getattr(algo.config, "sync", None)
    if sync is not None:
        validate_layout(sync, layout)
    abstract = jax.eval_shape(algo.init_params, jax.random.key(0))
    layout.check_divisible(algo.learner.param_logical, nn.meta.unbox(abstract))


# -- Everything checked, then built ---------------------------------------------------------------
def make_run_mesh(run: RunConfig) -> Mesh:
    check_num_devices(run.parallel.num_devices)  # before JAX creates any device
    if run.parallel.num_devices is not None:
        set_num_cpu_devices(run.parallel.num_devices)
    mesh = make_mesh(run.parallel.mesh)
    if jax.process_count() > 1 and mesh.devices.size != jax.device_count():
        raise ConfigError(
            f"mesh {run.parallel.mesh!r} uses {mesh.devices.size} of the {jax.device_count()} "
            f"devices of {jax.process_count()} processes; with several processes the mesh must "
            "span every device (e.g. data=-1,model=2)"
        )
    return mesh


def prepare(algorithm, run: RunConfig, swept: tuple[str, ...] = ()) -> tuple[Layout, Any]:
    """Validate everything and build the layout and the algorithm (a config, instance or class:
    an instance is rebuilt as its own class for the layout's replicas); raises ``ConfigError``
    before anything compiles, also when the run cannot fit in the devices' memory
    (``rljax.run.memory``: traced, cached; ``memory.estimate(algo, layout, num_seeds)``)."""
    algo_cls, config = resolve_algorithm(algorithm)
    layout = Layout(make_run_mesh(run), rules_for(run))
    validate_run(run, layout)
    # One data-parallel replica per shard of the replica rule's mesh axis; seeds on that axis
    # leave each seed's environment batch whole on its shard (one replica).
    replicas = layout.shards("replica")
    algo_cls.validate(config, layout.shards("batch"), layout.shards("mlp"))
    algo = algo_cls(config, replicas=replicas, swept=swept)
    check_layout(algo, layout)
    memory.check(algo, layout, run.num_seeds)
    return layout, algo
