"""The one host loop: hook cadence (every=N crossings, at_end), stop, rewind, state replacement.

A stand-in for ShardedRun (numpy "updates", nothing compiled) keeps these instant; train() with
real hooks: tests/run/test_training.py, test_resume.py, test_run_log.py."""

import time

import numpy as np
import pytest

from rljax.run.loop import Hook, Loop


class CountingRun:
    """``run_chunk`` adds one per update to the state; metrics: the update numbers."""

    def __init__(self, chunk_size: int, num_seeds: int = 1):
        self.chunk_size, self.num_seeds, self.calls = chunk_size, num_seeds, []

    def run_chunk(self, state, count):
        self.calls.append(count)
        updates = np.zeros((self.chunk_size, self.num_seeds), np.float32)
        updates[:count] = state + 1 + np.arange(count)[:, None]
        if self.num_seeds == 1:
            updates = updates[:, 0]
        return state + count, {"episode_return": updates, "loss": updates * 0}


def record(calls, name):
    return lambda info: calls.append((name, info.update))


def test_every_fires_at_chunks_crossing_a_multiple_and_at_end_once():
    run = CountingRun(chunk_size=3)
    loop = Loop(run, num_updates=10, env_steps_per_update=8)
    calls = []
    loop.add_hook(record(calls, "every4"), every=4)
    loop.add_hook(record(calls, "end"), every=None, at_end=True)
    loop.add_hook(record(calls, "every4+end"), every=4, at_end=True)
    loop.add_hook(record(calls, "chunk"))
    loop.add_hook(record(calls, "every5+end"), every=5, at_end=True)  # 10 crosses 10: fires once
    assert loop.run(0) == 10 and run.calls == [3, 3, 3, 1]
    by_name = {}
    for name, update in calls:
        by_name.setdefault(name, []).append(update)
    assert by_name == {
        "every4": [6, 9],  # chunk ends 3, 6, 9, 10: 6 crosses 4, 9 crosses 8
        "end": [10],
        "every4+end": [6, 9, 10],
        "chunk": [3, 6, 9, 10],
        "every5+end": [6, 10],
    }
    assert [r["update"] for r in loop.rows] == list(range(1, 11))
    assert loop.rows[-1]["env_steps"] == 80 and loop.rows[-1]["episode_return"] == 10


def test_hooks_get_host_rows_and_may_add_columns():
    loop = Loop(CountingRun(chunk_size=2, num_seeds=3), num_updates=4)
    seen = []

    def add(info):
        info.rows[-1]["extra"] = info.update

    loop.add_hook(add, every=4)
    loop.add_hook(lambda info: seen.append((info.metrics["episode_return"].shape, info.rows)))
    loop.run(0)
    assert [shape for shape, _ in seen] == [(2, 3), (2, 3)]  # per-seed metrics of the chunk
    row = seen[-1][1][-1]
    assert row["update"] == 4 and row["extra"] == 4
    assert row["episode_return"] == 4.0 and list(row["episode_return_per_seed"]) == [4, 4, 4]
    assert [r.get("extra") for r in loop.rows] == [None, None, None, 4]


def test_stop_request_ends_after_the_chunk_and_runs_pending_at_end_hooks():
    loop = Loop(CountingRun(chunk_size=2), num_updates=20)
    calls = []
    loop.add_hook(lambda info: calls.append(("save", info.update, info.stop_reason)), every=10,
                  at_end=True)  # fmt: skip
    loop.add_hook(lambda info: info.update >= 6 and info.loop.request_stop("enough"))
    loop.add_hook(record(calls, "chunk"))
    assert loop.run(0) == 6 and loop.stop_reason == "enough"
    assert calls[-2:] == [("chunk", 6), ("save", 6, "enough")]  # the save hook, after a stop
    assert [r["update"] for r in loop.rows] == list(range(1, 7))


def test_rewind_skips_the_rest_of_the_chunk_and_forgets_later_rows():
    loop = Loop(CountingRun(chunk_size=2), num_updates=8)
    calls = []

    def rollback_once(info):
        if info.update == 6 and not calls.count(("rewound", 6)):
            calls.append(("rewound", 6))
            info.loop.rewind(2, 2)

    loop.add_hook(rollback_once)
    loop.add_hook(record(calls, "after"))
    assert loop.run(0) == 8
    assert [u for name, u in calls if name == "after"] == [2, 4, 4, 6, 8]  # 6 skipped once
    assert [r["update"] for r in loop.rows] == list(range(1, 9))  # none doubled


