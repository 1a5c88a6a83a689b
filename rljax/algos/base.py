"""What every algorithm is to the rest of rljax, and the pieces algorithms share.

An algorithm is a class built from ``(config, replicas, swept)`` whose methods are pure functions
of arrays. The runner, host loop, evaluator, checkpoints and sweeps use only the members declared
on ``Algorithm``; ``docs/architecture.md`` has the recipe for adding one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax

from rljax.algos import hparams as hparams_lib
from rljax.algos import normalize
from rljax.envs import EpisodeStats, make_env
from rljax.errors import ConfigError
from rljax.parallel.learner import Learner
from rljax.parallel.rules import batch_spec_like
from rljax.parallel.sync import tree_norm


def sweepable(default: float):
    """A float config field a sweep may vary inside one jit (held as traced ``state.hparams``)."""
    return dataclasses.field(default=default, metadata={"sweepable": True})


def resumable(default):
    """A config field that may change when a run is resumed."""
    return dataclasses.field(default=default, metadata={"resumable": True})


def fields_with(config_type: type, flag: str) -> tuple[str, ...]:
    """Names of ``config_type``'s fields whose metadata sets ``flag``."""
    return tuple(f.name for f in dataclasses.fields(config_type) if f.metadata.get(flag))


class Algorithm:
    """Base class: subclasses set ``name`` and ``config_type`` and implement ``build_network``,
    ``build_optimizer``, ``init_boxed``, ``update`` and ``eval_action``.

    ``replicas`` data-parallel replicas (the layout's replica count; the runner sets it) each own
    ``num_envs / R`` environments and compute their own gradient, which ``config.sync``
    synchronises through ``self.learner``. ``swept``: sweepable fields held as traced
    ``state.hparams`` (sweeps vmap over them); every other field is a compile-time constant.
    """

    name: ClassVar[str]
    config_type: ClassVar[type]

    def __init__(self, config, replicas: int = 1, swept: tuple[str, ...] = ()):
        self.config = config
        self.replicas = replicas
        self.swept = hparams_lib.check_swept(swept, self.sweepable(), self.name)
        self.env = make_env(config.env, config.num_envs)
        self.network = self.build_network()
        self.optimizer = self.build_optimizer()
        boxed = jax.eval_shape(self.init_params, jax.random.key(0))
        self.learner = Learner(self.optimizer, config.sync, replicas, boxed)

    @classmethod
    def sweepable(cls) -> tuple[str, ...]:
        return fields_with(cls.config_type, "sweepable")

    def rebuild(self, replicas: int | None = None, swept: tuple[str, ...] | None = None):
        """The same algorithm class and config with another replica count or swept fields."""
        return type(self)(
            self.config,
            replicas=self.replicas if replicas is None else replicas,
            swept=self.swept if swept is None else swept,
        )

    # -- what subclasses provide --------------------------------------------------------------
    @classmethod
    def validate(cls, config, batch_shards: int = 1, mlp_shards: int = 1) -> None:
        """Raise ``ConfigError`` naming the first invalid field, before anything compiles.

        ``batch_shards``: pieces the environment batch is split into (data-parallel replicas);
        ``mlp_shards``: pieces tensor-parallel layers are split into."""
        if not isinstance(config, cls.config_type):
            raise ConfigError(
                f"{cls.__name__} needs a {cls.config_type.__name__}, got {type(config).__name__}"
            )
        check_representable(config)

    def build_network(self) -> nn.Module:
        raise NotImplementedError

    def build_optimizer(self) -> optax.GradientTransformation:
        raise NotImplementedError

    def init_boxed(self, key: jax.Array):
        """One replica's state, ``params``/``opt_state`` in logical-axis boxes."""
        raise NotImplementedError

    def update(self, state) -> tuple[Any, dict[str, jax.Array]]:
        raise NotImplementedError

    def eval_action(
        self, params, obs: jax.Array, key: jax.Array, greedy: bool = True, obs_stats=None
    ):
        """One replica's ``params``, raw ``obs: [B@batch, D]`` -> actions ``[B@batch]`` (discrete)
        or ``[B@batch, A]`` (continuous, as the environment receives them); ``obs_stats``: the
        state's frozen ``obs_stats`` (see ``observe``)."""
        raise NotImplementedError

    def eval_memory(self, num_envs: int):
        """What the policy carries between evaluation steps: ``None`` (feed-forward: it acts on
        the observation alone) or, recurrent, the state of ``num_envs`` episodes at their start
        (``[num_envs@batch, ...]``); then ``eval_action`` takes ``memory=`` and returns
        ``(actions, memory)``."""
        return None

    def optimizer_step(self, state):
        """One optimizer step on placeholder data: the program whose collectives
        ``rljax.diagnostics`` counts (values do not matter there)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------
    def init_params(self, key: jax.Array):
        """Boxed parameters of ``self.network`` from a ``[1, D]`` dummy observation.

        Under ``jax.vmap`` (seeds: ``jax.vmap(algo.init)(keys)``) the seeds' parameters are drawn
        one after another, as ``lax.map`` would: batched, an orthogonal initialiser is a batched
        LAPACK QR, whose CPU kernel in jaxlib 0.10 deadlocked on one CPU device (two vmapped
        GRU PPO inits, 2026-12-07). The numbers are the same either way."""
        obs = jnp.zeros((1, self.env.spec.obs_dim), jnp.float32)
        return jax.custom_batching.sequential_vmap(lambda k: self.network.init(k, obs))(key)

    def with_learner(self, state, params, opt_state, sync):
        """``state`` with the learner's ``params``/``opt_state``/``sync`` (or their specs)."""
        return state.replace(params=params, opt_state=opt_state, sync=sync)

    def init(self, key: jax.Array, params: dict[str, jax.Array] | None = None):
        """``key`` -> a fresh state (plain arrays, in the sync strategy's parameter layout).

        ``params``: one replica's parameters to start from instead of the initial ones, by path
        (``{"actor/dense_0/kernel": array}``, ``leaf_path``); the others stay as initialised and
        the optimizer state starts afresh (``--init-from``, ``rljax.tools.transfer``)."""
        state = nn.meta.unbox(self.init_boxed(key))
        if params:
            state = self.start_from(state, with_leaves(state.params, params))
        return self.with_learner(state, *self.learner.init(state.params, state.opt_state))

    def start_from(self, state, params):
        """A fresh one-replica ``state`` with ``params`` in place of its initial ones."""
        return state.replace(params=params, opt_state=self.optimizer.init(params))

    def state_specs(self):
        """Logical ``PartitionSpec`` of every leaf of the state."""
        abstract = jax.eval_shape(self.init_boxed, jax.random.key(0))
        specs = nn.get_partition_spec(abstract)
        specs = specs.replace(env=batch_spec_like(abstract.env))
        return self.with_learner(specs, *self.learner.specs())

    # -- observation normalisation (config.normalize_obs) --------------------------------------
    @property
    def normalizes_obs(self) -> bool:
        return bool(getattr(self.config, "normalize_obs", False))

    def init_obs_stats(self) -> normalize.RunningStats | None:
        """The state's ``obs_stats``: fresh ``RunningStats [D]`` with ``normalize_obs``, else
        ``None`` (no leaves: the state and its checkpoints are what they were without it)."""
        return normalize.init_stats(self.env.spec.obs_dim) if self.normalizes_obs else None

    def observe(self, obs_stats, obs: jax.Array) -> jax.Array:
        """Raw ``obs [..., D]`` -> what the network sees: normalised with ``obs_stats`` (read
        only, never updated here), or ``obs`` itself without ``normalize_obs``."""
        if obs_stats is None:
            if self.normalizes_obs:
                raise ValueError(
                    f"{self.name} with normalize_obs=True acts on normalised observations: pass "
                    "the state's obs_stats"
                )
            return obs
        return normalize.normalize(obs_stats, obs)

    def update_obs_stats(self, obs_stats, obs: jax.Array):
        """``obs_stats`` merged with raw ``obs [..., D]`` (``None`` stays ``None``). Call it
        outside any per-replica ``vmap``: the reduction is over the whole (sharded) batch."""
        return None if obs_stats is None else normalize.update(obs_stats, obs)

    def acting_params(self, params):
        """One replica's parameters, whatever the sync strategy's layout."""
        return self.learner.acting_params(params)

    def resolve(self, hparams: dict[str, jax.Array]) -> Any:
        """Every config field as an attribute, swept ones from ``hparams`` (``state.hparams``,
        traced)."""
        return hparams_lib.resolve(self.config, hparams)

    def initial_hparams(self) -> dict[str, jax.Array]:
        return hparams_lib.initial(self.config, self.swept)


