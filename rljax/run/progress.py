"""What a run prints: compile lines, progress with steps/s and an ETA, and the closing summary.

    console = Console(print, tty=sys.stdout.isatty())
    with console.compiling("the update chunk"):      # a line before, one after, ticks between
        ...
    progress = Progress(console, loop)                # a hook (a line per chunk) and, entered,
    with progress:                                    # a ticker thread that estimates progress
        loop.run(state)                               # while a long chunk blocks the host
    summary = run_summary(loop, ...); console.line(format_summary(summary))

A chunk is one blocking compiled call, so a daemon thread reports meanwhile: from the seconds
the chunk has run and the measured seconds per update (``Loop.seconds_per_update``) it estimates
the update reached. On a terminal (``tty``) that estimate redraws one status line with ``\\r``
every ``interval`` seconds (default 1); otherwise (logs, CI, pytest capture, a ``progress``
callable) it is a plain full line, only when nothing was printed for ``interval`` seconds (default
15), and no control characters are ever written. The line at the end of each chunk is always a
full line. ``Console(None)`` (quiet, processes other than 0) prints nothing and starts no thread.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import threading
import time

import numpy as np

from rljax.run.loop import ChunkInfo, Loop

FINAL_WINDOW = 10  # the final training return: mean of the last updates that finished episodes


def duration(seconds: float) -> str:
    """``"42 s"``, ``"3m07s"``, ``"2h05m"``."""
    if not math.isfinite(seconds):
        return "?"
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class Console:
    """Full lines through ``say``; transient status lines (redrawn on a terminal, rate-limited
    full lines otherwise). Thread-safe: the ticker and the loop share it."""

    def __init__(self, say=print, *, tty: bool = False, interval: float | None = None, stream=None):
        self.say = say
        self.enabled = say is not None
        self.tty = tty and self.enabled
        self.interval = interval if interval is not None else (1.0 if self.tty else 15.0)
        self.stream = stream or sys.stdout
        self._lock = threading.Lock()
        self._status_width = 0
        self.last_output = time.perf_counter()

    def line(self, text: str) -> None:
        if not self.enabled:
            return
        with self._lock:
            self._clear_status()
            self.say(text)
            self.last_output = time.perf_counter()

    def status(self, text: str) -> None:
        """A progress estimate: redrawn in place on a terminal; elsewhere a full line, at most
        one per ``interval`` seconds of silence."""
        if not self.enabled:
            return
        with self._lock:
            now = time.perf_counter()
            if self.tty:
                pad = max(0, self._status_width - len(text))
                self.stream.write("\r" + text + " " * pad)
                self.stream.flush()
                self._status_width = len(text)
            elif now - self.last_output >= self.interval:
                self.say(text)
                self.last_output = now

    def _clear_status(self) -> None:
        if self._status_width:
            self.stream.write("\r" + " " * self._status_width + "\r")
            self.stream.flush()
            self._status_width = 0

    @contextlib.contextmanager
    def ticking(self, status_fn):
        """While entered, ``status(status_fn())`` every ``interval`` seconds on a daemon thread."""
        if not self.enabled:
            yield
            return
        stop = threading.Event()

        def tick():
            while not stop.wait(self.interval if self.tty else min(self.interval, 1.0)):
                text = status_fn()
                if text:
                    self.status(text)

        thread = threading.Thread(target=tick, name="rljax-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join(timeout=5)
            with self._lock:
                self._clear_status()

    @contextlib.contextmanager
    def compiling(self, what: str):
        """``compiling <what> ...`` before, ``still compiling (N s)`` ticks, ``compiled in`` after
        (the caller prints the timings; this prints the start and the ticks)."""
        t0 = time.perf_counter()
        self.line(f"compiling {what} (once per run; this can take a minute) ...")
        with self.ticking(lambda: f"  still compiling ({duration(time.perf_counter() - t0)})"):
            yield


class Progress:
    """A hook: ``  update     25/976  env steps     12,800       4,607 steps/s  ETA 1m52s  return
    77.4  eval 500.0`` after each chunk (wall-clock steps/s of all seeds; ETA from the wall time
    per update so far); entered, the ticker's estimate while a chunk runs."""

    def __init__(self, console: Console, loop: Loop):
        self.console, self.loop = console, loop

    def eta(self, update: float) -> float:
        loop = self.loop
        done = update - loop.start_update
        if done <= 0:
            return math.nan
        return (loop.num_updates - update) * loop.wall_seconds() / done

    def __call__(self, info: ChunkInfo) -> None:
        loop = info.loop
        recent = np.mean([r["episode_return"] for r in info.rows])
        last = info.rows[-1]
        evaluated = f"  eval {last['eval_return']:8.1f}" if "eval_return" in last else ""
        self.console.line(
            f"  update {info.update:>6}/{info.num_updates}  env steps "
            f"{info.update * loop.env_steps_per_update:>10,}  {loop.steps_per_second():>10,.0f} "
            f"steps/s  ETA {duration(self.eta(info.update)):>6}  return {recent:8.1f}{evaluated}"
        )

    def estimate(self) -> str | None:
        """The ticker's line while a chunk runs (None between chunks)."""
        loop, chunk = self.loop, self.loop.chunk
        if chunk is None:
            return None
        first, count, started = chunk
        running = time.perf_counter() - started
        per_update = loop.seconds_per_update()
        if per_update is None:  # the first chunk: nothing measured yet
            return (
                f"  update {first:>6}/{loop.num_updates}  first chunk of {count} updates running "
                f"for {duration(running)}"
            )
        update = first + min(count, running / per_update)
        steps = update * loop.env_steps_per_update
        rate = loop.env_steps_per_update * loop.sharded.num_seeds / per_update
        return (
            f"  update ~{update:>5.0f}/{loop.num_updates}  env steps ~{steps:>9,.0f}  "
            f"{rate:>10,.0f} steps/s  ETA {duration(self.eta(update)):>6}  (in a chunk)"
        )

    def __enter__(self):
        self._ticking = self.console.ticking(self.estimate)
        self._ticking.__enter__()
        return self

    def __exit__(self, *exc):
        return self._ticking.__exit__(*exc)


