"""What the workbench's keys do: which of them fit the moment (a training run offers stop and pause, a
replay speed and seek, a sweep its finish), and the actions themselves — stop, pause, freeze, tabs, replay
control, help, new run, compare, quit. The keys are in nanodist_tui/bindings.py. A mixin of NanoDistApp:
the actions drive its sessions (app.py); `WorkbenchHost` is what they need of it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from engine.run import stop_signals
from nanodist_tui.bindings import ANY_SCREEN, REPLAY_ACTIONS, RUN_ACTIONS, SEEK_SHARE, WORKBENCH_ACTIONS
from nanodist_tui.replay import ReplayPlayer, faster, slower
from nanodist_tui.session import JobFn, RunSession
from nanodist_tui.workspace import switchable_pipeline

if TYPE_CHECKING:
    from textual.await_complete import AwaitComplete
    from textual.notifications import SeverityLevel
    from textual.screen import Screen, ScreenResultCallbackType
    from textual.widget import AwaitMount
    from textual.worker import Worker
    from tomlkit import TOMLDocument

    from engine.config import Config
    from nanodist_tui.app import MakeJob
    from nanodist_tui.serve.server import ModelServer
    from nanodist_tui.widgets.projection_pane import ProjectionPane
    from nanodist_tui.widgets.run_header import RunHeader
    from nanodist_tui.workspace import Workspace

_T = TypeVar("_T")

class WorkbenchHost(Protocol):
    """What the actions use of the app they are mixed into (NanoDistApp). A mixin has no base class to say
    what `self` is, so its methods take `self: WorkbenchHost`: mypy checks their bodies against this, and
    NanoDistApp against this wherever one of them is called on it (app.py calls several)."""

    # NanoDistApp's state (app.py): the actions set these three, and only read the rest
    display_frozen: bool
    model_server: ModelServer | None
    _quit_when_done: bool

    @property
    def session(self) -> RunSession | None: ...
    @property
    def header(self) -> RunHeader: ...
    @property
    def workspace(self) -> Workspace | None: ...
    @property
    def preset_name(self) -> str: ...
    @property
    def make_job(self) -> MakeJob | None: ...
    @property
    def check_run(self) -> Callable[[Any], None] | None: ...
    @property
    def sweep_finish(self) -> threading.Event | None: ...
    @property
    def sweeping(self) -> bool: ...
    @property
    def projection(self) -> ProjectionPane: ...

    # NanoDistApp's methods (app.py)
    def say(self, text: str, level: str = "info") -> None: ...
    def replace_session(self, job_fn: JobFn, player: ReplayPlayer | None, name: str) -> None: ...
    def _set_state(self, s: RunSession, state: str) -> None: ...
    def _redraw(self) -> None: ...

    # Textual's App: what the actions call of it
    @property
    def screen(self) -> Screen[object]: ...
    @property
    def screen_stack(self) -> list[Screen[Any]]: ...
    @property
    def is_running(self) -> bool: ...
    @property
    def is_headless(self) -> bool: ...
    def push_screen(self, screen: Screen[_T] | str, callback: ScreenResultCallbackType[_T] | None = None
                    ) -> AwaitMount: ...
    def pop_screen(self) -> AwaitComplete: ...
    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None) -> None: ...
    def run_worker(self, work: Callable[[], _T], *, name: str | None = "", group: str = "default",
                   exit_on_error: bool = True, thread: bool = False) -> Worker[_T]: ...
    def call_from_thread(self, callback: Callable[..., _T], *args: Any, **kwargs: Any) -> _T: ...
    def exit(self) -> None: ...

    # the mixin's own, which its other methods call on `self`
    def _stop(self, s: RunSession, quiet: bool = False) -> None: ...
    def seek_to(self, step: int) -> None: ...
    def _new_run_chosen(self, chosen: tuple[Config, TOMLDocument] | None) -> None: ...
    def _plan_chosen(self, chosen: tuple[Config, TOMLDocument] | None) -> None: ...
    def _replay_chosen(self, chosen: list[Path] | None) -> None: ...
    def _compare_chosen(self, chosen: list[Path] | None) -> None: ...
    def _serve_chosen(self, chosen: list[Path] | None) -> None: ...
    def _start_serving(self, run_dir: Path) -> None: ...
    def _serving(self, server: ModelServer, run_dir: Path) -> None: ...
    def action_stop_and_quit(self) -> None: ...
    def action_fits(self, action: str) -> bool | None: ...
    def _hold_while_asking(self, s: RunSession) -> Callable[[], None]: ...
    def _moot(self, s: RunSession) -> bool: ...


class WorkbenchActions:
    """The workbench's actions; mixed into NanoDistApp, whose members they use (`WorkbenchHost`)."""

    # The host's state the actions set, typed here too: mypy takes an attribute assigned in a class's
    # methods for one of that class.
    display_frozen: bool
    model_server: ModelServer | None
    _quit_when_done: bool

    def check_action(self: WorkbenchHost, action: str, parameters: tuple[object, ...]) -> bool | None:
        """Footer and keys offer only what fits: run control for a training run, seeking for a replay."""
        if action in WORKBENCH_ACTIONS and len(self.screen_stack) > 1 and action not in ANY_SCREEN:
            return False  # a dialog or another screen is open: it has its own keys
        return self.action_fits(action)

    def action_fits(self: WorkbenchHost, action: str) -> bool | None:
        """Whether `action` fits the run as it is, whatever screen is open (the palette asks this: it is a
        screen itself). True: offered; None: shown, but dimmed; False: not offered."""
        if action == "stop_serving":  # the palette's only
            return self.model_server is not None
        if action not in WORKBENCH_ACTIONS:
            return True  # Textual's own (pop_screen, the palette, ...)
        s = self.session
        if action == "toggle_pause" and self.sweeping:
            return False  # a sweep's trials cannot be held
        if action in RUN_ACTIONS:
            if s is None or not s.active or (s.replay and action == "stop_training"):
                return False
            return None if s.state == "stopping" else True  # None: shown, but dimmed
        if action in REPLAY_ACTIONS:
            return s is not None and s.replay
        if action == "finish_sweep":
            return self.sweeping and s is not None and s.active
        if action == "new_run":
            return self.make_job is not None
        if action == "next_pipeline":
            return switchable_pipeline(self.workspace) is not None
        return True

    def action_projection(self: WorkbenchHost) -> None:
        """The run projected onto a cluster (its own screen, installed by the app; `escape` comes back)."""
        self.push_screen("projection")

    def action_stop_training(self: WorkbenchHost) -> None:
        """Hold the run at once, then ask: yes stops it at the step it holds at (checkpoint kept), no lets it
        go on. Asking without holding let it train on while the user read the question: the stop landed
        tens of steps after the decision."""
        s = self.session
        if s is None or not s.active or s.state == "stopping":
            self.notify("no training is running")
            return
        from nanodist_tui.screens.confirm import ConfirmScreen
        resume = self._hold_while_asking(s)
        question = ("Stop training here? It is held after its step; every rank saves a checkpoint there and "
                    "`nanodist-tui resume` continues the run. No: training goes on.")
        self.push_screen(ConfirmScreen(question, "Stop", moot=lambda: self._moot(s),
                                       moot_note="the run has ended: the question was closed"),
                         lambda yes: self._stop(s) if yes else resume())

    def _hold_while_asking(self: WorkbenchHost, s: RunSession) -> Callable[[], None]:
        """Hold a training run while a question about stopping it is open; returns what undoes that (if the
        run was held already, or cannot be held, it does nothing)."""
        if s.replay or self.sweeping or s.control.pause.is_set() or s.control.is_set():
            return lambda: None  # a sweep's trials cannot be held; a held run stays as the user left it
        s.control.pause.set()
        self._set_state(s, "pausing")

        def resume() -> None:
            if s.active and not s.control.is_set() and s.control.pause.is_set():
                s.control.pause.clear()
                self._set_state(s, "running")
        return resume

    def _moot(self: WorkbenchHost, s: RunSession) -> bool:
        """A question about stopping `s` no longer matters: it ended, is stopping, or another run replaced
        it."""
        return self.session is not s or not s.active or s.control.is_set()

    def _stop(self: WorkbenchHost, s: RunSession, quiet: bool = False) -> None:
        if s.control.is_set() or not s.active:
            return
        # Stop first, then wake a held run: held ranks see both at their next poll and stop where they
        # hold (the other order could let them take one more step in between).
        s.control.set()
        s.control.pause.clear()
        if not quiet:
            self.say("stop requested: every rank finishes its step, evaluates and saves a checkpoint",
                     "warning")
        self._set_state(s, "stopping")

    def action_toggle_pause(self: WorkbenchHost) -> None:
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

    def action_finish_sweep(self: WorkbenchHost) -> None:
        """The sweep's own thread sees the event after the running trial and calls Optuna's stop."""
        if self.sweep_finish is None or not self.sweeping or self.sweep_finish.is_set():
            return
        self.sweep_finish.set()
        self.say("the sweep stops after the running trial", "warning")

    def action_toggle_freeze(self: WorkbenchHost) -> None:
        self.display_frozen = not self.display_frozen
        self.header.display_frozen = self.display_frozen
        self.header.redraw(force=True)
        if not self.display_frozen:
            self._redraw()

    def action_show_tab(self: WorkbenchHost, number: int) -> None:
        if self.workspace is not None:
            self.workspace.show_tab(number)

    def action_next_pipeline(self: WorkbenchHost) -> None:
        if (pane := switchable_pipeline(self.workspace)) is not None:
            pane.next_pipeline()

    def action_scroll_pane(self: WorkbenchHost, how: str) -> None:
        """Scroll the pane on show: the focused widget if it scrolls, else the first that can in the tab."""
        if self.workspace is not None:
            self.workspace.scroll_pane(how, self.screen.focused)

    def action_replay_speed(self: WorkbenchHost, direction: int) -> None:
        s = self.session
        if s is None or s.player is None:
            return
        s.player.speed = faster(s.player.speed) if direction > 0 else slower(s.player.speed)
        self.header.replay_speed = s.player.speed
        self.header.redraw(force=True)

    def action_seek(self: WorkbenchHost, direction: int) -> None:
        s = self.session
        if s is None or s.player is None:
            return
        player = s.player
        span = max(1, player.last_step - player.first_step)
        target = player.step + round(direction * SEEK_SHARE * span)
        target = max(player.first_step, min(player.last_step, target))
        self.seek_to(target)

    def seek_to(self: WorkbenchHost, step: int) -> None:
        """Replay from the start up to `step` at once, then at the current speed (the panes are rebuilt)."""
        s = self.session
        if s is None or s.player is None:
            return
        player = ReplayPlayer(s.player.events, s.player.speed, start_step=step)
        self.replace_session(player, player, self.preset_name)

    def action_help(self: WorkbenchHost) -> None:
        from nanodist_tui.screens.help import HelpScreen
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen())

    def action_new_run(self: WorkbenchHost) -> None:
        if self.make_job is None:
            self.notify("starting runs needs the workbench started by nanodist-tui")
            return
        from nanodist_tui.screens.new_run import NewRunScreen
        self.push_screen(NewRunScreen(self.check_run), self._new_run_chosen)

    def _new_run_chosen(self: WorkbenchHost, chosen: tuple[Config, TOMLDocument] | None) -> None:
        if chosen is None or self.make_job is None:
            return
        cfg, doc = chosen
        job = self.make_job(cfg, doc)
        s = self.session
        if s is None or not s.active or s.replay:
            self.replace_session(job, None, cfg.name)
            return
        from nanodist_tui.screens.confirm import ConfirmScreen
        question = (f"Start {cfg.name}? The run going now stops first: every rank saves a checkpoint at the "
                    "step it reached.")
        note = f"the run going has ended: the question was closed; n starts {cfg.name}"
        running = s
        self.push_screen(ConfirmScreen(question, "Stop it and start", moot=lambda: self._moot(running),
                                       moot_note=note),
                         lambda yes: self.replace_session(job, None, cfg.name) if yes else None)

    async def action_quit(self: WorkbenchHost) -> None:
        """Quit; a run still going is stopped first (after a confirmation), keeping its checkpoint."""
        s = self.session
        if s is None or s.replay:
            self.exit()
        elif not s.active:
            if s.job_running and not self._quit_when_done:
                # The run has ended but its job is still closing the run folder (sinks, record): quit
                # once it has, so the shell gets the job's whole summary (the process waits for it anyway).
                self._quit_when_done = True
                self.say("closing the run folder, then quitting")
            else:
                self.exit()
        elif s.control.is_set():
            self.exit()  # a second quit while stopping: leave now
        else:
            from nanodist_tui.screens.confirm import QuitConfirmScreen
            if isinstance(self.screen, QuitConfirmScreen):  # ctrl+q over its own question: a second quit
                self.screen.dismiss(True)
                return
            resume = self._hold_while_asking(s)
            question = ("Stop the run and quit? It is held after its step; every rank saves a checkpoint "
                        "there. q again (or y) quits.")
            self.push_screen(QuitConfirmScreen(question, "Stop and quit", moot=lambda: self._moot(s)),
                             lambda yes: self.action_stop_and_quit() if yes else resume())

    def action_stop_and_quit(self: WorkbenchHost) -> None:
        """Stop the run (checkpoint kept) and quit once it has stopped; pressed again, quit at once."""
        s = self.session
        if s is None or not s.active or self._quit_when_done:
            self.exit()
            return
        self._quit_when_done = True
        self._stop(s, quiet=s.replay)
        if not s.job_running:
            self.exit()

    def _watch_signals(self: WorkbenchHost) -> None:
        """SIGTERM (a scheduler's), SIGHUP (the terminal went away) and a SIGINT from outside (ctrl+c
        itself arrives as a key) stop the run and quit, leaving the terminal as the app found it; a second
        one quits at once. They usually reach the whole process group: the rank processes stop too, after
        the agreed step (engine.run.stop_signals)."""
        if self.is_headless:
            return
        loop = asyncio.get_running_loop()
        for sig in stop_signals.watched():
            try:
                loop.add_signal_handler(sig, self.action_stop_and_quit)
            except (ValueError, NotImplementedError, RuntimeError):  # not the main thread, or no signals here
                return
