"""--compile-cache: the persistent compilation cache a run writes and the next one loads."""

import chex
import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache.compilation_cache import reset_cache

from rljax import ConfigError, PPOConfig, RunConfig, train
from rljax.parallel import make_mesh
from rljax.run import compile_cache
from rljax.run.sharded import ShardedRun, prepare
from tests.run.trees import host_state

NAMES = (
    "jax_enable_compilation_cache",
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
)


@pytest.fixture
def jax_cache_settings():
    """The suite's own cache settings (conftest) are restored after the test."""
    saved = {name: getattr(jax.config, name) for name in NAMES}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    reset_cache()


def entries(path):
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


def test_bad_settings_get_one_message_and_good_ones_pass(tmp_path):
    for ok in ("auto", "off", str(tmp_path / "new" / "dir")):
        compile_cache.check(ok)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="compile_cache '.*file/xla' is not a directory"):
        compile_cache.check(str(tmp_path / "file" / "xla"))
    with pytest.raises(ConfigError, match="compile_cache must be 'auto', 'off' or a directory"):
        compile_cache.check("")
    with pytest.raises(ConfigError, match="compile_cache"):  # validated with the run's flags
        train(PPOConfig(), RunConfig.make(compile_cache=str(tmp_path / "file" / "x")))


def test_a_directory_receives_the_programs_compiled_after_it_is_set(tmp_path, jax_cache_settings):
    where = compile_cache.use(str(tmp_path / "xla"))
    assert where == str((tmp_path / "xla").resolve())
    assert jax.config.jax_compilation_cache_dir == where
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0).lower(jnp.ones(7)).compile()
    assert entries(tmp_path / "xla")  # written, although this process compiled before


def test_auto_keeps_a_directory_jax_has_and_otherwise_uses_the_user_cache(
    tmp_path, monkeypatch, jax_cache_settings
):
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)  # jax's default
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    assert compile_cache.use("auto") == str(tmp_path / "mine")  # JAX_COMPILATION_CACHE_DIR, say
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    expected = tmp_path / "home-cache" / "rljax" / "xla"
    assert compile_cache.default_dir() == expected
    assert compile_cache.use("auto") == str(expected.resolve()) and expected.is_dir()
    assert jax.config.jax_persistent_cache_min_compile_time_secs == compile_cache.MIN_SECONDS
    assert compile_cache.use("off") is None
    assert not jax.config.jax_enable_compilation_cache


def test_a_second_run_loads_the_first_runs_programs(tmp_path, jax_cache_settings):
    config = PPOConfig(num_envs=4, num_steps=16, total_timesteps=4 * 16 * 2, num_minibatches=2)
    cache = tmp_path / "xla"
    lines = []

    def run(name):
        settings = RunConfig.make(
            runs_dir=str(tmp_path), run_name=name, log_every=1, eval_every=0,
            compile_cache=str(cache),
        )  # fmt: skip
        return train(config, settings, progress=lines.append)

    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every program
    first = run("a")
    written = entries(cache)
    assert written
    second = run("b")
    assert entries(cache) == written  # both programs were found: nothing new written
    assert sum(second.compile_seconds.values()) < sum(first.compile_seconds.values())
    compiled = [line for line in lines if line.startswith("compiled in ")]
    assert len(compiled) == 2 and all(f"compilation cache {cache}" in c for c in compiled)
    for name in ("a", "b"):  # the cache changes no number
        assert (tmp_path / name / "metrics.jsonl").exists()
    a, b = first.metrics, second.metrics
    assert [r["policy_loss"] for r in a] == [r["policy_loss"] for r in b]


def test_cpu_programs_compile_at_llvm_o2_unless_xla_flags_set_the_level(monkeypatch):
    mesh = make_mesh("data=1,model=1")
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
    assert compile_cache.compiler_options(mesh) == {"xla_backend_optimization_level": 2}
    init = compile_cache.compiler_options(mesh, "init")
    assert init == {**compile_cache.CPU_OPTIONS, **compile_cache.INIT_OPTIONS}
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=3")
    assert compile_cache.compiler_options(mesh) is None
    assert compile_cache.compiler_options(mesh, "init") == compile_cache.INIT_OPTIONS
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_scheduler_type=CPU_SCHEDULER_TYPE_DEFAULT")
    assert compile_cache.compiler_options(mesh, "init") == compile_cache.CPU_OPTIONS
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setattr(compile_cache, "INIT_OPTIONS", {"xla_cpu_no_such_option": True})
    assert compile_cache.compiler_options(mesh, "init") == compile_cache.CPU_OPTIONS  # unknown


def test_init_compiles_for_memory_the_same_state_in_fewer_bytes(monkeypatch):
    """Init's scheduler (INIT_OPTIONS) against XLA's default on fsdp=4: the same state, less
    memory. By default every device drew its whole orthogonal matrices side by side."""
    config = PPOConfig(
        network="residual", residual_width=64, residual_depth=2, residual_expansion=2,
        num_envs=8, num_steps=4, num_minibatches=1, total_timesteps=32,
    )  # fmt: skip
    layout, algo = prepare(config, RunConfig.make(mesh="fsdp=4", eval_every=0, quiet=True))
    if "xla_cpu_scheduler_type" not in (compile_cache.compiler_options(layout.mesh, "init") or {}):
        pytest.skip("this XLA has no xla_cpu_scheduler_type, or XLA_FLAGS sets it")
    states, temps = {}, {}
    for name, init_options in (("rljax", compile_cache.INIT_OPTIONS), ("default", {})):
        monkeypatch.setattr(compile_cache, "INIT_OPTIONS", init_options)
        run = ShardedRun(algo, layout, 1, chunk_size=1)
        run.compile(jax.random.key(0))
        temps[name] = run.compiled["init"].memory_analysis().temp_size_in_bytes
        states[name] = run.init(jax.random.key(0))
    chex.assert_trees_all_equal(host_state(states["rljax"]), host_state(states["default"]))
    assert temps["rljax"] < temps["default"] / 2, temps


def test_the_compiler_options_change_no_number_on_one_device(monkeypatch):
    config = PPOConfig(num_envs=4, num_steps=8, total_timesteps=4 * 8 * 3, num_minibatches=1)
    layout, algo = prepare(config, RunConfig.make(eval_every=0, quiet=True))
    xla_default = {"xla_backend_optimization_level": 3}  # overrides the suite's XLA_FLAGS too
    runs = {}
    for name, options in (("tuned", compile_cache.CPU_OPTIONS), ("default", xla_default)):
        monkeypatch.setattr(compile_cache, "compiler_options", lambda mesh, _="", o=options: o)
        runs[name] = ShardedRun(algo, layout, 1, chunk_size=config.num_updates)
    runs["tuned"].compile(jax.random.key(0))  # init on a second thread; both add up to the wall
    assert set(runs["tuned"].compile_seconds) == {"init", "chunk"}

    def trained(run):  # both from the tuned run's init program: the chunks are compared
        state = runs["tuned"].init(jax.random.key(0))
        state, metrics = run.run_chunk(state, config.num_updates)
        return state.params, state.opt_state, metrics

    chex.assert_trees_all_close(
        trained(runs["default"]), trained(runs["tuned"]), rtol=1e-6, atol=1e-6
    )
