"""The panes of one run, as tabs: the overview first (the panes that fit on one screen), then one tab per
pane the run has (panes.PANES decides which). Built when the run starts, rebuilt for the next run or a seek
in a replay. Every pane instance (a pane on the overview and in its own tab is two) is listed in `panes`,
which the app feeds every tick."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import TabbedContent, TabPane

from nanodist_tui.panes import PaneSpec, panes_for
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.pane import Pane, as_panes
from nanodist_tui.widgets.pipeline_pane import PipelinePane

OVERVIEW = "overview"


def tab_id(pane_id: str) -> str:
    return f"tab-{pane_id}"


class Workspace(Vertical):
    def __init__(self, info: RunInfo, *, id: str | None = None, initial_tab: str | None = None) -> None:
        super().__init__(id=id)
        self.info = info
        self.initial_tab = initial_tab
        self.specs: list[PaneSpec] = panes_for(info)
        self.tabs: dict[str, Widget] = {spec.id: spec.make(info) for spec in self.specs}
        self.overview: dict[int, list[Widget]] = {}
        for spec in self.specs:
            if spec.overview_row is not None:
                widget = (spec.overview_make or spec.make)(info)
                widget.add_class(f"overview-{spec.id}")
                self.overview.setdefault(spec.overview_row, []).append(widget)
        for spec in self.specs:
            self.tabs[spec.id].add_class(f"tab-{spec.id}")

    def focus_tabs(self) -> None:
        """Give the tab strip the focus (arrows then switch tabs), once it exists."""
        for tabs in self.query("ContentTabs"):
            tabs.focus()

    @property
    def active_tab(self) -> str | None:
        """The id of the tab on show (None before the tabs exist)."""
        tabs = self.query(TabbedContent)
        return tabs.first().active or None if tabs else None

    @property
    def panes(self) -> list[Pane]:
        return as_panes([*(w for row in self.overview.values() for w in row), *self.tabs.values()])

    @property
    def tab_ids(self) -> list[str]:
        """Tab ids in the order of their keys (1 = overview, 2 = the first pane, ...)."""
        return [tab_id(OVERVIEW), *(tab_id(spec.id) for spec in self.specs)]

    def show_tab(self, number: int) -> None:
        """Show the tab of key `number` (1 = the overview); a number past the last tab does nothing."""
        ids = self.tab_ids
        if 1 <= number <= len(ids):
            self.query_one(TabbedContent).active = ids[number - 1]

    def scroll_pane(self, how: str, focused: Widget | None) -> None:
        """Scroll the pane on show by `how` (up, page_down, home, ...): the focused widget if it is in the
        pane and scrolls, else the first widget there that can."""
        pane = self.query_one(TabbedContent).active_pane
        if pane is None:
            return
        candidates = [focused] if focused is not None and pane in focused.ancestors else []
        candidates += [w for w in pane.query(Widget) if w.display]
        target = next((w for w in candidates if w.max_scroll_y > 0), None)
        if target is not None:
            getattr(target, f"scroll_{how}")(animate=False)

    def compose(self) -> ComposeResult:
        initial = self.initial_tab if self.initial_tab in self.tab_ids else tab_id(OVERVIEW)
        with TabbedContent(initial=initial):
            with TabPane(f"1 {OVERVIEW}", id=tab_id(OVERVIEW)), Vertical(classes="overview"):
                for row in sorted(self.overview):
                    with Horizontal(classes=f"overview-row row-{row}"):
                        yield from self.overview[row]
            for key, spec in enumerate(self.specs, 2):
                with TabPane(f"{key} {spec.title}", id=tab_id(spec.id)):
                    yield self.tabs[spec.id]


def switchable_pipeline(workspace: Workspace | None) -> PipelinePane | None:
    """The pipeline pane, while its tab is on show and the run has more than one pipeline to step through."""
    pane = workspace.tabs.get("pipeline") if workspace is not None else None
    if not isinstance(pane, PipelinePane) or len(pane.pipelines) < 2:
        return None
    return pane if workspace is not None and workspace.active_tab == "tab-pipeline" else None
