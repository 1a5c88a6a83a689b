"""``rljax export RUN_DIR OUT_DIR``: a trained policy on its own, outside its run.

OUT_DIR receives
  policy.json          what the policy is: algorithm, its config, environment, observation and
                       action shapes, the checkpoint it came from
  params.msgpack       one replica's acting parameters and, with ``normalize_obs``, the frozen
                       observation statistics (flax msgpack)
  greedy.jaxexport     ``jax.export`` artifact: ``obs [b, D] float32 -> action [b] / [b, A]``
  sample.jaxexport     ``(obs [b, D] float32, key_data uint32[2]) -> action``, a sample
                       (``key_data = jax.random.key_data(jax.random.key(seed))``)

A recurrent policy (``recurrent="gru"``) carries a memory ``[b, H] float32`` from step to step:
zeros at an episode's start (``policy.json``: ``memory_shape``), and each artifact takes it after
the observation and returns ``(action, memory')``.

``rljax.load_policy(OUT_DIR)`` gives a ``Policy`` with a jitted ``act(obs, key=None)`` (recurrent:
``act(obs, key=None, memory=...)`` from ``initial_memory(b)``). The two artifacts run with JAX
alone (``jax.export.deserialize(bytes).call(obs)``), without rljax: the parameters are constants
inside them, and the batch size ``b`` is symbolic.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated, Any

import tyro

from rljax.errors import ConfigError

POLICY_FILE = "policy.json"
PARAMS_FILE = "params.msgpack"
GREEDY_FILE = "greedy.jaxexport"
SAMPLE_FILE = "sample.jaxexport"
STATS_FIELDS = ("mean", "var", "count")


@dataclasses.dataclass(frozen=True)
class ExportArgs:
    """Export a run's policy: parameters + config (rljax.load_policy) and jax.export artifacts
    that run without rljax."""

    run_dir: Annotated[str, tyro.conf.Positional]
    """the run directory (runs/<name>)."""
    out_dir: Annotated[str, tyro.conf.Positional]
    """where to write the policy (created; must not exist unless --overwrite)."""
    step: int | None = None
    """the checkpoint's update (default: the newest valid checkpoint)."""
    seed_index: int = 0
    """with several seeds in the run: which seed's policy."""
    overwrite: bool = False
    """replace the files of an existing out_dir."""


@dataclasses.dataclass
class Policy:
    """A policy loaded by ``load_policy``: ``act(obs [B, D], key=None)`` -> actions as the
    environment takes them (``[B]`` int32, or ``[B, A]`` within the bounds); greedy without a
    key, sampled with one. A recurrent policy also takes ``memory [B, H]`` (``initial_memory(B)``
    at the episodes' start, reset there after every episode end) and returns
    ``(actions, memory')``."""

    algorithm: str
    config: Any
    params: Any
    obs_stats: Any
    meta: dict

    def __post_init__(self):
        import jax

        self.algo = _algo_class(self.algorithm)(self.config)
        self.recurrent = self.algo.eval_memory(1) is not None
        stats = {} if self.obs_stats is None else {"obs_stats": self.obs_stats}

        def action(params, obs, key, greedy, memory):
            carried = {"memory": memory} if self.recurrent else {}
            return self.algo.eval_action(params, obs, key, greedy, **stats, **carried)

        self._greedy = jax.jit(lambda p, o, m: action(p, o, jax.random.key(0), True, m))
        self._sample = jax.jit(lambda p, o, m, k: action(p, o, k, False, m))

    def initial_memory(self, num_envs: int):
        """``[num_envs, H]`` zeros for a recurrent policy's episodes at their start; ``None``
        for a feed-forward one."""
        return self.algo.eval_memory(num_envs) if self.recurrent else None

    @property
    def memory_shape(self) -> tuple[int, ...] | None:
        """One episode's memory shape (``(H,)``), ``None`` for a feed-forward policy."""
        return tuple(self.initial_memory(1).shape[1:]) if self.recurrent else None

    def act(self, obs, key=None, memory=None):
        if self.recurrent and memory is None:
            raise ValueError(
                "a recurrent policy acts from its memory: pass memory=initial_memory(num_envs) "
                "at the episodes' start and the memory each call returns after that"
            )
        if key is None:
            return self._greedy(self.params, obs, memory)
        return self._sample(self.params, obs, memory, key)


def _algo_class(algorithm: str):
    from rljax.algos import ALGORITHMS

    return ALGORITHMS[algorithm]


def check_args(args: ExportArgs) -> None:
    out = Path(args.out_dir)
    if out.exists() and not args.overwrite and any(out.iterdir()):
        raise ConfigError(f"{args.out_dir!r} exists and is not empty; pass --overwrite")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"{args.out_dir!r} exists and is not a directory")
    if args.seed_index < 0:
        raise ConfigError(f"--seed-index must be >= 0, got {args.seed_index}")


