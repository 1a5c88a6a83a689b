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
from rljax.envs import BatchedEnv, EpisodeStats
from rljax.errors import ConfigError
from rljax.parallel.learner import Learner
from rljax.parallel.rules import batch_spec_like


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
        self.env = BatchedEnv(config.env, config.num_envs)
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
        """One replica's ``params``, raw ``obs: [B@batch, D]`` -> actions ``[B@batch]``;
        ``obs_stats``: the state's frozen ``obs_stats`` (see ``observe``)."""
        raise NotImplementedError

    def optimizer_step(self, state):
        """One optimizer step on placeholder data: the program whose collectives
        ``rljax.diagnostics`` counts (values do not matter there)."""
        raise NotImplementedError

    # -- shared -------------------------------------------------------------------------------
    def init_params(self, key: jax.Array):
        """Boxed parameters of ``self.network`` from a ``[1, D]`` dummy observation."""
        return self.network.init(key, jnp.zeros((1, self.env.spec.obs_dim), jnp.float32))

    def with_learner(self, state, params, opt_state, sync):
        """``state`` with the learner's ``params``/``opt_state``/``sync`` (or their specs)."""
        return state.replace(params=params, opt_state=opt_state, sync=sync)

    def init(self, key: jax.Array):
        """``key`` -> a fresh state (plain arrays, in the sync strategy's parameter layout)."""
        state = nn.meta.unbox(self.init_boxed(key))
        return self.with_learner(state, *self.learner.init(state.params, state.opt_state))

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
    ``step(scale=lr)`` can multiply in a traced learning rate (sweeps)."""
    chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm > 0 else []
    if traced_lr:
        chain.append(optax.scale_by_adam(eps=eps))
        chain.append(optax.scale_by_schedule(lambda n: -decay(n)) if decay else optax.scale(-1.0))
    else:
        chain.append(optax.adam((lambda n: lr * decay(n)) if decay else lr, eps=eps))
    return optax.chain(*chain)


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
            f"{what} is not divisible by the data axis size {shards}{why}; "
            f"use a multiple of {shards}"
        )