def adam(
    lr: float,
    *,
    eps: float = 1e-8,
    max_grad_norm: float = 0.0,
    decay: Callable[[jax.Array], jax.Array] | None = None,
    traced_lr: bool = False,
) -> optax.GradientTransformation:
    """Adam with optional global-norm clipping (``max_grad_norm > 0``) and a learning-rate
    ``decay(count) -> fraction`` of ``lr``. ``traced_lr``: a unit rate, so that the learner's
    ``step(scale=lr)`` can multiply in a traced learning rate (sweeps).

    Adam's moments are stored in the dtype of the parameters they belong to (optax's own
    default), so bfloat16 parameters (``--param-dtype bfloat16``) get bfloat16 moments: half the
    bytes. Gradients, clipping and Adam's arithmetic are float32 whatever the storage; a value
    stored back into bfloat16 (moments; parameters, unless ``traced_lr``) is rounded
    stochastically, because round-to-nearest loses every change smaller than half a bfloat16
    ulp (2**-9 relative): ``nu``'s decay by ``b2 = 0.999`` and most ``lr``-sized parameter
    steps. For float32 parameters this is exactly ``optax.adam`` (same state tree)."""
    chain = [clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    if traced_lr:
        chain.append(_adam_moments_stored(eps))
        chain.append(optax.scale_by_schedule(lambda n: -decay(n)) if decay else optax.scale(-1.0))
    else:
        schedule = (lambda n: lr * decay(n)) if decay else lr
        chain.append(
            _params_rounded(
                optax.chain(_adam_moments_stored(eps), optax.scale_by_learning_rate(schedule))
            )
        )
    return _float32_gradients(optax.chain(*chain))


def clip_by_global_norm(max_norm: float) -> optax.GradientTransformation:
    """``optax.clip_by_global_norm`` (same arithmetic, same empty state) with the norm computed
    by ``tree_norm``, the learner's ``grad_norm`` metric: XLA then computes it once for both."""

    def update(updates, state, params=None):
        del params
        norm = tree_norm(updates)
        keep = norm < max_norm
        clipped = jax.tree.map(
            lambda t: jax.lax.select(keep, t, (t / norm.astype(t.dtype)) * max_norm), updates
        )
        return clipped, state

    return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


# -- storage narrower than float32 ----------------------------------------------------------------
_ROUNDING_SEED = 0x5EED  # stochastic rounding's bits: from this and Adam's step count


def _narrow(x) -> bool:
    return jnp.dtype(x.dtype) == jnp.bfloat16


def _float32(tree):
    return jax.tree.map(lambda x: x.astype(jnp.float32) if _narrow(x) else x, tree)


def stochastic_round(x: jax.Array, dtype, key: jax.Array) -> jax.Array:
    """float32 ``x`` -> ``dtype`` (float32 or bfloat16); to bfloat16 rounded up or down at
    random with probability proportional to the distance, so the expected value is ``x``."""
    if jnp.dtype(dtype) != jnp.bfloat16:
        return x.astype(dtype)
    bits = jax.lax.bitcast_convert_type(x.astype(jnp.float32), jnp.uint32)
    # bfloat16 is float32's upper 16 bits: add uniform noise below them, then truncate.
    noise = jax.random.bits(key, x.shape, jnp.uint32) & jnp.uint32(0xFFFF)
    truncated = (bits + noise) & jnp.uint32(0xFFFF0000)
    return jax.lax.bitcast_convert_type(truncated, jnp.float32).astype(jnp.bfloat16)


def _round_like(values, like, key):
    """float32 ``values`` stored back in the dtypes of ``like`` (same tree)."""
    leaves, treedef = jax.tree.flatten(values)
    dtypes = [x.dtype for x in jax.tree.leaves(like)]
    keys = [jax.random.fold_in(key, i) for i in range(len(leaves))]
    return treedef.unflatten(
        [stochastic_round(v, d, k) for v, d, k in zip(leaves, dtypes, keys, strict=True)]
    )


def _rounding_key(count, stream: int) -> jax.Array:
    return jax.random.fold_in(jax.random.fold_in(jax.random.key(_ROUNDING_SEED), count), stream)


def _float32_gradients(inner: optax.GradientTransformation) -> optax.GradientTransformation:
    """``inner`` fed float32 gradients (bfloat16 parameters have bfloat16 gradients)."""

    def update(updates, state, params=None):
        return inner.update(_float32(updates), state, params)

    return optax.GradientTransformation(inner.init, update)


def _adam_moments_stored(eps: float) -> optax.GradientTransformation:
    """``optax.scale_by_adam`` computing in float32, its moments stored in the parameters'
    dtypes (``ScaleByAdamState``; ``nu``'s dtype already follows the parameters in optax, ``mu``'s
    does with ``mu_dtype=None``)."""
    inner = optax.scale_by_adam(eps=eps)

    def update(updates, state, params=None):
        if not any(_narrow(x) for x in jax.tree.leaves((state.mu, state.nu))):
            return inner.update(updates, state, params)
        wide = state._replace(mu=_float32(state.mu), nu=_float32(state.nu))
        updates, new = inner.update(_float32(updates), wide, params)
        mu = _round_like(new.mu, state.mu, _rounding_key(new.count, 0))
        nu = _round_like(new.nu, state.nu, _rounding_key(new.count, 1))
        return updates, new._replace(mu=mu, nu=nu)

    return optax.GradientTransformation(inner.init, update)


def _params_rounded(adam_chain: optax.GradientTransformation) -> optax.GradientTransformation:
    """``adam_chain``'s float32 updates of bfloat16 parameters replaced by ``new - params``, where
    ``new`` is ``params + updates`` rounded stochastically to bfloat16: ``apply_updates`` then
    stores exactly ``new``. The state (and its tree) is ``adam_chain``'s; the rounding's bits
    come from its Adam step count, the same on every replica."""

    def update(updates, state, params=None):
        updates, state = adam_chain.update(updates, state, params)
        if params is None or not any(_narrow(p) for p in jax.tree.leaves(params)):
            return updates, state
        p32 = _float32(params)
        new = jax.tree.map(lambda p, u: p + u.astype(jnp.float32), p32, updates)
        new = _round_like(new, params, _rounding_key(state[0].count, 2))
        return jax.tree.map(lambda n, p: n.astype(jnp.float32) - p, new, p32), state

    return optax.GradientTransformation(adam_chain.init, update)


def episode_metrics(stats: EpisodeStats) -> dict[str, jax.Array]:
    """Mean return and length of each environment's last finished episode, and the count."""
    finished = stats.completed > 0
    count = jnp.maximum(finished.sum(), 1)
    return {
        "episode_return": jnp.sum(jnp.where(finished, stats.last_return, 0.0)) / count,
        "episode_length": jnp.sum(jnp.where(finished, stats.last_length, 0)) / count,
        "episodes": stats.completed.sum(),
    }


INT32_MAX = 2**31 - 1


def check_representable(config, prefix: str = "") -> None:
    """Every float field finite, every int field within int32 (step counters are int32 on
    device), nested config dataclasses included."""
    for f in dataclasses.fields(config):
        value, name = getattr(config, f.name), prefix + f.name
        if dataclasses.is_dataclass(value):
            check_representable(value, name + ".")
        elif isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(f"{name} must be a finite number, got {value}")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > INT32_MAX:
            raise ConfigError(
                f"{name}={value} does not fit the int32 counters on the device "
                f"(at most {INT32_MAX:,})"
            )


def check_divisible(what: str, value: int, shards: int, why: str = "") -> None:
    """``value`` (described by ``what``, e.g. ``"num_envs=6"``) must split evenly over the
    ``shards`` data-parallel shards."""
    if value % shards:
        raise ConfigError(
            f"{what} is not divisible by the {shards} data-parallel shards of the batch{why}; "
            f"use a multiple of {shards}"
        )


def leaf_path(path) -> str:
    """A pytree key path as ``"actor/dense_0/kernel"`` (the leading ``params`` collection
    dropped)."""
    parts = [str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path]
    return "/".join(parts[1:] if parts and parts[0] == "params" else parts)


def flat_leaves(tree) -> dict[str, jax.Array]:
    """``{leaf_path: leaf}`` of ``tree`` (the inverse of ``with_leaves``)."""
    return {leaf_path(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def with_leaves(tree, leaves: dict[str, jax.Array]):
    """``tree`` with the leaves named in ``leaves`` (by ``leaf_path``) replaced."""
    return jax.tree_util.tree_map_with_path(
        lambda path, x: (
            jnp.asarray(leaves[leaf_path(path)], x.dtype) if leaf_path(path) in leaves else x
        ),
        tree,
    )