def export_run(args: ExportArgs, say=print) -> Path:
    """Write the policy of ``args.run_dir`` to ``args.out_dir`` (see the module doc)."""
    import jax
    from flax import serialization

    from rljax.run.evaluation import obs_stats_of
    from rljax.run.run_log import write_text_atomic
    from rljax.tools.runs import load_run

    check_args(args)
    loaded = load_run(args.run_dir, args.step, verb="export")
    if args.seed_index >= loaded.run.num_seeds:
        raise ConfigError(
            f"--seed-index {args.seed_index}: the run has {loaded.run.num_seeds} seed(s)"
        )
    state = loaded.state
    if loaded.run.num_seeds > 1:
        state = jax.tree.map(lambda x: x[args.seed_index], state)
    params = jax.device_get(loaded.algo.acting_params(state.params))
    stats = obs_stats_of(state)
    stats = None if stats is None else jax.device_get(stats)
    spec = loaded.algo.env.spec
    meta = {
        "algorithm": loaded.algorithm,
        "env": loaded.algo_config.env,
        "obs_dim": spec.obs_dim,
        "action_shape": list(loaded.algo.placeholder_actions(1).shape[1:])
        if hasattr(loaded.algo, "placeholder_actions")
        else [],
        "continuous": bool(getattr(spec, "continuous", False)),
        "step": loaded.step,
        "seed_index": args.seed_index,
        "run_dir": str(loaded.run_dir),
        "config": dataclasses.asdict(loaded.algo_config),
        "normalize_obs": stats is not None,
    }
    policy = Policy(loaded.algorithm, loaded.algo_config, params, stats, meta)
    meta["memory_shape"] = None if policy.memory_shape is None else list(policy.memory_shape)
    greedy, sample = _exported(policy, spec.obs_dim)

    blob = {
        "params": params,
        "obs_stats": None if stats is None else {k: getattr(stats, k) for k in STATS_FIELDS},
    }
    files = {  # everything serialised before anything is written
        PARAMS_FILE: serialization.msgpack_serialize(_plain(blob)),
        GREEDY_FILE: bytes(greedy.serialize()),
        SAMPLE_FILE: bytes(sample.serialize()),
        POLICY_FILE: (json.dumps(meta, indent=2) + "\n").encode(),
    }
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_text_atomic(out / name, data)
    say(
        f"exported {meta['algorithm']} {meta['env']} (update {meta['step']}) to {out}: "
        f"{POLICY_FILE}, {PARAMS_FILE}, {GREEDY_FILE}, {SAMPLE_FILE}"
    )
    return out


def _exported(policy: Policy, obs_dim: int):
    import jax
    import jax.numpy as jnp
    from jax import export

    (batch,) = export.symbolic_shape("b")
    obs = jax.ShapeDtypeStruct((batch, obs_dim), jnp.float32)
    key_data = jax.ShapeDtypeStruct((2,), jnp.uint32)

    def key_of(k):
        return jax.random.wrap_key_data(k, impl="threefry2x32")

    if not policy.recurrent:
        greedy = export.export(jax.jit(lambda o: policy.act(o)))(obs)
        sample = export.export(jax.jit(lambda o, k: policy.act(o, key_of(k))))(obs, key_data)
        return greedy, sample
    memory = jax.ShapeDtypeStruct((batch, *policy.memory_shape), jnp.float32)
    greedy = export.export(jax.jit(lambda o, m: policy.act(o, memory=m)))(obs, memory)
    sample = export.export(jax.jit(lambda o, m, k: policy.act(o, key_of(k), memory=m)))(
        obs, memory, key_data
    )
    return greedy, sample


def _plain(tree):
    """Arrays as numpy, containers as dicts: what msgpack stores and restores without a
    template."""
    import numpy as np

    if isinstance(tree, dict):
        return {k: _plain(v) for k, v in tree.items()}
    if tree is None:
        return {}
    return np.asarray(tree)


def load_policy(path: str | Path) -> Policy:
    """The policy ``rljax export`` wrote to ``path``; ``ConfigError`` if it is not one."""
    import jax.numpy as jnp
    from flax import serialization

    from rljax.algos.normalize import RunningStats
    from rljax.run.resume import config_from_dict
    from rljax.run.sharded import config_type_of

    path = Path(path)
    try:
        meta = json.loads((path / POLICY_FILE).read_text())
        blob = serialization.msgpack_restore((path / PARAMS_FILE).read_bytes())
    except (OSError, ValueError) as error:
        raise ConfigError(f"cannot load a policy from {str(path)!r}: {error}") from None
    config = config_from_dict(config_type_of(meta["algorithm"]), meta["config"])
    stats = blob.get("obs_stats") or None
    if stats:
        stats = RunningStats(*(jnp.asarray(stats[k]) for k in STATS_FIELDS))
    return Policy(meta["algorithm"], config, blob["params"], stats, meta)
