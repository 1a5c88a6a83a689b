"""Device meshes from a spec string such as ``data=2,model=2``, and emulated CPU devices.

Every rljax mesh has the same four axes: ``data`` (environment batch, seeds, gradient averaging
between replicas), ``fsdp`` (the batch as well, and parameters, gradients and optimizer moments
split ZeRO-3 style), ``stage`` (pipeline stages: consecutive residual blocks) and ``model``
(tensor-parallel network weights). An axis left out of the spec has size 1, so code never needs
to ask whether an axis exists.
"""

from __future__ import annotations

import math
import os

import jax
from jax.sharding import AxisType, Mesh

from rljax.errors import ConfigError

MESH_AXES = ("data", "fsdp", "stage", "model")
# Axes a spec shows only when they split something (the others always: data=1,model=1).
OPTIONAL_AXES = ("fsdp", "stage")
DEFAULT_MESH = "data=1,model=1"

# Auto axis types: parameters and the environment batch carry explicit NamedShardings and the
# hot loop adds `with_sharding_constraint` at layer boundaries, but the gymnax environments are
# third-party code without sharding-typed arrays. Explicit axes would make every op inside them
# resolve its output sharding by type and reject ambiguous ones (gathers, scatters in the physics),
# so Auto lets the partitioner fill in the few unannotated intermediates.
MESH_AXIS_TYPES = (AxisType.Auto,) * len(MESH_AXES)


def parse_mesh_spec(spec: str) -> dict[str, int]:
    """``"data=2,model=2"`` -> ``{"data": 2, "model": 2}``; one size may be -1 (the rest)."""
    sizes: dict[str, int] = {}
    text = spec.replace(" ", "")
    if not text:
        raise ConfigError(f"mesh spec is empty; expected e.g. 'data=2,model=2' (axes: {MESH_AXES})")
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or name not in MESH_AXES:
            raise ConfigError(
                f"mesh spec {spec!r}: bad entry {part!r}; expected 'axis=size' with axis in "
                f"{MESH_AXES}, e.g. 'data=2,model=2'"
            )
        if name in sizes:
            raise ConfigError(f"mesh spec {spec!r}: axis {name!r} given twice")
        try:
            size = int(value)
        except ValueError:
            raise ConfigError(
                f"mesh spec {spec!r}: size of {name!r} is {value!r}, not an integer"
            ) from None
        if size == 0 or size < -1:
            raise ConfigError(f"mesh spec {spec!r}: size of {name!r} is {size}; use >= 1 or -1")
        sizes[name] = size
    if list(sizes.values()).count(-1) > 1:
        raise ConfigError(f"mesh spec {spec!r}: at most one axis may be -1")
    return {axis: sizes.get(axis, 1) for axis in MESH_AXES}


def resolve_mesh_shape(spec: str, num_devices: int) -> dict[str, int]:
    """Sizes for every axis with -1 filled in; raises if the mesh needs more devices than exist."""
    sizes = parse_mesh_spec(spec)
    known = math.prod(s for s in sizes.values() if s != -1)
    if -1 in sizes.values():
        if num_devices % known:
            raise ConfigError(
                f"mesh spec {spec!r}: {num_devices} devices available, not divisible by {known} "
                "for the -1 axis"
            )
        sizes = {a: (num_devices // known if s == -1 else s) for a, s in sizes.items()}
    needed = math.prod(sizes.values())
    if needed > num_devices:
        raise ConfigError(
            f"mesh {spec!r} needs {needed} devices but only {num_devices} are available "
            f"({jax.default_backend()}); use a smaller mesh, or on CPU emulate more devices with "
            "--num-devices N / rljax.parallel.set_num_cpu_devices(N)"
        )
    return sizes


def make_mesh(spec: str = DEFAULT_MESH, devices=None) -> Mesh:
    """A ``(data, fsdp, stage, model)`` mesh over the first ``prod(sizes)`` of ``devices`` (all)."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = resolve_mesh_shape(spec, len(devices))
    shape = tuple(sizes[a] for a in MESH_AXES)
    return jax.make_mesh(
        shape, MESH_AXES, axis_types=MESH_AXIS_TYPES, devices=devices[: math.prod(shape)]
    )


def traced_on_one_device() -> bool:
    """Whether the function being traced runs under an active mesh of one device (``jax.set_mesh``):
    only then can it concatenate arrays of any sharding without moving data between devices.
    Without an active mesh the inputs' placement is unknown at trace time."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and mesh.size == 1


def shape_record(mesh: Mesh) -> dict[str, int]:
    """``{axis: size}`` for records (checkpoint layouts): ``stage`` only when it splits, so a
    record reads as it did before that axis existed."""
    return {str(a): int(n) for a, n in mesh.shape.items() if a != "stage" or n > 1}


def mesh_spec_of(mesh: Mesh) -> str:
    """``data=2,model=2``; ``fsdp`` and ``stage`` only when they split something
    (``data=2,fsdp=2,...``)."""
    return ",".join(
        f"{a}={mesh.shape[a]}" for a in MESH_AXES if a not in OPTIONAL_AXES or mesh.shape[a] > 1
    )


def _backends_initialized() -> bool:
    from jax._src import xla_bridge  # no public query exists

    return xla_bridge.backends_are_initialized()


def limit_lapack_threads() -> None:
    """One OpenBLAS thread for JAX's CPU LAPACK kernels (QR, eigh, ...), unless the user chose.

    Emulated devices run their programs on concurrent threads of one process; each LAPACK call
    then starts its own OpenBLAS thread pool, and the pools spin against each other. Measured on
    2 cores: a replicated 320x1280 QR takes 2.2 s on 8 emulated devices and 0.07 s with one
    thread (0.03 s on 1 device); the orthogonal init of a 105M-parameter network on
    fsdp=4,model=2 never finished. JAX loads this OpenBLAS (through scipy) on the first LAPACK
    call, so the variable takes effect when set before that."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def set_num_cpu_devices(n: int) -> None:
    """Emulate ``n`` CPU devices. Must run before JAX executes anything in this process.

    Also sets ``OPENBLAS_NUM_THREADS=1`` (unless already set) for ``n > 1``: see
    ``limit_lapack_threads``."""
    if n < 1:
        raise ConfigError(f"number of devices must be >= 1, got {n}")
    if n > 1:
        limit_lapack_threads()
    if _backends_initialized():
        have = jax.device_count()
        if jax.default_backend() == "cpu" and have == n:
            return
        raise ConfigError(
            f"cannot emulate {n} CPU devices: JAX is already initialised with {have} "
            f"{jax.default_backend()} device(s). Call set_num_cpu_devices before any JAX "
            f"computation (right after `import jax`), or set JAX_NUM_CPU_DEVICES={n} in the "
            "environment before starting Python"
        )
    os.environ["JAX_NUM_CPU_DEVICES"] = str(n)
    jax.config.update("jax_num_cpu_devices", n)
