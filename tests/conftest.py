"""Eight emulated CPU devices for every test; set before JAX is imported anywhere."""

import getpass
import os
import tempfile

os.environ["JAX_NUM_CPU_DEVICES"] = "8"
# Every program of the suite at LLVM -O2, as rljax compiles its own on CPU (compile_cache.
# compiler_options): the tests' own programs compile ~20 % faster too.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=2"
).strip()
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # as set_num_cpu_devices does
# One persistent compilation cache for the suite, its xdist workers and the subprocesses it starts
# (CLI, resume after SIGKILL, multi-process): many tests compile the same small programs.
os.environ.setdefault(
    "JAX_COMPILATION_CACHE_DIR",
    os.path.join(tempfile.gettempdir(), f"rljax-test-jax-cache-{getpass.getuser()}"),
)
# Every program is written, however fast it compiled: the other worker and the subprocesses
# (CLI, resume, multi-process) compile many of the same small programs.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_num_cpu_devices", 8)

from rljax.parallel import make_mesh  # noqa: E402


@pytest.fixture(scope="session")
def mesh4():
    """The demo mesh: data=2, model=2 over 4 of the 8 devices."""
    return make_mesh("data=2,model=2")


@pytest.fixture(scope="session")
def small_run(mesh4):
    """A small PPO compiled once on the 4-device mesh, after two updates: (run, state, metrics)."""
    from rljax import PPO, PPOConfig
    from rljax.run.sharded import ShardedRun

    config = PPOConfig(num_envs=8, num_steps=16, total_timesteps=8 * 16 * 4, num_minibatches=2)
    run = ShardedRun(PPO(config, replicas=2), mesh4, num_seeds=1, chunk_size=2)
    state = run.init(jax.random.key(0))
    state, metrics = run.run_chunk(state, 2)
    return run, state, metrics
