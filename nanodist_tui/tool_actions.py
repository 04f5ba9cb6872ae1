"""The workbench's tools, reached by their keys or the palette: replaying a recorded run, comparing two,
the planner, the sweeps, serving a trained model. A mixin of NanoDistApp beside WorkbenchActions
(nanodist_tui/actions.py), whose `WorkbenchHost` is what they need of the app."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nanodist_tui.replay import ReplayPlayer

if TYPE_CHECKING:
    from tomlkit import TOMLDocument

    from engine.config import Config
    from nanodist_tui.actions import WorkbenchHost
    from nanodist_tui.serve.server import ModelServer


class ToolActions:
    """Opening the workbench's tools; what each picks starts here (a replay, a planned run) or on a screen
    of its own."""

    # the host's state these set, typed here too: mypy takes an attribute assigned in a class's methods
    # for one of that class
    model_server: ModelServer | None

    def action_open_replay(self: WorkbenchHost) -> None:
        from nanodist_tui.screens.open_run import OpenRunScreen
        self.push_screen(OpenRunScreen(count=1), self._replay_chosen)

    def _replay_chosen(self: WorkbenchHost, chosen: list[Path] | None) -> None:
        if not chosen:
            return
        from engine.run.recorder import read_events
        (run_dir,) = chosen
        events = read_events(run_dir)
        s = self.session
        if s is not None and s.active and not s.replay:
            # a run is training: the replay goes on a screen of its own over it, and `esc` comes back to
            # the run, still training (replacing the session would have stopped it)
            from nanodist_tui.screens.replay_over import ReplayOverScreen
            self.push_screen(ReplayOverScreen(events, run_dir.name))
            return
        player = ReplayPlayer(events)
        self.replace_session(player, player, run_dir.name)

    def action_compare(self: WorkbenchHost) -> None:
        from nanodist_tui.screens.open_run import OpenRunScreen
        self.push_screen(OpenRunScreen(count=2), self._compare_chosen)

    def _compare_chosen(self: WorkbenchHost, chosen: list[Path] | None) -> None:
        if chosen and len(chosen) == 2:
            from nanodist_tui.screens.compare import CompareScreen
            self.push_screen(CompareScreen(*chosen))

    def action_plan(self: WorkbenchHost) -> None:
        """The planner on the run's preset (nanodist_tui/screens/plan.py); a layout chosen there starts here
        as a new run does."""
        from nanodist_tui.screens.plan import PlanScreen
        self.push_screen(PlanScreen(self.projection._cfg()), self._plan_chosen)

    def _plan_chosen(self: WorkbenchHost, chosen: tuple[Config, TOMLDocument] | None) -> None:
        if chosen is not None and self.make_job is None:
            self.notify("starting runs needs the workbench started by nanodist-tui")
            return
        self._new_run_chosen(chosen)

    def action_sweeps(self: WorkbenchHost) -> None:
        from nanodist_tui.screens.sweeps import SweepsScreen
        self.push_screen(SweepsScreen())

    def action_serve(self: WorkbenchHost) -> None:
        if self.model_server is not None:
            self.notify(f"already serving on {self.model_server.url} (the palette's Stop serving ends it)")
            return
        from nanodist_tui.screens.open_run import OpenRunScreen
        self.push_screen(OpenRunScreen(count=1), self._serve_chosen)

    def _serve_chosen(self: WorkbenchHost, chosen: list[Path] | None) -> None:
        if chosen:
            self.run_worker(lambda: self._start_serving(chosen[0]), name="serve", group="serve", thread=True,
                            exit_on_error=False)

    def _start_serving(self: WorkbenchHost, run_dir: Path) -> None:
        """On a worker thread: loading and checking the model takes a moment."""
        from nanodist_tui.serving import start_server
        try:
            server = start_server(run_dir)
        except Exception as e:  # noqa: BLE001 - shown as one line; the workbench goes on
            self.call_from_thread(self.notify, f"cannot serve {run_dir}: {e}", severity="error", timeout=10)
            return
        self.call_from_thread(self._serving, server, run_dir)

    def _serving(self: WorkbenchHost, server: ModelServer, run_dir: Path) -> None:
        if not self.is_running:
            server.stop()
            return
        self.model_server = server
        self.say(f"serving {run_dir} on {server.url}: POST /generate, GET /info, GET /health, docs at "
                 f"{server.url}/docs (palette: \"Stop serving\")", "success")
        self.notify(f"serving on {server.url}")

    def action_stop_serving(self: WorkbenchHost) -> None:
        server, self.model_server = self.model_server, None
        if server is not None:
            server.stop()
            self.say(f"stopped serving on {server.url}")
