"""A recorded run replayed over a live one (`o` while a run trains): its own header and panes on a screen of
their own, fed by their own player, so the run behind it goes on training and `esc` returns to it as it is
now. (With no live run, `o` replays into the workbench itself: there is nothing to keep.)"""

from __future__ import annotations

import threading

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.screen import Screen

from engine.events import RunStarted
from engine.run.control import RunControl
from nanodist_tui.bindings import WORKSPACE_KEYS
from nanodist_tui.bridge import EventBatcher
from nanodist_tui.messages import Tick
from nanodist_tui.replay import ReplayPlayer, faster, slower
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.footer import WorkbenchFooter
from nanodist_tui.widgets.run_header import RunHeader
from nanodist_tui.workspace import Workspace, switchable_pipeline

REDRAW_S = 0.3


class ReplayOverScreen(Screen[None]):
    BINDINGS = [Binding("escape", "close", "Back to the run", id="replay-over-close"),
                Binding("p", "pause", "Pause the replay", id="replay-over-pause"),
                Binding("plus", "faster", "Faster", id="replay-over-faster"),
                Binding("minus", "slower", "Slower", id="replay-over-slower"),
                Binding("g", "next_pipeline", "Next pipeline", id="replay-over-next-pipeline"),
                *WORKSPACE_KEYS]

    def __init__(self, events: list, name: str, speed: float = 1.0) -> None:
        super().__init__()
        self.run_name = name
        self.player = ReplayPlayer(events, speed)
        self.control = RunControl()
        self.batcher = EventBatcher(self._post)
        self.workspace: Workspace | None = None
        self._early: list[Tick] = []  # ticks before RunStarted made the panes
        self._thread: threading.Thread | None = None

    def compose(self) -> ComposeResult:
        self.header = RunHeader(self.run_name, id="replay-over-header")
        yield self.header
        yield Container(id="replay-over-body")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        self.header.reset(self.run_name, replay_speed=self.player.speed)
        self.header.set_state("running")
        self.batcher.start()
        self._thread = threading.Thread(target=self._play, name="nanodist-replay-over", daemon=True)
        self._thread.start()
        self.set_interval(REDRAW_S, self._redraw)

    def _play(self) -> None:
        try:
            self.player(self.batcher.emit, self.control)
        finally:
            self.batcher.close()
            if not self.control.is_set():
                self.app.call_from_thread(self.header.set_state, "finished")

    def _post(self, tick: Tick) -> bool:
        # the app's own ticks are the live run's; this screen's go to it alone
        return bool(self.is_attached) and self.post_message(tick)

    async def on_tick(self, tick: Tick) -> None:
        tick.stop()
        started = next((e for e in tick.events if isinstance(e, RunStarted)), None)
        if started is not None and self.workspace is None:
            self.workspace = Workspace(RunInfo.from_started(started, replay=True), id="replay-over-workspace")
            await self.query_one("#replay-over-body").mount(self.workspace)
            for early in self._early:
                for pane in self.workspace.panes:
                    pane.ingest(early)
            self._early.clear()
        elif self.workspace is None:
            self._early.append(tick)
        if self.workspace is not None:
            for pane in self.workspace.panes:
                pane.ingest(tick)
        self.header.ingest(tick)

    def _redraw(self) -> None:
        self.header.redraw()
        if self.workspace is not None:
            for pane in self.workspace.panes:
                pane.redraw()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_pipeline":  # on the replay's pipeline tab, with several pipelines to show
            return switchable_pipeline(self.workspace) is not None
        return True

    def on_tabbed_content_tab_activated(self) -> None:
        self.refresh_bindings()  # the next-pipeline key comes and goes with the pipeline tab

    def action_next_pipeline(self) -> None:
        if (pane := switchable_pipeline(self.workspace)) is not None:
            pane.next_pipeline()

    def action_show_tab(self, number: int) -> None:
        if self.workspace is not None:
            self.workspace.show_tab(number)

    def action_scroll_pane(self, how: str) -> None:
        if self.workspace is not None:
            self.workspace.scroll_pane(how, self.focused)

    def action_close(self) -> None:
        self.control.set()  # the player stops at its next event; the live run never noticed
        self.dismiss(None)

    def action_pause(self) -> None:
        paused = not self.control.pause.is_set()
        (self.control.pause.set if paused else self.control.pause.clear)()
        self.header.set_state("paused" if paused else "running")

    def action_faster(self) -> None:
        self.player.speed = faster(self.player.speed)
        self.header.replay_speed = self.player.speed

    def action_slower(self) -> None:
        self.player.speed = slower(self.player.speed)
        self.header.replay_speed = self.player.speed
