"""The nanoDist workbench: runs a training job (or a replay) on a background thread and shows its events live.

A job is `job_fn(emit, control)`: it trains on the calling thread, calls `emit(event)` for every engine
event, stops early once `control` (an engine.control.RunControl) is set, holds while `control.pause` is, and
raises on an engine error. The CLI passes a real training run or a replay; tests pass fakes. Events go through
`bridge.EventBatcher` and arrive here as `Tick` messages; the panes of the run (panes.py lists them,
workspace.py lays them out as tabs) store what a tick brings at once and draw it on a timer, a few times a
second, only while they are on screen.

Stopping (s, or q / ctrl+c / SIGTERM on the way out) asks every rank to stop after the same step; each writes
a checkpoint there, the run is recorded as stopped and `nanodist-tui resume` continues it. Quitting waits for
that, then `farewell()` gives the lines the CLI prints on the shell (the run folder and the summary).
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Iterable
from typing import Any

from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Container
from textual.screen import Screen
from textual.widgets import Footer, TabbedContent
from textual.worker import Worker, WorkerState

from engine.events import RunFailed, RunFinished, RunPaused, RunStarted
from nanodist_tui.describe import failure
from nanodist_tui.messages import Tick
from nanodist_tui.replay import ReplayPlayer, faster, slower
from nanodist_tui.run_info import RunInfo
from nanodist_tui.session import JobFn, RunSession
from nanodist_tui.user_config import UserConfig
from nanodist_tui.widgets.glyphs import choose
from nanodist_tui.widgets.log_pane import LogPane
from nanodist_tui.widgets.run_header import RunHeader
from nanodist_tui.workspace import Workspace

RENDER_INTERVAL_S = 0.3  # panes redraw at most ~3 times a second
SEEK_SHARE = 0.1  # [ and ] move a replay by this share of the run
COMPACT_BELOW = (120, 36)  # narrower or shorter than this, the overview keeps only what fits
MakeJob = Callable[[Any, Any], JobFn]  # (Config, preset document) -> job


def _bindings() -> list[Binding]:
    keys = [
        Binding("s", "stop_training", "Stop", id="stop"),
        Binding("p", "toggle_pause", "Pause", id="pause"),
        Binding("f", "toggle_freeze", "Freeze display", id="freeze"),
        Binding("n", "new_run", "New run", id="new-run"),
        Binding("o", "open_replay", "Replay a run", id="open-replay", show=False),
        Binding("c", "compare", "Compare runs", id="compare"),
        Binding("plus", "replay_speed(1)", "Faster", id="replay-faster", key_display="+"),
        Binding("minus", "replay_speed(-1)", "Slower", id="replay-slower", key_display="-"),
        Binding("right_square_bracket", "seek(1)", "Seek +10%", id="seek-forward", key_display="]"),
        Binding("left_square_bracket", "seek(-1)", "Seek -10%", id="seek-back", key_display="["),
        Binding("question_mark", "help", "Help", key_display="?", id="help"),
        Binding("q", "quit", "Quit", id="quit"),
        Binding("ctrl+c", "stop_and_quit", "Stop and quit at once", show=False, id="stop-and-quit"),
    ]
    keys += [Binding(str(n), f"show_tab({n})", f"Show tab {n}", show=False, id=f"tab-{n}")
             for n in range(1, 10)]
    return keys


BINDINGS = _bindings()
BINDING_IDS = tuple(b.id for b in BINDINGS if b.id)
WORKBENCH_ACTIONS = {b.action.partition("(")[0] for b in BINDINGS}
RUN_ACTIONS = ("stop_training", "toggle_pause")
REPLAY_ACTIONS = ("replay_speed", "seek")


class NanoDistApp(App[None]):
    CSS_PATH = "app.tcss"
    BINDINGS = BINDINGS

    def __init__(self, preset_name: str, job_fn: JobFn | None, *, replay: ReplayPlayer | None = None,
                 make_job: MakeJob | None = None, check_run: Callable[[Any], None] | None = None,
                 user_config: UserConfig | None = None, compare: tuple | None = None) -> None:
        super().__init__()
        self.compare_runs = compare
        self.preset_name = preset_name
        self.first_job = job_fn
        self.first_player = replay
        self.make_job, self.check_run = make_job, check_run
        self.user_config = user_config or UserConfig()
        self.glyphs = choose(self.user_config.ascii, self.no_color)
        self.session: RunSession | None = None
        self.workspace: Workspace | None = None
        self.display_frozen = False
        self.shell_exit_code = 0
        self._early: list[Tick] = []  # ticks before the run's panes exist
        self._next_job: tuple[JobFn, ReplayPlayer | None, str] | None = None  # started once the current ends
        self._quit_when_done = False
        self._ended: list[RunSession] = []

    # ------------------------------------------------------------------ layout

    def compose(self) -> ComposeResult:
        # Widgets are kept by reference: ticks and the render timer can still fire while the app shuts down,
        # when querying the DOM would find nothing.
        self.header = RunHeader(self.preset_name, id="header")
        self.startup_log = LogPane(id="startup-log")
        yield self.header
        with Container(id="body"):
            yield self.startup_log
        yield Footer()

    def on_mount(self) -> None:
        self.title = f"nanoDist · {self.preset_name}"
        self.set_keymap(self.user_config.keymap)
        self.set_class(self.user_config.ascii, "ascii")
        self._watch_signals()
        self.set_interval(RENDER_INTERVAL_S, self._redraw)
        if self.first_job is not None:
            self.start_session(self.first_job, self.first_player, self.preset_name)
        if self.compare_runs is not None:
            self._compare_chosen(list(self.compare_runs))
        self.header.redraw()

    def on_resize(self, event) -> None:
        width, height = event.size
        self.set_class(width < COMPACT_BELOW[0] or height < COMPACT_BELOW[1], "compact")

    def on_unmount(self) -> None:
        if self.session is not None:
            self.session.control.set()  # however the app ends, the job must stop

    @property
    def panes(self) -> list:
        return [self.header, *(self.workspace.panes if self.workspace else [self.startup_log])]

    async def _build_workspace(self, info: RunInfo) -> None:
        body = self.query_one("#body")
        self.screen.set_focus(None)  # the startup log is going: focus must not stay on a removed widget
        await body.remove_children()
        self.workspace = Workspace(info, id="workspace")
        await body.mount(self.workspace)
        self.workspace.query_one("ContentTabs").focus()
        for tick in self._early:
            for pane in self.workspace.panes:
                pane.ingest(tick)
        self._early.clear()

    # ------------------------------------------------------------------ sessions

    def start_session(self, job_fn: JobFn, player: ReplayPlayer | None, name: str) -> RunSession:
        session = RunSession(job_fn, self.post_message, player=player)
        self.session = session
        self.preset_name = name
        self.header.reset(name, replay_speed=player.speed if player is not None else None)
        self._early.clear()
        if self.workspace is not None:
            self.screen.set_focus(None)
            self.workspace.remove()
            self.workspace = None
            self.startup_log = LogPane(id="startup-log")
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
        s = self.session
        if s is None or tick.session != s.id:
            return  # a replaced run's last words
        started = next((e for e in tick.events if isinstance(e, RunStarted)), None)
        if started is not None and s.info is None:
            s.info = RunInfo.from_started(started, replay=s.replay)
            s.run_dir = started.run_dir
            self._early.append(tick)
            await self._build_workspace(s.info)
            self.header.ingest(tick)
        else:
            if self.workspace is None:
                self._early.append(tick)
            for pane in self.panes:
                pane.ingest(tick)
        if (tick.steps or started) and s.state == "starting":
            self._set_state(s, "running")
        for event in tick.events:
            if isinstance(event, RunPaused) and not s.replay and s.state in ("pausing", "paused", "running"):
                self._set_state(s, "paused" if event.paused else "running")
            elif isinstance(event, RunFinished):
                s.run_dir = event.run_dir or s.run_dir
                if s.active:
                    self._set_state(s, "stopped" if event.stopped else "finished")
            elif isinstance(event, RunFailed):
                self._show_failure(s, failure(event), logged=True)

    def on_worker_state_changed(self, event: Worker.StateChanged) -> None:
        sessions = (self.session, *self._ended)
        s = next((s for s in sessions if s is not None and s.worker is event.worker), None)
        if s is None or event.state not in (WorkerState.SUCCESS, WorkerState.ERROR):
            return
        if event.state == WorkerState.ERROR:
            error = event.worker.error
            self._show_failure(s, f"engine error: {type(error).__name__}: {error}", logged=False)
        else:
            result = event.worker.result
            s.summary = result if isinstance(result, dict) else None
            if s.summary and s.summary.get("run_dir"):
                s.run_dir = s.summary["run_dir"]
            if s.active:
                self._set_state(s, "stopped" if s.control.is_set() else "finished")
        if s is self.session and self._quit_when_done:
            self.exit()
        elif s is self.session and self._next_job is not None:
            job, player, name = self._next_job
            self._next_job = None
            self._ended.append(s)
            self.start_session(job, player, name)
        self.refresh_bindings()

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
            self.notify(message, title="run failed", severity="error", timeout=15)
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
        for pane in self.panes[1:]:
            pane.redraw()

    def redraw_now(self) -> None:
        """Draw every pane on screen now (the timer would within RENDER_INTERVAL_S)."""
        self.header.redraw(force=True)
        for pane in self.panes[1:]:
            pane.redraw()

    # ------------------------------------------------------------------ actions

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer and keys offer only what fits: run control for a training run, seeking for a replay."""
        if action not in WORKBENCH_ACTIONS:
            return True  # Textual's own (pop_screen, the palette, ...)
        if len(self.screen_stack) > 1 and action not in ("quit", "stop_and_quit", "help"):
            return False  # a dialog or another screen is open: it has its own keys
        s = self.session
        if action in RUN_ACTIONS:
            if s is None or not s.active or (s.replay and action == "stop_training"):
                return False
            return None if s.state == "stopping" else True  # None: shown, but dimmed
        if action in REPLAY_ACTIONS:
            return s is not None and s.replay
        if action == "new_run":
            return self.make_job is not None
        return True

    def action_stop_training(self) -> None:
        s = self.session
        if s is None or not s.active or s.state == "stopping":
            self.notify("no training is running")
            return
        from nanodist_tui.screens.confirm import ConfirmScreen
        question = ("Stop training? Every rank finishes its step and saves a checkpoint there; "
                    "`nanodist-tui resume` continues the run.")
        self.push_screen(ConfirmScreen(question, "Stop"), lambda yes: self._stop(s) if yes else None)

    def _stop(self, s: RunSession, quiet: bool = False) -> None:
        if s.control.is_set() or not s.active:
            return
        s.control.pause.clear()  # a held run must wake up to stop
        s.control.set()
        if not quiet:
            self.say("stop requested: every rank finishes its step, evaluates and saves a checkpoint",
                     "warning")
        self._set_state(s, "stopping")

    def action_toggle_pause(self) -> None:
        s = self.session
        if s is None or not s.active or s.state == "stopping":
            self.notify("nothing is running")
            return
        holding = s.control.toggle_pause()
        if s.replay:
            self._set_state(s, "paused" if holding else "running")
        else:
            self.say("pause requested: every rank holds after its step" if holding else "resume requested")
            self._set_state(s, "pausing" if holding else "running")

    def action_toggle_freeze(self) -> None:
        self.display_frozen = not self.display_frozen
        self.header.display_frozen = self.display_frozen
        self.header.redraw(force=True)
        if not self.display_frozen:
            self._redraw()

    def action_show_tab(self, number: int) -> None:
        if self.workspace is None:
            return
        ids = self.workspace.tab_ids
        if 1 <= number <= len(ids):
            self.workspace.query_one(TabbedContent).active = ids[number - 1]

    def action_replay_speed(self, direction: int) -> None:
        s = self.session
        if s is None or s.player is None:
            return
        s.player.speed = faster(s.player.speed) if direction > 0 else slower(s.player.speed)
        self.header.replay_speed = s.player.speed
        self.header.redraw(force=True)

    def action_seek(self, direction: int) -> None:
        s = self.session
        if s is None or s.player is None:
            return
        player = s.player
        span = max(1, player.last_step - player.first_step)
        target = player.step + round(direction * SEEK_SHARE * span)
        target = max(player.first_step, min(player.last_step, target))
        self.seek_to(target)

    def seek_to(self, step: int) -> None:
        """Replay from the start up to `step` at once, then at the current speed (the panes are rebuilt)."""
        s = self.session
        if s is None or s.player is None:
            return
        player = ReplayPlayer(s.player.events, s.player.speed, start_step=step)
        self.replace_session(player, player, self.preset_name)

    def action_help(self) -> None:
        from nanodist_tui.screens.help import HelpScreen
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen())

    def action_new_run(self) -> None:
        if self.make_job is None:
            self.notify("starting runs needs the workbench started by nanodist-tui")
            return
        from nanodist_tui.screens.new_run import NewRunScreen
        self.push_screen(NewRunScreen(self.check_run), self._new_run_chosen)

    def _new_run_chosen(self, chosen) -> None:
        if chosen is None or self.make_job is None:
            return
        cfg, doc = chosen
        self.replace_session(self.make_job(cfg, doc), None, cfg.name)

    def action_open_replay(self) -> None:
        from nanodist_tui.screens.open_run import OpenRunScreen
        self.push_screen(OpenRunScreen(count=1), self._replay_chosen)

    def _replay_chosen(self, chosen) -> None:
        if not chosen:
            return
        from engine.recorder import read_events
        (run_dir,) = chosen
        events = read_events(run_dir)
        player = ReplayPlayer(events)
        self.replace_session(player, player, run_dir.name)

    def action_compare(self) -> None:
        from nanodist_tui.screens.open_run import OpenRunScreen
        self.push_screen(OpenRunScreen(count=2), self._compare_chosen)

    def _compare_chosen(self, chosen) -> None:
        if chosen and len(chosen) == 2:
            from nanodist_tui.screens.compare import CompareScreen
            self.push_screen(CompareScreen(*chosen))

    async def action_quit(self) -> None:
        """Quit; a run still going is stopped first (after a confirmation), keeping its checkpoint."""
        s = self.session
        if s is None or not s.active or s.replay:
            self.exit()
        elif s.control.is_set():
            self.exit()  # a second quit while stopping: leave now
        else:
            from nanodist_tui.screens.confirm import ConfirmScreen
            question = "Stop the run and quit? Every rank saves a checkpoint at the step it reached."
            self.push_screen(ConfirmScreen(question, "Stop and quit"),
                             lambda yes: self.action_stop_and_quit() if yes else None)

    def action_stop_and_quit(self) -> None:
        """Stop the run (checkpoint kept) and quit once it has stopped; pressed again, quit at once."""
        s = self.session
        if s is None or not s.active or self._quit_when_done:
            self.exit()
            return
        self._quit_when_done = True
        self._stop(s, quiet=s.replay)
        if s.worker is not None and s.worker.is_finished:
            self.exit()

    def _watch_signals(self) -> None:
        """SIGTERM (and a SIGINT from outside: ctrl+c itself arrives as a key) stop the run and quit."""
        if self.is_headless:
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(sig, self.action_stop_and_quit)
            except (ValueError, NotImplementedError, RuntimeError):  # not the main thread, or no signals here
                return

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """The palette (ctrl+p): every action of the workbench and every pane, then Textual's own."""
        from nanodist_tui.commands import workbench_commands
        yield from workbench_commands(self)
        yield from super().get_system_commands(screen)

    # ------------------------------------------------------------------ leaving

    def farewell(self) -> list[str]:
        """What the shell shows once the workbench has closed: the run folder and the summary, or the
        failure; sets `shell_exit_code` (1 for a failed run)."""
        from nanodist_tui.headless import summary_lines
        s = self.session
        if s is None or s.replay:
            return []
        if s.failure is not None:
            self.shell_exit_code = 1
            return [f"run failed: {s.failure}"] + ([f"run folder     {s.run_dir}"] if s.run_dir else [])
        if s.summary is not None:
            return summary_lines(s.summary)
        if s.run_dir:
            still = " (still stopping when the workbench closed)" if s.active else ""
            return [f"run folder     {s.run_dir}{still}"]
        return []


def create_app(preset_name: str, job_fn: JobFn | None, *, replay: ReplayPlayer | None = None,
               make_job: MakeJob | None = None, check_run: Callable[[Any], None] | None = None,
               user_config: UserConfig | None = None, compare: tuple | None = None) -> NanoDistApp:
    """The app for one run (or none, to compare two recorded ones); shared by the CLI (real or replayed
    run) and the tests (fake jobs). `make_job(cfg, doc)` lets the user start other runs from the app."""
    return NanoDistApp(preset_name, job_fn, replay=replay, make_job=make_job, check_run=check_run,
                       user_config=user_config, compare=compare)
