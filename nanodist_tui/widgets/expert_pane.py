"""The experts of a mixture-of-experts run, step by step: per MoE layer the tokens each expert kept, the
load each rank's experts ran, max/mean load, dropped tokens, the router's entropy and the load-balancing
loss (nanodist_tui.expert_chart draws them). From the ExpertLoad events, one per rank per step, live and in
a replay: the pane shows the latest step every rank has reported (until then the latest any has)."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from engine.events import ExpertLoad
from nanodist_tui.expert_chart import layer_loads, render
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import glyphs_of
from nanodist_tui.widgets.text_view import TextView

KEPT_STEPS = 3  # steps whose reports are kept while the slower ranks catch up


class ExpertPane(VerticalScroll):
    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "experts"
        self.info = info
        self.steps: dict[int, dict[int, ExpertLoad]] = {}  # step -> rank -> its report
        self.view = TextView("", classes="expert-text")
        self._dirty = True

    def compose(self) -> ComposeResult:
        yield self.view

    def ingest(self, tick: Tick) -> None:
        for event in tick.events:
            if isinstance(event, ExpertLoad):
                self.steps.setdefault(event.step, {})[event.rank] = event
                self._dirty = True
        for old in sorted(self.steps)[:-KEPT_STEPS]:
            del self.steps[old]

    def on_resize(self) -> None:
        self._dirty = True

    def redraw(self) -> None:
        if not (self._dirty and self.is_on_screen):
            return
        self._dirty = False
        width = (self.content_region.width or 80) - self.styles.scrollbar_size_vertical
        self.view.show(self.render_experts(width))

    def render_experts(self, width: int) -> Text:
        if not self.steps:
            return Text("no expert load yet: each rank reports its routing once per step", style="dim")
        whole = [s for s, ranks in self.steps.items() if len(ranks) == self.info.world_size]
        step = max(whole) if whole else max(self.steps)
        glyphs = glyphs_of(self)
        return render(step, layer_loads(self.steps[step].values()), self.info.expert, self.info.moe_every,
                      width, glyphs.block, glyphs.track)
