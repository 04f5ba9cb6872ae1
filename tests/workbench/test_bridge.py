"""EventBatcher: few ticks for many steps, discrete events exactly once and in order, clean shutdown."""

from __future__ import annotations

import threading
import time

import pytest

from engine.events import Eval, Log, LossScaleChange, MemorySnapshot, RankStats, StepEnd, Traffic, to_json
from nanodist_tui.bridge import EventBatcher
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.history import History


def step(i: int) -> StepEnd:
    return StepEnd(
        step=i,
        loss=5.0 - i * 1e-4,
        lr=1e-3,
        tokens=256,
        step_time_s=0.01,
        tokens_per_s=25_600.0,
        grad_norm=1.0,
    )


def rank_stats(i: int, rank: int) -> RankStats:
    return RankStats(step=i, rank=rank, step_time_s=0.01, comm_wait_s=0.002, bytes_sent=1024 * i)


class Recorder:
    """Stands in for `App.post_message`: keeps every tick, thread-safe like the real one."""

    def __init__(self, accept: int | None = None) -> None:
        self.ticks: list[Tick] = []
        self.times: list[float] = []
        self.accept = accept  # accept this many ticks, then answer False as a closing app does
        self.lock = threading.Lock()

    def __call__(self, tick: Tick) -> bool:
        with self.lock:
            if self.accept is not None and len(self.ticks) >= self.accept:
                return False
            self.ticks.append(tick)
            self.times.append(time.monotonic())
            return True

    def events(self) -> list:
        return [event for tick in self.ticks for event in tick.events]

    def steps(self) -> list[StepEnd]:
        return [s for tick in self.ticks for s in tick.steps]


def run_in_thread(batcher: EventBatcher, events: list) -> None:
    """Emit from another thread, as the engine does, then close as the app's worker does."""
    batcher.start()
    emitter = threading.Thread(target=lambda: [batcher.emit(e) for e in events])
    emitter.start()
    emitter.join()
    batcher.close()


def test_five_thousand_steps_make_a_handful_of_ticks_with_the_latest_values():
    recorder = Recorder()
    batcher = EventBatcher(recorder)
    events = []
    for i in range(5000):
        events += [step(i), rank_stats(i, 0), rank_stats(i, 1)]
    run_in_thread(batcher, events)

    assert 1 <= len(recorder.ticks) <= 5
    last = recorder.ticks[-1]
    assert last.steps[-1].step == 4999
    assert last.rank_stats[0].step == last.rank_stats[1].step == 4999
    # Steps are accumulated, not dropped: every one arrives once, in order.
    assert [s.step for s in recorder.steps()] == list(range(5000))
    assert [t.seq for t in recorder.ticks] == list(range(len(recorder.ticks)))


def test_every_discrete_event_arrives_exactly_once_in_order():
    recorder = Recorder()
    batcher = EventBatcher(recorder)
    events, discrete = [], []
    for i in range(5000):
        events.append(step(i))
        if i % 7 == 0:
            extra = Log(level="info", message=f"line {i}") if i % 2 else Eval(step=i, val_loss=1.0)
            if i % 1001 == 0:
                extra = LossScaleChange(
                    step=i, reason="inf", old_scale=2.0**16, new_scale=2.0**15, first_param="wte"
                )
            events.append(extra)
            discrete.append(extra)
    run_in_thread(batcher, events)

    received = recorder.events()
    assert len(received) == len(discrete)
    assert all(a is b for a, b in zip(received, discrete, strict=True))


def test_ticks_are_rate_limited_while_the_engine_keeps_emitting():
    recorder = Recorder()
    batcher = EventBatcher(recorder, interval_s=0.1)
    batcher.start()
    i, start = 0, time.monotonic()
    while time.monotonic() - start < 0.6:
        batcher.emit(step(i))
        i += 1
        time.sleep(0.0005)
    batcher.close()

    assert len(recorder.ticks) <= 0.6 / 0.1 + 2
    # Every gap between timed ticks respects the interval; the closing flush may come early.
    gaps = [b - a for a, b in zip(recorder.times[:-2], recorder.times[1:-1])]
    assert all(gap >= 0.09 for gap in gaps)
    assert len(recorder.steps()) == i


def test_a_lone_event_is_posted_promptly_not_held_until_the_next_one():
    recorder = Recorder()
    batcher = EventBatcher(recorder, interval_s=0.1)
    batcher.start()
    batcher.emit(step(0))
    time.sleep(0.05)
    batcher.emit(Log(level="info", message="after a quiet spell"))
    deadline = time.monotonic() + 1.0
    while len(recorder.events()) < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        assert [e.message for e in recorder.events()] == ["after a quiet spell"]
    finally:
        batcher.close()


def test_the_flusher_sleeps_while_nothing_happens():
    batcher = EventBatcher(Recorder(), interval_s=0.05)
    flushes = []
    real_flush = batcher.flush
    batcher.flush = lambda: (flushes.append(1), real_flush())
    batcher.start()
    for i in range(3):
        batcher.emit(step(i))
        time.sleep(0.01)
    time.sleep(0.5)
    batcher.close()
    assert len(flushes) <= 4  # one per interval with news, not a busy loop


def snapshot(step: int, phase: str) -> MemorySnapshot:
    return MemorySnapshot(step=step, rank=1, phase=phase, current={"parameters": 10}, peak={"parameters": 10})


