"""The workbench driven by fake jobs through Textual's Pilot: progress, errors, stop, pause, quit."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

from textual.widgets import Footer, RichLog

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
)
from nanodist_tui.app import NanoDistApp, create_app
from nanodist_tui.widgets.log_pane import LogPane
from nanodist_tui.widgets.loss_plot import LossPlot
from nanodist_tui.widgets.memory_pane import MemoryPane
from nanodist_tui.widgets.pane import Pane
from nanodist_tui.widgets.rank_table import RankTable

SIZE = (160, 50)


def memory(activations: int) -> dict[str, int]:
    return {"parameters": 49_380, "gradients": 49_380, "master": 98_760, "activations": activations}


# Per phase: (activations at the phase's end, activations at its peak); backward peaks highest.
PHASES = {"forward": (20_000, 20_000), "backward": (0, 24_000), "optimizer": (0, 0)}


class FakeJob:
    """A job that emits what a 2-rank fp16 run emits; `then` decides how it ends."""

    def __init__(self, steps: int = 30, world_size: int = 2, then: str = "finish") -> None:
        self.steps = steps
        self.world_size = world_size
        self.then = then  # "finish" | "raise" | "run_failed" | "wait_for_stop"
        self.thread: threading.Thread | None = None
        self.saw_stop = threading.Event()
        self.go = threading.Event()  # "wait_for_stop": set to emit one more log line

    def __call__(self, emit: Callable, stop: threading.Event) -> None:
        self.thread = threading.current_thread()
        emit(
            RunStarted(
                run_id="r1",
                preset="fake",
                config={},
                n_params=12_345,
                world_size=self.world_size,
                total_steps=self.steps,
            )
        )
        scale = 2.0**16
        for i in range(self.steps):
            if stop.is_set():
                self.saw_stop.set()
                return
            overflow = i == 5
            emit(
                StepEnd(
                    step=i,
                    loss=4.0 / (i + 1),
                    lr=1e-3,
                    tokens=512,
                    step_time_s=0.004,
                    tokens_per_s=128_000.0,
                    grad_norm=1.0,
                    loss_scale=scale,
                    skipped=overflow,
                )
            )
            if overflow:
                emit(
                    LossScaleChange(
                        step=i,
                        reason="inf",
                        old_scale=scale,
                        new_scale=scale / 2,
                        first_param="blocks.0.attn.w_qkv",
                    )
                )
                scale /= 2
            for rank in range(self.world_size):
                emit(RankStats(step=i, rank=rank, step_time_s=0.004, comm_wait_s=0.001, bytes_sent=4096))
                for phase, (end, peak) in PHASES.items():
                    emit(
                        MemorySnapshot(
                            step=i,
                            rank=rank,
                            phase=phase,
                            current=memory(end),
                            peak=memory(peak),
                            estimate=memory(peak - peak // 8),
                        )
                    )
            if i % 10 == 9:
                emit(Eval(step=i, val_loss=4.5 / (i + 1)))
            time.sleep(0.004)
        if self.then == "raise":
            raise RuntimeError("rank 1 lost its socket")
        if self.then == "run_failed":
            emit(RunFailed(message="loss is NaN", rank=0))
            return
        if self.then == "wait_for_stop":
            while not (self.go.is_set() or stop.is_set()):
                time.sleep(0.01)
            if self.go.is_set():
                emit(Log(level="info", message="still training"))
            stop.wait()
            self.saw_stop.set()
            return
        emit(
            RunFinished(
                steps=self.steps,
                initial_val_loss=4.5,
                final_val_loss=0.15,
                tokens_per_s=128_000.0,
                wall_s=0.2,
                run_dir="runs/r1",
            )
        )


async def wait_for(pilot, condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await pilot.pause(0.05)


def header_text(app: NanoDistApp) -> str:
    return str(app.header.content)


def log_text(app: NanoDistApp, selector: str = "#log") -> str:
    """The log's text with wrapped lines joined back (words separated by single spaces)."""
    return " ".join(" ".join(line.text for line in app.query_one(selector, RichLog).lines).split())


def run(scenario: Callable, job: FakeJob, replay: bool = False) -> NanoDistApp:
    app = create_app("fake", job, replay=replay)

    async def main() -> None:
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await scenario(app, pilot)

    asyncio.run(main())
    return app


