"""Emulated CPU devices: ``set_num_cpu_devices`` and its LAPACK thread limit."""

import os
import subprocess
import sys
import textwrap

import pytest

PROBE = textwrap.dedent(
    """
    import os, sys
    import jax, jax.numpy as jnp
    from rljax.parallel import set_num_cpu_devices
    set_num_cpu_devices(int(sys.argv[1]))
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    q = jax.jit(lambda x: jnp.linalg.qr(x)[0], out_shardings=jax.NamedSharding(mesh, jax.P()))
    x = jnp.eye(64) + 0.1
    assert jnp.allclose(q(x) @ q(x).T, jnp.eye(64), atol=1e-5)
    print(os.environ.get("OPENBLAS_NUM_THREADS"))
    """
)


def probe(devices: int, **env_overrides) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS",)}
    env.pop("JAX_NUM_CPU_DEVICES", None)
    env.update(env_overrides)
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(devices)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(
    "devices, env, expected",
    [
        (4, {}, "1"),  # emulated devices: one OpenBLAS thread each
        (4, {"OPENBLAS_NUM_THREADS": "2"}, "2"),  # the user's choice stands
        (1, {}, "None"),  # one device: left alone
    ],
)
def test_emulated_devices_limit_lapack_threads(devices, env, expected):
    assert probe(devices, **env) == expected
