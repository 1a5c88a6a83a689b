"""rljax.launch + rljax.distributed: real 2-process CPU jobs (gloo collectives), failures, input."""

import io
import re
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from rljax.distributed import DistributedConfig, initialize, resolve
from rljax.errors import ConfigError
from rljax.launch import child_command, launch, main

# x [8, 6], w [6, 4]: sum(tanh(x @ w)) reduces over rows split across the two processes.
X = (np.arange(8 * 6, dtype=np.float32).reshape(8, 6) - 20.0) / 17.0
W = (np.arange(6 * 4, dtype=np.float32).reshape(6, 4) % 5 - 2.0) / 3.0

WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    from rljax.distributed import DistributedConfig, exit_process, initialize
    assert initialize(DistributedConfig())  # coordinator etc. from the launcher's environment
    import atexit
    atexit.register(sys.stdout.write, "exit hook ran\\n")  # exit_process(0) must still run it
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P
    from rljax.parallel import make_mesh

    mesh = make_mesh("data=2,model=2")  # over jax.devices(): both processes' devices
    pid = jax.process_index()
    x_sharding = NamedSharding(mesh, P("data", None))
    X = (np.arange(8 * 6, dtype=np.float32).reshape(8, 6) - 20.0) / 17.0
    W = (np.arange(6 * 4, dtype=np.float32).reshape(6, 4) % 5 - 2.0) / 3.0
    # This process's rows: the union of its devices' shards.
    rows = sorted({i[0].indices(8)[:2] for i in
                   x_sharding.addressable_devices_indices_map(X.shape).values()})
    local = X[rows[0][0]:rows[-1][1]]
    x = jax.make_array_from_process_local_data(x_sharding, local, X.shape)
    w = jax.make_array_from_process_local_data(NamedSharding(mesh, P(None, "model")), W, W.shape)
    reduce = jax.jit(lambda x, w: jnp.sum(jnp.tanh(x @ w)), out_shardings=NamedSharding(mesh, P()))
    total = reduce(x, w)
    print(f"process {pid}/{jax.process_count()}: {jax.local_device_count()} of "
          f"{jax.device_count()} devices, rows {rows[0][0]}:{rows[-1][1]}")
    if pid == 0:  # one write: print's text and newline are two in an unbuffered child
        sys.stdout.write(f"result {float(total)!r}\\n")
    mode = sys.argv[1]
    if mode == "ok":
        exit_process(0)
    step = jax.jit(lambda x: x * 0.5 + jnp.mean(x), out_shardings=x_sharding)
    start = time.time()
    while True:  # process 1 fails after 1 s; process 0 keeps going (or idles)
        if pid == 1 and time.time() - start > 1.0:
            print("failing now", flush=True)
            if mode == "hang":  # stopped: alive, but no heartbeats and no progress
                os.kill(os.getpid(), signal.SIGSTOP)
            if mode == "exit3":
                exit_process(3)
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "idle":  # outside any collective: only the heartbeat notices
            time.sleep(0.05)
        else:  # a cross-process collective each step
            x = step(x)
            x.block_until_ready()
    """
)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    path = tmp_path_factory.mktemp("launch") / "worker.py"
    path.write_text(WORKER)
    return str(path)


def run_job(worker, mode, **kwargs):
    """(exit code, stdout, stderr, seconds) of a 2 processes x 2 CPU devices job."""
    out, err = io.StringIO(), io.StringIO()
    start = time.monotonic()
    code = launch([worker, mode], 2, 2, cpu=True, stdout=out, stderr=err, **kwargs)
    return code, out.getvalue(), err.getvalue(), time.monotonic() - start


def launcher_lines(err):
    return [line for line in err.splitlines() if line.startswith("launch: ")]


def test_two_processes_reduce_like_one_process(worker, mesh4):
    code, out, err, seconds = run_job(worker, "ok", timeout_s=50)
    assert code == 0, err
    expected = np.tanh(X.astype(np.float64) @ W.astype(np.float64)).sum()
    single = jax.jit(lambda x, w: jnp.sum(jnp.tanh(x @ w)))(
        jax.device_put(X, NamedSharding(mesh4, P("data", None))),
        jax.device_put(W, NamedSharding(mesh4, P(None, "model"))),
    )
    # Gloo's native log can land mid-line in the same stream ("[p0] [Gloo] Rank 0 is connected
    # to result 0.048..."), so the result is matched as a token of a process-0 line.
    results = [m for line in out.splitlines() if (m := re.search(r"\bresult (\S+)$", line))]
    assert len(results) == 1 and results[0].string.startswith("[p0] ")  # process 0 only
    value = float(results[0].group(1))
    np.testing.assert_allclose(value, float(single), rtol=1e-6)
    np.testing.assert_allclose(value, expected, rtol=1e-5)
    assert "[p0] process 0/2: 2 of 4 devices, rows 0:4" in out
    assert "[p1] process 1/2: 2 of 4 devices, rows 4:8" in out
    # exit_process(0) ends without interpreter teardown, but after the exit hooks (gloo's log
    # may share the line, as above).
    for p in ("[p0] ", "[p1] "):
        assert any(line.startswith(p) and "exit hook ran" in line for line in out.splitlines())
    for line in out.splitlines() + err.splitlines():
        assert line.startswith(("[p0] ", "[p1] ", "launch: ")), line
    assert launcher_lines(err) == []


def test_killed_process_ends_the_job_and_the_survivor_exits_by_itself(worker):
    # A grace of 45 s: the launcher would only SIGTERM the survivor after that, so an exit
    # well before shows the survivor noticed on its own (its collective fails at once).
    code, out, err, seconds = run_job(worker, "kill", grace_s=45.0)
    print(f"killed process: launcher returned after {seconds:.1f} s")
    lines = launcher_lines(err)
    assert lines[0] == "launch: process 1 exited with code -9 (SIGKILL)", err
    assert code == 128 + 9
    assert "launch: process 0 exited with code 1" in lines  # not "stopped" by the launcher
    assert "[p1] failing now" in out
    assert seconds < 40


def test_survivor_outside_collectives_is_stopped_by_the_heartbeat_timeout(worker):
    code, out, err, seconds = run_job(worker, "idle", grace_s=45.0, heartbeat_timeout_s=5)
    print(f"idle survivor: launcher returned after {seconds:.1f} s")
    lines = launcher_lines(err)
    assert lines[0] == "launch: process 1 exited with code -9 (SIGKILL)", err
    # The coordination service (in process 0) declares process 1 dead and aborts.
    assert "launch: process 0 exited with code -6 (SIGABRT)" in lines
    assert "heartbeat" in err
    assert code == 128 + 9
    assert seconds < 40


def test_hung_process_is_named_not_the_process_that_aborted(worker):
    # Before: "process 0 exited with code -6 (SIGABRT)", "process 0 failed" (exit 134): the
    # coordination service in process 0 aborted it because process 1 hung, and process 0 was
    # blamed.
    code, out, err, seconds = run_job(worker, "hang", grace_s=3.0, heartbeat_timeout_s=5)
    lines = launcher_lines(err)
    assert lines[0] == (
        "launch: process 1 stopped responding (no heartbeats; reported by the coordination "
        "service in process 0)"
    ), err
    assert lines[1] == "launch: process 0 exited with code -6 (SIGABRT)"
    assert lines[2].startswith("launch: process 1 hung; stopping the other 1 process(es)")
    assert code == 124
    assert seconds < 40


def test_failing_process_is_named_and_its_code_returned(worker):
    code, out, err, seconds = run_job(worker, "exit3", grace_s=45.0)
    lines = launcher_lines(err)
    assert lines[0] == "launch: process 1 exited with code 3", err
    assert code == 3
    assert "launch: process 0 exited with code 1" in lines
    assert seconds < 40


CASUALTY = textwrap.dedent(
    """
    import os, sys, time
    if os.environ["RLJAX_PROCESS_ID"] == "0":  # the casualty: reaped first
        print("jax.errors.JaxRuntimeError: UNKNOWN: Gloo all-reduce failed: [pair.cc:538] "
              "Read error [127.0.0.1]:21154: Connection reset by peer", file=sys.stderr)
        sys.exit(1)
    time.sleep(0.5)  # the cause: reaped after it
    sys.exit(3)
    """
)


def test_a_process_that_lost_a_peer_is_not_named_before_the_peer(tmp_path):
    # The kernel can report the casualty's exit first: the failed peer's sockets close before
    # its own exit is reaped (seen in CI: "process 0 exited with code 1" named first).
    script = tmp_path / "casualty.py"
    script.write_text(CASUALTY)
    out, err = io.StringIO(), io.StringIO()
    code = launch([str(script)], 2, grace_s=10.0, stdout=out, stderr=err)
    lines = launcher_lines(err.getvalue())
    assert lines[:2] == [
        "launch: process 1 exited with code 3",
        "launch: process 0 exited with code 1",
    ], err.getvalue()
    assert code == 3


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--num-processes", "0", "--", "train"], "--num-processes must be an integer >= 1, got 0"),
        (["--num-processes", "2"], "no command to run"),
        (["--num-processes", "2", "--"], "no command to run"),
        (["--num-processes", "2", "--", "trian", "ppo"], "unknown command 'trian'"),
        (["--devices-per-process", "2", "--", "train"], "required: --num-processes"),
        (["-n", "2", "--devices-per-process", "0", "--", "train"], "--devices-per-process must"),
    ],
)
def test_bad_launcher_input_is_one_error_line(argv, message, capsys):
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("launch: error: "), captured.err
    assert message in lines[0]


def test_cli_exit_code_for_bad_input():
    result = subprocess.run(
        [sys.executable, "-m", "rljax.launch", "--num-processes", "-1", "--", "train"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip() == "launch: error: --num-processes must be an integer >= 1, got -1"


def test_child_command():
    python = sys.executable
    assert child_command(["train", "ppo"]) == [python, "-m", "rljax", "train", "ppo"]
    assert child_command(["a", "b"], module="pkg.mod") == [python, "-m", "pkg.mod", "a", "b"]
    with pytest.raises(ConfigError, match="does not exist"):
        child_command(["/nonexistent/job.py"])


ENV = {"RLJAX_COORDINATOR": "127.0.0.1:1234", "RLJAX_NUM_PROCESSES": "2", "RLJAX_PROCESS_ID": "1"}


def test_resolve_reads_fields_then_rljax_then_jax_environment():
    r = resolve(DistributedConfig(), ENV)
    assert (r.coordinator, r.num_processes, r.process_id) == ("127.0.0.1:1234", 2, 1)
    assert (r.init_timeout_s, r.heartbeat_timeout_s, r.shutdown_timeout_s) == (300, 30, 60)
    r = resolve(DistributedConfig(process_id=0, heartbeat_timeout_s=7), ENV)
    assert (r.process_id, r.heartbeat_timeout_s) == (0, 7)
    jax_env = {"JAX_COORDINATOR_ADDRESS": "h:9", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    r = resolve(DistributedConfig(), {**jax_env, "JAX_LOCAL_DEVICE_IDS": "0,1"})
    assert (r.coordinator, r.num_processes, r.process_id, r.local_device_ids) == (
        "h:9",
        4,
        3,
        (0, 1),
    )
    r = resolve(DistributedConfig(), {"RLJAX_HEARTBEAT_TIMEOUT_S": "5"})
    assert r.heartbeat_timeout_s == 5 and r.coordinator is None


@pytest.mark.parametrize(
    "cfg, env, message",
    [
        (DistributedConfig(process_id=2), ENV, "process_id 2 is out of range for num_processes 2"),
        (DistributedConfig(num_processes=0), {}, "num_processes must be >= 1"),
        (DistributedConfig(), {**ENV, "RLJAX_PROCESS_ID": "one"}, "RLJAX_PROCESS_ID='one'"),
        (DistributedConfig(coordinator="localhost"), ENV, "'localhost' is not 'host:port'"),
        (DistributedConfig(heartbeat_timeout_s=0), {}, "heartbeat_timeout_s must be >= 1"),
        (DistributedConfig(), {"RLJAX_LOCAL_DEVICE_IDS": "0;1"}, "comma-separated device ids"),
    ],
)
def test_resolve_rejects_inconsistent_input(cfg, env, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        resolve(cfg, env)


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*ENV, "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_initialize_single_process_is_a_no_op(clean_env):
    assert initialize(DistributedConfig()) is False
    assert initialize(DistributedConfig(num_processes=1)) is False
    assert not jax.distributed.is_initialized()


def test_initialize_rejects_incomplete_or_late_setup(clean_env):
    with pytest.raises(ConfigError, match=r"missing coordinator \(DistributedConfig.coordinator"):
        initialize(DistributedConfig(num_processes=2, process_id=0))
    jax.devices()  # JAX has started in this process
    with pytest.raises(ConfigError, match="must run before any JAX computation"):
        initialize(DistributedConfig(coordinator="127.0.0.1:1", num_processes=2, process_id=0))
    assert not jax.distributed.is_initialized()
