"""The nanoDist workbench: runs a training job (or a replay) on a background thread and shows its events live.

A job is `job_fn(emit, control)`: it trains on the calling thread, calls `emit(event)` for every engine event,
stops early once `control` (an engine.run.control.RunControl) is set, holds while `control.pause` is, and
raises on an engine error. The CLI passes a real training run or a replay; tests pass fakes. Events go through
`bridge.EventBatcher` and arrive here as `Tick` messages; the panes of the run (panes.py lists them,
workspace.py lays them out as tabs) store what a tick brings at once and draw it on a timer, a few times a
second, only while they are on screen.

Stopping (s, or q / ctrl+c / SIGTERM on the way out) asks every rank to stop after the same step; each writes
a checkpoint there, the run is recorded as stopped and `nanodist-tui resume` continues it. Quitting waits for
that, then `farewell()` gives the lines the CLI prints on the shell (the run folder and the summary).
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import BindingType
from textual.containers import Container
from textual.filter import LineFilter
from textual.screen import Screen
from textual.worker import Worker, WorkerState

from engine.events import RunFailed, RunFinished, RunPaused, RunStarted, TrialFinished
from engine.run.printable import printable
from nanodist_tui.actions import WorkbenchActions
from nanodist_tui.ascii_filter import AsciiFilter
from nanodist_tui.bindings import BINDINGS
from nanodist_tui.describe import best_text, failure
from nanodist_tui.messages import Tick
from nanodist_tui.panes import panes_for
from nanodist_tui.priority import lower_this_thread, start_spawner
from nanodist_tui.replay import ReplayPlayer
from nanodist_tui.run_info import RunInfo
from nanodist_tui.session import JobFn, RunSession
from nanodist_tui.tool_actions import ToolActions
from nanodist_tui.user_config import UserConfig
from nanodist_tui.widgets.footer import WorkbenchFooter
from nanodist_tui.widgets.glyphs import choose
from nanodist_tui.widgets.log_pane import LogPane
from nanodist_tui.widgets.pane import Pane, as_panes
from nanodist_tui.widgets.projection_pane import ProjectionPane
from nanodist_tui.widgets.projection_screen import ProjectionScreen
from nanodist_tui.widgets.run_header import RunHeader
from nanodist_tui.workspace import Workspace

if TYPE_CHECKING:
    from nanodist_tui.serve.server import ModelServer

HEADER_INTERVAL_S = 0.3  # the header (state, step, loss, tok/s) redraws ~3 times a second: it is cheap
# The panes redraw once a second: drawing them (plots, tables, bars) is Python holding the GIL, which thread
# ranks need, and CPU the rank processes need; `bench ui` measures what it costs (README, "What the
# workbench costs").
PANE_INTERVAL_S = 1.0
PLOT_EVERY = 2  # the plots redraw on every 2nd pane redraw (2 s): a plotext build costs more than a table
COMPACT_BELOW = (120, 36)  # narrower or shorter than this, the overview keeps only what fits
MakeJob = Callable[[Any, Any], JobFn]  # (Config, preset document) -> job


class NanoDistApp(WorkbenchActions, ToolActions, App[None]):
    CSS_PATH = "app.tcss"
    BINDINGS: ClassVar[list[BindingType]] = [*BINDINGS]  # Textual's type (list[Binding] is not: invariant)

    def __init__(self, preset_name: str, job_fn: JobFn | None, *, replay: ReplayPlayer | None = None,
                 make_job: MakeJob | None = None, check_run: Callable[[Any], None] | None = None,
                 user_config: UserConfig | None = None, compare: tuple | None = None,
                 sweep_finish: threading.Event | None = None,
                 pane_interval_s: float = PANE_INTERVAL_S, shape: RunInfo | None = None) -> None:
        super().__init__()
        if "TEXTUAL_ANIMATIONS" not in os.environ:
            # No sliding tab underline: it redrew the tab bar every frame for a third of a second after each
            # tab key, work that a key pressed then waited behind. A user may still ask for animations.
            self.animation_level = "none"
        # the first run's shape from its config: its panes are laid out from the first frame, and laid out
        # again (the same) when its RunStarted brings the figures they hold
        self.first_shape = shape
        self.pane_interval_s = pane_interval_s
        self.compare_runs = compare
        self.sweep_finish = sweep_finish  # set: the first job is a sweep, and this ends it after its trial
        self.preset_name = preset_name
        self.first_job = job_fn
        self.first_player = replay
        self.make_job, self.check_run = make_job, check_run
        self.user_config = user_config or UserConfig()
        self.glyphs = choose(self.user_config.ascii, self.no_color)
        self._ascii_filter = AsciiFilter()
        self.session: RunSession | None = None
        # the latest training run (not a replay): what the shell is told about on exit, whatever was opened
        # after it (a replay replaces the run's session; its summary still belongs in the farewell)
        self.training: RunSession | None = None
        self.workspace: Workspace | None = None
        self.display_frozen = False
        self.plots_due = True  # whether this pane redraw also redraws the plots (widgets/live_plot.py)
        self.pane_redraws = 0
        self.shell_exit_code = 0
        self._early: list[Tick] = []  # ticks before the run's panes exist
        # (posted, handled) times of every Tick: the UI's updates, and how late each was
        self.tick_times: deque[tuple[float, float]] = deque(maxlen=10_000)
        self._next_job: tuple[JobFn, ReplayPlayer | None, str] | None = None  # started once the current ends
        self._quit_when_done = False
        self.model_server: ModelServer | None = None  # a run's model served from the palette (serving.py)

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        # Widgets are kept by reference: ticks and the render timer can still fire while the app shuts down,
        # when querying the DOM would find nothing.
        self.header = RunHeader(self.preset_name, id="header")
        self.startup_log = self._startup_log()
        self.projection = ProjectionPane(self.preset_name, id="projection")  # on its own screen (`j`)
        shape = RunInfo(preset=self.preset_name, sweep=self.sweep_finish is not None)
        self.session_panes = [spec.make(shape) for spec in panes_for(shape, scope="session")]
        yield self.header
        with Container(id="session-panes"):
            yield from self.session_panes
        with Container(id="body"):
            if self.first_shape is not None and self.first_job is not None:
                # the layout from the first frame
                self.workspace = Workspace(self.first_shape, id="workspace")
                yield self.workspace
            else:
                yield self.startup_log
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        # Training before drawing: jobs run on threads of normal priority, this thread draws at a lower one.
        start_spawner()
        lower_this_thread()
        self.install_screen(ProjectionScreen(self.projection), name="projection")
        self.title = f"nanoDist · {printable(self.preset_name)}"
        self.set_keymap(self.user_config.keymap)
        self.set_class(self.user_config.ascii, "ascii")
        self._watch_signals()
        self.set_interval(HEADER_INTERVAL_S, self.header.redraw)
        self.set_interval(self.pane_interval_s, self._redraw)
        if self.first_job is not None:
            self.start_session(self.first_job, self.first_player, self.preset_name)
        if self.workspace is not None:
            self.call_after_refresh(self.workspace.focus_tabs)
        if self.compare_runs is not None:
            from nanodist_tui.screens.compare import CompareScreen
            # `nanodist-tui compare`: no run behind the screen, so leaving the comparison leaves the
            # workbench (behind it is an app with nothing to show, stuck at "starting")
            self.push_screen(CompareScreen(*self.compare_runs),
                             lambda _: self.exit() if self.session is None else None)
        self.header.redraw()
        # Everything imported and built so far lives as long as the app (but for a first layout the run's own
        # replaces, once). Frozen, it is out of the collector's sight: a full collection no longer walks it
        # (one took over 0.1 s with the whole engine, Textual and plotext in the heap, holding up a key in the
        # middle: docs/workbench.md, "Key latency").
        self.call_after_refresh(gc.freeze)

    def on_resize(self, event) -> None:
        width, height = event.size
        self.set_class(width < COMPACT_BELOW[0] or height < COMPACT_BELOW[1], "compact")
        for screen in self.screen_stack:
            for footer in screen.query(WorkbenchFooter):
                footer.fit(width)

    def on_tabbed_content_tab_activated(self) -> None:
        # a key that fits one tab (the pipeline's next-pipeline) comes and goes with it; only a run with
        # that tab pays for the footer's redraw
        if self.workspace is not None and "pipeline" in self.workspace.tabs:
            self.refresh_bindings()

    def on_unmount(self) -> None:
        if self.session is not None:
            self.session.control.set()  # however the app ends, the job must stop
        self.action_stop_serving()

    @staticmethod
    def _startup_log() -> LogPane:
        """What shows until the run's panes exist; never focused (it goes away under the cursor)."""
        log = LogPane(id="startup-log")
        log.can_focus = False
        return log

    @property
    def panes(self) -> list[Pane]:
        """Every pane the app feeds: the header, the session's panes, the run's (or the startup log), and the
        projection (on its own screen, `j`: it needs the run's config and step times whenever it opens)."""
        run = self.workspace.panes if self.workspace else [self.startup_log]
        return [self.header, *self.session_panes, *run, self.projection]

    @property
    def sweeping(self) -> bool:
        s = self.session
        return self.sweep_finish is not None and s is not None and s.job_fn is self.first_job

    async def _build_workspace(self, info: RunInfo) -> None:
        body = self.query_one("#body")
        # the tab the user chose while the run started stays chosen when its panes are made again
        tab = self.workspace.active_tab if self.workspace is not None else None
        self.screen.set_focus(None)  # the startup log is going: focus must not stay on a removed widget
        await body.remove_children()
        workspace = Workspace(info, id="workspace", initial_tab=tab)
        await body.mount(workspace)
        self.workspace = workspace  # only now: its tabs exist
        for tick in self._early:
            for pane in workspace.panes:
                pane.ingest(tick)
        if self.session is None or self.session.info is not None:  # the config's shape: RunStarted's come
            self._early.clear()
        self.call_after_refresh(workspace.focus_tabs)

    # ------------------------------------------------------------------ sessions

    def start_session(self, job_fn: JobFn, player: ReplayPlayer | None, name: str) -> RunSession:
        session = RunSession(job_fn, self.post_message, player=player)
        first, self.session = self.session is None, session
        if player is None:
            self.training = session
        self.preset_name = name
        self.header.reset(name, replay_speed=player.speed if player is not None else None)
        self._early.clear()
        if job_fn is not self.first_job and self.session_panes:  # a run started later is not a sweep
            for pane in self.session_panes:
                pane.remove()
            self.session_panes = []
        if self.workspace is not None and not first:  # the first run's panes, of its config's shape, stay
            self.screen.set_focus(None)
            self.workspace.remove()
            self.workspace = None
            self.startup_log = self._startup_log()
            self.query_one("#body").mount(self.startup_log)
        session.batcher.start()
        session.worker = self.run_worker(session.run, name="engine", group="engine", thread=True,
                                         exit_on_error=False)
        self.refresh_bindings()
        return session

    def replace_session(self, job_fn: JobFn, player: ReplayPlayer | None, name: str) -> None:
        """Start a job now, or once the current one has stopped (it is asked to)."""
        current = self.session
        if current is None or not current.active:
            self.start_session(job_fn, player, name)
            return
        self._next_job = (job_fn, player, name)
        self._stop(current, quiet=current.replay)

    async def on_tick(self, tick: Tick) -> None:
        if not self.is_running:
            return  # the app is closing (its screen's widgets are going): what a job still reports is dropped
        self.tick_times.append((tick.posted_at, time.monotonic()))
        s = self.session
        if s is None or tick.session != s.id:
            return  # a replaced run's last words
        started = next((e for e in tick.events if isinstance(e, RunStarted)), None)
        if started is not None and (s.info is None or self.sweeping):  # a sweep's next trial: its own panes
            s.info = RunInfo.from_started(started, replay=s.replay, sweep=self.sweeping)
            s.run_dir = started.run_dir
            self._early.append(tick)
            await self._build_workspace(s.info)  # feeds the new panes every tick so far
            for pane in (self.header, *as_panes(self.session_panes), self.projection):
                pane.ingest(tick)
        else:
            if s.info is None:  # kept for the panes RunStarted makes (those of the config's shape go)
                self._early.append(tick)
            for pane in self.panes:
                pane.ingest(tick)
        if (tick.steps or started) and s.state == "starting":
            self._set_state(s, "running")
        if self.sweeping:
            self._sweep_events(tick)
            return  # a trial's run ending is not the sweep's: the sweep pane and the log show it
        for event in tick.events:
            if isinstance(event, RunPaused) and not s.replay and s.state in ("pausing", "paused", "running"):
                self._set_state(s, "paused" if event.paused else "running")
            elif isinstance(event, RunFinished):
                s.run_dir = event.run_dir or s.run_dir
                # the summary until the job returns its own (with threads and network), should the
                # workbench close in between
                s.summary = s.summary or dataclasses.asdict(event)
                if s.active:
                    self._set_state(s, "stopped" if event.stopped else "finished")
            elif isinstance(event, RunFailed):
                self._show_failure(s, failure(event), logged=True)

    def _sweep_events(self, tick: Tick) -> None:
        for event in tick.events:
            if isinstance(event, TrialFinished) and event.best:
                self.header.set_extra("sweep", best_text(event.best, event.metrics, event.best_values))

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        s = self.session  # a replaced run ends before the next starts: only the current one's worker runs
        if s is None or s.worker is not event.worker or event.state not in (WorkerState.SUCCESS,
                                                                           WorkerState.ERROR):
            return
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            self._show_failure(s, f"engine error: {type(error).__name__}: {error}", logged=False)
        else:
            result = event.worker.result
            if isinstance(result, dict):
                s.summary = result
            if s.summary and s.summary.get("run_dir"):
                s.run_dir = s.summary["run_dir"]
            if s.active:
                self._set_state(s, "stopped" if s.control.is_set() else "finished")
        if self._quit_when_done:
            self.exit()
        elif self._next_job is not None:
            job, player, name = self._next_job
            self._next_job = None
            self.start_session(job, player, name)
        self.refresh_bindings()

    def refresh_bindings(self) -> None:
        if self.screen_stack:  # a job may end while the app closes, its screens already gone
            super().refresh_bindings()

    def _set_state(self, s: RunSession, state: str) -> None:
        s.state = state
        if s is self.session:
            self.header.set_state(state)
            self.header.redraw()  # the run state shows even while the display is frozen
            self.refresh_bindings()

    def _show_failure(self, s: RunSession, message: str, logged: bool) -> None:
        """A failure is shown once: one notification, one log line (the RunFailed event's own, when there is
        one), the header. The same failure arriving again (the job raising after it emitted RunFailed) adds
        nothing."""
        if s.fail(message) and s is self.session:
            # a replayed run's failure is recorded text: escaped, and not read as markup
            self.notify(printable(message), title="run failed", severity="error", timeout=15, markup=False)
            if not logged:
                self.say(message, "error")
        if s.active or s.state != "failed":
            self._set_state(s, "failed")

    def say(self, text: str, level: str = "info") -> None:
        """One of the app's own lines, in every log pane."""
        for pane in self.panes:
            if isinstance(pane, LogPane):
                pane.add(text, level)

    def _redraw(self) -> None:
        self.header.redraw()
        if self.display_frozen:
            return
        self.pane_redraws += 1
        self.plots_due = self.pane_redraws % PLOT_EVERY == 0
        self._redraw_each(self.panes[1:])

    def _redraw_each(self, panes: list[Pane]) -> None:
        """Redraw the first pane, and the rest later, one per message: a key pressed meanwhile queues behind
        one pane's redraw (a plot's build can take 0.1 s), not behind all of them (bench_keys.py)."""
        if panes:
            panes[0].redraw()
        if len(panes) > 1:
            self.call_later(self._redraw_each, panes[1:])

    def redraw_now(self) -> None:
        """Draw every pane on screen now, plots too (the timer would within PLOT_EVERY × pane_interval_s)."""
        self.header.redraw(force=True)
        self.plots_due = True
        for pane in self.panes[1:]:
            pane.redraw()

    def get_line_filters(self) -> Sequence[LineFilter]:
        """Textual's filters, and in ASCII mode one that makes whatever the panes did not draw themselves
        (borders, tab underline, scrollbars, footer, plot frames) ASCII too (ascii_filter.py)."""
        filters = super().get_line_filters()
        return [*filters, self._ascii_filter] if self.user_config.ascii else filters

    # ------------------------------------------------------------------ actions

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette (ctrl+p): every action of the workbench and every pane, then Textual's own."""
        from nanodist_tui.commands import workbench_commands
        yield from workbench_commands(self)
        # Textual's "Quit" would exit at once, leaving a run unstopped: the workbench's own is above
        yield from (c for c in super().get_system_commands(screen) if c.title != "Quit")

    # ------------------------------------------------------------------ leaving

    def farewell(self) -> list[str]:
        """What the shell shows once the workbench has closed: the run folder and the summary, or the
        failure; sets `shell_exit_code` (1 for a failed run)."""
        from nanodist_tui.headless import summary_lines
        s = self.session
        if s is not None and s.replay:
            s = self.training  # a replay (opened with `o`, or the command's own) has nothing to report
        if s is None:
            return []
        if s.failure is not None:
            self.shell_exit_code = 1
            return [f"run failed: {s.failure}"] + ([f"run folder     {s.run_dir}"] if s.run_dir else [])
        if s.summary is not None and self.sweeping:
            best = self.header.extras.get("sweep", "")
            lines = [f"sweep folder   {s.summary.get('sweep_dir', '')}"]
            return lines + ([f"sweep          {best}"] if best else [])
        if s.summary is not None:
            return summary_lines(s.summary)
        if s.run_dir:
            still = " (still stopping when the workbench closed)" if s.active else ""
            return [f"run folder     {s.run_dir}{still}"]
        return []


def create_app(preset_name: str, job_fn: JobFn | None, *, replay: ReplayPlayer | None = None,
               make_job: MakeJob | None = None, check_run: Callable[[Any], None] | None = None,
               user_config: UserConfig | None = None, compare: tuple | None = None,
               sweep_finish: threading.Event | None = None,
               pane_interval_s: float = PANE_INTERVAL_S, shape: RunInfo | None = None) -> NanoDistApp:
    """The app for one run, a sweep (`sweep_finish` given) or none (to compare two recorded runs); shared
    by the CLI (real or replayed run, sweep) and the tests (fake jobs). `make_job(cfg, doc)` lets the user
    start other runs from the app. `pane_interval_s`: how often the panes redraw (tests draw faster). `shape`
    (RunInfo.from_config): the first run's panes from the first frame, not once the run has started."""
    return NanoDistApp(preset_name, job_fn, replay=replay, make_job=make_job, check_run=check_run,
                       user_config=user_config, compare=compare, sweep_finish=sweep_finish,
                       pane_interval_s=pane_interval_s, shape=shape)