def test_replace_state_and_first_hooks_run_before_the_others():
    loop = Loop(CountingRun(chunk_size=5), num_updates=10)
    seen = []
    loop.add_hook(lambda info: seen.append(info.state))
    loop.add_hook(Hook(lambda info: info.loop.replace_state(info.state + 100), first=True))
    assert loop.run(0) == 210  # 0+5 -> 105 -> +5 -> 110 -> 210
    assert seen == [105, 210]


def test_every_must_be_positive():
    with pytest.raises(ValueError, match="every must be >= 1"):
        Loop(CountingRun(1), 1).add_hook(print, every=0)


class SlowRun(CountingRun):
    """Each chunk blocks ``seconds`` (a long compiled call)."""

    def __init__(self, chunk_size: int, seconds: float, num_seeds: int = 1):
        super().__init__(chunk_size, num_seeds)
        self.seconds = seconds

    def run_chunk(self, state, count):
        time.sleep(self.seconds)
        return super().run_chunk(state, count)


def test_loop_memory_is_bounded_to_the_last_rows():
    loop = Loop(CountingRun(chunk_size=7), num_updates=5000, keep_rows=50)
    held = []
    loop.add_hook(lambda info: held.append(len(info.loop.rows)))
    loop.run(0)
    assert len(held) == 715 and max(held) <= 50  # 5000 updates, never more than 50 rows held
    assert [r["update"] for r in loop.rows] == list(range(4951, 5001))


def test_rows_carry_wall_time_and_steps_per_second_and_both_throughputs_are_defined_once():
    loop = Loop(SlowRun(chunk_size=2, seconds=0.05, num_seeds=2), 6, env_steps_per_update=10)
    loop.add_hook(lambda info: time.sleep(0.1))  # host work: counts in wall clock only
    loop.run(0)
    assert [r["update"] for r in loop.rows] == list(range(1, 7))
    times = [r["wall_time"] for r in loop.rows]
    assert times == sorted(times) and times[0] >= 0.05
    assert loop.env_steps_done() == 6 * 10 * 2  # all seeds
    assert loop.compiled_steps_per_second() == pytest.approx(120 / loop.compiled_seconds)
    assert loop.compiled_seconds >= 0.15 and loop.wall_seconds() >= loop.compiled_seconds + 0.3
    assert loop.steps_per_second() == pytest.approx(120 / loop.wall_seconds(), rel=0.05)
    assert loop.steps_per_second() < loop.compiled_steps_per_second()
    assert loop.rows[-1]["steps_per_second"] >= loop.steps_per_second()  # before the last hook


def test_a_stop_makes_later_at_end_hooks_run_in_the_same_pass():
    loop = Loop(CountingRun(chunk_size=2), num_updates=20)
    calls = []
    loop.add_hook(lambda info: info.update >= 4 and info.loop.request_stop("signal"))
    loop.add_hook(lambda info: calls.append(("eval", info.update, info.at_end)), every=10,
                  at_end=True)  # fmt: skip
    loop.add_hook(lambda info: calls.append(("log", info.update, info.at_end)))
    assert loop.run(0) == 4
    assert calls[-2:] == [("eval", 4, True), ("log", 4, True)]  # evaluated before it is logged


# -- pipelining: the next chunk is dispatched before hooks that do not read the state -----------
class Donated:
    """A state the next chunk consumes (like a donated jax array): reading it afterwards fails."""

    def __init__(self, value):
        self.value, self.consumed = value, False

    def read(self):
        assert not self.consumed, "read a state the next chunk consumed"
        return self.value


class CheckedRun(CountingRun):
    """``run_chunk_checked`` (NaN/inf counts, as ShardedRun) on ``Donated`` states; ``events``:
    ``("dispatch", first_update)`` in the order the loop dispatched the chunks."""

    def __init__(self, chunk_size: int, events: list):
        super().__init__(chunk_size)
        self.events = events

    def run_chunk_checked(self, state, count):
        value = state.read()
        state.consumed = True
        self.events.append(("dispatch", value))
        new, metrics = self.run_chunk(value, count)
        return Donated(new), metrics, np.zeros(1, np.int32)


def test_the_next_chunk_runs_during_hooks_that_do_not_read_the_state():
    events = []
    loop = Loop(CheckedRun(chunk_size=2, events=events), num_updates=8)
    loop.add_hook(lambda info: events.append(("log", info.update)), reads_state=False)
    loop.add_hook(lambda info: events.append(("save", info.update, info.state.read())), every=4)
    assert loop.run(Donated(0)).read() == 8
    assert events == [
        ("dispatch", 0), ("dispatch", 2), ("log", 2),  # pipelined: no state hook at 2
        ("log", 4), ("save", 4, 4), ("dispatch", 4),  # the save reads update 4: waits for it
        ("dispatch", 6), ("log", 6),
        ("log", 8), ("save", 8, 8),  # the end: nothing left to dispatch
    ]  # fmt: skip
    assert loop.pipelined_chunks == 2
    assert [r["update"] for r in loop.rows] == list(range(1, 9))


