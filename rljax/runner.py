"""Sharded execution of an algorithm: run configuration, validation, layouts, compiled chunks.

    run = ShardedRun(PPO(config, rules, replicas=2), mesh, num_seeds=8)
    state = run.init(jax.random.key(0))          # born sharded: jit(init, out_shardings=...)
    state, metrics = run.run_chunk(state, 20)    # 20 updates in one compiled call
    for state, metrics, done in run.chunks(state, 976): ...  # the host loop's chunking

``rljax.training.train(algo_config, RunConfig(...))`` is the whole job around it.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import time
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rljax.algos import algorithm_for
from rljax.errors import ConfigError
from rljax.parallel import Layout, make_mesh, set_num_cpu_devices
from rljax.parallel.rules import RULES, Rules, prepend_axis, rules_with


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Where and how a run executes (not part of the algorithm's maths)."""

    mesh: str = "data=1,model=1"
    """device mesh, e.g. 'data=2,model=2'; one axis may be -1 (all remaining devices)."""
    num_devices: int | None = None
    """emulate this many CPU devices (must be set before JAX starts)."""
    seed: int = 0
    num_seeds: int = 1
    """independent seeds vmapped inside one jit."""
    seed_axis: Literal["none", "data"] = "none"
    """'data' places the seeds on the data axis (each seed's envs then stay on one data shard)."""
    log_every: int = 25
    """updates per jitted chunk; progress and metrics are written between chunks."""
    run_name: str | None = None
    """run directory name under runs_dir (default: <algo>-<env>-<time>)."""
    runs_dir: str = "runs"
    quiet: bool = False
    measure_comm: bool = True
    """count the collectives of one compiled optimizer step and log bytes per update."""
    checkpoint_every: int = 100
    """updates between orbax checkpoints (at chunk ends; also at the end and on SIGTERM)."""
    keep_checkpoints: int = 3
    resume: str | None = None
    """run directory to continue from its newest valid checkpoint, e.g. runs/<name>."""
    on_nonfinite: Literal["stop", "rollback"] = "stop"
    """NaN/Inf loss, gradient or parameters: stop, or roll back to the last checkpoint."""
    max_rollbacks: int = 3
    debug_nonfinite_at: int = 0
    """testing aid: make the parameters NaN after this update (0: off)."""
    eval_every: int = 100
    """updates between greedy evaluations on separate environments (0: off)."""
    eval_episodes: int = 8
    """evaluation environments (one episode each), sharded like the training batch."""
    tensorboard: bool = False
    """also write metrics as TensorBoard events to <run dir>/tensorboard (needs tensorboardX)."""
    wandb: bool = False
    """also log metrics to Weights & Biases, offline unless WANDB_MODE says otherwise (needs
    wandb; files under <run dir>/wandb, upload later with `wandb sync`)."""
    wandb_project: str = "rljax"


def validate_run(run: RunConfig, mesh: Mesh) -> None:
    for name in ("num_seeds", "log_every", "checkpoint_every", "keep_checkpoints"):
        if getattr(run, name) < 1:
            raise ConfigError(f"{name} must be >= 1, got {getattr(run, name)}")
    if run.max_rollbacks < 0:
        raise ConfigError(f"max_rollbacks must be >= 0, got {run.max_rollbacks}")
    if run.eval_every < 0:
        raise ConfigError(f"eval_every must be >= 0 (0: no evaluation), got {run.eval_every}")
    data = 1 if run.seed_axis == "data" else mesh.shape["data"]
    if run.eval_every and (run.eval_episodes < 1 or run.eval_episodes % data):
        raise ConfigError(
            f"eval_episodes={run.eval_episodes} must be a positive multiple of the data axis "
            f"size {data} (evaluation environments are sharded like the training batch)"
        )
    optional = {"tensorboard": "tensorboardX", "wandb": "wandb"}  # flag = the rljax extra
    for flag, module in optional.items():
        if getattr(run, flag):
            try:
                importlib.import_module(module)
            except ImportError:
                raise ConfigError(
                    f"--{flag} needs {module}: pip install 'rljax[{flag}]' "
                    f"(or pip install {module})"
                ) from None
    if run.seed_axis == "data" and run.num_seeds % mesh.shape["data"]:
        raise ConfigError(
            f"seed_axis='data' needs num_seeds ({run.num_seeds}) divisible by the data axis size "
            f"{mesh.shape['data']}"
        )


def rules_for(run: RunConfig) -> Rules:
    """Seeds on `data` take the axis from the environment batch."""
    if run.seed_axis == "data":
        return rules_with(seed="data", batch=None, replica=None)
    return RULES


