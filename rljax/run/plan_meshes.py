"""Meshes that would fit a run over its memory budget (``rljax.run.plan``'s suggestion)."""

from __future__ import annotations

import math

import jax
from jax.sharding import PartitionSpec

from rljax.errors import ConfigError
from rljax.parallel.candidates import Candidate, candidates
from rljax.run import memory


def _on_candidate(leaves, mesh: Candidate) -> dict[str, int]:
    """Per-device bytes of each state part on ``mesh``: every leaf's shard (a per-replica axis
    has one entry per replica of ``mesh``)."""
    out: dict[str, int] = {}
    for _, field, leaf, spec in leaves:
        names = tuple(spec) + (None,) * (len(leaf.shape) - len(tuple(spec)))
        shards = mesh.dim_shards(PartitionSpec(*names))
        shape = [
            mesh.shards("replica") if n == "replica" else d
            for d, n in zip(leaf.shape, names, strict=True)
        ]
        nbytes = math.prod(-(-d // s) for d, s in zip(shape, shards, strict=True))
        name = memory.CATEGORIES.get(field, ("other state", ""))[0]
        out[name] = out.get(name, 0) + nbytes * memory._itemsize(leaf.dtype)
    return out


def suggest(sharded, leaves, programs, budget: int) -> tuple[str, int] | None:
    """A mesh over all available devices that fits ``budget``: the most data-parallel one
    (cheapest in communication), then the least memory; ``None`` when none does.

    State parts are exact; the chunk's temporaries less the gradients are split like the batch,
    the gradients and the init program's temporaries like the parameters."""
    algo, layout = sharded.algo, sharded.layout
    params_label = memory.CATEGORIES["params"][0]
    now = _on_candidate(leaves, _current(layout))
    params_now = max(now.get(params_label, 0), 1)
    chunk, init = programs["chunk"], programs["init"]
    working = max(chunk["temp"] - params_now, 0) * layout.shards("batch")
    # the trip count argument, the metrics buffer (outputs not aliased to the state), code
    extra = chunk["argument"] - sum(now.values()) + chunk["output"] - chunk["alias"]
    extra += chunk["generated_code"]
    fitting = []
    for mesh in candidates(jax.device_count(), layout.rules):
        if mesh.sizes == _current(layout).sizes:
            continue
        try:
            type(algo).validate(algo.config, mesh.shards("batch"), mesh.shards("mlp"))
        except ConfigError:
            continue
        if sharded.num_seeds % mesh.shards("seed"):
            continue
        parts = _on_candidate(leaves, mesh)
        state, params = sum(parts.values()), parts.get(params_label, 0)
        need_chunk = state + working // mesh.shards("batch") + params + extra
        need_init = state + init["temp"] * params // params_now + init["generated_code"]
        need = max(need_chunk, need_init)
        if need <= budget:
            fitting.append((-mesh.shards("batch"), need, mesh.spec))
    if not fitting:
        return None
    _, need, spec = min(fitting)
    return spec, need


def _current(layout) -> Candidate:
    return Candidate(tuple((a, int(s)) for a, s in layout.mesh.shape.items()), layout.rules)
