"""How fast the workbench answers its keys while a run trains (`nanodist-tui bench ui-keys`).

A real training run (the preset's own backend: quickstart's four rank processes) runs in the workbench,
headless but drawing every pane on its timer, exactly as on a terminal. Once steps arrive, the tab keys are
pressed in turn (`presses` of them, a short random gap between two, so presses land anywhere between ticks
and redraws), each posted to the app as the terminal's driver posts it, and timed to the moment the screen
has been redrawn with the new tab showing (`call_after_refresh`: after the compositor has drawn). Then `p`
once: how long until the run is held, and after which step, beside the first step reported after the key
(the one the ranks were in then, or under load the one before, whose report was still on its way) and the
step on screen then (which lags the ranks by up to the event batcher's interval and the header's).

The timing runs on the app's own event loop, on the thread that draws (at the workbench's nice value), so
it includes everything that delays a real key: ticks and redraws queued before it, and the CPU the ranks
leave that thread.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time

from textual import events
from textual.widgets import TabbedContent

from engine.events import StepEnd, as_event
from nanodist_tui.app import create_app
from nanodist_tui.priority import start_spawner


async def _screen_shows(app, done) -> float:
    """The time at which `done()` holds and the screen has been drawn since."""
    loop = asyncio.get_running_loop()
    while not done():
        await asyncio.sleep(0.002)
    drawn: asyncio.Future[float] = loop.create_future()

    def mark() -> None:
        if not drawn.done():
            drawn.set_result(time.perf_counter())
    app.call_after_refresh(mark)
    return await drawn


def press(app, key: str) -> None:
    """A key as the terminal's driver delivers it: one Key message to the app. (Pilot.press also waits for
    the app to go idle, which a workbench with ticks and timers running rarely is: it added ~0.4 s.)"""
    app.post_message(events.Key(key, key if len(key) == 1 else None))


def key_latency(cfg, doc, presses: int = 50, seed: int = 0) -> dict:
    """Median and worst key-to-screen time of `presses` tab switches while `cfg` trains, and how soon a
    pause lands (seconds and steps)."""
    from multiprocessing import resource_tracker

    from nanodist_tui.cli.running import training_job
    start_spawner()  # before the workbench lowers this thread's priority (priority.py)
    # Started now, while sys.stderr is the process's own: started under a headless app, it would be handed
    # the app's captured stderr, which has no file descriptor, and rank processes could not start.
    resource_tracker.ensure_running()
    rng = random.Random(seed)
    report: dict = {}

    arrivals: list[tuple[float, int]] = []  # (when, step) of every step the ranks reported, as it arrived

    def note_steps(emit):
        def emit_noting(event) -> None:
            event = as_event(event)
            if isinstance(event, StepEnd):
                arrivals.append((time.perf_counter(), event.step))
            emit(event)
        return emit_noting

    job = training_job(cfg, doc)
    app = create_app(cfg.name, lambda emit, control: job(note_steps(emit), control))

    async def drive(pilot) -> None:
        while app.workspace is None or app.header.latest is None or app.header.latest.step < 5:
            await asyncio.sleep(0.05)
        tabs = app.workspace.tab_ids
        tabbed = app.workspace.query_one(TabbedContent)
        times: list[float] = []
        by_tab: dict[str, list[float]] = {}
        for i in range(presses):
            number = 1 + (i + 1) % min(len(tabs), 5)
            await asyncio.sleep(rng.uniform(0.1, 0.4))
            t0 = time.perf_counter()
            press(app, str(number))
            shown = await _screen_shows(app, lambda n=number: tabbed.active == tabs[n - 1])
            times.append(shown - t0)
            by_tab.setdefault(tabs[number - 1].removeprefix("tab-"), []).append(shown - t0)
        session = app.session
        assert session is not None
        on_screen, t0 = app.header.latest.step, time.perf_counter()
        press(app, "p")
        # the app turns "paused" on the ranks' RunPaused event, which names the step they hold after
        while session.state != "paused" and time.perf_counter() - t0 < 60:
            await asyncio.sleep(0.005)
        pause_s = time.perf_counter() - t0
        held = arrivals[-1][1] if session.state == "paused" and arrivals else None
        # the step the ranks were in when the key was pressed, or the one before it: the first one reported
        # after the key (a step's report reaches the workbench after it ends: under load, up to a step later)
        in_progress = next((step for t, step in arrivals if t > t0), None)
        report.update(times_s=times, worst_by_tab_s={tab: max(t) for tab, t in by_tab.items()},
                      median_s=statistics.median(times), worst_s=max(times),
                      pause_s=pause_s if held is not None else None,
                      held_step=held, first_step_after_key=in_progress, step_on_screen=on_screen)
        app.action_stop_and_quit()

    app.run(headless=True, size=(160, 50), auto_pilot=drive)
    return report