def test_snapshots_keep_the_latest_value_per_rank_across_ticks():
    recorder = Recorder()
    batcher = EventBatcher(recorder)
    forward, backward = snapshot(0, "forward"), snapshot(0, "backward")
    traffic = Traffic(
        step=0, rank=0, links=[{"src": 0, "dst": 1, "phase": "reduce_scatter", "bytes": 8, "seconds": 0.001}]
    )
    for event in (rank_stats(0, 0), rank_stats(0, 1), forward, backward, traffic):
        batcher.emit(event)
    batcher.flush()
    later_forward = snapshot(1, "forward")
    batcher.emit(rank_stats(1, 0))
    batcher.emit(later_forward)
    batcher.flush()

    first, second = recorder.ticks
    assert first.memory == {(1, "forward"): forward, (1, "backward"): backward}  # one per phase
    assert first.traffic == {0: traffic}
    assert second.rank_stats[0].step == 1
    assert second.rank_stats[1].step == 0  # rank 1 did not report again: its last value stays
    assert second.memory == {(1, "forward"): later_forward, (1, "backward"): backward}


def test_flush_with_nothing_new_posts_nothing():
    recorder = Recorder()
    batcher = EventBatcher(recorder)
    batcher.flush()
    batcher.emit(step(0))
    batcher.flush()
    batcher.flush()
    assert len(recorder.ticks) == 1


def test_too_many_steps_for_one_tick_keeps_the_newest_and_counts_the_rest():
    recorder = Recorder()
    batcher = EventBatcher(recorder, max_steps_per_tick=100)
    for i in range(250):
        batcher.emit(step(i))
    batcher.flush()
    (tick,) = recorder.ticks
    assert [s.step for s in tick.steps] == list(range(150, 250))
    assert tick.dropped_steps == 150


@pytest.mark.parametrize("failure", ["returns_false", "raises"])
def test_a_closing_app_stops_the_posting(failure):
    recorder = Recorder(accept=1)
    calls = []

    def post(tick: Tick) -> bool:
        calls.append(tick)
        if failure == "raises" and len(calls) > 1:
            raise RuntimeError("Event loop is closed")
        return recorder(tick)

    batcher = EventBatcher(post)
    batcher.emit(step(0))
    batcher.flush()
    batcher.emit(step(1))
    batcher.flush()  # refused: from now on nothing is posted
    batcher.emit(step(2))
    batcher.flush()
    batcher.close()
    assert len(calls) == 2
    assert len(recorder.ticks) == 1


def test_close_ends_the_flusher_thread():
    batcher = EventBatcher(Recorder())
    batcher.start()
    batcher.emit(step(0))
    batcher.close()
    batcher.close()
    assert not [t for t in threading.enumerate() if t.name == "nanodist-ticks"]


class CloseWhileClearing(threading.Event):
    """The flusher's wake event; its first clear() (the flusher, inside flush) starts close() on another
    thread and gives it a moment to run first: the window in which a wake meant for stopping could be lost."""

    def __init__(self, batcher_ref: list) -> None:
        super().__init__()
        self.batcher_ref = batcher_ref
        self.closer: threading.Thread | None = None

    def clear(self) -> None:
        if self.closer is None and threading.current_thread().name == "nanodist-ticks":
            batcher = self.batcher_ref[0]
            self.closer = threading.Thread(target=batcher.close, daemon=True)
            self.closer.start()
            batcher._stopping.wait(0.3)  # an unguarded close() sets it at once; a guarded one waits for us
        super().clear()


def test_close_while_the_flusher_is_flushing_does_not_hang():
    ref: list = []
    batcher = EventBatcher(Recorder())
    ref.append(batcher)
    batcher._wake = wake = CloseWhileClearing(ref)
    batcher.start()
    batcher.emit(step(0))  # wakes the flusher, which flushes, and close() races its clear()
    deadline = time.monotonic() + 5
    while wake.closer is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert wake.closer is not None, "the flusher never flushed"
    wake.closer.join(timeout=3)
    assert not wake.closer.is_alive(), "close() hung: the flusher missed its wake-up"
    assert not [t for t in threading.enumerate() if t.name == "nanodist-ticks"]


def test_only_a_snapshot_only_tick_may_be_superseded():
    def tick(**overrides) -> Tick:
        fields = dict(seq=0, steps=(), dropped_steps=0, rank_stats={}, memory={}, traffic={}, events=())
        return Tick(**{**fields, **overrides})

    newer = tick(seq=1)
    assert tick(rank_stats={0: rank_stats(0, 0)}).can_replace(newer)
    assert not tick(steps=(step(0),)).can_replace(newer)
    assert not tick(events=(Log(level="info", message="x"),)).can_replace(newer)
    assert not tick(dropped_steps=3).can_replace(newer)


def test_history_stays_bounded_and_spans_the_whole_run():
    history = History(capacity=64)
    for i in range(100_000):
        history.append(i, float(i))
    assert len(history.xs) < 64
    assert history.xs[0] == 0
    xs, ys = history.points(max_points=20)
    assert len(xs) <= 21 and xs[-1] == 99_999 and ys[-1] == 99_999.0
    gaps = {b - a for a, b in zip(history.xs, history.xs[1:])}
    assert len(gaps) == 1  # evenly spaced


def test_json_dicts_from_other_processes_are_decoded():
    recorder = Recorder()
    batcher = EventBatcher(recorder)
    batcher.emit(to_json(step(3)))
    batcher.emit(to_json(Log(level="info", message="from rank 1")))
    batcher.flush()
    (tick,) = recorder.ticks
    assert tick.steps == (step(3),)
    assert tick.events == (Log(level="info", message="from rank 1"),)
