"""How much device memory a run needs, estimated by tracing only (nothing is allocated).

    estimate = memory.estimate(algo, layout, num_seeds)   # MemoryEstimate, per device
    estimate.describe()      # 'about 1.2 MB per device (update working memory 1.0 MB, ...)'
    memory.check(algo, layout, num_seeds)                  # ConfigError when it cannot fit

The training state (parameters, optimizer and sync state, environment batch, replay buffer,
keys) comes from ``jax.eval_shape`` of the algorithm's init, each leaf divided by the number of
shards of its ``NamedSharding``. The working memory of one update (a PPO/A2C rollout
``[T, B, ...]`` and its minibatch activations, DQN's sampled windows) is the peak of the arrays
alive at once in the update's jaxpr, split like the batch. The device's memory: its
``memory_stats()["bytes_limit"]`` (GPU/TPU); emulated CPU devices share the host's RAM, so there
the sum over this process's devices is compared with ``MemAvailable``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import weakref

import jax
import numpy as np
from jax.extend import core as jex_core

from rljax.errors import ConfigError

# Fraction of the device's (or the host's available) memory a run may plan to use: XLA needs
# room for its own temporaries and fragmentation, and host memory moves with other processes.
USABLE_FRACTION = 0.9

# Top-level state fields -> what the message calls them and which flags shrink them.
CATEGORIES = {
    "params": ("parameters", "network widths"),
    "target_params": ("target parameters", "network widths"),
    "opt_state": ("optimizer state", "network widths"),
    "sync": ("sync state", "network widths"),
    "env": ("environments", "--num-envs"),
    "buffer": ("replay buffer", "--buffer-size or --num-envs"),
}
WORKING = "update working memory"


@dataclasses.dataclass(frozen=True)
class MemoryEstimate:
    """Bytes one device needs: ``parts`` by quantity (state fields and ``WORKING``), the total,
    and what the device offers (``available``; ``None`` when unknown). ``shared_host``: the
    process's ``local_devices`` CPU devices share the host's memory, so ``total * local_devices``
    is what is compared with ``available`` there."""

    parts: dict[str, int]
    available: int | None
    local_devices: int = 1
    shared_host: bool = False
    hints: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @property
    def needed(self) -> int:
        """What is compared with ``available``: the process's devices together on CPU."""
        return self.total * (self.local_devices if self.shared_host else 1)

    @property
    def fits(self) -> bool:
        return self.available is None or self.needed <= USABLE_FRACTION * self.available

    def describe(self) -> str:
        """``about 1.2 MB per device (parameters 40.0 kB, ...)[, 4.8 MB for this process's 4 CPU
        devices]``: the three biggest parts and the rest."""
        parts = sorted(((n, name) for name, n in self.parts.items() if n), reverse=True)
        detail = [f"{name} {human(n)}" for n, name in parts[:3]]
        if len(parts) > 3:
            detail.append(f"rest {human(sum(n for n, _ in parts[3:]))}")
        text = f"about {human(self.total)} per device ({', '.join(detail)})"
        if self.shared_host and self.local_devices > 1:
            text += f", {human(self.needed)} for this process's {self.local_devices} CPU devices"
        return text

    def offered(self) -> str:
        """``the device has 24.0 GB`` / ``the host has 23.8 GB available`` / ``unknown``."""
        if self.available is None:
            return "the device's memory is unknown"
        if self.shared_host:
            return f"the host has {human(self.available)} available"
        return f"the device has {human(self.available)}"


_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40}  # fmt: skip
_SIZE = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9]*)?(?:e[+-]?[0-9]+)?)\s*([kmgt]i?)?b?\s*$", re.I)


def parse_bytes(value, flag: str = "memory_per_device") -> int:
    """``"16GB"`` / ``"512MiB"`` / ``"2e9"`` / ``2_000_000_000`` -> bytes (decimal k/M/G/T, binary
    Ki/Mi/Gi/Ti, the trailing B optional); ``ConfigError`` naming ``flag`` for anything else
    or a size below one byte."""
    match = None if isinstance(value, bool) else _SIZE.match(str(value))
    if match is not None:
        try:
            n = float(match.group(1).replace("_", "")) * _UNITS[(match.group(2) or "").lower()]
        except (ValueError, OverflowError):
            n = math.nan
        if math.isfinite(n) and n >= 1:
            return int(n)
    raise ConfigError(
        f"{flag}={value!r}: expected a size of at least one byte such as 16GB, 512MiB, 1.5GiB "
        "or 2e9 (bytes)"
    )


