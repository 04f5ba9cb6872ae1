"""Playing a recorded run back: at any speed, paused and resumed, from any step (the workbench seeks by
starting a new player at the step it wants)."""

from __future__ import annotations

import threading

MAX_PAUSE_S = 2.0  # a replay never waits longer than this between two events
SPEEDS = (0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)  # what faster / slower step through


class ReplayPlayer:
    """A job (`player(emit, control)`) that emits recorded events in order. Events up to step `start_step`
    go out at once; after that each step takes its recorded time / `speed` (0: no pauses). `speed` may be
    changed from another thread while it plays; `control.pause` (an engine.run.control.RunControl's) holds
    it."""
    def __init__(self, events: list, speed: float = 1.0, start_step: int = 0) -> None:
        self.events = events
        self.speed = speed
        self.start_step = start_step
        self.step = 0  # the last step played
        steps = [e.step for e in events if e.kind == "step_end"]
        started = next((e for e in events if e.kind == "run_started"), None)
        self.first_step = started.first_step if started is not None else 0
        self.last_step = max(steps, default=self.first_step)

    def __call__(self, emit, control: threading.Event) -> None:
        pause = getattr(control, "pause", None)
        for event in self.events:
            if control.is_set():
                return
            while pause is not None and pause.is_set() and not control.is_set():
                control.wait(0.05)
            emit(event)
            if event.kind != "step_end":
                continue
            self.step = event.step
            wait = event.step_time_s / self.speed if self.speed > 0 else 0.0
            if event.step > self.start_step and wait > 0:
                control.wait(min(wait, MAX_PAUSE_S))


def faster(speed: float) -> float:
    return next((s for s in SPEEDS if s > speed), SPEEDS[-1])


def slower(speed: float) -> float:
    return next((s for s in reversed(SPEEDS) if s < speed), SPEEDS[0])


def replay_events(events: list, emit, stop_event: threading.Event, speed: float) -> None:
    """Emit recorded events in order, each step taking its recorded time / speed (0 = no pauses)."""
    ReplayPlayer(events, speed)(emit, stop_event)
