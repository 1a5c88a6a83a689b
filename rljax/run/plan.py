"""The memory plan of a run: what one device holds, read from the compiled programs.

    p = plan(PPOConfig(), RunConfig.make(mesh="data=2,model=2"))  # compiles; runs, writes nothing
    print(p.table())           # parameter count, bytes per device by part, largest array, budget
    p.as_dict()                # the same figures for JSON (config.json's "memory_plan")
    p.check()                  # ConfigError with the figures and a mesh that would fit

The state's parts (parameters, optimizer and sync state, environments, replay buffer; the
categories of ``rljax.run.memory``) are the bytes of each leaf's shard under the run's state
shardings. The programs' figures are XLA's ``memory_analysis()`` of the compiled init and update
chunk, per device (SPMD programs are compiled for one device's shards): arguments (the state,
donated), outputs (aliased to the arguments), temporaries (activations, rollout, gradients, the
optimizer's intermediates) and generated code. A device needs ``arguments + outputs - aliased +
temporaries + code`` of the bigger program. Gradients are one copy of the parameter shards and
live inside the temporaries; they are shown, not added.

The budget: ``--memory-per-device`` (``RunConfig.parallel.memory_per_device``), else the device's
own ``bytes_limit`` where JAX reports one (GPU/TPU); emulated CPU devices have none here (the
traced host-memory check of ``rljax.run.memory`` covers them). Over budget, the message names a
mesh of the available devices that would fit (``rljax.parallel.candidates``; state parts exact,
temporaries scaled with the batch shards) or says that none does and what to lower.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel import mesh_spec_of
from rljax.parallel.pipeline import bubble_fraction
from rljax.run import memory
from rljax.run.config import RunConfig
from rljax.run.plan_meshes import suggest
from rljax.run.sharded import ShardedRun, algorithm_name, prepare, resolve_algorithm

PROGRAM_FIELDS = ("argument", "output", "alias", "temp", "generated_code")
GRADIENTS = "gradients"
TEMPORARIES = "activations/temporaries"


def program_bytes(compiled) -> dict[str, int]:
    """``{argument, output, alias, temp, generated_code, total}`` bytes per device of a
    ``jax.stages.Compiled`` (its ``memory_analysis()``); ``total`` = what it needs at once."""
    analysis = compiled.memory_analysis()
    if isinstance(analysis, (list, tuple)):  # one per device on some backends: all the same
        analysis = analysis[0]
    out = {f: int(getattr(analysis, f"{f}_size_in_bytes", 0) or 0) for f in PROGRAM_FIELDS}
    out["total"] = (
        out["argument"] + out["output"] - out["alias"] + out["temp"] + out["generated_code"]
    )
    return out


@dataclasses.dataclass(frozen=True)
class Plan:
    """Bytes per device of a compiled run. ``state``: per part (``memory.CATEGORIES`` labels);
    ``programs``: ``program_bytes`` of ``"init"`` and ``"chunk"`` (of each program of its mesh
    for an actor-learner run, ``update_program`` the one that updates); ``largest``: the biggest
    state array on a device (``path``, ``shape``, ``dtype``, ``bytes_per_device``); ``budget``:
    bytes a device may use (``None``: no limit known) and where it came from;
    ``suggestion``: over budget, a mesh that would fit and its estimated need, else ``None``
    (and ``hints``: the flags that shrink the biggest parts)."""

    algorithm: str
    env: str
    mesh: str
    devices: int
    num_seeds: int
    param_count: int
    state: dict[str, int]
    gradients: int
    programs: dict[str, dict[str, int]]
    largest: dict[str, Any]
    budget: int | None = None
    budget_source: str | None = None
    compile_seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    suggestion: tuple[str, int] | None = None
    available_devices: int = 1
    hints: tuple[str, ...] = ()
    pipeline: dict[str, Any] | None = None  # stages, microbatches, bubble, stacked_param_bytes
    # The actor-learner layout plans each mesh apart (``rljax.run.plan_actor_learner``): whose
    # devices these are, the program that updates, and the bytes queued beside it.
    role: str = ""
    update_program: str = "chunk"
    beside_programs: int = 0

    @property
    def temporaries(self) -> int:
        return self.programs[self.update_program]["temp"]

    @property
    def total(self) -> int:
        """Bytes one device needs: the biggest program's total (the updating one's with what is
        queued beside it)."""
        return self._needs()[self.peak]

    @property
    def peak(self) -> str:
        """The program whose total (with what is queued beside it) is ``total``."""
        needs = self._needs()
        return max(needs, key=needs.__getitem__)

    def _needs(self) -> dict[str, int]:
        beside = {self.update_program: self.beside_programs}
        return {name: p["total"] + beside.get(name, 0) for name, p in self.programs.items()}

    @property
    def fits(self) -> bool:
        return self.budget is None or self.total <= self.budget

    def parts(self) -> dict[str, int]:
        """The state's parts, the gradients and the updating program's temporaries, biggest
        first."""
        parts = {**self.state, GRADIENTS: self.gradients, TEMPORARIES: self.temporaries}
        return dict(sorted(parts.items(), key=lambda kv: -kv[1]))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready figures (bytes per device)."""
        return {
            "algorithm": self.algorithm,
            "env": self.env,
            "mesh": self.mesh,
            "devices": self.devices,
            "num_seeds": self.num_seeds,
            "param_count": self.param_count,
            "bytes_per_device": {
                "total": self.total,
                "state": dict(self.state),
                GRADIENTS: self.gradients,
                "temporaries": self.temporaries,
                "programs": {k: dict(v) for k, v in self.programs.items()},
            },
            "largest_array": dict(self.largest),
            "budget": self.budget,
            "budget_source": self.budget_source,
            "fits": self.fits,
            "suggested_mesh": None if self.suggestion is None else self.suggestion[0],
            "compile_seconds": {k: round(v, 3) for k, v in self.compile_seconds.items()},
            "pipeline": self.pipeline,
            **({"role": self.role, "beside_programs": self.beside_programs} if self.role else {}),
        }

    def table(self) -> str:
        """The plan for the console, one figure a line."""
        h = memory.human
        seeds = f", {self.num_seeds} seeds" if self.num_seeds > 1 else ""
        role = f" ({self.role} devices)" if self.role else ""
        lines = [
            f"memory plan{role}: {self.algorithm} on {self.env}, mesh {self.mesh} "
            f"({self.devices} device{'s' if self.devices > 1 else ''}){seeds}",
            f"  parameters: {self.param_count:,}",
            "  bytes per device:",
        ]
        for name, n in self.state.items():
            lines.append(f"    {name:<26}{h(n):>10}")
        if self.gradients:
            lines.append(f"    {GRADIENTS:<26}{h(self.gradients):>10}  (within the temporaries)")
        what = self.update_program
        what = "update chunk" if what == "chunk" else f"{what} program"
        lines.append(f"    {TEMPORARIES:<26}{h(self.temporaries):>10}  ({what})")
        for name, p in self.programs.items():
            lines.append(
                f"    {name + ' program total':<26}{h(p['total']):>10}  (arguments "
                f"{h(p['argument'])} + outputs {h(p['output'])} - aliased {h(p['alias'])} + "
                f"temporaries {h(p['temp'])} + code {h(p['generated_code'])})"
            )
        peak = f"  (the {self.peak} program"
        queued = self.beside_programs and self.peak == self.update_program
        peak += " and what is queued beside it)" if queued else ")"
        lines.append(f"    {'needed':<26}{h(self.total):>10}{peak if self.role else ''}")
        if self.pipeline:
            pl = self.pipeline
            lines.append(
                f"  pipeline: {pl['stages']} stages x {pl['microbatches']} microbatches, GPipe "
                f"bubble (S-1)/(M+S-1) = {pl['bubble']:.3f}; stacked blocks "
                f"{h(pl['stacked_param_bytes'])} of parameters per device"
            )
        big = self.largest
        if big:
            shape = ", ".join(str(d) for d in big["shape"])
            lines.append(
                f"  largest array: {big['path']} {big['dtype']}[{shape}], "
                f"{h(big['bytes_per_device'])} per device"
            )
        if self.budget is None:
            lines.append("  budget: none known (set one with --memory-per-device)")
        else:
            share = 100 * self.total / self.budget
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(
                f"  budget: {h(self.budget)} per device ({self.budget_source}): {verdict} "
                f"({share:.1f}%)"
            )
        if self.compile_seconds:
            parts = ", ".join(f"{k} {v:.1f} s" for k, v in self.compile_seconds.items())
            lines.append(f"  compiled in {sum(self.compile_seconds.values()):.1f} s ({parts})")
        return "\n".join(lines)

    def message(self) -> str:
        """One line: what is needed per part against the budget, and a mesh that would fit."""
        h = memory.human
        parts = ", ".join(f"{n} {h(b)}" for n, b in self.parts().items() if b and n != GRADIENTS)
        peak = self.peak
        text = (
            f"this run needs {h(self.total)} per device on mesh {self.mesh} (the {peak} "
            f"program; {parts}; gradients {h(self.gradients)} within the temporaries) but "
            f"{self.budget_source} allows {h(self.budget or 0)}"
        )
        if self.suggestion is not None:
            spec, need = self.suggestion
            return f"{text}; a mesh that would fit: --mesh {spec} (about {h(need)} per device)"
        lower = [h for h in self.hints if not h.startswith("--compute-dtype")]
        tries = [h for h in self.hints if h.startswith("--compute-dtype")]
        advice = f"lower {', '.join(lower) or 'the sizes'}"
        advice += "".join(f", try {t}" for t in tries)
        return (
            f"{text}; no mesh of the {self.available_devices} device(s) fits: {advice}, or use "
            "more devices"
        )

    def check(self) -> Plan:
        """``self`` when it fits the budget, else ``ConfigError`` (``message``)."""
        if not self.fits:
            raise ConfigError(self.message())
        return self