def human(n: float) -> str:
    """``1234567`` -> ``'1.2 MB'`` (decimal units)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


# -- the state ------------------------------------------------------------------------------------
def _itemsize(dtype) -> int:
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return 8  # threefry: two uint32 words per key (rbg keys are bigger but tiny in count)
    return np.dtype(dtype).itemsize


def shard_bytes(shape, dtype, sharding) -> int:
    """Bytes of one device's shard of a ``shape``/``dtype`` array under ``sharding``."""
    try:
        local = sharding.shard_shape(tuple(shape))
    except Exception:  # uneven split: the biggest shard
        mesh, spec = sharding.mesh, tuple(sharding.spec) + (None,) * len(shape)
        local = []
        for dim, axes in zip(shape, spec, strict=False):
            axes = () if axes is None else (axes,) if isinstance(axes, str) else axes
            local.append(-(-dim // math.prod(mesh.shape[a] for a in axes)))
    return math.prod(local) * _itemsize(dtype)


def _field(path) -> str:
    key = path[0] if path else None
    return str(getattr(key, "name", getattr(key, "key", key)))


def state_bytes(algo, layout, num_seeds: int = 1) -> dict[str, int]:
    """Per-device bytes of each top-level field of ``algo``'s state on ``layout``."""
    from rljax.run.sharded import state_shardings  # noqa: PLC0415 (sharded imports this module)

    abstract = jax.eval_shape(algo.init, jax.random.key(0))
    shardings = state_shardings(algo, layout, num_seeds)
    seeds = (num_seeds,) if num_seeds > 1 else ()
    leaves = jax.tree_util.tree_flatten_with_path(abstract)[0]
    return bytes_by_part(
        (path, seeds + tuple(leaf.shape), leaf.dtype, sharding)
        for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings), strict=True)
    )


def bytes_by_part(leaves) -> dict[str, int]:
    """``(path, shape, dtype, sharding)`` leaves -> one device's bytes of each part, by the
    ``CATEGORIES`` label of the path's top-level field ("other state" for the rest)."""
    out: dict[str, int] = {}
    for path, shape, dtype, sharding in leaves:
        name = CATEGORIES.get(_field(path), ("other state", ""))[0]
        out[name] = out.get(name, 0) + shard_bytes(shape, dtype, sharding)
    return out


# -- one update's working memory ------------------------------------------------------------------
def _bytes(var) -> int:
    aval = getattr(var, "aval", None)
    shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        return 0
    return math.prod(shape) * _itemsize(dtype)


def _sub_jaxprs(params):
    for value in params.values():
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, jex_core.ClosedJaxpr):
                yield item.jaxpr
            elif isinstance(item, jex_core.Jaxpr):
                yield item


def peak_bytes(jaxpr) -> int:
    """Peak bytes of the values alive at once inside ``jaxpr``, its inputs not counted.

    Values live from their equation to their last use (outputs to the end); a nested jaxpr (scan,
    while, cond, pjit bodies) adds its own peak at its equation. An output the size of an input
    that dies at the same equation reuses its buffer (in-place updates, elementwise ops), as XLA
    does."""
    last_use: dict = {}
    for i, eqn in enumerate(jaxpr.eqns):
        for v in eqn.invars:
            if not isinstance(v, jex_core.Literal):
                last_use[v] = i
    end = len(jaxpr.eqns)
    for v in jaxpr.outvars:
        if not isinstance(v, jex_core.Literal):
            last_use[v] = end
    inputs = set(jaxpr.invars) | set(jaxpr.constvars)
    live, peak = 0, 0
    for i, eqn in enumerate(jaxpr.eqns):
        operands = {v for v in eqn.invars if not isinstance(v, jex_core.Literal)}
        dying = [v for v in operands if last_use.get(v) == i]
        # (bytes, counted in live): an input's buffer may be reused too (the state is donated)
        free = sorted(((_bytes(v), v not in inputs) for v in dying), reverse=True)
        new = 0
        for out in eqn.outvars:
            size = _bytes(out) if out in last_use else 0
            match = next((f for f in free if f[0] == size), None) if size else None
            if match is not None:
                free.remove(match)  # takes over a dying operand's buffer: nothing new
                continue
            new += size
        inner = max((peak_bytes(j) for j in _sub_jaxprs(eqn.params)), default=0)
        peak = max(peak, live + new + inner)
        live = max(live + new - sum(n for n, counted in free if counted), 0)
    return peak


