"""Engine thread -> UI: batch engine events into at most ~10 `Tick` messages a second.

The engine thread only calls `EventBatcher.emit`, which takes a lock, files the event and
returns: it never waits for the UI (design rule 6). A small flusher thread turns what has
piled up into one `Tick` and hands it to `post` (the app's thread-safe `post_message`) at most
once per `interval_s`. Continuous events (StepEnd, RankStats, Traffic, MemorySnapshot,
PipelineTimeline) are coalesced: StepEnds are accumulated for the curves, the rest keep the
latest value per rank (memory: per rank and phase).
Every other event is discrete and is carried, in order, in the next tick; none is dropped
while the app accepts messages. Once `post` returns False (the app is closing) the batcher
stops posting and `emit` becomes a no-op.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from engine.events import MemorySnapshot, PipelineTimeline, RankStats, StepEnd, Traffic, as_event
from nanodist_tui.messages import Tick

# Continuous event type -> (Tick field, key under which its latest value is kept).
_LATEST: dict[type, tuple[str, Callable[[Any], Any]]] = {
    RankStats: ("rank_stats", lambda e: e.rank),
    MemorySnapshot: ("memory", lambda e: (e.rank, e.phase)),  # the ledger reports once per phase
    Traffic: ("traffic", lambda e: e.rank),
    PipelineTimeline: ("pipeline", lambda e: e.rank),  # each pipeline rank's latest step, action by action
}


class EventBatcher:
    """Thread-safe event sink for one run; `emit` may be called from any thread.

    `start()` the flusher before the engine runs; `close()` after it returns (posts what is left).
    """

    def __init__(
        self,
        post: Callable[[Tick], bool],
        *,
        interval_s: float = 0.1,
        max_steps_per_tick: int = 10_000,
    ) -> None:
        self._post = post
        self._interval_s = interval_s
        self._lock = threading.Lock()  # guards the pending batch; held only for list/dict updates
        self._post_lock = threading.Lock()  # keeps ticks in order when close() flushes concurrently
        self._wake = threading.Event()  # set while the batch is non-empty (or the batcher is closing)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._steps: deque[StepEnd] = deque(maxlen=max_steps_per_tick)
        self._steps_seen = 0
        self._events: list[Any] = []
        self._latest: dict[str, dict[Any, Any]] = {field: {} for field, _ in _LATEST.values()}
        self._dirty = False
        self._app_gone = False
        self._last_post = float("-inf")
        self.ticks_posted = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._flush_loop, name="nanodist-ticks", daemon=True)
        self._thread.start()

    def emit(self, event: Any) -> None:
        """File one engine event (or its `to_json` dict, as ranks relay them); never waits for the UI."""
        if self._app_gone:
            return
        event = as_event(event)
        with self._lock:
            if isinstance(event, StepEnd):
                self._steps.append(event)
                self._steps_seen += 1
            elif (latest := _LATEST.get(type(event))) is not None:
                field, key = latest
                self._latest[field][key(event)] = event
            else:
                self._events.append(event)
            if not self._dirty:
                # Set and cleared under the lock, so the flusher is awake exactly when there is news.
                self._dirty = True
                self._wake.set()

    def flush(self) -> None:
        """Post one tick now with whatever is pending (nothing if nothing is)."""
        with self._post_lock:
            with self._lock:
                if not self._dirty or self._app_gone:
                    return
                steps = tuple(self._steps)
                tick = Tick(
                    seq=self.ticks_posted,
                    steps=steps,
                    dropped_steps=self._steps_seen - len(steps),
                    rank_stats=dict(self._latest["rank_stats"]),
                    memory=dict(self._latest["memory"]),
                    traffic=dict(self._latest["traffic"]),
                    events=tuple(self._events),
                    pipeline=dict(self._latest["pipeline"]),
                )
                self._steps.clear()
                self._steps_seen = 0
                self._events = []
                self._dirty = False
                # close() sets _stopping and _wake under this lock: a wake meant for stopping is never lost.
                if not self._stopping.is_set():
                    self._wake.clear()
            self._last_post = time.monotonic()
            try:
                accepted = self._post(tick)
            except RuntimeError:  # the app's event loop is already closed
                accepted = False
            if accepted:
                self.ticks_posted += 1
            else:
                self._app_gone = True

    def close(self) -> None:
        """Stop the flusher and post what is left; safe to call more than once."""
        with self._lock:  # not between flush's check of _stopping and its clearing of _wake
            self._stopping.set()
            self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self.flush()

    def _flush_loop(self) -> None:
        while True:
            self._wake.wait()  # close() wakes it too, and no flush can clear that wake-up (see flush)
            if self._stopping.is_set() or self._app_gone:
                return
            # Rate limit: the first event after a quiet spell goes out at once, then one tick per interval.
            delay = self._last_post + self._interval_s - time.monotonic()
            if delay > 0 and self._stopping.wait(delay):
                return
            self.flush()