def state_shardings(algo, layout, num_seeds: int = 1):
    """The ``NamedSharding`` of every leaf of ``algo``'s training state (parameters, optimizer
    moments, environment batch, keys, counters) under the layout; seeds add a leading axis."""
    if isinstance(layout, Mesh):
        layout = Layout(layout)
    specs = algo.state_specs()
    if num_seeds > 1:
        specs = prepend_axis(specs, "seed")
    return layout.shardings(specs)


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
        self, algo, mesh: Mesh, num_seeds: int = 1, chunk_size: int = 25, rules: Rules = RULES
    ):
        self.algo = algo
        self.mesh = mesh
        self.layout = Layout(mesh, rules)
        self.num_seeds = num_seeds
        self.chunk_size = chunk_size
        self.state_shardings = state_shardings(algo, self.layout, num_seeds)
        if num_seeds > 1:
            seed_mesh_axis = dict(self.layout.rules)["seed"]
            self._update = jax.vmap(algo.update, spmd_axis_name=seed_mesh_axis)
            # lax.map, not vmap: a vmapped orthogonal init becomes a batched LAPACK QR, whose
            # CPU kernel in jaxlib 0.10 can deadlock in its thread pool (seen on 2 cores).
            self._init = functools.partial(jax.lax.map, algo.init)
        else:
            self._update, self._init = algo.update, algo.init
        self._init_jit = jax.jit(self._init_from_seed_key, out_shardings=self.state_shardings)
        # Metrics replicated: every process can read them (multi-host) without a gather.
        replicated = NamedSharding(mesh, PartitionSpec())
        self._chunk_jit = jax.jit(
            self._run_updates, out_shardings=(self.state_shardings, replicated), donate_argnums=0
        )
        self.compile_seconds: dict[str, float] = {}
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

            self._init_members_jit = jax.jit(init, out_shardings=self.state_shardings)
        with self.layout.active():
            return self._init_members_jit(*replicate(self.mesh, (keys, hparams)))

    def _init_from_seed_key(self, key):
        if self.num_seeds > 1:
            return self._init(jax.random.split(key, self.num_seeds))
        return self._init(key)

    def _run_updates(self, state, num_updates):
        """Up to ``chunk_size`` updates; metrics ``[chunk_size, (S,)]``, rows past ``num_updates``
        are zeros. A traced trip count keeps one compiled program for every chunk length."""
        metric_shapes = jax.eval_shape(self._update, state)[1]
        buffer = jax.tree.map(
            lambda m: jnp.zeros((self.chunk_size, *m.shape), m.dtype), metric_shapes
        )

        def body(i, carry):
            state, buffer = carry
            state, metrics = self._update(state)
            buffer = jax.tree.map(lambda b, m: b.at[i].set(m), buffer, metrics)
            return state, buffer

        return jax.lax.fori_loop(0, num_updates, body, (state, buffer))

    def init(self, key: jax.Array):
        with self.layout.active():
            return self._init_jit(replicate(self.mesh, key))

    def abstract_state(self, key: jax.Array):
        """The state as ``ShapeDtypeStruct`` leaves with shardings (ahead-of-time lowering)."""
        return jax.tree.map(
            lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
            jax.eval_shape(self._init_from_seed_key, key),
            self.state_shardings,
        )

    def compile(self, key: jax.Array) -> None:
        """Compile init and the chunk runner ahead of time; timings in ``compile_seconds``."""
        with self.layout.active():
            t0 = time.perf_counter()
            self._init_jit = self._init_jit.lower(key).compile()
            t1 = time.perf_counter()
            self._chunk_jit = self._chunk_jit.lower(
                self.abstract_state(key), jnp.int32(0)
            ).compile()
            t2 = time.perf_counter()
        self.compile_seconds = {"init": t1 - t0, "chunk": t2 - t1}

    def chunks(self, state, num_updates: int, start: int = 0):
        """Run updates ``start..num_updates`` chunk by chunk; yields ``(state, metrics,
        updates_done)`` after each chunk, metrics trimmed to that chunk's updates (on device)."""
        done = start
        while done < num_updates:
            count = min(self.chunk_size, num_updates - done)
            state, metrics = self.run_chunk(state, count)
            done += count
            yield state, jax.tree.map(lambda m, n=count: m[:n], metrics), done

    def run_chunk(self, state, num_updates: int):
        if not 0 < num_updates <= self.chunk_size:
            raise ValueError(f"num_updates must be in [1, {self.chunk_size}], got {num_updates}")
        with self.layout.active():
            return self._chunk_jit(state, replicate(self.mesh, jnp.int32(num_updates)))


def algorithm_name(algo_config) -> str:
    return algorithm_for(algo_config).name


def prepare(algo_config, run: RunConfig, swept: tuple[str, ...] = ()) -> tuple[Mesh, Any]:
    """Validate everything and build mesh and algorithm; raises ``ConfigError`` before compiling."""
    algorithm = algorithm_for(algo_config)
    if run.num_devices is not None:
        set_num_cpu_devices(run.num_devices)
    mesh = make_mesh(run.mesh)
    if jax.process_count() > 1 and mesh.devices.size != jax.device_count():
        raise ConfigError(
            f"mesh {run.mesh!r} uses {mesh.devices.size} of the {jax.device_count()} devices of "
            f"{jax.process_count()} processes; with several processes the mesh must span every "
            "device (e.g. data=-1,model=2)"
        )
    validate_run(run, mesh)
    # One data-parallel replica per data shard; seeds on `data` leave each seed's environment
    # batch whole on its data shard (one replica).
    layout = Layout(mesh, rules_for(run))
    replicas = layout.shards("replica")
    algorithm.validate(algo_config, layout.shards("batch"), layout.shards("mlp"))
    return mesh, algorithm(algo_config, replicas=replicas, swept=swept)
