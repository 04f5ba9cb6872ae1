"""What the workbench's UI thread does while a run goes on: the header and the text panes repaint without
laying out the screen, plots draw at half the panes' rate and build their figure once per draw, and a
workbench with nothing arriving does next to nothing. (What this costs a real run is measured by
`nanodist-tui bench ui`, not here.)"""

from __future__ import annotations

import threading
import time

import pytest
from rich.text import Text

from engine.events import MemorySnapshot, RankStats, RunStarted, StepEnd, Traffic
from nanodist_tui.app import PLOT_EVERY, NanoDistApp
from nanodist_tui.widgets.memory_pane import MemoryPane
from nanodist_tui.widgets.text_view import ROW_STEP, rows
from nanodist_tui.widgets.traffic_pane import TrafficPane
from tests.app_helpers import LINK_BYTES, N_PARAMS, config, memory, run, wait_for

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


class SteadyJob:
    """Steps, rank figures, memory and traffic and nothing discrete (a log line lays out its pane), until
    stopped."""

    def __init__(self, world_size: int = 2, pace_s: float = 0.005) -> None:
        self.world_size, self.pace_s = world_size, pace_s

    def __call__(self, emit, control: threading.Event) -> None:
        emit(RunStarted(run_id="r1", preset="steady", config=config(self.world_size, "fp32"),
                        n_params=N_PARAMS, world_size=self.world_size, total_steps=100_000,
                        run_dir="runs/r1"))
        step = 0
        while not control.is_set():
            step += 1
            emit(StepEnd(step=step, loss=4.0 / step, lr=1e-3, tokens=512, step_time_s=0.004,
                         tokens_per_s=128_000.0, grad_norm=1.0))
            for rank in range(self.world_size):
                emit(RankStats(step=step, rank=rank, step_time_s=0.004, comm_wait_s=0.001,
                               bytes_sent=LINK_BYTES))
                emit(MemorySnapshot(step=step, rank=rank, phase="backward", current=memory(0),
                                    peak=memory(24_000 + step % 7)))
                emit(Traffic(step=step, rank=rank, links=[{
                    "src": rank, "dst": (rank + 1) % self.world_size, "bytes": LINK_BYTES, "group": "world",
                    "algorithm": "ring", "phase": "all-reduce", "seconds": 0.001 * (1 + step % 3)}]))
            time.sleep(self.pace_s)


def count_layouts(app: NanoDistApp) -> list[float]:
    """From now on, the time of every layout of the app's screen (a full re-arrangement and repaint)."""
    screen, layouts = app.screen, []
    original = screen._refresh_layout

    def counted(*args, **kwargs):
        layouts.append(time.monotonic())
        return original(*args, **kwargs)

    screen._refresh_layout = counted
    return layouts


async def stop(app: NanoDistApp, pilot) -> None:
    app.session.control.set()
    await wait_for(pilot, lambda: not app.session.active)


def test_rows_counts_wrapped_lines_unless_the_widget_cuts_them():
    text = Text("a" * 25 + "\nshort\n")
    assert rows(text, 10) == 3 + 1 + 1
    assert rows(text, 10, wrap=False) == 3


def test_a_running_workbench_repaints_its_header_and_panes_without_laying_out_the_screen():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None and app.header.latest is not None)
        memory_pane = app.workspace.query_one(".overview-memory", MemoryPane)
        traffic_pane = app.workspace.query_one(".overview-traffic", TrafficPane)
        await wait_for(pilot, lambda: memory_pane.shows > 0 and traffic_pane.shows > 0)
        await pilot.pause(1.0)  # the workspace's own layouts (mounting, the first text of each pane) settle
        layouts = count_layouts(app)
        step, shows = app.header.latest.step, (app.header.shows, memory_pane.shows, traffic_pane.shows)
        await pilot.pause(2.0)
        assert app.header.latest.step > step + 50
        assert app.header.shows >= shows[0] + 4  # the header followed the steps (every 0.3 s)
        assert memory_pane.shows > shows[1] and traffic_pane.shows > shows[2]  # so did the panes
        assert layouts == []  # and none of it laid out the screen
        await stop(app, pilot)

    run(scenario, SteadyJob())


