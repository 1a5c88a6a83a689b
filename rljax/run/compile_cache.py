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


def compiler_options(mesh) -> dict | None:
    """XLA options for rljax's compiled programs on ``mesh``: ``CPU_OPTIONS`` on CPU devices,
    None (XLA's defaults) elsewhere or when ``XLA_FLAGS`` sets the level itself."""
    if "xla_backend_optimization_level" in os.environ.get("XLA_FLAGS", ""):
        return None
    return dict(CPU_OPTIONS) if mesh.devices.flat[0].platform == "cpu" else None


def jit_for(mesh):
    """``jax.jit`` with ``compiler_options(mesh)``: how rljax's runners compile their programs."""
    return functools.partial(jax.jit, compiler_options=compiler_options(mesh))
