"""The device mesh: the ranks laid out on the grid of their parallelism axes (rows pipeline stage x data
replica, columns context x tensor rank), then every kind of process group with its size, the link it uses
(inside a node or across nodes) and the bytes its ranks sent in the last step, under the names the traffic
meter booked them, and what each kind is for. The grid comes from the run's config alone, so it is there
before the first step; the bytes come with the Traffic events, read as the traffic pane reads them."""

from __future__ import annotations

import textwrap

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll

from engine.events import Traffic
from engine.parallel.mesh import AXES, Mesh
from engine.run.printable import printable
from nanodist_tui.mesh_grid import grid_lines, layout_text, rank_formula
from nanodist_tui.mesh_groups import GroupKind, group_kinds, nodes_text, unknown_groups
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.traffic import bytes_by_group, rank_traffic
from nanodist_tui.widgets.text_view import TextView
from nanodist_tui.widgets.units import format_bytes, short_bytes

# the group table's columns: (title, width, aligned left); "what for" follows where the line has room, else
# a legend below
TABLE = (("group", 6, True), ("ranks", 5, False), ("groups", 7, False), ("", 2, True), ("link", 10, True),
         ("per group", 13, False), ("in all", 10, False))


class MeshPane(VerticalScroll):
    """A scrolling frame around the text: the group table and the legend run below the fold at 80x24, and a
    Static scrolls no text of its own (Textual scrolls only containers and scroll views)."""

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.border_title = "device mesh"
        self.info = info
        self.mesh: Mesh | None = None
        self.problem = ""
        try:
            self.mesh = info.mesh  # once: its groups are worked out on first use and kept
        except ValueError as err:  # only a damaged recording: a run's layout was checked before it started
            self.problem = str(err)
        self.view = TextView("", classes="mesh-text")
        self.events: dict[int, Traffic] = {}  # each rank's latest; read only when drawn
        self._dirty = True  # the grid needs no event: it is drawn from the config

    def compose(self) -> ComposeResult:
        yield self.view

    def ingest(self, tick: Tick) -> None:
        for rank, event in tick.traffic.items():
            if self.events.get(rank) is not event:
                self.events[rank] = event
                self._dirty = True

    def on_resize(self) -> None:
        self._dirty = True  # the lines are fitted to the width

    def redraw(self) -> None:
        if not (self._dirty and self.is_on_screen):
            return
        self._dirty = False
        # the scrollbar's column kept free from the start: lines fitted without it would lose their ends
        # when it appears (the frame keeps its size, so no resize says so)
        width = (self.content_region.width or 80) - self.styles.scrollbar_size_vertical
        self.view.show(self.render_mesh(width))

    def render_mesh(self, width: int) -> Text:
        mesh = self.mesh
        if mesh is None:
            return Text(wrapped(printable(f"no mesh to draw: {self.problem}"), width), style="yellow")
        out = Text()
        self._title(out, mesh, width)
        out.append("\n")
        for line in grid_lines(mesh, width):
            out.append(line + "\n")
        out.append("\n")
        self._groups(out, mesh, width)
        out.rstrip()
        return out

    def _title(self, out: Text, mesh: Mesh, width: int) -> None:
        info = self.info
        degrees = {a: mesh.degree(a) for a in AXES}
        out.append(f"{mesh.world_size} ranks = {layout_text(degrees, info.sequence_parallel)}", style="bold")
        if sum(mesh.degree(a) > 1 for a in ("tp", "cp", "dp", "pp")) > 1:  # one axis: the order moves nothing
            order = f"order {'-'.join(mesh.axes)} (innermost first)"
            fits = len(out.plain) + 3 + len(order) <= width
            out.append(f"   {order}" if fits else f"\n{order}", style="dim")
        formula, nodes = rank_formula(mesh), nodes_text(mesh.world_size, info.ranks_per_node)
        out.append(f"\n{formula}; {nodes}\n" if len(formula) + 2 + len(nodes) <= width
                   else f"\n{formula}\n{nodes}\n", style="dim")

    def _groups(self, out: Text, mesh: Mesh, width: int) -> None:
        sent = bytes_by_group([rank_traffic(e) for e in self.events.values()])
        kinds, alone = group_kinds(mesh, self.info.ranks_per_node, sent)
        if self.events:
            step = max(e.step for e in self.events.values())
            out.append(f"groups: bytes all of a group's ranks sent in step {step}\n", style="bold")
        else:
            out.append("groups: no traffic yet (bytes per group come with the first step)\n",
                       style="bold")
        longest = max((len(purpose(k)) for k in kinds), default=0)
        inline = sum(w for _, w, _ in TABLE) + 2 + longest <= width
        head = table_row([t for t, _, _ in TABLE]) + ("  what for" if inline else "")
        out.append(head + "\n", style="bold")
        for k in kinds:
            cells = [k.kind, str(k.size), str(len(k.groups)), "", k.link, per_group(k),
                     format_bytes(sum(k.sent.values())) if k.sent else "-"]
            out.append(table_row(cells) + (f"  {purpose(k)}" if inline else "") + "\n")
        if alone:
            line = f"one rank each (degree 1, nothing to send): {', '.join(alone)}"
            out.append(wrapped(line, width) + "\n", style="dim")
        if other := unknown_groups(mesh, self.info.ranks_per_node, sent):
            named = ", ".join(f"{n} {format_bytes(b)}" for n, b in other.items())
            out.append(wrapped(printable(f"other groups the meter booked: {named}"), width) + "\n",
                       style="yellow")
        if not inline and kinds:
            out.append("\nwhat each group is for\n", style="bold")
            for k in kinds:
                out.append(wrapped(f"{k.kind:<7}{purpose(k)}", width, indent=7) + "\n")


def wrapped(line: str, width: int, indent: int = 2) -> str:
    """A line of words folded to `width`, its continuation lines indented: nothing is cut off."""
    return "\n".join(textwrap.wrap(line, max(width, indent + 10), subsequent_indent=" " * indent,
                                   break_on_hyphens=False)) or line


def table_row(cells: list[str]) -> str:
    return "".join(c.ljust(w) if left else c.rjust(w) for c, (_, w, left) in zip(cells, TABLE, strict=True))


def purpose(kind: GroupKind) -> str:
    return kind.what + (f" (= {kind.same_as} here)" if kind.same_as else "")


def per_group(kind: GroupKind) -> str:
    """One group's bytes in the step: the figure, or the lowest and the highest where the groups differ."""
    if not kind.sent:
        return "-"
    values = [*kind.sent.values(), *[0] * (len(kind.groups) - len(kind.sent))]  # a silent group sent 0
    low, high = min(values), max(values)
    if format_bytes(low) == format_bytes(high):
        return format_bytes(high)
    return f"{short_bytes(low)}-{short_bytes(high)}"
