"""The nanoDist workbench: runs a training job on a background thread and shows its events live.

A job is `job_fn(emit, stop_event)`: it trains on the calling thread, calls `emit(event)` for
every engine event, returns early once `stop_event` is set and raises on an engine error. The
CLI passes a real training run or a replay of a recorded one; tests pass a fake. Events go
through `bridge.EventBatcher` and arrive here as `Tick` messages; panes (widgets/pane.py) store
what a tick brings at once and draw it on a timer, a few times a second.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal
from textual.widgets import Footer, HelpPanel
from textual.worker import Worker, WorkerState

from engine.events import RunFailed, RunFinished, RunStarted
from nanodist_tui.bridge import EventBatcher
from nanodist_tui.describe import failure
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.log_pane import LogPane
from nanodist_tui.widgets.loss_plot import LossPlot
from nanodist_tui.widgets.loss_scale_pane import LossScalePane
from nanodist_tui.widgets.memory_pane import MemoryPane
from nanodist_tui.widgets.pane import Pane
from nanodist_tui.widgets.projection_pane import ProjectionPane
from nanodist_tui.widgets.projection_screen import ProjectionScreen
from nanodist_tui.widgets.rank_table import RankTable
from nanodist_tui.widgets.run_header import RunHeader
from nanodist_tui.widgets.sweep_pane import SweepPane

Emit = Callable[[Any], None]
JobFn = Callable[[Emit, threading.Event], None]

RENDER_INTERVAL_S = 0.3  # panes redraw at most ~3 times a second
QUIT_WAIT_S = 2.0  # how long quitting waits for the job to notice the stop event
TERMINAL_STATES = ("finished", "stopped", "failed")


class NanoDistApp(App[None]):
    CSS_PATH = "app.tcss"
    BINDINGS = [
        Binding("s", "stop_training", "Stop training"),
        Binding("x", "finish_sweep", "Stop sweep after this trial"),  # sweeps only (check_action)
        Binding("p", "toggle_pause", "Pause display"),
        Binding("j", "projection", "Projection"),
        Binding("question_mark", "toggle_help", "Help", key_display="?"),
        Binding("q", "quit", "Quit"),  # ctrl+q (Textual's own binding) runs the same action
    ]

    def __init__(self, preset_name: str, job_fn: JobFn, *, replay: bool = False,
                 sweep_finish: threading.Event | None = None) -> None:
        super().__init__()
        self.preset_name = preset_name
        self.replay = replay
        self.sweep_finish = sweep_finish  # set: the job is a sweep, and this ends it after the running trial
        self.job_fn = job_fn
        self.stop_event = threading.Event()
        self.display_paused = False
        self.engine_worker: Worker[None] | None = None
        self._batcher = EventBatcher(self.post_message)

    def compose(self) -> ComposeResult:
        # Panes are kept by reference: ticks and the render timer can still fire while the app
        # shuts down, when querying the DOM would find nothing.
        self.header = RunHeader(self.preset_name, replay=self.replay, id="header")
        self.rank_table = RankTable(id="ranks")
        self.log_pane = LogPane(id="log")
        curves = (LossPlot(id="loss"), LossScalePane(id="loss-scale"))
        memory = MemoryPane(id="memory")
        self.projection = ProjectionPane(self.preset_name, id="projection")  # on its own screen (`j`)
        self.panes: tuple[Pane, ...] = (self.header, *curves, memory, self.rank_table, self.log_pane,
                                        self.projection)
        yield self.header
        if self.sweep_finish is not None:  # trials, best so far, history; the live panes follow its trials
            sweep = SweepPane(id="sweep")
            self.panes += (sweep,)
            yield sweep
        with Horizontal(id="curves"):
            yield from curves
        with Horizontal(id="resources"):
            yield memory
            yield self.rank_table
        yield self.log_pane
        yield Footer()

    def on_mount(self) -> None:
        self.install_screen(ProjectionScreen(self.projection), name="projection")
        self.title = f"nanoDist · {self.preset_name}"
        self._batcher.start()
        self.engine_worker = self.run_worker(
            self._run_job, name="engine", group="engine", thread=True, exit_on_error=False
        )
        self.set_interval(RENDER_INTERVAL_S, self._redraw)
        self.header.redraw()

    def on_unmount(self) -> None:
        self.stop_event.set()  # however the app ends, the job must stop

    def _run_job(self) -> None:
        """On the worker thread: the job only ever emits into the batcher, never touches widgets."""
        try:
            self.job_fn(self._batcher.emit, self.stop_event)
        finally:
            self._batcher.close()

    def on_tick(self, tick: Tick) -> None:
        for pane in self.panes:
            pane.ingest(tick)
        if tick.steps and self.header.state == "starting":
            self._set_state("running")
        for event in tick.events:
            if isinstance(event, RunStarted):
                self._run_started(event)
            elif self.sweep_finish is not None:
                continue  # a trial's run ending is not the sweep's: the sweep pane and the log show it
            elif isinstance(event, RunFinished):
                self._end("stopped" if self.stop_event.is_set() else "finished")
            elif isinstance(event, RunFailed):
                self._fail(failure(event))

    def _run_started(self, event: RunStarted) -> None:
        if event.world_size > 1:
            self.rank_table.add_ranks(event.world_size)
            self.rank_table.display = True
        if self.header.state == "starting":
            self._set_state("running")

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        if event.worker is not self.engine_worker:
            return
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            message = f"engine error: {type(error).__name__}: {error}"
            self.log_pane.add(message, level="error")
            self._fail(message)
        elif event.state == WorkerState.SUCCESS:
            self._end("stopped" if self.stop_event.is_set() else "finished")

    def _set_state(self, state: str) -> None:
        self.header.set_state(state)
        self.header.redraw()  # the run state shows even while the display is paused

    def _end(self, state: str) -> None:
        if self.header.state not in TERMINAL_STATES:
            self._set_state(state)

    def _fail(self, message: str) -> None:
        """Show a failure once (notification + header); later failures only add log lines."""
        if self.header.state != "failed":
            self.notify(message, title="run failed", severity="error", timeout=15)
            self._set_state("failed")

    def _redraw(self) -> None:
        if self.display_paused:
            return
        for pane in self.panes:
            pane.redraw()

    def action_stop_training(self) -> None:
        if self.header.state in TERMINAL_STATES or self.stop_event.is_set():
            self.notify("no training is running")
            return
        self.stop_event.set()
        self.log_pane.add("stop requested: the job stops at its next check", level="warning")
        self._set_state("stopping")

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return self.sweep_finish is not None if action == "finish_sweep" else True

    def action_finish_sweep(self) -> None:
        """The sweep's own thread sees the event after the running trial and calls Optuna's stop."""
        if self.sweep_finish is None or self.header.state in TERMINAL_STATES:
            return
        self.sweep_finish.set()
        self.log_pane.add("the sweep stops after the running trial", level="warning")

    def action_toggle_pause(self) -> None:
        self.display_paused = not self.display_paused
        self.header.display_paused = self.display_paused
        self.header.redraw(force=True)
        if not self.display_paused:
            self._redraw()

    def action_projection(self) -> None:
        self.push_screen("projection")

    def action_toggle_help(self) -> None:
        if self.screen.query(HelpPanel):
            self.action_hide_help_panel()
        else:
            self.action_show_help_panel()

    async def action_quit(self) -> None:
        """Stop the job, give it a moment to return (its thread then ends), then exit."""
        self.stop_event.set()
        deadline = time.monotonic() + QUIT_WAIT_S
        while (
            self.engine_worker is not None
            and not self.engine_worker.is_finished
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.02)
        self.exit()


def create_app(preset_name: str, job_fn: JobFn, *, replay: bool = False,
               sweep_finish: threading.Event | None = None) -> NanoDistApp:
    """The app for one run, or for a sweep (`sweep_finish` given); shared by the CLI (real or replayed
    run, sweep) and the tests (fake jobs)."""
    return NanoDistApp(preset_name, job_fn, replay=replay, sweep_finish=sweep_finish)