def test_a_finished_run_shows_progress_in_every_pane():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.state == "finished")
        await pilot.pause(0.5)  # at least one render tick after the last event
        assert "step 29/30" in header_text(app)
        assert "finished" in header_text(app)
        assert "run r1 started" in log_text(app)
        assert "val loss" in log_text(app)
        assert "finished 30 steps" in log_text(app)
        scale_log = log_text(app, "#loss-scale-log")
        assert "inf overflow, scale 65536 -> 32768 (first: blocks.0.attn.w_qkv)" in scale_log
        loss = app.query_one(LossPlot)
        assert len(loss.train) == 29 and len(loss.val) == 3  # the overflowed step has no loss
        memory = str(app.query_one(MemoryPane).content)
        assert "rank 0" in memory and "rank 1" in memory
        # Backward peaked highest: 2 x 49,380 + 98,760 + 24,000 = 221,520 B = 216.3 KiB; estimate 218,520 B.
        assert "peak 216.3 KiB (backward)  est 213.4 KiB, measured +1.4%" in memory
        assert "activations 23.4 KiB" in memory
        table = app.query_one(RankTable)
        assert table.display and table.row_count == 2
        assert table.get_cell("1", "step") == "29"
        assert table.get_cell("0", "bytes_sent") == "4.0 KiB"
        assert app.is_running
        await pilot.press("q")

    run(scenario, FakeJob())


def test_a_replay_without_data_shows_placeholders_and_one_rank_hides_the_table():
    job = FakeJob(steps=0, world_size=1, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.state == "running")
        await pilot.pause(0.4)
        assert "no memory snapshot yet" in str(app.query_one(MemoryPane).content)
        assert "waiting for the first step" in str(app.query_one(LossPlot).render())
        assert not app.query_one(RankTable).display
        assert "replay" in header_text(app)
        await pilot.press("q")

    run(scenario, job, replay=True)


def test_an_engine_exception_is_shown_and_the_app_keeps_running():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.state == "failed")
        await pilot.pause(0.4)
        assert app.is_running
        assert "failed" in header_text(app)
        assert "engine error: RuntimeError: rank 1 lost its socket" in log_text(app)
        assert any("rank 1 lost its socket" in n.message for n in app._notifications)
        await pilot.press("q")

    run(scenario, FakeJob(then="raise"))


def test_a_run_failed_event_is_shown_like_an_exception():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.state == "failed")
        await pilot.pause(0.4)
        assert "run failed: rank 0: loss is NaN" in log_text(app)
        assert any("rank 0: loss is NaN" in n.message for n in app._notifications)
        await wait_for(pilot, lambda: app.engine_worker.is_finished)
        assert app.header.state == "failed"  # the job returning normally does not hide the failure

    run(scenario, FakeJob(then="run_failed"))


def test_s_stops_the_job_and_the_run_ends_stopped():
    job = FakeJob(steps=2000)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None)
        await pilot.press("s")
        await wait_for(pilot, lambda: app.engine_worker.is_finished, timeout=2)
        assert job.saw_stop.is_set()
        assert app.header.state == "stopped"
        await pilot.pause(0.4)
        assert "stopped" in header_text(app)
        assert "stop requested" in log_text(app)

    run(scenario, job)


def test_pause_freezes_the_display_while_work_continues():
    job = FakeJob(steps=3, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step == 2)
        await pilot.pause(0.4)
        await pilot.press("p")
        assert "display paused" in header_text(app)
        lines_before = len(app.query_one(LogPane).lines)
        job.go.set()  # the job keeps working: one more event arrives while paused
        await pilot.pause(0.6)
        assert len(app.query_one(LogPane).lines) == lines_before
        await pilot.press("p")
        await pilot.pause(0.1)
        assert "still training" in log_text(app)
        assert "display paused" not in header_text(app)

    run(scenario, job)


def test_quit_stops_the_job_and_leaves_no_engine_thread_behind():
    job = FakeJob(steps=0, then="wait_for_stop")
    timings = {}

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: job.thread is not None)
        timings["start"] = time.monotonic()
        await pilot.press("q")

    run(scenario, job)
    assert job.saw_stop.is_set()
    deadline = timings["start"] + 2.0
    while job.thread in threading.enumerate() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job.thread not in threading.enumerate()
    assert not [t for t in threading.enumerate() if t.name == "nanodist-ticks"]
    assert time.monotonic() - timings["start"] < 2.0


def test_help_key_toggles_the_key_panel():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await pilot.press("question_mark")
        assert app.screen.query("HelpPanel")
        await pilot.press("question_mark")
        await pilot.pause()
        assert not app.screen.query("HelpPanel")

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))


def test_every_pane_the_app_composes_keeps_the_pane_protocol():
    async def scenario(app: NanoDistApp, pilot) -> None:
        assert len(app.panes) == 7 and all(isinstance(pane, Pane) for pane in app.panes)
        assert not isinstance(app.query_one(Footer), Pane)  # the check tells a pane from any widget
        # No pane goes unfed: each is one the app feeds, or inside one that feeds it (the loss-scale plot).
        fed = set(app.panes)
        for widget in app.screen.query("*"):
            if isinstance(widget, Pane):
                assert widget in fed or any(parent in fed for parent in widget.ancestors), widget

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))
