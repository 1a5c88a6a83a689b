"""Multi-process JAX: one controller process per host (or per group of devices) in one job.

    from rljax.distributed import DistributedConfig, initialize
    initialize(DistributedConfig())   # first thing, before any JAX computation

Every field left ``None`` is read from the environment (what ``python -m rljax.launch`` sets),
then JAX's own variables; with none set anywhere the run stays single-process. ``auto=True``
lets JAX detect the cluster (Cloud TPU pods, SLURM, Open MPI, Kubernetes).

After initialisation ``jax.devices()`` lists every process's devices (process 0's first), so
``rljax.parallel.make_mesh("data=2,model=2")`` over 2 processes x 2 devices puts ``data``
across processes and ``model`` within each; every process runs the same program on global
arrays (``jax.make_array_from_process_local_data`` for host data).

Failure behaviour, measured with jax 0.10.2 on CPU (gloo collectives):

- a peer that dies while the others are in a collective: the survivors' collective raises at
  once (gloo: "Connection closed by peer"); with ``fail_fast`` the survivor then exits 1 at once;
- a survivor outside a collective: the coordination service (in process 0) marks the dead peer
  after ``heartbeat_timeout_s`` and aborts every other process (SIGABRT);
- process 0 (the coordinator) dies: the others abort within a fraction of a second.

JAX's exit hook runs a shutdown barrier that waits up to ``shutdown_timeout_s`` for every peer.
A process that fails while its peers wait for it in a collective would deadlock there (the
peers wait for its data, it waits for them at the barrier) until that timeout, and then die
by SIGABRT instead of exiting with its own code. ``fail_fast`` (uncaught exceptions) and
:func:`exit_process` (explicit exit codes) skip the barrier on failure. On success,
:func:`exit_process` passes the barrier and then ends the process without interpreter teardown,
where jaxlib 0.10's CPU client can hang joining a worker thread stuck in a gloo connect.
"""

from __future__ import annotations

import atexit
import dataclasses
import inspect
import logging
import os
import sys
from collections.abc import Mapping
from typing import NoReturn

from rljax.errors import ConfigError

# Environment variables set by ``rljax.launch`` for each child process.
ENV_COORDINATOR = "RLJAX_COORDINATOR"
ENV_NUM_PROCESSES = "RLJAX_NUM_PROCESSES"
ENV_PROCESS_ID = "RLJAX_PROCESS_ID"
ENV_LOCAL_DEVICE_IDS = "RLJAX_LOCAL_DEVICE_IDS"
ENV_INIT_TIMEOUT = "RLJAX_INIT_TIMEOUT_S"
ENV_HEARTBEAT_TIMEOUT = "RLJAX_HEARTBEAT_TIMEOUT_S"
ENV_SHUTDOWN_TIMEOUT = "RLJAX_SHUTDOWN_TIMEOUT_S"

# Fallbacks: JAX itself reads JAX_COORDINATOR_ADDRESS and JAX_LOCAL_DEVICE_IDS; the other two
# follow the same naming (JAX does not read them).
_JAX_ENV = {
    ENV_COORDINATOR: "JAX_COORDINATOR_ADDRESS",
    ENV_NUM_PROCESSES: "JAX_NUM_PROCESSES",
    ENV_PROCESS_ID: "JAX_PROCESS_ID",
    ENV_LOCAL_DEVICE_IDS: "JAX_LOCAL_DEVICE_IDS",
}

DEFAULT_INIT_TIMEOUT_S = 300
# JAX's defaults are 100 s and 300 s. A dead peer is noticed after the heartbeat timeout (when
# no collective notices it first), so 30 s bounds a failed job's hang to well under a minute;
# heartbeats come from a C++ thread, so long compilations or Python work do not delay them.
DEFAULT_HEARTBEAT_TIMEOUT_S = 30
# The exit barrier: how long a finished process waits for slower peers before aborting.
DEFAULT_SHUTDOWN_TIMEOUT_S = 60


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How this process joins a multi-process job; ``None`` fields come from the environment."""

    coordinator: str | None = None
    """'host:port' of process 0's coordination service (env RLJAX_COORDINATOR)."""
    num_processes: int | None = None
    """processes in the job (env RLJAX_NUM_PROCESSES); 1 means single-process."""
    process_id: int | None = None
    """this process's index in [0, num_processes) (env RLJAX_PROCESS_ID)."""
    local_device_ids: tuple[int, ...] | None = None
    """GPU ids this process may use (env RLJAX_LOCAL_DEVICE_IDS='0,1'); ignored on CPU."""
    num_cpu_devices: int | None = None
    """emulate this many CPU devices in this process (else JAX_NUM_CPU_DEVICES, read by JAX)."""
    init_timeout_s: int | None = None
    """seconds to wait for every process to connect (default 300)."""
    heartbeat_timeout_s: int | None = None
    """seconds without heartbeats after which a process counts as dead (default 30)."""
    shutdown_timeout_s: int | None = None
    """seconds a finished process waits at exit for the others (default 60)."""
    auto: bool = False
    """let JAX detect the cluster (TPU pod, SLURM, Open MPI, k8s) for the fields left unset."""
    fail_fast: bool = True
    """an uncaught exception exits at once (code 1) instead of waiting at JAX's exit barrier."""


