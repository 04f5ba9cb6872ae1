"""The experts of a mixture-of-experts run, step by step: per MoE layer the tokens each expert kept, the
load each rank's experts ran, max/mean load, dropped tokens, the router's entropy and the load-balancing
loss (nanodist_tui.expert_chart draws them). From the ExpertLoad events, one per rank per step, live and in
a replay: the latest step every rank has reported (widgets/rank_reports.py keeps and picks them)."""

from __future__ import annotations

from rich.text import Text

from engine.events import ExpertLoad
from nanodist_tui.expert_chart import layer_loads, render
from nanodist_tui.widgets.glyphs import Glyphs
from nanodist_tui.widgets.rank_reports import RankReportsPane


class ExpertPane(RankReportsPane):
    event_type = ExpertLoad
    title = "experts"
    waiting = "no expert load yet: each rank reports its routing once per step"

    def render_step(self, step: int, reports: list, width: int, glyphs: Glyphs) -> Text:
        return render(step, layer_loads(reports), self.info.expert, self.info.moe_every, width, glyphs.block,
                      glyphs.track)