# -- building a plan ------------------------------------------------------------------------------
def budget_of(run: RunConfig, mesh) -> tuple[int | None, str | None]:
    """``(bytes, source)``: ``--memory-per-device``, else the smallest ``bytes_limit`` of this
    process's devices of ``mesh`` (GPU/TPU), else ``(None, None)`` (CPU)."""
    if run.parallel.memory_per_device is not None:
        return memory.parse_bytes(run.parallel.memory_per_device), "--memory-per-device"
    local = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    limit, shared_host = memory.device_bytes(local or list(mesh.devices.flat))
    if shared_host or limit is None:
        return None, None
    return limit, "the device's memory limit"


def _spec_leaves(sharded) -> list[PartitionSpec]:
    from rljax.parallel.rules import prepend_axis  # noqa: PLC0415

    specs = sharded.algo.state_specs()
    if sharded.num_seeds > 1:
        specs = prepend_axis(specs, "seed")
    return jax.tree.leaves(specs, is_leaf=lambda x: isinstance(x, PartitionSpec))


def _leaves(sharded):
    """``[(path, field, ShapeDtypeStruct with sharding, logical spec)]`` of the state."""
    abstract = sharded.abstract_state(jax.random.key(0))
    flat = jax.tree_util.tree_flatten_with_path(abstract)[0]
    specs = _spec_leaves(sharded)
    return [
        (path, memory._field(path), leaf, spec)
        for (path, leaf), spec in zip(flat, specs, strict=True)
    ]


