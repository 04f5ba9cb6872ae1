"""Playing recorded events back at their recorded pace: the workbench's and the printer's view of a
finished run."""

from __future__ import annotations

import threading

MAX_PAUSE_S = 2.0  # a replay never waits longer than this between two events


def replay_events(events: list, emit, stop_event: threading.Event, speed: float) -> None:
    """Emit recorded events in order; each step takes its recorded time / speed (0 = no pauses)."""
    for event in events:
        if stop_event.is_set():
            return
        emit(event)
        pause = getattr(event, "step_time_s", 0.0) if event.kind == "step_end" else 0.0
        if speed > 0 and pause > 0:
            stop_event.wait(min(pause / speed, MAX_PAUSE_S))