@dataclasses.dataclass(frozen=True)
class _Resolved:
    coordinator: str | None
    num_processes: int | None
    process_id: int | None
    local_device_ids: tuple[int, ...] | None
    init_timeout_s: int
    heartbeat_timeout_s: int
    shutdown_timeout_s: int


def _env_value(name: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """The value of ``name`` (or its JAX fallback) and the variable it came from."""
    for var in (name, _JAX_ENV.get(name)):
        if var and env.get(var, "").strip():
            return env[var].strip(), var
    return None, name


def _int_field(value: int | None, field: str, env_name: str, env: Mapping[str, str]) -> int | None:
    if value is not None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"DistributedConfig.{field} must be an int, got {value!r}")
        return value
    text, var = _env_value(env_name, env)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{var}={text!r} is not an integer ({field})") from None


def _timeout(value: int | None, field: str, env_name: str, default: int, env) -> int:
    value = _int_field(value, field, env_name, env)
    if value is None:
        return default
    if value < 1:
        raise ConfigError(f"{field} must be >= 1 second, got {value}")
    return value


def _check_coordinator(coordinator: str, source: str) -> None:
    host, sep, port = coordinator.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(
            f"{source}={coordinator!r} is not 'host:port' with a port in [1, 65535], "
            "e.g. '127.0.0.1:12345'"
        )


def resolve(cfg: DistributedConfig, env: Mapping[str, str] | None = None) -> _Resolved:
    """Fields, else ``env`` (default ``os.environ``), checked; raises ``ConfigError``."""
    env = os.environ if env is None else env
    coordinator, coordinator_source = cfg.coordinator, "coordinator"
    if coordinator is None:
        coordinator, coordinator_source = _env_value(ENV_COORDINATOR, env)
    if coordinator is not None:
        _check_coordinator(coordinator, coordinator_source)
    num_processes = _int_field(cfg.num_processes, "num_processes", ENV_NUM_PROCESSES, env)
    process_id = _int_field(cfg.process_id, "process_id", ENV_PROCESS_ID, env)
    if num_processes is not None and num_processes < 1:
        raise ConfigError(f"num_processes must be >= 1, got {num_processes}")
    if process_id is not None:
        if process_id < 0:
            raise ConfigError(f"process_id must be >= 0, got {process_id}")
        if num_processes is not None and process_id >= num_processes:
            raise ConfigError(
                f"process_id {process_id} is out of range for num_processes {num_processes} "
                f"(allowed: 0..{num_processes - 1})"
            )
    local_ids = cfg.local_device_ids
    if local_ids is None:
        text, var = _env_value(ENV_LOCAL_DEVICE_IDS, env)
        if text is not None:
            try:
                local_ids = tuple(int(t) for t in text.split(","))
            except ValueError:
                raise ConfigError(
                    f"{var}={text!r}: expected comma-separated device ids, e.g. '0,1'"
                ) from None
    elif any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in local_ids):
        raise ConfigError(f"local_device_ids must be non-negative ints, got {local_ids!r}")
    return _Resolved(
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        local_device_ids=tuple(local_ids) if local_ids is not None else None,
        init_timeout_s=_timeout(
            cfg.init_timeout_s, "init_timeout_s", ENV_INIT_TIMEOUT, DEFAULT_INIT_TIMEOUT_S, env
        ),
        heartbeat_timeout_s=_timeout(
            cfg.heartbeat_timeout_s,
            "heartbeat_timeout_s",
            ENV_HEARTBEAT_TIMEOUT,
            DEFAULT_HEARTBEAT_TIMEOUT_S,
            env,
        ),
        shutdown_timeout_s=_timeout(
            cfg.shutdown_timeout_s,
            "shutdown_timeout_s",
            ENV_SHUTDOWN_TIMEOUT,
            DEFAULT_SHUTDOWN_TIMEOUT_S,
            env,
        ),
    )


def _explicit_kwargs(r: _Resolved) -> dict:
    """Missing pieces of an explicit (non-auto) multi-process config are errors."""
    missing = [
        f"{field} (DistributedConfig.{field} or {env_name})"
        for field, env_name, value in (
            ("coordinator", ENV_COORDINATOR, r.coordinator),
            ("num_processes", ENV_NUM_PROCESSES, r.num_processes),
            ("process_id", ENV_PROCESS_ID, r.process_id),
        )
        if value is None
    ]
    if missing:
        raise ConfigError(
            "multi-process setup is incomplete: missing " + ", ".join(missing) + "; set all "
            "three (rljax.launch does), none (single process), or use auto=True on a cluster"
        )
    return dict(
        coordinator_address=r.coordinator,
        num_processes=r.num_processes,
        process_id=r.process_id,
        local_device_ids=list(r.local_device_ids) if r.local_device_ids is not None else None,
        # Everything is given: skip JAX's SLURM/MPI/TPU detection.
        cluster_detection_method="deactivate",
    )