def working_bytes(algo, layout, abstract_state) -> int:
    """Peak working memory of one ``algo.update`` on one seed, split over the batch shards."""
    with layout.active():
        closed = jax.make_jaxpr(algo.update)(abstract_state)
    return peak_bytes(closed.jaxpr) // max(layout.shards("batch"), 1)


# -- the device -----------------------------------------------------------------------------------
def host_available_bytes() -> int | None:
    """``MemAvailable`` of /proc/meminfo (``None`` where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def device_bytes(devices) -> tuple[int | None, bool]:
    """``(bytes one device offers, shared_host)``: the smallest ``bytes_limit`` of ``devices``
    (GPU/TPU), or the host's available memory for CPU devices (``shared_host``)."""
    devices = list(devices)
    if all(d.platform == "cpu" for d in devices):
        return host_available_bytes(), True
    limits = []
    for d in devices:
        try:
            stats = d.memory_stats() or {}
        except Exception:  # a backend without memory statistics
            stats = {}
        if "bytes_limit" in stats:
            limits.append(int(stats["bytes_limit"]))
    return (min(limits) if limits else None), False


# -- everything -----------------------------------------------------------------------------------
_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def estimate(algo, layout, num_seeds: int = 1) -> MemoryEstimate:
    """The per-device memory of ``algo`` (an algorithm instance) on ``layout`` (a ``Layout``)
    with ``num_seeds`` seeds, and what the devices offer. Traces init and one update (cached per
    algorithm, layout and seed count); allocates nothing."""
    cached = _CACHE.setdefault(algo, {})
    key = (layout, num_seeds)
    if key in cached:
        return cached[key]
    parts = state_bytes(algo, layout, num_seeds)
    abstract = jax.eval_shape(algo.init, jax.random.key(0))
    seed_shards = layout.shards("seed") if num_seeds > 1 else 1
    per_device_seeds = -(-num_seeds // seed_shards)
    parts[WORKING] = working_bytes(algo, layout, abstract) * per_device_seeds
    local = [d for d in layout.mesh.devices.flat if d.process_index == jax.process_index()]
    available, shared = device_bytes(local or layout.mesh.devices.flat)
    result = MemoryEstimate(
        parts, available, len(local) or 1, shared, hints=_hints(algo.config, parts, num_seeds)
    )
    cached[key] = result
    return result


def _hints(config, parts: dict[str, int], num_seeds: int) -> tuple[str, ...]:
    """What to lower: the flags of the (at most two) parts that make up a tenth of the total or
    more, biggest first."""
    hints: list[str] = []
    by_size = sorted(parts.items(), key=lambda kv: -kv[1])
    flags = {label: flag for label, flag in CATEGORIES.values()}
    fields = {f.name for f in dataclasses.fields(config)}
    working = [f"--{n.replace('_', '-')}" for n in ("num_envs", "num_steps", "batch_size")]
    working = [w for w in working if w[2:].replace("-", "_") in fields]
    total = sum(parts.values())
    for name, _ in [(n, b) for n, b in by_size[:2] if b >= total / 10]:
        hint = " or ".join(working) if name == WORKING else flags.get(name, "")
        for flag in hint.split(" or "):
            if flag and flag not in hints:
                hints.append(flag)
    if num_seeds > 1:
        hints.append("--num-seeds")
    return tuple(hints)


def check(algo, layout, num_seeds: int = 1) -> MemoryEstimate:
    """``estimate``, raising ``ConfigError`` with the figures when the run cannot fit (more than
    ``USABLE_FRACTION`` of what the device, or on CPU the host, has)."""
    est = estimate(algo, layout, num_seeds)
    if est.fits:
        return est
    lower = " or ".join(est.hints) if est.hints else "the sizes"
    spread = "" if est.shared_host else ", or spread the batch over more devices (--mesh)"
    raise ConfigError(
        f"this run needs {est.describe()}, but {est.offered()}; lower {lower}{spread}"
    )
