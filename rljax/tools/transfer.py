"""``--init-from RUN_DIR [--init-part all|torso]``: a new run starts from another run's trained
parameters.

The source may have trained on another mesh, with another sync strategy or seed count, or on
another environment: what must agree is the shape of every parameter copied. ``all`` copies every
parameter; ``torso`` every parameter outside the output heads (``policy_head``, ``value_head``,
the Q head ``q_head``...: any top-level module whose name ends in ``head``), so a source with
another number of actions still transfers its features. The optimizer state starts afresh. The
source's newest valid checkpoint is read, seed 0's (replica 0's) parameters, and every seed of the
new run starts from them.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import numpy as np

from rljax.algos.base import flat_leaves
from rljax.errors import ConfigError

PARTS = ("all", "torso")


@dataclasses.dataclass(frozen=True)
class TransferPlan:
    source: Path
    part: str
    paths: tuple[str, ...]  # the parameters copied


def param_shapes(algo) -> dict[str, tuple[int, ...]]:
    """``{"actor/dense_0/kernel": shape}`` of one replica's parameters (traced, nothing run)."""
    import flax.linen as nn

    boxed = jax.eval_shape(algo.init_params, jax.random.key(0))
    return {path: tuple(x.shape) for path, x in flat_leaves(nn.meta.unbox(boxed)).items()}


def is_head(path: str) -> bool:
    return path.split("/", 1)[0].endswith("head")


def plan_transfer(source_dir: str, part: str, algo) -> TransferPlan:
    """What ``--init-from source_dir --init-part part`` copies into ``algo``'s parameters; one
    ``ConfigError`` before anything compiles: an unknown part, an unreadable source, or the
    parameters whose shapes do not match (all of them listed)."""
    from rljax.algos import ALGORITHMS
    from rljax.tools.runs import read_run

    if part not in PARTS:
        raise ConfigError(f"init_part must be one of {list(PARTS)}, got {part!r}")
    algorithm, source_config, _ = read_run(source_dir, "initialise from")
    if not (Path(source_dir) / "checkpoints").is_dir():
        raise ConfigError(f"cannot initialise from {source_dir!r}: it has no checkpoints")
    source_shapes = param_shapes(ALGORITHMS[algorithm](source_config))
    target_shapes = param_shapes(algo)
    wanted = [p for p in target_shapes if part == "all" or not is_head(p)]
    problems = []
    for path in wanted:
        if path not in source_shapes:
            problems.append(f"{path}: not in the source (this run {target_shapes[path]})")
        elif source_shapes[path] != target_shapes[path]:
            problems.append(f"{path}: source {source_shapes[path]}, this run {target_shapes[path]}")
    if problems:
        hint = "; --init-part torso leaves the heads out" if part == "all" else ""
        raise ConfigError(
            f"cannot initialise from {source_dir!r} ({algorithm} on {source_config.env}): "
            f"{len(problems)} parameter(s) do not match: " + "; ".join(problems) + hint
        )
    return TransferPlan(Path(source_dir), part, tuple(wanted))


def load_params(plan: TransferPlan) -> dict[str, np.ndarray]:
    """The planned parameters of the source's newest valid checkpoint (seed 0), on the host."""
    from rljax.tools.runs import load_run

    loaded = load_run(plan.source, verb="initialise from")
    state = loaded.state
    if loaded.run.num_seeds > 1:
        state = jax.tree.map(lambda x: x[0], state)
    flat = flat_leaves(jax.device_get(loaded.algo.acting_params(state.params)))
    return {path: np.asarray(flat[path]) for path in plan.paths}