_installed_hook = False


def _install_fail_fast_hook() -> None:
    global _installed_hook
    if _installed_hook:
        return
    previous = sys.excepthook

    def hook(exc_type, exc, tb):
        previous(exc_type, exc, tb)
        _flush_stdio()
        os._exit(130 if issubclass(exc_type, KeyboardInterrupt) else 1)

    sys.excepthook = hook
    _installed_hook = True


def _flush_stdio() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def initialize(cfg: DistributedConfig | None = None) -> bool:
    """Join the multi-process job described by ``cfg`` and the environment.

    Returns True if ``jax.distributed`` is initialised (this call or an earlier one), False
    for a single-process run (nothing set, or ``num_processes == 1``). Must run before any JAX
    computation; raises ``ConfigError`` on inconsistent input or when JAX already started.
    """
    import jax

    from rljax.parallel.mesh import _backends_initialized, set_num_cpu_devices

    cfg = cfg or DistributedConfig()
    resolved = resolve(cfg)
    if jax.distributed.is_initialized():
        _install_exit_hook()
        return True
    from rljax.run.config import check_num_devices

    check_num_devices(cfg.num_cpu_devices)  # --num-devices sets it; checked before JAX starts
    if cfg.num_cpu_devices is not None:
        set_num_cpu_devices(cfg.num_cpu_devices)
    if not cfg.auto:
        if resolved.num_processes == 1 and resolved.process_id in (None, 0):
            return False
        if (resolved.coordinator, resolved.num_processes, resolved.process_id) == (None,) * 3:
            return False
        kwargs = _explicit_kwargs(resolved)
    else:
        kwargs = dict(
            coordinator_address=resolved.coordinator,
            num_processes=resolved.num_processes,
            process_id=resolved.process_id,
            local_device_ids=list(resolved.local_device_ids)
            if resolved.local_device_ids is not None
            else None,
        )
    if _backends_initialized():
        raise ConfigError(
            "rljax.distributed.initialize must run before any JAX computation (JAX is already "
            "initialised in this process: jax.devices(), an array or a jit call came first)"
        )
    # gloo is the default in jax 0.10; older/newer versions may default to none, which makes
    # cross-process collectives on CPU fail. It only affects the CPU backend.
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") is None:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    kwargs.update(
        initialization_timeout=resolved.init_timeout_s,
        heartbeat_timeout_seconds=resolved.heartbeat_timeout_s,
        shutdown_timeout_seconds=resolved.shutdown_timeout_s,
    )
    accepted = inspect.signature(jax.distributed.initialize).parameters
    kwargs = {k: v for k, v in kwargs.items() if k in accepted}
    try:
        jax.distributed.initialize(**kwargs)
    except ValueError as error:  # JAX's own checks, e.g. auto-detection found no cluster
        hint = " (auto-detection found no TPU pod, SLURM, Open MPI or k8s job)" if cfg.auto else ""
        raise ConfigError(f"jax.distributed.initialize failed{hint}: {error}") from None
    if cfg.fail_fast:
        _install_fail_fast_hook()
    _install_exit_hook()
    return True


def is_main_process() -> bool:
    """True in process 0 (and in a single-process run): the one that logs and writes files."""
    import jax

    return jax.process_index() == 0


# The code exit_process was given, for the exit hook (None: exit_process was not called).
_exit_code: int | None = None
_installed_exit_hook = False


def _install_exit_hook() -> None:
    """After ``exit_process``: the exit barrier, then the end of the process without teardown.

    Registered after JAX's own exit hook, so it runs before it (and after every hook registered
    later: checkpointers, loggers). Interpreter teardown is skipped because destroying jaxlib
    0.10's CPU client joins its worker threads, and one can sit in a gloo connect that never
    completes (about once in 60 two-process jobs on a loaded 2-core machine, after both had
    their results).
    """
    global _installed_exit_hook
    if not _installed_exit_hook:
        atexit.register(_end_process)
        _installed_exit_hook = True


def _end_process() -> None:
    if _exit_code is None:
        return
    import jax

    jax.effects_barrier()
    jax.distributed.shutdown()  # the barrier: every peer has finished too
    logging.shutdown()
    _flush_stdio()
    os._exit(_exit_code)


def exit_process(code: int | None) -> NoReturn:
    """``sys.exit(code)``; in a multi-process run a failure exits at once, a success after the
    exit hooks and JAX's exit barrier but without interpreter teardown.

    A non-zero exit normally waits at JAX's exit barrier for every peer, which deadlocks when
    the peers are blocked in a collective waiting for this process (see the module docstring).
    """
    import jax

    global _exit_code
    code = 0 if code is None else code
    if jax.distributed.is_initialized():
        if code != 0:
            _flush_stdio()
            os._exit(code)
        _exit_code = code
    sys.exit(code)
