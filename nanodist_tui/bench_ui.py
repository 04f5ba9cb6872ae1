"""What the workbench costs and how it holds up (`nanodist-tui bench ui`, `bench ui-events`):

- overhead: the same training run's tokens/s with the workbench open (headless Textual, every pane drawn
  on its timer) against the same run with no UI, taking turns, medians of `repeats` runs each;
- a 1 kHz event stream: a synthetic job emits StepEnd, RankStats and MemorySnapshot events at `rate_hz`
  with a discrete Log event every `every`-th step; the app must handle at most ~10 updates a second, show
  the last step exactly and lose none of the discrete events.
"""

from __future__ import annotations

import asyncio
import statistics
import threading
import time
from functools import partial

from engine.events import Log, MemorySnapshot, RankStats, RunFinished, RunStarted, StepEnd
from nanodist_tui.app import create_app
from nanodist_tui.priority import run_at_normal_priority, start_spawner
from nanodist_tui.widgets.log_pane import LogPane

MAX_UPDATES_PER_S = 10


def storm_job(steps: int, rate_hz: float, every: int, ranks: int = 4):
    """A job emitting `steps` steps at `rate_hz` (with each step one RankStats and one MemorySnapshot per
    rank) and a Log "mark N" every `every` steps; returns the marks it sent."""
    marks: list[str] = []

    def job(emit, control: threading.Event) -> list[str]:
        emit(RunStarted(run_id="storm", preset="storm", config={"parallel": {"world_size": ranks}},
                        n_params=1000, world_size=ranks, total_steps=steps))
        start = time.perf_counter()
        for i in range(1, steps + 1):
            if control.is_set():
                break
            emit(StepEnd(step=i, loss=1.0 + 1.0 / i, lr=1e-3, tokens=64, step_time_s=1 / rate_hz,
                         tokens_per_s=64 * rate_hz, grad_norm=1.0))
            for rank in range(ranks):
                emit(RankStats(step=i, rank=rank, step_time_s=1 / rate_hz, comm_wait_s=0.0, bytes_sent=i))
                emit(MemorySnapshot(step=i, rank=rank, phase="backward", current={"parameters": i},
                                    peak={"parameters": i}))
            if i % every == 0:
                marks.append(f"mark {i}")
                emit(Log(level="info", message=marks[-1]))
            delay = start + i / rate_hz - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        emit(RunFinished(steps=steps, initial_val_loss=None, final_val_loss=None, tokens_per_s=64 * rate_hz,
                         wall_s=time.perf_counter() - start, run_dir=""))
        return marks

    return job, marks


def event_storm(steps: int = 3000, rate_hz: float = 1000.0, every: int = 50) -> dict:
    """Run the storm through the app (headless) and report what the UI did with it."""
    job, marks = storm_job(steps, rate_hz, every)
    app = create_app("storm", job)
    seen: dict = {}

    async def watch(pilot) -> None:
        while app.session is None or app.session.active:
            await pilot.pause(0.05)
        await pilot.pause(0.5)
        app.redraw_now()
        await pilot.pause(0.1)
        log = " ".join(line.text for line in app.query_one("LogPane.overview-log", LogPane).lines) + " "
        seen.update(shown_step=app.header.latest.step if app.header.latest else None,
                    logged=[m for m in marks if f"info: {m} " in log], times=list(app.tick_times))
        app.exit()

    app.run(headless=True, size=(160, 50), auto_pilot=watch)
    posted = [p for p, _ in seen["times"]]
    per_second = [sum(1 for t in posted if start <= t < start + 1.0) for start in posted]
    lateness = sorted(h - p for p, h in seen["times"])
    return {"events_per_s": rate_hz * (1 + 2 * 4), "steps": steps, "updates": len(posted),
            "max_updates_in_1s": max(per_second, default=0),
            "median_latency_s": statistics.median(lateness) if lateness else None,
            "max_latency_s": lateness[-1] if lateness else None, "last_step_shown": seen["shown_step"],
            "discrete_sent": len(marks), "discrete_shown": len(seen["logged"])}


def ui_overhead(cfg, doc, repeats: int = 3) -> dict:
    """Median tokens/s of the same run with the workbench open and with no UI, taking turns; and the CPU
    seconds the workbench's own thread (the event loop that draws) used per second of the run.

    The UI's CPU time is the load-robust figure: tokens/s swing with whatever else the machine runs, the
    CPU seconds the UI thread spent do not (much). Measured with the main thread's CPU clock, which counts
    that thread alone (not the ranks' threads, nor the flusher)."""
    import io

    from rich.console import Console

    from engine.run.job import run_training
    from nanodist_tui.cli.running import training_job
    from nanodist_tui.headless import HeadlessPrinter
    start_spawner()  # before any workbench lowers this thread's priority
    rates: dict[str, list[float]] = {"workbench": [], "no-ui": []}
    ui_cpu: list[float] = []  # UI thread CPU seconds per second of the run
    redraws: list[float] = []  # pane redraws per second of the run (how live the workbench stayed)
    for _ in range(repeats):
        # --no-ui: the run recorded and printed as `nanodist-tui --no-ui` does (into a buffer, not the screen)
        printer = HeadlessPrinter(Console(file=io.StringIO()), live=False)
        # at the priority a plain `--no-ui` run has: the workbench lowers the priority of the thread that
        # drew it (this one) for good, and processes started here would inherit it (priority.py)
        plain = run_at_normal_priority(partial(run_training, cfg, on_event=printer, preset_doc=doc))
        rates["no-ui"].append(plain["tokens_per_s"])
        app = create_app(cfg.name, training_job(cfg, doc))

        async def until_done(pilot, app=app) -> None:
            # A plain sleep, not pilot.pause: a pause waits for every widget's queue and forces a screen
            # update, work the workbench does not do on its own, which would be counted against it.
            while app.session is None or app.session.active or app.session.job_running:
                await asyncio.sleep(0.5)
            app.exit()

        cpu0, wall0 = time.thread_time(), time.perf_counter()
        app.run(headless=True, size=(160, 50), auto_pilot=until_done)
        wall = time.perf_counter() - wall0
        ui_cpu.append((time.thread_time() - cpu0) / wall)
        redraws.append(app.pane_redraws / wall)
        session = app.session
        assert session is not None and session.summary is not None  # the run was seen to its end (until_done)
        rates["workbench"].append(session.summary["tokens_per_s"])
    medians = {k: statistics.median(v) for k, v in rates.items()}
    return {"runs": rates, "median": medians, "ratio": medians["workbench"] / medians["no-ui"],
            "ui_cpu_per_s": ui_cpu, "ui_cpu_per_s_median": statistics.median(ui_cpu),
            "redraws_per_s": redraws}
