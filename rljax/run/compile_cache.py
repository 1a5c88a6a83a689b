"""JAX's persistent compilation cache for a run (``--compile-cache``).

    use("auto")        # JAX_COMPILATION_CACHE_DIR / jax's own setting, else ~/.cache/rljax/xla
    use("/scratch/xla"), use("off")

A program compiled once on a machine is loaded from disk the next time the same program (same
config, mesh, jax and XLA version) compiles there: a repeated run, a resume, a sweep's next
launch. A cache can only make compiling faster; it never changes what a program computes.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import jax
from jax.experimental.compilation_cache import compilation_cache

from rljax.errors import ConfigError
from rljax.run.run_dir import check_writable_dir

# Programs that compile faster than this are not written (jax's default is 1 s, which leaves out
# a PPO init program of ~1 s on CPU that a resume would compile again).
MIN_SECONDS = 0.5


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/rljax/xla``, or ``~/.cache/rljax/xla``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "rljax" / "xla"


def check(setting: str) -> None:
    """``ConfigError`` unless ``setting`` is "auto", "off" or a directory this process can write
    (before anything compiles)."""
    if setting in ("auto", "off"):
        return
    if not setting:
        raise ConfigError("compile_cache must be 'auto', 'off' or a directory, got ''")
    check_writable_dir(setting, "compile_cache")


def use(setting: str) -> str | None:
    """Point JAX's persistent compilation cache at ``setting`` for the programs compiled from now
    on -> the directory in use, or None (off).

    "auto": a directory jax already has (``JAX_COMPILATION_CACHE_DIR``, or
    ``jax.config.update("jax_compilation_cache_dir", ...)``) is kept as it is; otherwise
    ``default_dir()``, or no cache when that cannot be created (a cache is never a reason for a run
    to fail). "off": no cache for this process. A directory: that one (``check`` has vetted it)."""
    current = jax.config.jax_compilation_cache_dir
    if setting == "off":
        if jax.config.jax_enable_compilation_cache:
            jax.config.update("jax_enable_compilation_cache", False)
            compilation_cache.reset_cache()
        return None
    if setting == "auto":
        if current and jax.config.jax_enable_compilation_cache:
            return current
        path = default_dir()
        try:
            check_writable_dir(path, "compile_cache")
            path.mkdir(parents=True, exist_ok=True)
        except (ConfigError, OSError):
            return None
    else:
        path = Path(setting).expanduser()
        path.mkdir(parents=True, exist_ok=True)
    path = str(path.resolve())
    if path != current or not jax.config.jax_enable_compilation_cache:
        jax.config.update("jax_enable_compilation_cache", True)
        jax.config.update("jax_compilation_cache_dir", path)
        if jax.config.jax_persistent_cache_min_compile_time_secs > MIN_SECONDS:
            jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_SECONDS)
        # jax decides once per process whether a cache is used (at its first compile): decide
        # again, so the directory counts even after earlier compiles in this process.
        compilation_cache.reset_cache()
    return path


# -- compiler options -----------------------------------------------------------------------------
# XLA compiles CPU programs with LLVM at -O3 by default. At -O2 PPO's CartPole chunk compiles in
# 2.2 s instead of 2.7 s and its init in 0.7 s instead of 1.0 s, and runs at the same speed
# (measured on 2 CPU cores, jax 0.10.2): the heavy kernels are library matmuls, which the level
# does not touch. On one device the results equal -O3's; on a sharded mesh the rounding of some
# fused kernels can differ, which moves a seed's learning curve but not the statistics over
# seeds (24 CartPole seeds on data=2,model=2: mean final return 432 at -O3 with
# jax.random.permutation's shuffle, 432 at -O2 with rljax's; tests/algos/test_ppo.py).
CPU_OPTIONS = {"xla_backend_optimization_level": 2}
# Init runs once, so its programs also take XLA CPU's memory-optimized scheduler. The default
# (concurrency-optimized) gives independent operations their own buffers, so an init whose
# orthogonal QRs need every matrix whole held them all at once: a residual network's init needed
# more per device at fsdp=8 than on one device. The same numbers either way (only the order
# changes); docs/performance.md has the figures. Updates keep the default: it was up to 12 %
# faster on PPO's CartPole chunk.
INIT_OPTIONS = {"xla_cpu_scheduler_type": "CPU_SCHEDULER_TYPE_MEMORY_OPTIMIZED"}


def compiler_options(mesh, program: str = "update") -> dict | None:
    """XLA options for rljax's compiled programs on ``mesh``: on CPU devices ``CPU_OPTIONS``, and
    for ``program="init"`` ``INIT_OPTIONS`` too, each unless ``XLA_FLAGS`` sets it itself (or this
    XLA lacks it); None (XLA's defaults) elsewhere."""
    if mesh.devices.flat[0].platform != "cpu":
        return None
    wanted = dict(CPU_OPTIONS)
    if program == "init" and all(_knows(k, v) for k, v in INIT_OPTIONS.items()):
        wanted.update(INIT_OPTIONS)
    flags = os.environ.get("XLA_FLAGS", "")
    return {k: v for k, v in wanted.items() if k not in flags} or None


@functools.cache
def _knows(option: str, value) -> bool:
    """This XLA accepts ``option=value`` for a CPU program (an unknown option fails a compile)."""
    try:
        one = jax.device_put(0, jax.local_devices(backend="cpu")[0])
        jax.jit(lambda x: x + 1).lower(one).compile(compiler_options={option: value})
    except jax.errors.JaxRuntimeError:
        return False
    return True


def jit_for(mesh, program: str = "update"):
    """``jax.jit`` with ``compiler_options(mesh, program)``: how rljax's runners compile their
    programs (``program="init"`` for the ones that build a state)."""
    return functools.partial(jax.jit, compiler_options=compiler_options(mesh, program))