def _param_count(leaves) -> int:
    count = 0
    for _, field, leaf, spec in leaves:
        if field != "params":
            continue
        names = tuple(spec) + (None,) * (len(leaf.shape) - len(tuple(spec)))
        count += math.prod(
            d for d, n in zip(leaf.shape, names, strict=False) if n not in ("seed", "replica")
        )
    return count


def _largest(leaves) -> dict[str, Any]:
    best: dict[str, Any] = {}
    for path, _, leaf, _ in leaves:
        n = memory.shard_bytes(leaf.shape, leaf.dtype, leaf.sharding)
        if not best or n > best["bytes_per_device"]:
            best = {
                "path": jax.tree_util.keystr(path).lstrip("."),
                "shape": [int(d) for d in leaf.shape],
                "dtype": str(leaf.dtype),
                "bytes_per_device": int(n),
            }
    return best


def _pipeline(sharded, leaves) -> dict[str, Any] | None:
    """Stages, microbatches, GPipe's bubble and the stacked blocks' parameter bytes per device,
    when the layout pipelines (``layers`` split); else ``None``."""
    stages = sharded.layout.shards("layers")
    microbatches = getattr(sharded.algo.config, "pipeline_microbatches", 0)
    if stages == 1 or not microbatches:
        return None
    stacked = sum(
        memory.shard_bytes(leaf.shape, leaf.dtype, leaf.sharding)
        for path, field, leaf, _ in leaves
        if field == "params" and "'blocks'" in jax.tree_util.keystr(path)
    )
    return {
        "stages": stages,
        "microbatches": microbatches,
        "bubble": bubble_fraction(stages, microbatches),
        "stacked_param_bytes": int(stacked),
    }


