"""Ring traffic: the ranks as a ring with each link's bytes and rate in the last step, the bytes a rank sent
against the ring's k(N-1)/N · S bound, NCCL-tests' algbw and busbw per phase, and each rank's step split
into compute and waiting (with its communication time), the straggler and any slow link marked."""

from __future__ import annotations

from rich.text import Text

from engine.events import RankStats
from engine.run.printable import printable
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.traffic import (
    RankTraffic,
    allreduce_bandwidth,
    phase_bandwidths,
    rank_traffic,
    ring_bound,
    ring_factor,
    slow_links,
    step_splits,
    stragglers,
    which_ran_where,
)
from nanodist_tui.widgets.glyphs import glyphs_of
from nanodist_tui.widgets.ring_diagram import draw_ring
from nanodist_tui.widgets.text_view import TextView
from nanodist_tui.widgets.units import format_bytes, format_rate, format_seconds

SPLIT_WIDTH = 20  # cells of the per-rank compute / wait bar
COMPUTE_STYLE, WAIT_STYLE = "green", "red"


class TrafficPane(TextView):
    FIXED_SIZE = True  # a share of its row: lines that come and go need no layout until it overflows

    def __init__(self, info: RunInfo, *, id: str | None = None) -> None:
        super().__init__("no traffic yet: waiting for the first step", id=id, classes="placeholder")
        self.border_title = "ring traffic"
        self.info = info
        self.traffic: dict[int, RankTraffic] = {}
        self.stats: dict[int, RankStats] = {}
        self._seen: dict[int, object] = {}
        self._dirty = False

    def ingest(self, tick: Tick) -> None:
        for rank, event in tick.traffic.items():
            if self._seen.get(rank) is not event:
                self._seen[rank] = event
                self.traffic[rank] = rank_traffic(event)
                self._dirty = True
        for rank, stats in tick.rank_stats.items():
            if self.stats.get(rank) is not stats:
                self.stats[rank] = stats
                self._dirty = True

    def on_resize(self) -> None:
        self._dirty = bool(self.traffic)

    def redraw(self) -> None:
        if not (self._dirty and self.traffic and self.is_on_screen):
            return
        self._dirty = False
        self.remove_class("placeholder")
        self.show(self.render_traffic(self.content_region.width or 80))

    def render_traffic(self, width: int) -> Text:
        glyphs = glyphs_of(self)
        world = self.info.world_size
        links = {key: link for t in self.traffic.values() for key, link in t.links.items()}
        slow = slow_links(list(links.values()))
        step = max(t.step for t in self.traffic.values())
        out = Text()
        drawn = draw_ring(world, links, width, glyphs, slow)
        ring_links = {(r, (r + 1) % world) for r in range(world)}
        if drawn is not None:
            lines, with_bytes = drawn
            caption = f"ring, step {step}"
            if not with_bytes:
                caption += f": every link carried {format_bytes(next(iter(links.values())).bytes)}"
            out.append(caption + "\n", style="bold")
            for line in lines:
                out.append_text(line)
                out.append("\n")
        shown = ring_links if drawn is not None else set()
        others = sorted(key for key in links if key not in shown)
        if others:
            out.append("links" if drawn is None else "other links", style="bold")
            out.append(f"  (step {step})\n" if drawn is None else "\n")
            for key in others:
                link = links[key]
                phases = ", ".join(link.phases)
                if link.algorithms:
                    phases += "  " + ", ".join(f"{a} in {g}" for g, a in link.algorithms)
                phases = printable(phases)  # a replay's names are a recorded run's text
                out.append(f"  {key[0]:>3} {glyphs.right} {key[1]:<3} {format_bytes(link.bytes, 9)} "
                           f"{format_rate(link.rate, 11)}  {phases}\n",
                           style="bold red" if key in slow else "")
        if slow:
            out.append("slow link: ", style="bold red")
            named = ", ".join(f"{s} {glyphs.right} {d}" for s, d in sorted(slow))
            out.append(f"{named}  (under half the median rate of the others)\n")
        out.append("\n")
        self._bound(out)
        self._phases(out, width)
        self._algorithms(out)
        self._splits(out, glyphs, width)
        missing = sorted(set(range(world)) - set(self.traffic))
        if missing:
            out.append(f"\nno traffic reported by rank(s) {', '.join(map(str, missing))}", style="yellow")
        out.rstrip()
        return out

    def _bound(self, out: Text) -> None:
        info = self.info
        mine = self.traffic.get(0) or next(iter(self.traffic.values()))
        degrees = {"tp": info.tensor, "pp": info.pipeline, "cp": info.context, "ep": info.expert}
        if splits := {axis: d for axis, d in degrees.items() if d > 1}:
            # S and N are data parallelism's alone: a split model's ranks each reduce their own shard or
            # stage over a smaller group, and other groups carry other messages (listed per group below)
            split = " x ".join(f"{axis} {d}" for axis, d in splits.items())
            out.append("no ring bound ", style="bold")
            out.append(f"for a split model ({split}): each rank reduces its own share of the gradients "
                       f"over its data-parallel group; the bytes per group are below\n", style="dim")
            return
        bound = ring_bound(info.gradient_bytes, info.world_size, info.zero_stage)
        out.append("sent per rank and step ", style="bold")
        k = ring_factor(info.zero_stage)
        out.append(f"{format_bytes(mine.sync_bytes)}  vs ring bound {k}(N-1)/N·S = {format_bytes(bound)}")
        if bound:
            out.append(f"  {mine.sync_bytes / bound:.1%}", style="bold")
        out.append(f"\n  S = {format_bytes(info.gradient_bytes)} of gradients ({info.n_params:,} × "
                   f"{info.dtype}); rank {mine.rank}, step {mine.step}\n", style="dim")

    def _phases(self, out: Text, width: int) -> None:
        mine = self.traffic.get(0) or next(iter(self.traffic.values()))
        world = self.info.world_size
        whole = allreduce_bandwidth(mine, world)
        if whole is not None and self.info.zero_stage == 0:
            figures = f"algbw {format_rate(whole[0])}  busbw {format_rate(whole[1])}"
            out.append("all-reduce ", style="bold")
            out.append(figures)
            # the definitions beside the figures where they fit, else on a line of their own: never cut
            legend = "(algbw = S/t, busbw = algbw·2(N-1)/N)"
            fits = len("all-reduce ") + len(figures) + 2 + len(legend) <= width
            out.append(f"  {legend}\n" if fits else f"\n  {legend}\n", style="dim")
        rows = phase_bandwidths(mine, world)
        if not rows:
            return
        out.append(f"{'phase':<15}{'sent':>10}{'time':>10}{'algbw':>12}{'busbw':>12}\n", style="bold")
        for row in rows:
            phase = printable(row.phase)
            out.append(f"{phase:<15}{format_bytes(row.bytes, 10)}{format_seconds(row.seconds, 10)}"
                       f"{format_rate(row.algbw, 12)}{format_rate(row.busbw, 12)}\n")

    def _algorithms(self, out: Text) -> None:
        ran = which_ran_where(list(self.traffic.values()))
        if not ran:
            return
        out.append("which ran where ", style="bold")
        out.append(f"(parallel.algorithm = {printable(self.info.algorithm)}; bytes all ranks sent, step "
                   f"{max(t.step for t in self.traffic.values())})\n", style="dim")
        for group, algorithms in ran.items():
            used = ", ".join(f"{a} {format_bytes(b).strip()}" for a, b in algorithms.items())
            out.append(printable(f"  {group:<10}{used}") + "\n")

    def _splits(self, out: Text, glyphs, width: int) -> None:
        splits = step_splits(self.stats, self.traffic)
        if not splits:
            return
        late = stragglers(splits)
        longest = max(s.step_s for s in splits) or 1.0
        out.append(f"\n{'rank':>4}{'step':>10}{'compute':>10}{'comm':>10}{'wait':>10}  ", style="bold")
        out.append(glyphs.fill("c") * 2, style=COMPUTE_STYLE)
        out.append(" compute ")
        out.append(glyphs.fill("w") * 2, style=WAIT_STYLE)
        out.append(" wait\n")
        # the bars shrink before anything is cut: 46 cells of figures, then the bar, then the straggler's mark
        bar_width = max(4, min(SPLIT_WIDTH, width - 46 - (len(f" {glyphs.left} straggler") if late else 0)))
        for s in splits:
            comm = "-" if s.comm_s is None else format_seconds(s.comm_s)
            out.append(f"{s.rank:>4}{format_seconds(s.step_s, 10)}{format_seconds(s.compute_s, 10)}{comm:>10}"
                       f"{format_seconds(s.wait_s, 10)}  ")
            cells = round(s.step_s / longest * bar_width)
            wait_cells = min(cells, round(s.wait_s / longest * bar_width))
            out.append(glyphs.fill("c") * (cells - wait_cells), style=COMPUTE_STYLE)
            out.append(glyphs.fill("w") * wait_cells, style=WAIT_STYLE)
            if s.rank in late:
                # the long note where the line has room for it, else the word alone: never cut
                used = 4 + 4 * 10 + 2 + cells
                note = f" {glyphs.left} straggler: the others wait for it"
                short = f" {glyphs.left} straggler"
                out.append(note if used + len(note) <= width else short, style="bold yellow")
            out.append("\n")