def test_a_pane_whose_lines_come_and_go_lays_out_the_screen_only_when_its_text_overflows_it():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        pane = app.workspace.query_one(".overview-memory", MemoryPane)
        await pilot.pause(0.5)
        room = pane.content_region.height
        assert room >= 4
        pane.show(Text("one\ntwo\nthree"))
        await pilot.pause(0.1)
        layouts = count_layouts(app)
        pane.show(Text("four\nfive"))  # shorter, and both fit: nothing to lay out
        await pilot.pause(0.2)
        pane.show(Text("\n".join(map(str, range(room)))))  # taller, still fits
        await pilot.pause(0.2)
        assert layouts == [] and str(pane.content) == "\n".join(map(str, range(room)))
        padded = -(-(room + 1) // ROW_STEP) * ROW_STEP
        overflowing = "\n".join(map(str, range(room + 1)))
        pane.show(Text(overflowing))  # more than fits: the scroll range changes, one layout
        await pilot.pause(0.2)
        assert len(layouts) == 1
        assert str(pane.content) == overflowing + "\n" * (padded - room - 1)  # padded to whole steps
        pane.show(Text("\n".join(map(str, range(padded)))))  # longer, within the same step: no layout
        await pilot.pause(0.2)
        assert len(layouts) == 1 and str(pane.content) == "\n".join(map(str, range(padded)))
        pane.show(Text("six\nseven"))  # back within the pane: one more, so the scroll bar goes
        await pilot.pause(0.2)
        assert len(layouts) == 2 and str(pane.content) == "six\nseven"
        await stop(app, pilot)

    run(scenario, SteadyJob(pace_s=0.05), pane_interval_s=60.0)  # the panes' timer stays out of the way


def test_plots_draw_at_half_the_panes_rate_and_build_their_figure_once_per_draw():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        plot = app.workspace.query_one("LossPlot.overview-curves")
        await wait_for(pilot, lambda: plot.draws > 0)
        builds: list[int] = []
        build = plot.plt.build

        def counted_build():
            builds.append(plot.draws)
            return build()

        plot.plt.build = counted_build
        redraws, draws = app.pane_redraws, plot.draws
        await pilot.pause(3.0)
        ran, drew = app.pane_redraws - redraws, plot.draws - draws
        assert ran >= 6 and 1 <= drew <= ran // PLOT_EVERY + 1  # data at every redraw, a draw every 2nd
        # one plotext build per draw at most (none for a draw not yet on screen); the draw from before the
        # window may be built inside it, when its repaint comes after the window opened
        assert len([d for d in builds if d > draws]) <= drew

        app.display_frozen = True  # no more draws: repaints now only render what was built
        await pilot.pause(0.4)
        renders, built = [], len(builds)
        render = plot.render

        def counted_render():
            renders.append(1)
            return render()

        plot.render = counted_render
        for _ in range(3):
            app.screen.refresh(layout=True)  # lays out and repaints every widget
            plot.refresh()
            await pilot.pause(0.2)
        assert renders and len(builds) == built  # rendered again, from the figure already built
        await stop(app, pilot)

    run(scenario, SteadyJob())


def test_an_idle_workbench_does_no_work():
    """After the run, with nothing arriving, the UI thread sleeps: its timers find nothing to draw."""
    done = threading.Event()

    def job(emit, control) -> None:
        SteadyJob(pace_s=0.01)(emit, done)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None and app.header.latest is not None)
        await pilot.pause(0.5)
        done.set()
        await pilot.pause(1.0)  # what was pending is drawn
        shows = app.header.shows
        draws = [p.draws for p in app.query("LossPlot")]
        cpu = time.thread_time()  # this thread runs the app's event loop (and this test, which only waits)
        await pilot.pause(2.0)
        assert app.header.shows == shows and [p.draws for p in app.query("LossPlot")] == draws
        assert time.thread_time() - cpu < 0.2  # two seconds of a quiet workbench: a small fraction of a core

    run(scenario, job)