def plan_of(sharded, algorithm: str, run: RunConfig) -> Plan:
    """The ``Plan`` of a compiled ``ShardedRun`` (``sharded.compile`` has run)."""
    programs = {name: program_bytes(c) for name, c in sharded.compiled.items()}
    leaves = _leaves(sharded)
    layout = sharded.layout
    state = memory.state_bytes(sharded.algo, layout, sharded.num_seeds)
    budget, source = budget_of(run, layout.mesh)
    plan = Plan(
        algorithm=algorithm,
        env=str(getattr(sharded.algo.config, "env", "")),
        mesh=mesh_spec_of(layout.mesh),
        devices=int(layout.mesh.devices.size),
        num_seeds=sharded.num_seeds,
        param_count=_param_count(leaves),
        state=state,
        gradients=state.get(memory.CATEGORIES["params"][0], 0),
        programs=programs,
        largest=_largest(leaves),
        budget=budget,
        budget_source=source,
        compile_seconds=dict(sharded.compile_seconds),
        available_devices=jax.device_count(),
        pipeline=_pipeline(sharded, leaves),
    )
    if plan.fits:
        return plan
    return dataclasses.replace(
        plan,
        suggestion=suggest(sharded, leaves, programs, budget),
        hints=lowering_hints(plan, sharded.algo.config),
    )


def lowering_hints(plan: Plan, config) -> tuple[str, ...]:
    """The flags that shrink ``plan``'s biggest parts (``memory._hints``), then bfloat16
    matmuls where the run computes in float32."""
    parts = {**plan.state, memory.WORKING: plan.temporaries}
    hints = memory._hints(config, parts, plan.num_seeds)
    if getattr(config, "compute_dtype", None) == "float32":
        hints += ("--compute-dtype bfloat16",)
    return hints


def plan(algorithm, run: RunConfig | None = None):
    """Validate (``prepare``), compile init and the update chunk as ``train`` would, and return
    their ``Plan``; nothing runs and nothing is written. ``algorithm``: as for ``train``. With
    ``--actor-mesh``/``--learner-mesh`` an ``ActorLearnerPlan``: one ``Plan`` per mesh."""
    run = run or RunConfig()
    algo_cls, config = resolve_algorithm(algorithm)
    if run.parallel.actor_mesh is not None or run.parallel.learner_mesh is not None:
        from rljax.run.plan_actor_learner import compile_and_plan  # noqa: PLC0415

        return compile_and_plan(algorithm, run)
    layout, algo = prepare(algorithm, run)
    chunk = min(run.logging.log_every, config.num_updates)
    sharded = ShardedRun(algo, layout, run.num_seeds, chunk, run.parallel.seed_group)
    sharded.compile(jax.random.key(run.seed))
    return plan_of(sharded, algorithm_name(algo_cls), run)
