"""Console progress: compile lines, a ticker during long chunks, clean non-TTY output, the
closing summary. Stand-in runs (nothing compiled); the real thing: tests/run/test_training.py."""

import io
import json
import threading
import time

import numpy as np

from rljax.run.loop import Loop
from rljax.run.progress import Console, Progress, format_summary, run_summary, write_summary


class SleepyRun:
    """Chunks that block ``seconds`` each; metrics like a real run's."""

    def __init__(self, chunk_size: int, seconds: float, num_seeds: int = 1):
        self.chunk_size, self.seconds, self.num_seeds = chunk_size, seconds, num_seeds

    def run_chunk(self, state, count):
        time.sleep(self.seconds)
        shape = (self.chunk_size, self.num_seeds) if self.num_seeds > 1 else (self.chunk_size,)
        ret = np.full(shape, 100.0 + state, np.float32)
        return state + count, {"episode_return": ret, "episodes": np.ones(shape, np.float32)}


def run_with_progress(console, run, num_updates):
    loop = Loop(run, num_updates, env_steps_per_update=100)
    progress = Progress(console, loop)
    loop.add_hook(progress)
    with progress:
        loop.run(0)
    return loop


def test_non_tty_progress_ticks_during_a_long_chunk_with_plain_lines():
    lines = []
    console = Console(lines.append, interval=0.3)
    loop = run_with_progress(console, SleepyRun(chunk_size=4, seconds=1.0), num_updates=8)
    chunk_ends = [line for line in lines if "ETA" in line and "in a chunk" not in line]
    assert len(chunk_ends) == 2 and chunk_ends[-1].startswith("  update      8/8")
    assert "steps/s" in chunk_ends[0] and "ETA" in chunk_ends[0]
    assert any("first chunk of 4 updates running" in line for line in lines)
    ticks = [line for line in lines if "(in a chunk)" in line]  # estimates in the 2nd chunk
    assert ticks and all("update ~" in t and "ETA" in t for t in ticks)
    assert not any("\r" in line or "\x1b" in line for line in lines)  # no control characters
    assert loop.update == 8


def test_tty_progress_redraws_one_line_and_clears_it_before_a_full_line():
    lines, stream = [], io.StringIO()
    console = Console(lines.append, tty=True, interval=0.1, stream=stream)
    run_with_progress(console, SleepyRun(chunk_size=2, seconds=0.5), num_updates=4)
    assert stream.getvalue().count("\r") >= 4 and "first chunk" in stream.getvalue()
    assert len(lines) == 2 and not any("\r" in line for line in lines)


def test_quiet_prints_nothing_and_starts_no_thread():
    console = Console(None)
    before = threading.active_count()
    with console.compiling("x"):
        assert threading.active_count() == before
    run_with_progress(console, SleepyRun(chunk_size=2, seconds=0.0), num_updates=4)
    console.line("hello")  # nothing, and no error


def test_compiling_prints_a_line_before_and_ticks_while_it_runs():
    lines = []
    console = Console(lines.append, interval=0.2)
    with console.compiling("the update chunk (5 updates)"):
        time.sleep(0.7)
    assert lines[0] == (
        "compiling the update chunk (5 updates) (once per run; this can take a minute) ..."
    )
    assert any(line.startswith("  still compiling (") for line in lines[1:])


class FakeEvaluation:
    last_returns = np.array([[490.0, 500.0, 500.0], [500.0, 480.0, 500.0]])  # [seeds, episodes]
    last_update = 8


def test_summary_has_both_throughputs_final_returns_with_intervals_and_files():
    loop = run_with_progress(Console(None), SleepyRun(2, 0.01, num_seeds=2), num_updates=8)
    summary = run_summary(
        loop, wall_seconds=12.5, compile_seconds={"init": 1.0, "chunk": 2.5},
        evaluation=FakeEvaluation(), files={"metrics": "runs/x/metrics.jsonl"}, stop_reason=None,
    )  # fmt: skip
    assert summary["steps_per_second"] == loop.steps_per_second()
    assert summary["compiled_steps_per_second"] == loop.compiled_steps_per_second()
    assert summary["env_steps_all_seeds"] == 8 * 100 * 2 and summary["compile_seconds"] == 3.5
    train = summary["final_training_return"]
    assert train["seeds"] == 2 and train["updates"] == 8 and train["std"] == 0.0
    ev = summary["final_eval_return"]
    assert ev["episodes"] == 6 and np.isclose(ev["mean"], 495.0) and 0 < ev["ci95"] < 20
    text = format_summary(summary)
    assert text.startswith("done: 8/8 updates, 800 env steps in 12 s (compile 3.5 s)")
    assert "wall clock" in text and "inside compiled chunks" in text
    assert "over 2 seed(s)" in text and "(95 % CI) over 6 greedy episodes at update 8" in text
    assert text.endswith("  metrics            runs/x/metrics.jsonl")


def test_summary_json_is_strict_json(tmp_path):
    write_summary(tmp_path / "s.json", {"a": float("nan"), "b": {"c": float("inf"), "d": 1.5}})
    assert json.loads((tmp_path / "s.json").read_text()) == {"a": None, "b": {"c": None, "d": 1.5}}
