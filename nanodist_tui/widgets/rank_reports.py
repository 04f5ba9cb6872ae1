"""A pane fed one report per rank per step (an event with `step` and `rank`: ContextWork, ExpertLoad, ...): it
keeps the last few steps and draws the latest step every rank has reported (ranks report at different
moments; until one step is whole, the latest any has), live and in a replay. A subclass names the event
type, its border title, the line shown before any report, and how one step's reports are drawn."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import Glyphs, glyphs_of
from nanodist_tui.widgets.text_view import TextView

KEPT_STEPS = 3  # steps whose reports are kept while the slower ranks catch up


class RankReportsPane(VerticalScroll):
    event_type: type
    title: str
    waiting: str  # shown before any report came

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = self.title
        self.info = info
        self.steps: dict[int, dict[int, Any]] = {}  # step -> rank -> its report (an event_type)
        self.view = TextView("", classes=f"{self.title}-text")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self.view

    def ingest(self, tick: Tick) -> None:
        reports: list[Any] = [e for e in tick.events if isinstance(e, self.event_type)]
        for report in reports:
            self.steps.setdefault(report.step, {})[report.rank] = report
            self._dirty = True
        for old in sorted(self.steps)[:-KEPT_STEPS]:
            del self.steps[old]

    def on_resize(self) -> None:
        self._dirty = True

    def redraw(self) -> None:
        if not (self._dirty and self.is_on_screen):
            return
        self._dirty = False
        if not self.steps:
            self.view.show(Text(self.waiting, style="dim"))
            return
        whole = [s for s, ranks in self.steps.items() if len(ranks) == self.info.world_size]
        step = max(whole) if whole else max(self.steps)
        width = (self.content_region.width or 80) - self.styles.scrollbar_size_vertical
        self.view.show(self.render_step(step, list(self.steps[step].values()), width, glyphs_of(self)))

    def render_step(self, step: int, reports: list, width: int, glyphs: Glyphs) -> Text:
        raise NotImplementedError
