"""Driving the workbench in tests: fake jobs that emit what a real run emits, the recorded demo run, waiting,
and reading back what the screen shows."""

from __future__ import annotations

import asyncio
import dataclasses
import io
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console
from textual.widgets import RichLog

from engine.events import (
    Eval,
    Log,
    LossScaleChange,
    MemorySnapshot,
    RankStats,
    RunFailed,
    RunFinished,
    RunStarted,
    StepEnd,
    SweepFinished,
    SweepStarted,
    Traffic,
    TrialFinished,
    TrialReport,
    TrialStarted,
)
from engine.run.recorder import read_events
from nanodist_tui.app import NanoDistApp, create_app
from nanodist_tui.demo import DEMO_DIR

SIZE = (160, 50)
SMALL = (80, 24)


def memory(activations: int) -> dict[str, int]:
    return {"parameters": 49_380, "gradients": 49_380, "master": 98_760, "activations": activations}


# Per phase: (activations at the phase's end, activations at its peak); backward peaks highest.
PHASES = {"forward": (20_000, 20_000), "backward": (0, 24_000), "optimizer": (0, 0)}
# The run's memory estimate (RunStarted.memory_estimate): per phase, activations an eighth below the peak.
ESTIMATE = {phase: memory(peak - peak // 8) for phase, (_, peak) in PHASES.items()}
# Each rank sends LINK_BYTES in each of two phases to the next rank; with 2 ranks and fp16 a gradient of S =
# 2·LINK_BYTES bytes (N_PARAMS elements) makes that exactly the ring bound 2(N-1)/N·S.
LINK_BYTES = 4_000_000
N_PARAMS = LINK_BYTES


def config(world_size: int, dtype: str = "fp16", zero_stage: int = 0) -> dict:
    return {"parallel": {"backend": "threads", "world_size": world_size, "zero_stage": zero_stage},
            "precision": {"dtype": dtype}, "memory": {"checkpointing": "none"}}


class FakeJob:
    """A job that emits what an N-rank run emits (fp16 by default); `then` decides how it ends."""

    def __init__(self, steps: int = 30, world_size: int = 2, then: str = "finish", dtype: str = "fp16",
                 pace_s: float = 0.004, honour_pause: bool = True) -> None:
        self.steps, self.world_size, self.then, self.dtype = steps, world_size, then, dtype
        self.pace_s, self.honour_pause = pace_s, honour_pause
        self.thread: threading.Thread | None = None
        self.saw_stop = threading.Event()
        self.go = threading.Event()  # "wait_for_stop": set to emit one more log line; "linger": to return
        self.held_at: int | None = None

    def __call__(self, emit: Callable, control: threading.Event) -> None:
        self.thread = threading.current_thread()
        emit(RunStarted(run_id="r1", preset="fake", config=config(self.world_size, self.dtype),
                        n_params=N_PARAMS, world_size=self.world_size, total_steps=self.steps,
                        run_dir="runs/r1", memory_estimate=ESTIMATE))
        scale = 2.0**16 if self.dtype == "fp16" else None
        for i in range(1, self.steps + 1):
            if not control.is_set():
                self._hold(i - 1, emit, control)
            if control.is_set():  # also when stopped while held: the engine stops where it holds
                self.saw_stop.set()
                emit(RunFinished(steps=i - 1, initial_val_loss=4.5, final_val_loss=4.5 / i, tokens_per_s=1.0,
                                 wall_s=0.1, run_dir="runs/r1", stopped=True))
                return
            overflow = i == 5 and scale is not None
            emit(StepEnd(step=i, loss=4.0 / i, lr=1e-3 * i / self.steps, tokens=512, step_time_s=0.004,
                         tokens_per_s=128_000.0, grad_norm=1.0 + 1.0 / i, loss_scale=scale, skipped=overflow))
            if overflow:
                emit(LossScaleChange(step=i, reason="inf", old_scale=scale, new_scale=scale / 2,
                                     first_param="blocks.0.attn.w_qkv"))
                scale /= 2
            for rank in range(self.world_size):
                emit(RankStats(step=i, rank=rank, step_time_s=0.004, comm_wait_s=0.001 * (1 + rank),
                               bytes_sent=2 * LINK_BYTES))
                for phase, (end, peak) in PHASES.items():
                    emit(MemorySnapshot(step=i, rank=rank, phase=phase, current=memory(end),
                                        peak=memory(peak)))
                if self.world_size > 1:
                    dst = (rank + 1) % self.world_size
                    link = {"src": rank, "dst": dst, "bytes": LINK_BYTES, "group": "world",
                            "algorithm": "ring"}
                    links = [{**link, "phase": "reduce-scatter", "seconds": 0.001},
                             {**link, "phase": "all-gather", "seconds": 0.002}]
                    emit(Traffic(step=i, rank=rank, links=links))
            if i % 10 == 0:
                emit(Eval(step=i, val_loss=4.5 / i))
            time.sleep(self.pace_s)
        return self._end(emit, control)

    def _hold(self, step: int, emit, control) -> None:
        pause = getattr(control, "pause", None)
        if not self.honour_pause or pause is None or not pause.is_set():
            return
        from engine.events import RunPaused
        self.held_at = step
        emit(RunPaused(step=step, paused=True))
        while pause.is_set() and not control.is_set():
            time.sleep(0.01)
        emit(RunPaused(step=step, paused=False))

    def _end(self, emit, control) -> None:
        if self.then == "raise":
            raise RuntimeError("rank 1 lost its socket")
        if self.then == "run_failed":
            emit(RunFailed(message="loss is NaN", rank=0))
            return
        if self.then == "run_failed_then_raise":  # what engine.run.job does: the event, then the exception
            emit(RunFailed(message="ValueError: loss is NaN", rank=1))
            raise RuntimeError("rank 1 failed: ValueError: loss is NaN")
        if self.then == "wait_for_stop":
            while not (self.go.is_set() or control.is_set()):
                time.sleep(0.01)
            if self.go.is_set():
                emit(Log(level="info", message="still training"))
            control.wait()
            self.saw_stop.set()
            return
        finished = RunFinished(steps=self.steps, initial_val_loss=4.5, final_val_loss=0.15,
                               tokens_per_s=128_000.0, wall_s=0.2, run_dir="runs/r1")
        emit(finished)
        if self.then == "linger":  # what engine.run.job does after the event: close sinks and record, return
            self.go.wait()
            return {**dataclasses.asdict(finished), "threads_per_rank": 1}
        return


def demo_events() -> list:
    """The recorded 4-rank fp16 ZeRO-2 run shipped with the package (nanodist_tui/demo)."""
    return read_events(DEMO_DIR)


TEST_PANE_INTERVAL_S = 0.3  # panes redraw this often in tests (the app's default is slower: see app.py)


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await pilot.pause(0.05)


def footer_line(app: NanoDistApp) -> str:
    """The terminal's last line: the footer's keys."""
    return screen_text(app).rstrip("\n").splitlines()[-1]


async def footer_when(pilot, app: NanoDistApp, condition: Callable[[str], bool], timeout: float = 5.0) -> str:
    """The footer once it is drawn and meets `condition`. Textual's Footer rebuilds its keys after the
    screen's bindings change (a tab shown, a screen pushed) and is blank for a refresh between: read then,
    a check that a key is offered fails, and one that a key is not offered passes on nothing."""
    await wait_for(pilot, lambda: footer_line(app).strip() != "" and condition(footer_line(app)), timeout)
    return footer_line(app)


async def check_scroll_keys(pilot, log) -> None:
    """home, page down, down and end scroll `log` (a pane's log with more lines than fit, not focused)."""
    assert pilot.app.screen.focused is not log  # the keys reach it through the screen's bindings
    await pilot.press("home")
    assert log.scroll_y == 0
    await pilot.press("pagedown", "down")
    assert log.scroll_y > 1
    await pilot.press("end")
    assert log.scroll_y == log.max_scroll_y


def run(scenario: Callable, job, size=SIZE, **kwargs) -> NanoDistApp:
    app = create_app("fake", job, **{"pane_interval_s": TEST_PANE_INTERVAL_S, **kwargs})

    async def main() -> None:
        async with app.run_test(size=size, notifications=True) as pilot:
            await scenario(app, pilot)

    asyncio.run(main())
    return app


def header_text(app: NanoDistApp) -> str:
    return str(app.header.content)


async def tabs_row_laid_out(app: NanoDistApp, pilot) -> int:
    """The row the tabs start on, once the layout has caught up with the header's text: a header that
    changes height is laid out at the next refresh, which comes late on a loaded machine."""
    await wait_for(pilot, lambda: app.header.region.height == header_text(app).count("\n") + 1
                   and app.workspace.region.y == app.header.region.bottom)
    return app.workspace.region.y


def log_text(app: NanoDistApp, selector: str = "LogPane") -> str:
    """Every log pane's text, wrapped lines joined back (words separated by single spaces)."""
    logs = app.query(selector).results(RichLog)
    return " | ".join(" ".join(" ".join(line.text for line in log.lines).split()) for log in logs)


def screen_text(app: NanoDistApp) -> str:
    """What the terminal shows, as plain text."""
    width, height = app.size
    console = Console(width=width, height=height, file=io.StringIO(), force_terminal=True, record=True,
                      color_system=None, legacy_windows=False, safe_box=False)
    console.print(app.screen._compositor.render_update(full=True, screen_stack=app._background_screens))
    return console.export_text()

class FakeSweep:
    """Emits what a sweep of `n` one-metric trials emits (each trial a 4-step run); after `hold_at`
    trials it waits for `go` (so a test can look), and it ends early when `finish` is set."""

    def __init__(self, n: int = 3, metrics=("val_loss",), hold_at: int | None = None) -> None:
        self.n, self.metrics, self.hold_at = n, list(metrics), hold_at
        self.finish = threading.Event()
        self.go = threading.Event()
        self.thread: threading.Thread | None = None
        self.ran: list[int] = []

    def values(self, number: int) -> list[float]:
        return [3.0 - 0.5 * (number % 2) + 0.1 * number, 10.0 + number][:len(self.metrics)]

    def __call__(self, emit, stop: threading.Event) -> None:
        self.thread = threading.current_thread()
        emit(SweepStarted(study="fake", sweep_dir="runs/sweep-fake", storage="sqlite:///x.db",
                          metrics=self.metrics, directions=["minimize"] * len(self.metrics),
                          n_trials=self.n, timeout_s=0.0, existing=0, jobs=1))
        best: tuple[float, int] | None = None
        for number in range(self.n):
            if self.hold_at == number:
                self.go.wait(10)
            if self.finish.is_set() or stop.is_set():
                break
            emit(TrialStarted(number=number, params={"optim.lr": 1e-3 * (number + 1)}))
            emit(RunStarted(run_id=f"t{number}", preset="fake", config={}, n_params=10, world_size=1,
                            total_steps=4))
            for step in range(1, 5):
                emit(StepEnd(step=step, loss=4.0 - step * 0.1, lr=1e-3, tokens=64, step_time_s=0.001,
                             tokens_per_s=64_000.0, grad_norm=1.0))
                if step % 2 == 0:
                    emit(Eval(step=step, val_loss=4.0 - step * 0.2))
                    emit(TrialReport(number=number, step=step, value=4.0 - step * 0.2))
            emit(RunFinished(steps=4, initial_val_loss=4.0, final_val_loss=3.2, tokens_per_s=64_000.0,
                             wall_s=0.1, run_dir=f"runs/sweep-fake/t{number}"))
            values = self.values(number)
            if best is None or values[0] < best[0]:
                best = (values[0], number)
            front = list(range(number + 1)) if len(self.metrics) > 1 else [best[1]]
            emit(TrialFinished(number=number, state="complete", metrics=self.metrics, values=values,
                               params={"optim.lr": 1e-3 * (number + 1)}, duration_s=0.1, steps=4,
                               best=front, best_values=[best[0]] if len(self.metrics) == 1 else None))
            self.ran.append(number)
        emit(SweepFinished(study="fake", counts={"complete": len(self.ran)}, best=[best[1]] if best else [],
                           stopped=len(self.ran) < self.n))

DEMO_RUN = "20261201-110111-quickstart"  # the demo recording, as a finished run folder


def demo_run_folder(root: Path, name: str = DEMO_RUN) -> Path:
    """runs/<name>: the demo recording as a finished run folder (its events and a summary)."""
    run = root / "runs" / name
    run.mkdir(parents=True)
    shutil.copy(DEMO_DIR / "events.jsonl", run / "events.jsonl")
    finished = next(e for e in demo_events() if isinstance(e, RunFinished))
    (run / "summary.json").write_text(json.dumps({
        "status": "finished", "preset": "quickstart", "steps": finished.steps,
        "final_val_loss": finished.final_val_loss, "tokens_per_s": finished.tokens_per_s,
        "wall_s": finished.wall_s}))
    return run