def test_a_skipped_state_hook_is_asked_once_per_boundary_and_does_not_hold_the_next_chunk():
    events, asked = [], []

    def skip(update):  # e.g. a checkpoint younger than its time floor: only update 4 is due
        asked.append(update)
        return update != 4

    loop = Loop(CheckedRun(chunk_size=2, events=events), num_updates=8)
    loop.add_hook(lambda info: events.append(("log", info.update)), reads_state=False)
    save = lambda info: events.append(("save", info.update, info.state.read()))  # noqa: E731
    loop.add_hook(save, every=2, at_end=True, skip=skip)
    assert loop.run(Donated(0)).read() == 8
    assert events == [
        ("dispatch", 0), ("dispatch", 2), ("log", 2),  # skipped at 2: pipelined
        ("log", 4), ("save", 4, 4), ("dispatch", 4),  # due at 4: the loop waits for it
        ("dispatch", 6), ("log", 6),
        ("log", 8), ("save", 8, 8),  # at_end always runs, whatever skip says
    ]  # fmt: skip
    assert asked == [2, 4, 6, 8]  # once each: the pipelining decision and the run agree


def test_pipelining_can_be_turned_off_and_needs_the_chunks_own_nonfinite_counts():
    events = []
    loop = Loop(CheckedRun(chunk_size=2, events=events), num_updates=4, pipeline=False)
    loop.add_hook(lambda info: events.append(("log", info.update)), reads_state=False)
    loop.run(Donated(0))
    assert events == [("dispatch", 0), ("log", 2), ("dispatch", 2), ("log", 4)]
    plain = Loop(CountingRun(chunk_size=2), num_updates=4)  # no counts: the guard reads state
    assert not plain.pipeline


def test_a_hook_that_declares_no_state_reads_but_reads_it_gets_one_clear_error():
    loop = Loop(CheckedRun(chunk_size=2, events=[]), num_updates=4)
    loop.add_hook(lambda info: info.state, reads_state=False)
    with pytest.raises(RuntimeError, match="reads_state=False and the next chunk already"):
        loop.run(Donated(0))


def test_a_stop_during_a_pipelined_boundary_ends_after_the_chunk_in_flight():
    events = []
    loop = Loop(CheckedRun(chunk_size=2, events=events), num_updates=20)
    loop.add_hook(lambda info: info.update == 4 and info.loop.request_stop("SIGTERM"),
                  reads_state=False)  # fmt: skip
    save = lambda info: events.append(("save", info.update, info.state.read(), info.stop_reason))  # noqa: E731
    loop.add_hook(save, every=10, at_end=True)
    assert loop.run(Donated(0)).read() == 6
    assert events[-3:] == [("dispatch", 2), ("dispatch", 4), ("save", 6, 6, "SIGTERM")]
    assert [r["update"] for r in loop.rows] == list(range(1, 7))


def test_rewind_or_replace_during_a_pipelined_boundary_drops_the_chunk_in_flight():
    events = []
    loop = Loop(CheckedRun(chunk_size=2, events=events), num_updates=8)
    done = []

    def rollback_once(info):
        if info.update == 6 and not done:
            done.append(6)
            info.loop.rewind(2, Donated(2))  # the state at update 2, e.g. from a checkpoint

    loop.add_hook(rollback_once, reads_state=False)
    loop.add_hook(lambda info: events.append(("log", info.update)), reads_state=False)
    assert loop.run(Donated(0)).read() == 8
    dispatched = [first for name, first, *_ in events if name == "dispatch"]
    assert dispatched == [0, 2, 4, 6, 2, 4, 6]  # the chunk from 6 in flight was dropped
    assert [u for name, u in events if name == "log"] == [2, 4, 4, 6, 8]
    assert [r["update"] for r in loop.rows] == list(range(1, 9))

    loop = Loop(CheckedRun(chunk_size=2, events=[]), num_updates=4)
    loop.add_hook(lambda info: info.update == 2 and info.loop.replace_state(Donated(100)),
                  reads_state=False)  # fmt: skip
    assert loop.run(Donated(0)).read() == 102  # 0 -> 2 (replaced by 100) -> 102