# -- the end of a run -----------------------------------------------------------------------------
def final_training_return(rows, window: int = FINAL_WINDOW) -> dict:
    """Mean ± std over seeds of each seed's mean return over the last ``window`` rows that
    finished episodes (``rows``: the loop's retained rows)."""
    rows = [r for r in rows if np.all(np.asarray(r.get("episodes", 1)) > 0)][-window:]
    if not rows:
        return {"mean": None, "std": None, "seeds": 0, "updates": 0}
    key = "episode_return_per_seed" if "episode_return_per_seed" in rows[0] else "episode_return"
    per_seed = np.asarray([np.atleast_1d(np.asarray(r[key], float)) for r in rows]).mean(0)
    return {
        "mean": float(per_seed.mean()),
        "std": float(per_seed.std()),
        "seeds": int(per_seed.size),
        "updates": len(rows),
    }


def final_evaluation(evaluation) -> dict | None:
    """The latest evaluation's mean return and 95 % t-interval over its episodes (all seeds)."""
    if evaluation is None or evaluation.last_returns is None:
        return None
    from rljax.run.stats import mean_ci

    returns = np.asarray(evaluation.last_returns, float).ravel()
    mean, half = mean_ci(returns)
    return {
        "mean": float(mean),
        "ci95": float(half) if np.isfinite(half) else None,
        "episodes": int(returns.size),
        "update": evaluation.last_update,
    }


def run_summary(loop: Loop, *, wall_seconds, compile_seconds, evaluation, files, stop_reason):
    """The closing figures (``TrainResult.summary``, ``summary.json``)."""
    seeds = loop.sharded.num_seeds
    return {
        "updates_done": loop.update,
        "num_updates": loop.num_updates,
        "env_steps": loop.update * loop.env_steps_per_update,  # per seed
        "env_steps_all_seeds": loop.update * loop.env_steps_per_update * seeds,
        "wall_seconds": wall_seconds,
        "compile_seconds": float(sum(compile_seconds.values())),
        "steps_per_second": loop.steps_per_second(),
        "compiled_steps_per_second": loop.compiled_steps_per_second(),
        "final_training_return": final_training_return(loop.rows),
        "final_eval_return": final_evaluation(evaluation),
        "stop_reason": stop_reason,
        "files": {k: str(v) for k, v in files.items()},
    }


def format_summary(summary: dict) -> str:
    """The closing lines printed at the end of a run."""
    s = summary
    lines = [
        f"done: {s['updates_done']}/{s['num_updates']} updates, {s['env_steps']:,} env steps "
        f"in {duration(s['wall_seconds'])} (compile {s['compile_seconds']:.1f} s)"
        + (f", stopped: {s['stop_reason']}" if s["stop_reason"] else ""),
        f"  throughput       {s['steps_per_second']:,.0f} env steps/s wall clock (host work "
        f"included), {s['compiled_steps_per_second']:,.0f} inside compiled chunks",
    ]
    train = s["final_training_return"]
    if train["mean"] is not None:
        spread = f" ± {train['std']:.1f} (std)" if train["seeds"] > 1 else ""
        lines.append(
            f"  training return  {train['mean']:.1f}{spread} over {train['seeds']} seed(s), "
            f"mean of the last {train['updates']} updates"
        )
    ev = s["final_eval_return"]
    if ev is not None:
        ci = f" ± {ev['ci95']:.1f} (95 % CI)" if ev["ci95"] is not None else ""
        lines.append(
            f"  eval return      {ev['mean']:.1f}{ci} over {ev['episodes']} greedy episodes "
            f"at update {ev['update']}"
        )
    files = s["files"]
    if files:
        lines.append("files:")
        lines += [f"  {name:<18} {path}" for name, path in files.items()]
    return "\n".join(lines)


def write_summary(path, summary: dict) -> None:
    """``summary`` as strict JSON (NaN/Inf as null)."""

    def finite(value):
        if isinstance(value, dict):
            return {k: finite(v) for k, v in value.items()}
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    with open(path, "w") as f:
        f.write(json.dumps(finite(summary), indent=2) + "\n")
