"""Run N cooperating JAX processes on this machine (multi-process JAX without a cluster).

    rljax launch --num-processes 2 --devices-per-process 2 --cpu -- \\
        train ppo --env CartPole-v1 --mesh data=2,model=2

(or ``python -m rljax launch ...``, ``python -m rljax.launch ...``) starts
``python -m rljax train ppo ...`` twice, each with ``RLJAX_COORDINATOR`` (127.0.0.1 and a free
port), ``RLJAX_NUM_PROCESSES``, ``RLJAX_PROCESS_ID`` and ``JAX_NUM_CPU_DEVICES`` set, for
``rljax.distributed.initialize`` to read. The first word after ``--`` is an ``rljax`` command
(``train`` -> ``python -m rljax train``); a word ending in ``.py`` is a script; ``--module
pkg.mod`` runs any module with every word after ``--`` as its arguments.

Each child's output lines are forwarded with a ``[p<i>] `` prefix (stdout to stdout, stderr to
stderr). When a child fails (non-zero exit or a signal) the launcher says which, gives the
others ``--grace`` seconds to exit on their own, then sends SIGTERM and, ``--grace`` seconds
later, SIGKILL. It returns 0 only if every child exits 0; otherwise the first failure's code
(128 + signal number for a signal, 124 for ``--timeout`` or a hung process). Ctrl-C / SIGTERM
are forwarded.

A process that hangs (stops sending heartbeats, e.g. stopped or stuck in native code) is not the
first to exit: JAX's coordination service (in process 0) notices it after the heartbeat timeout
and aborts process 0. The launcher reads the service's report in the children's stderr and
names the hung process, not the one that aborted.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TextIO

from rljax.distributed import (
    ENV_COORDINATOR,
    ENV_HEARTBEAT_TIMEOUT,
    ENV_NUM_PROCESSES,
    ENV_PROCESS_ID,
)
from rljax.errors import ConfigError

TIMEOUT_EXIT_CODE = 124
_POLL_S = 0.05
_SETTLE_S = 2.0


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the coordinator binds it shortly after)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


CHILD_COMMANDS = ("train",)  # rljax commands a child may run (`launch` would nest)


def child_command(
    command: Sequence[str], module: str | None = None, python: str = sys.executable
) -> list[str]:
    """``["train", "ppo"]`` -> ``[python, "-m", "rljax", "train", "ppo"]``; see the module doc."""
    command = list(command)
    if module is not None:
        return [python, "-m", module, *command]
    if not command:
        raise ConfigError(
            "no command to run: give it after '--', e.g. "
            "'rljax launch --num-processes 2 -- train ppo'"
        )
    first, rest = command[0], command[1:]
    if first.endswith(".py"):
        if not Path(first).is_file():
            raise ConfigError(f"script {first!r} does not exist")
        return [python, first, *rest]
    if first not in CHILD_COMMANDS:
        raise ConfigError(
            f"unknown command {first!r}: expected an rljax command ({', '.join(CHILD_COMMANDS)}), "
            "a script ending in .py, or --module pkg.mod"
        )
    return [python, "-m", "rljax", first, *rest]


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(code: int) -> str:
    """``-9`` -> ``'code -9 (SIGKILL)'``; ``3`` -> ``'code 3'``."""
    return f"code {code} ({_signal_name(-code)})" if code < 0 else f"code {code}"


def _shell_code(code: int) -> int:
    return 128 - code if code < 0 else code


class _Child:
    def __init__(self, index: int, popen: subprocess.Popen):
        self.index = index
        self.popen = popen
        self.readers: list[threading.Thread] = []
        self.terminated_by_launcher = False

    def signal(self, signum: int) -> None:
        # The child leads its own process group: reach whatever it started too.
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass


# JAX's coordination service, on a process that stopped sending heartbeats (jax 0.10):
#   "... UNAVAILABLE: The following tasks are unhealthy (stopped sending heartbeats):" then
#   one line of task ids ("1" or "1, 3"; other versions: "/job:jax_worker/replica:0/task:1").
_UNHEALTHY = "stopped sending heartbeats"
_TASK_IDS = re.compile(r"^[\d,\s]+$")
_TASK_PATH = re.compile(r"task:(\d+)")


# A collective that failed because a peer went away (gloo on CPU; jax 0.10):
#   "Gloo all-reduce failed: [.../pair.cc:538] Read error [127.0.0.1]:21154: Connection reset
#   by peer". Such a process is a casualty, not the cause.
_PEER_LOST = re.compile(r"Gloo \S+ failed|Connection reset by peer|Connection closed by peer")


class _HeartbeatReport:
    """Collects, from stderr lines, the processes the coordination service reported unhealthy
    and the processes whose collective failed because a peer went away."""

    def __init__(self):
        self.unhealthy: dict[int, int] = {}  # hung process -> the process that reported it
        self.lost_a_peer: set[int] = set()

    def reader(self, reporter: int):
        expecting = False

        def on_line(line: str) -> None:
            nonlocal expecting
            if _PEER_LOST.search(line):
                self.lost_a_peer.add(reporter)
            ids = [int(i) for i in _TASK_PATH.findall(line)]
            if _UNHEALTHY in line:
                expecting = True
                ids += [int(i) for i in re.findall(r"\d+", line.split(_UNHEALTHY, 1)[1])]
            elif expecting and _TASK_IDS.match(line):
                ids += [int(i) for i in re.findall(r"\d+", line)]
            elif not ids:
                expecting = False
            for task in ids:
                self.unhealthy.setdefault(task, reporter)

        return on_line


def _forward(stream, prefix: str, out: TextIO, lock: threading.Lock, on_line=None) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
        if on_line is not None:
            on_line(line)
        with lock:
            out.write(f"{prefix}{line}\n")
            out.flush()
    stream.close()


def launch(
    command: Sequence[str],
    num_processes: int,
    devices_per_process: int | None = None,
    *,
    module: str | None = None,
    port: int | None = None,
    cpu: bool = False,
    timeout_s: float | None = None,
    grace_s: float = 5.0,
    heartbeat_timeout_s: int | None = None,
    env: Mapping[str, str] | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    python: str = sys.executable,
) -> int:
    """Run ``command`` (words after ``--``) as ``num_processes`` cooperating processes.

    Returns 0 if all exit 0, else the first failure's exit code (128 + signal for a signal,
    124 on ``timeout_s``). Launcher messages go to ``stderr`` prefixed ``launch: ``.
    Raises ``ConfigError`` on invalid arguments, before starting anything.
    """
    if isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1:
        raise ConfigError(f"--num-processes must be an integer >= 1, got {num_processes!r}")
    if devices_per_process is not None and devices_per_process < 1:
        raise ConfigError(f"--devices-per-process must be >= 1, got {devices_per_process}")
    if port is not None and not 0 < port < 65536:
        raise ConfigError(f"--port must be in [1, 65535], got {port}")
    if timeout_s is not None and timeout_s <= 0:
        raise ConfigError(f"--timeout must be > 0 seconds, got {timeout_s}")
    if grace_s < 0:
        raise ConfigError(f"--grace must be >= 0 seconds, got {grace_s}")
    if heartbeat_timeout_s is not None and heartbeat_timeout_s < 1:
        raise ConfigError(f"--heartbeat-timeout must be >= 1 second, got {heartbeat_timeout_s}")
    argv = child_command(command, module, python)
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    lock = threading.Lock()

    def say(message: str) -> None:
        with lock:
            stderr.write(f"launch: {message}\n")
            stderr.flush()

    port = port or free_port()
    base_env = dict(os.environ if env is None else env)
    base_env.update(
        {
            ENV_COORDINATOR: f"127.0.0.1:{port}",
            ENV_NUM_PROCESSES: str(num_processes),
            # Read by JAX: keep process 0's coordination service off other interfaces.
            "JAX_COORDINATOR_BIND_ADDRESS": f"127.0.0.1:{port}",
            "PYTHONUNBUFFERED": "1",  # lines arrive as printed, not at exit
        }
    )
    if devices_per_process is not None:
        base_env["JAX_NUM_CPU_DEVICES"] = str(devices_per_process)
        if devices_per_process > 1:  # see rljax.parallel.mesh.limit_lapack_threads
            base_env.setdefault("OPENBLAS_NUM_THREADS", "1")
    if cpu:
        base_env["JAX_PLATFORMS"] = "cpu"
    if heartbeat_timeout_s is not None:
        base_env[ENV_HEARTBEAT_TIMEOUT] = str(heartbeat_timeout_s)

    children: list[_Child] = []
    exits: queue.Queue = queue.Queue()
    heartbeats = _HeartbeatReport()
    interrupted: list[int] = []  # signals received by the launcher

    def on_signal(signum, _frame):
        if interrupted:  # a second Ctrl-C: stop waiting
            for child in children:
                child.signal(signal.SIGKILL)
        interrupted.append(signum)
        for child in children:
            child.terminated_by_launcher = True
            child.signal(signum)

    previous_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous_handlers[signum] = signal.signal(signum, on_signal)
    try:
        for index in range(num_processes):
            popen = subprocess.Popen(
                argv,
                env={**base_env, ENV_PROCESS_ID: str(index)},
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            child = _Child(index, popen)
            for stream, out, on_line in (
                (popen.stdout, stdout, None),
                (popen.stderr, stderr, heartbeats.reader(index)),
            ):
                reader = threading.Thread(
                    target=_forward,
                    args=(stream, f"[p{index}] ", out, lock, on_line),
                    daemon=True,
                )
                reader.start()
                child.readers.append(reader)
            waiter = threading.Thread(
                target=lambda c=child: exits.put((c.index, c.popen.wait())), daemon=True
            )
            waiter.start()
            children.append(child)
        return _supervise(children, exits, timeout_s, grace_s, interrupted, say, heartbeats)
    finally:
        for child in children:  # only reached with live children if the launcher itself failed
            if child.popen.poll() is None:
                child.signal(signal.SIGKILL)
                child.popen.wait()
        for child in children:
            for reader in child.readers:
                reader.join(timeout=5)
        for signum, handler in previous_handlers.items():
            signal.signal(signum, handler)


def _supervise(
    children, exits: queue.Queue, timeout_s, grace_s, interrupted, say, heartbeats=None
) -> int:
    """Wait for every child; ``exits`` yields ``(index, code)`` in the order they exited.

    A first failure whose collective lost a peer is held back up to ``_SETTLE_S``: the peer that
    went away can be reaped after it (its sockets close before the kernel reports its exit), and
    it is the one to name.
    """
    start = time.monotonic()
    first_failure: int | None = None
    stop_reason: str | None = None
    stop_at: float | None = None  # when survivors get SIGTERM
    terminated_at: float | None = None  # when they got it (SIGKILL follows after grace_s)
    running = {child.index: child for child in children}
    held: list[tuple[_Child, int]] = []  # casualties held back, and when they stop being held
    held_until = 0.0
    while running or held:
        arrived: list[tuple[_Child, int]] = []
        try:
            index, code = exits.get(timeout=_POLL_S)
        except queue.Empty:
            pass
        else:
            child = running.pop(index)
            if stop_reason is None and _is_casualty(child, code, interrupted, heartbeats):
                held_until = held_until if held else time.monotonic() + _SETTLE_S
                held.append((child, code))
            else:
                arrived.append((child, code))
        failed_first = arrived and arrived[0][1] != 0
        if held and (failed_first or not running or time.monotonic() >= held_until):
            arrived, held = arrived + held, []
        for child, code in arrived:
            index = child.index
            if child.terminated_by_launcher and code != 0:
                say(f"process {index} stopped ({describe_exit(code)})")
            elif code != 0:
                hung = _hung_peers(child, running, heartbeats) if stop_reason is None else []
                for peer, reporter in hung:  # the real failure: named first
                    say(
                        f"process {peer} stopped responding (no heartbeats; reported by the "
                        f"coordination service in process {reporter})"
                    )
                say(f"process {index} exited with {describe_exit(code)}")
                if first_failure is None and not interrupted:
                    first_failure = TIMEOUT_EXIT_CODE if hung else _shell_code(code)
                    stop_reason = (
                        f"process {', '.join(str(p) for p, _ in hung)} hung"
                        if hung
                        else f"process {index} failed"
                    )
        now = time.monotonic()
        if interrupted and stop_reason is None:
            stop_reason = f"received {_signal_name(interrupted[0])}"
            first_failure = 128 + interrupted[0]
        if timeout_s is not None and stop_reason is None and now - start > timeout_s:
            stop_reason = f"timed out after {timeout_s:g} s"
            first_failure = TIMEOUT_EXIT_CODE
            stop_at = now  # a timeout stops everything at once
            say(f"{stop_reason}; sending SIGTERM to {len(running)} process(es)")
        if stop_reason is None or not running:
            continue
        if stop_at is None:
            stop_at = now + grace_s
            say(
                f"{stop_reason}; stopping the other {len(running)} process(es) "
                f"(SIGTERM in {grace_s:g} s if still running)"
            )
        if terminated_at is None and now >= stop_at:
            terminated_at = now
            for child in running.values():
                child.terminated_by_launcher = True
                child.signal(signal.SIGTERM)
        elif terminated_at is not None and now >= terminated_at + grace_s:
            for child in running.values():
                child.signal(signal.SIGKILL)
    return first_failure or 0


def _is_casualty(child, code: int, interrupted, heartbeats) -> bool:
    """Whether ``child`` failed only because a peer went away (read once its stderr is in)."""
    if code == 0 or interrupted or child.terminated_by_launcher or heartbeats is None:
        return False
    for reader in child.readers:
        reader.join(timeout=2)
    return child.index in heartbeats.lost_a_peer and child.index not in heartbeats.unhealthy


def _hung_peers(child, running, heartbeats) -> list[tuple[int, int]]:
    """``[(hung process, reporter)]``: still-running processes the coordination service reported
    unhealthy, read from stderr once the exited ``child``'s output is all in."""
    if heartbeats is None:
        return []
    for reader in child.readers:  # the abort message may still be in the pipe
        reader.join(timeout=2)
    return sorted((p, r) for p, r in heartbeats.unhealthy.items() if p in running)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse would print usage too)
        raise ConfigError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="rljax launch",
        description="Run N cooperating JAX processes on this machine; see rljax/launch.py.",
        usage="%(prog)s --num-processes N [options] -- COMMAND [ARGS...]",
    )
    parser.add_argument("--num-processes", "-n", type=int, required=True, metavar="N")
    parser.add_argument(
        "--devices-per-process",
        type=int,
        default=None,
        metavar="D",
        help="sets JAX_NUM_CPU_DEVICES",
    )
    parser.add_argument("--cpu", action="store_true", help="sets JAX_PLATFORMS=cpu")
    parser.add_argument(
        "--port", type=int, default=None, metavar="P", help="coordinator port (default: a free one)"
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=None,
        metavar="S",
        help="wall-clock limit in seconds (exit 124)",
    )
    parser.add_argument(
        "--grace",
        type=float,
        default=5.0,
        metavar="S",
        help="after a failure: seconds before SIGTERM to the others, then before SIGKILL",
    )
    parser.add_argument(
        "--heartbeat-timeout",
        type=int,
        default=None,
        metavar="S",
        help="seconds after which a silent process counts as dead (default 30)",
    )
    parser.add_argument("--module", default=None, help="run `python -m MODULE ARGS...`")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        split = argv.index("--")
        options, command = argv[:split], argv[split + 1 :]
    else:
        options, command = argv, []
    try:
        args = _parser().parse_args(options)
        return launch(
            command,
            args.num_processes,
            args.devices_per_process,
            module=args.module,
            port=args.port,
            cpu=args.cpu,
            timeout_s=args.timeout,
            grace_s=args.grace,
            heartbeat_timeout_s=args.heartbeat_timeout,
        )
    except ConfigError as error:
        print(f"launch: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
