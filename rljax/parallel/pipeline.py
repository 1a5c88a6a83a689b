"""Pipeline (layer-split) parallelism: stacked layers over the ``stage`` mesh axis, GPipe schedule.

    h = pipeline(layer_fn, stacked, x, microbatches=4)   # stacked: leaves [L@layers, ...]

Stage ``s`` of ``S`` holds layers ``[s L/S, (s+1) L/S)`` (the ``layers`` rule maps the stacked
axis to ``stage``); the batch is cut into ``M`` microbatches that enter stage 0 one per tick and
move to the next stage by ``ppermute``, ``M + S - 1`` ticks in all. The backward pass is the
same schedule reversed, by autodiff of the ``shard_map`` (GPipe: all forwards, then all
backwards). Only ``stage`` is manual inside the ``shard_map``; ``data``/``fsdp``/``model`` stay
automatic, so a layer's own ``constrain`` calls keep tensor and data parallelism inside a stage.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel.rules import active_rules, axes_of, mesh_axis, spending

STAGE_AXIS = "stage"
LAYERS = "layers"  # the logical name of the stacked-layer axis


def num_stages() -> int:
    """Pipeline stages the stacked ``layers`` axis is split into here (1 outside a mesh)."""
    return mesh_axis(LAYERS)[1]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle share of each stage's ticks: ``(S - 1) / (M + S - 1)``."""
    return (stages - 1) / (microbatches + stages - 1)


def check_pipeline(depth: int, microbatches: int, stages: int, batches: dict[str, int]) -> None:
    """One ``ConfigError`` for a pipeline that cannot split: ``depth`` layers over ``stages``,
    each of ``batches`` (name -> per-replica rows) into ``microbatches``."""
    if microbatches < 1:
        raise ConfigError(f"pipeline_microbatches must be >= 1, got {microbatches}")
    if depth % stages:
        raise ConfigError(
            f"residual_depth={depth} blocks do not split over the {stages} pipeline stages of "
            f"the mesh (stage={stages}); choose a depth that is a multiple of {stages}"
        )
    for name, rows in batches.items():
        if rows % microbatches:
            raise ConfigError(
                f"pipeline_microbatches={microbatches} does not divide the per-replica {name} of "
                f"{rows} rows; choose a divisor of {rows}"
            )


def sequential(layer_fn: Callable, params, x):
    """Each stacked layer's ``layer_fn`` in turn: ``params`` ``[L, ...]``, ``x: [B, ...]``."""
    return jax.lax.scan(lambda h, p: (layer_fn(p, h), None), x, params)[0]


def pipeline(layer_fn: Callable, params, x: jax.Array, microbatches: int) -> jax.Array:
    """``sequential(layer_fn, params, x)`` as a GPipe pipeline over the stage axis.

    ``params``: leaves ``[L@stage, ...]`` (``L`` a multiple of the stages); ``x: [B@batch, ...]``,
    ``layer_fn(p, h) -> h`` shape-preserving. ``M = gcd(B, microbatches)`` microbatches; rows
    ``i M + m`` form microbatch ``m``, so each keeps the batch's data sharding. Without a stage
    axis (or size 1) this is ``sequential``."""
    axis, stages = mesh_axis(LAYERS)
    if stages == 1:
        return sequential(layer_fn, params, x)
    (axis,) = axes_of(axis)
    depth = jax.tree.leaves(params)[0].shape[0]
    if depth % stages:
        raise ConfigError(f"{depth} stacked layers do not split over {stages} pipeline stages")
    batch, rest = x.shape[0], x.shape[1:]
    m = math.gcd(batch, microbatches)
    xs = jnp.swapaxes(x.reshape(batch // m, m, *rest), 0, 1)  # [M, B/M, ...]
    ticks = m + stages - 1
    last = stages - 1

    def body(local, xs):
        with spending(*mesh.axis_names):
            return schedule(local, xs)

    def schedule(local, xs):
        s = jax.lax.axis_index(axis)

        def tick(carry, t):
            state, outs = carry
            entering = jax.lax.dynamic_index_in_dim(xs, jnp.minimum(t, m - 1), 0, False)
            h = jnp.where(s == 0, entering, state)
            h = sequential(layer_fn, local, h)
            done = t - last  # the microbatch leaving the last stage at tick t
            slot = jnp.clip(done, 0, m - 1)
            keep = jax.lax.dynamic_index_in_dim(outs, slot, 0, False)
            put = jnp.where((s == last) & (done >= 0), h, keep)
            outs = jax.lax.dynamic_update_index_in_dim(outs, put, slot, 0)
            state = jax.lax.ppermute(h, axis, [(i, i + 1) for i in range(last)])
            return (state, outs), None

        zero = xs * 0.0  # as varying over the batch axes as xs
        init = (zero[0], zero)
        (_, outs), _ = jax.lax.scan(tick, init, jnp.arange(ticks))
        # Only the last stage holds the outputs; the sum hands them to every stage.
        return jax.lax.psum(jnp.where(s == last, outs, 0.0), axis)

    # Every mesh axis but the tensor-parallel ones is manual: a vmap with spmd_axis_name (the
    # learner's replicas, the seeds) can only batch a shard_map over its manual axes. The layers'
    # own constraints are dropped in there (`spending` every axis): under such a vmap they would
    # name that manual axis; the tensor-parallel layout follows from the parameters' shardings.
    mesh = jax.sharding.get_abstract_mesh()
    tensor = set(axes_of(dict(active_rules()).get("mlp")))
    manual = {a for a in mesh.axis_names if a not in tensor and a not in mesh.manual_axes}
    rows, pieces = mesh_axis("batch")
    # A batch too small to split (the [1, D] dummy of init) runs whole on every batch shard.
    x_spec = PartitionSpec(None, rows if (batch // m) % pieces == 0 else None)
    specs = jax.tree.map(lambda _: PartitionSpec(axis), params)
    out = jax.shard_map(
        body, in_specs=(specs, x_spec), out_specs=x_spec, axis_names=manual, check_vma=False
    )(params, xs)
    return jnp.swapaxes(out, 0, 1).reshape(batch, *rest)
