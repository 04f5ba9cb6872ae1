"""The pipeline in the workbench: the chart (nanodist_tui/pipeline_chart.py) against timelines whose columns
and bubbles are worked out by hand, the pane's text, the tab fed through the bridge as a run feeds it
(switching pipelines, the footer's key, no drawing while hidden), a recording that keeps the timelines, and
the tab in a real terminal (tmux) at 80x24. The snapshots are in test_snapshots.py.

The GPipe fixture (tests/pipeline_helpers.py): p = 4 ranks, m = 8 micro-batches, every action 2 ms, so the
step is 22 slots of 2 ms and each rank idles 6 of them: 6/22 = 27.3%, the formula's (p-1)/(m+p-1)."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path

import pytest

from engine.events import PipelineTimeline
from engine.run.recorder import read_events
from nanodist_tui.app import create_app
from nanodist_tui.messages import Tick
from nanodist_tui.panes import panes_for
from nanodist_tui.pipeline_chart import StepStore, bubble_formula, rank_row, step_chart
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.glyphs import ASCII
from nanodist_tui.widgets.pipeline_pane import PipelinePane, blocks, bubble_line, ruler
from tests.app_helpers import SMALL, TEST_PANE_INTERVAL_S, footer_when, screen_text, wait_for
from tests.pipeline_helpers import gpipe_step, pipeline_run, recorded_run, simulated_step

REPO = Path(__file__).resolve().parents[2]
BUBBLE = 6 / 22  # GPipe, p 4, m 8: 6 idle slots of 22


def timeline(rank: int, actions: list[list], step: int = 1) -> PipelineTimeline:
    return PipelineTimeline(step=step, rank=rank, stage_rank=rank, schedule="1f1b", micro_batches=2, chunks=1,
                            actions=actions)


# ---------------------------------------------------------------- the chart, by hand


def test_blocks_take_the_columns_of_their_times():
    """1 s over 10 columns, 0.1 s a column: F 0-0.2 s is columns 0-1, the send 0.2-0.4 s columns 2-3, the
    idle 0.4-0.6 s columns 4-5, B 0.6-1.0 s columns 6-9; each block's micro-batch in its middle."""
    first = timeline(0, [["F", 0, 0, 0.0, 0.2], ["SEND_ACT", 0, 0, 0.2, 0.4], ["B", 0, 0, 0.6, 1.0]])
    row = rank_row(first, 1.0, 10)
    assert row.kinds == "FF~~  BBBB"
    assert row.labels == "0      0  "
    assert row.busy_s == pytest.approx(0.6) and row.bubble == pytest.approx(0.4)
    # 0.25-0.35 s rounds to column 3 alone: "12" does not fit and is left out; a 10 ms forward still takes
    # a column (5), with its "3"; a 20 ms receive is shorter than a column and is not drawn
    second = timeline(1, [["F", 12, 1, 0.25, 0.35], ["F", 3, 1, 0.51, 0.52], ["RECV_GRAD", 0, 1, 0.8, 0.82]])
    chart = step_chart([second, first], 10, 2)
    assert [r.stage_rank for r in chart.rows] == [0, 1]  # rank 0 on top, whatever the order they came in
    assert chart.rows[1].kinds == "   F F    " and chart.rows[1].labels == "     3    "
    assert chart.makespan_s == 1.0
    # idle compute time over ranks x makespan: (0.4 + 0.89) / 2
    assert chart.measured == pytest.approx(0.645)


def test_ranks_that_started_the_step_apart_are_drawn_on_one_clock():
    """Each rank's rows count from its own step start; `clock_s` (that start on the wall clock) puts them on
    one: rank 1 started 0.5 s after rank 0, so its forward at 0-0.2 s of its own is drawn at 0.5-0.7 s, after
    rank 0's, and the step's makespan runs from rank 0's start to rank 1's last end (1.0 s)."""
    early = replace(timeline(0, [["F", 0, 0, 0.0, 0.2], ["B", 0, 0, 0.8, 1.0]]), clock_s=1000.0)
    late = replace(timeline(1, [["RECV_ACT", 0, 1, 0.0, 0.0], ["F", 0, 1, 0.0, 0.2], ["B", 0, 1, 0.2, 0.3]]),
                   clock_s=1000.5)
    chart = step_chart([late, early], 10, 2)
    assert [r.kinds for r in chart.rows] == ["FF      BB", "     FFB  "]
    assert chart.makespan_s == pytest.approx(1.0)
    assert chart.measured == pytest.approx(1 - 0.7 / 2)  # (0.4 + 0.3) busy over 2 ranks x 1.0 s
    # a recording without the clock (0): each rank from its own start, as before
    chart = step_chart([replace(late, clock_s=0.0), early], 10, 2)
    assert chart.rows[1].kinds == "FFB       " and chart.makespan_s == pytest.approx(1.0)


def test_gpipe_4_by_8_with_equal_times_measures_the_formulas_bubble():
    """44 columns, 2 per slot: rank r's forwards in slots r..r+7, its backwards in slots 14-r..21-r."""
    chart = step_chart(gpipe_step(4, 8, comm=False), 44, 4)
    assert [r.kinds for r in chart.rows] == [
        "F" * 16 + " " * 12 + "B" * 16,
        " " * 2 + "F" * 16 + " " * 8 + "B" * 16 + " " * 2,
        " " * 4 + "F" * 16 + " " * 4 + "B" * 16 + " " * 4,
        " " * 6 + "F" * 16 + "B" * 16 + " " * 6]
    assert chart.rows[0].labels == "0 1 2 3 4 5 6 7 " + " " * 12 + "0 1 2 3 4 5 6 7 "
    assert chart.makespan_s == pytest.approx(0.044)
    assert chart.measured == pytest.approx(BUBBLE) and round(chart.measured, 3) == 0.273
    assert all(r.bubble == pytest.approx(BUBBLE) for r in chart.rows)
    shape = (chart.step, chart.schedule, chart.ranks, chart.micro_batches, chart.emulated)
    assert shape == (1, "gpipe", 4, 8, True)


def test_waiting_is_drawn_but_is_no_compute():
    """With its receives, rank 0 waits for its first gradient from 16 ms (its forwards done) to 28 ms: the
    bubble's columns show the wait, and the bubble stays 6/22."""
    chart = step_chart(gpipe_step(4, 8), 44, 4)
    assert chart.rows[0].kinds == "F" * 16 + "~" * 12 + "B" * 16
    assert chart.rows[3].kinds == "~" * 6 + "F" * 16 + "B" * 16 + " " * 6
    assert chart.measured == pytest.approx(BUBBLE)


def test_an_odd_model_chunk_is_told_apart():
    """Interleaved, 2 ranks x 2 chunks: rank 0 holds stages 0 (chunk 0) and 2 (chunk 1). Its forward of
    micro-batch 0 through stage 0 fills columns 0-1, through stage 2 columns 2-3: without colour, the odd
    chunk's letter in lower case."""
    interleaved = PipelineTimeline(step=1, rank=0, stage_rank=0, schedule="interleaved", micro_batches=1,
                                   chunks=2, actions=[["F", 0, 0, 0.0, 1.0], ["F", 0, 2, 1.0, 2.0]])
    chart = step_chart([interleaved], 4, 2)
    assert chart.rows[0].kinds == "FFFF" and chart.rows[0].odd_chunk == "  11"
    assert blocks(chart.rows[0], ASCII).plain == "0F0f"
    assert "(p 2, m 1, v 2; equal action times)" in bubble_line(chart)


def test_the_formulas_for_p_4_m_8():
    """As published: 27.3% (gpipe, 1f1b), 15.8% (interleaved, v 2), 11.1% (zb-h1)."""
    assert bubble_formula("gpipe", 4, 8, 1) == ("(p-1)/(m+p-1)", pytest.approx(3 / 11))
    assert bubble_formula("1f1b", 4, 8, 1) == ("(p-1)/(m+p-1)", pytest.approx(3 / 11))
    assert bubble_formula("interleaved", 4, 8, 2) == ("(p-1)/(v*m+p-1)", pytest.approx(3 / 19))
    assert bubble_formula("zb-h1", 4, 8, 1) == ("(p-1)/(3m+p-1)", pytest.approx(3 / 27))
    assert [round(bubble_formula(s, 4, 8, 2)[1], 3) for s in ("1f1b", "interleaved", "zb-h1")] == \
        [0.273, 0.158, 0.111]
    assert bubble_formula("someday", 4, 8, 1) is None


@pytest.mark.parametrize(("schedule", "chunks", "published"),
                         [("gpipe", 1, 0.273), ("1f1b", 1, 0.273), ("interleaved", 2, 0.158),
                          ("zb-h1", 1, 0.111)])
def test_the_engines_schedules_played_out_measure_the_published_bubble(schedule, chunks, published):
    """p 4, m 8, equal action times: the engine's schedules as its simulator plays them out, measured by the
    chart, give the published figures; every rank's row holds 2m (3m for zb-h1) actions' worth of blocks."""
    chart = step_chart(simulated_step(schedule, 4, 8, chunks), 200, 4)
    assert round(chart.measured, 3) == published
    assert chart.measured == pytest.approx(bubble_formula(schedule, 4, 8, chunks)[1])
    ops = {"zb-h1": "FIW"}.get(schedule, "FB")
    assert all(set(row.kinds) - {" ", "~"} == set(ops) for row in chart.rows)


def test_the_newest_step_every_rank_reported():
    store = StepStore()
    for t in gpipe_step(4, 8, step=1):
        store.add(t)
    for t in gpipe_step(4, 8, step=2)[:3]:  # rank 3 has not reported step 2 yet
        store.add(t)
    assert {t.step for t in store.latest([0, 1, 2, 3])} == {1}
    assert {t.step for t in store.latest([0, 1])} == {2}
    later = StepStore()
    later.add(gpipe_step(4, 8, step=7)[0])
    assert [(t.step, t.rank) for t in later.latest([0, 1, 2, 3])] == [(7, 0)]  # nothing whole yet: what came
    for step in range(1, 10):  # only the last few steps are kept
        later.add(gpipe_step(4, 8, step=step)[0])
    assert sorted(later.steps) == [6, 7, 8, 9]


# ---------------------------------------------------------------- the pane's text


def fed_pane(world: int = 4) -> PipelinePane:
    events = pipeline_run(world=world)
    pane = PipelinePane(RunInfo.from_started(events[0]))
    latest = {e.rank: e for e in events if isinstance(e, PipelineTimeline)}
    pane.ingest(Tick(0, (), 0, {}, {}, {}, (), pipeline=latest))
    return pane


def test_the_pane_draws_rows_ruler_bubble_and_legend():
    """At 55 columns (4 label + 44 chart + 7 idle share), without colour: letters fill the blocks."""
    lines = fed_pane().render_pipeline(55, ASCII).plain.splitlines()
    assert lines[0] == "step 2 · gpipe · 4 ranks x 8 micro-batches · emulated"
    assert lines[1] == "  compute"
    assert lines[2] == " " * 51 + "idle"
    assert lines[3:7] == [
        "pp0 0F1F2F3F4F5F6F7F------------0B1B2B3B4B5B6B7B  27.3%",
        "pp1 --0F1F2F3F4F5F6F7F--------0B1B2B3B4B5B6B7B    27.3%",
        "pp2 ----0F1F2F3F4F5F6F7F----0B1B2B3B4B5B6B7B      27.3%",
        "pp3 ------0F1F2F3F4F5F6F7F0B1B2B3B4B5B6B7B        27.3%"]
    assert lines[7] == "    0" + "44.0 ms".rjust(43)
    text = "\n".join(lines)
    assert "bubble 27.3% measured, 27.3% by the formula\n  (p-1)/(m+p-1) (p 4, m 8; equal action times)" \
        in text
    for entry in (" F  forward   B  backward", "-- send/recv, waiting", "idle: the bubble"):
        assert entry in text
    assert max(len(line) for line in lines) <= 55
    assert ruler(2.5, 12) == "0     2.50 s"  # a step of a second or more in seconds


def test_several_pipelines_show_rank_0s_first_and_step_through():
    pane = fed_pane(world=8)  # dp 2 x pp 4: pipelines 0 2 4 6 and 1 3 5 7
    text = pane.render_pipeline(80, ASCII).plain
    assert "pipeline 1 of 2 (rank 0's): dp0, ranks 0 2 4 6; g: next pipeline" in text
    assert "\npp1 r2 " in text and "\npp3 r6 " in text
    pane.next_pipeline()
    text = pane.render_pipeline(80, ASCII).plain
    assert "pipeline 2 of 2: dp1, ranks 1 3 5 7; g: next pipeline" in text and "\npp0 r1 " in text
    pane.next_pipeline()
    assert "pipeline 1 of 2" in pane.render_pipeline(80, ASCII).plain


def test_no_pipeline_is_one_line_and_no_tab():
    assert "pipeline" not in [spec.id for spec in panes_for(RunInfo(world_size=4))]
    assert "pipeline" in [spec.id for spec in panes_for(RunInfo(world_size=4, pipeline=2))]
    assert PipelinePane(RunInfo(world_size=4)).render_pipeline(80, ASCII).plain == \
        "no pipeline in this run: parallel.pipeline is 1"
    assert PipelinePane(RunInfo(world_size=4, pipeline=3)).render_pipeline(80, ASCII).plain == \
        "no pipeline to draw: world size 4 is not a multiple of tp 1 x pp 3 x cp 1"
    waiting = PipelinePane(RunInfo(world_size=4, pipeline=4)).render_pipeline(80, ASCII).plain
    assert waiting == "no timeline yet: each pipeline rank reports its actions once per step"


def test_compare_gives_the_bubble_of_rank_0s_pipeline():
    """Each step's 6/22, the median over steps; a run without a pipeline has none, and a comparison of two
    such runs no row for it."""
    from nanodist_tui.compare import figures
    from nanodist_tui.screens.compare import traffic_table
    from tests.app_helpers import demo_events

    piped, plain = figures(pipeline_run(world=8), "piped"), figures(demo_events(), "plain")
    assert piped.bubble == pytest.approx(BUBBLE) and plain.bubble is None
    rows = traffic_table(piped, plain).plain.splitlines()
    assert f"{'pipeline bubble':<16}{'27.3%':>22}{'-':>22}" in rows
    assert "pipeline bubble" not in traffic_table(plain, plain).plain


# ---------------------------------------------------------------- in the app, fed as a run feeds it


def test_the_tab_live_switching_pipelines_and_its_footer_key():
    events = pipeline_run(world=8)

    def job(emit, control) -> None:
        for event in events:
            emit(event)

    app = create_app("pipe", job, pane_interval_s=TEST_PANE_INTERVAL_S)

    async def main() -> None:
        async with app.run_test(size=SMALL) as pilot:
            await wait_for(pilot, lambda: app.workspace is not None and app.session.state == "finished")
            pane = app.workspace.tabs["pipeline"]
            assert isinstance(pane, PipelinePane)
            await pilot.pause(2 * TEST_PANE_INTERVAL_S)
            assert pane.view.shows == 0  # hidden on its tab: fed, never drawn
            assert app.workspace.tab_ids.index("tab-pipeline") == 7
            await footer_when(pilot, app, lambda line: "Next pipeline" not in line)
            await pilot.press("8")
            await wait_for(pilot, lambda: "bubble 27.3% measured" in screen_text(app))
            shown = screen_text(app)
            assert "step 2 · gpipe · 4 ranks x 8 micro-batches · emulated compute" in shown
            assert "pipeline 1 of 2 (rank 0's): dp0, ranks 0 2 4 6; g: next pipeline" in shown
            await footer_when(pilot, app, lambda line: "g Next pipeline" in line)
            lines = str(pane.view.content).splitlines()  # at 80x24 every line whole in its view
            assert len(lines) == 11 and max(len(line) for line in lines) <= pane.view.content_region.width
            assert lines[-1].endswith("idle: the bubble")  # the legend's last entry, not cut off
            await pilot.press("g")
            await wait_for(pilot, lambda: "pipeline 2 of 2: dp1, ranks 1 3 5 7" in screen_text(app))
            await pilot.press("1")
            await footer_when(pilot, app, lambda line: "Next pipeline" not in line)

    asyncio.run(main())


def test_g_steps_through_a_replay_opened_over_a_training_run(tmp_path):
    """`o` over a training run replays on a screen of its own, where the app's keys are the run's: the screen
    has its own g, offered on its pipeline tab alone, and its own tab keys (the run behind keeps its tab)."""
    from nanodist_tui.screens.replay_over import ReplayOverScreen
    from tests.app_helpers import FakeJob, run

    run_dir = recorded_run(tmp_path)

    async def scenario(app, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "running")
        app._replay_chosen([run_dir])  # what `o` does with the chosen run
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayOverScreen))
        screen = app.screen
        await wait_for(pilot, lambda: screen.workspace is not None and screen.header.state == "finished"
                       and "8 pipeline" in screen_text(app))
        assert screen.check_action("next_pipeline", ()) is False  # the overview is on show
        behind = app.workspace.active_tab
        await pilot.press("8")
        await wait_for(pilot, lambda: "pipeline 1 of 2 (rank 0's)" in screen_text(app), timeout=5)
        await footer_when(pilot, app, lambda line: "g Next pipeline" in line)
        await pilot.press("g")
        await wait_for(pilot, lambda: "pipeline 2 of 2: dp1, ranks 1 3 5 7" in screen_text(app), timeout=5)
        assert app.workspace.active_tab == behind
        await pilot.press("1")
        await wait_for(pilot, lambda: screen.workspace.active_tab == "tab-overview")
        await footer_when(pilot, app, lambda line: "Next pipeline" not in line)
        await pilot.press("escape")
        app.session.control.set()
        await wait_for(pilot, lambda: not app.session.active)

    run(scenario, FakeJob(steps=400, pace_s=0.01), size=SMALL)


# ---------------------------------------------------------------- recorded, replayed in a real terminal


def test_a_recording_keeps_every_timeline(tmp_path):
    run_dir = recorded_run(tmp_path)
    kept = [e for e in read_events(run_dir) if isinstance(e, PipelineTimeline)]
    assert kept == [e for e in pipeline_run(world=8) if isinstance(e, PipelineTimeline)]
    assert len(kept) == 16  # 8 ranks x 2 steps


TMUX = shutil.which("tmux")


def tmux(*args: str) -> str:
    return subprocess.run([TMUX or "tmux", *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
@pytest.mark.skipif(TMUX is None, reason="tmux is not installed (.ci/run installs it with apt-get)")
def test_the_pipeline_tab_in_a_real_terminal_at_80x24(tmp_path):
    """`nanodist-tui replay` of a recorded dp 2 x pp 4 run: the pipeline tab by its key, the next pipeline
    with g, quit with q; no traceback, exit 0."""
    run = recorded_run(tmp_path)
    name = f"nanodist-pipe-{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm-256color", "NANODIST_CONFIG": "/nowhere"}
    subprocess.run([TMUX or "tmux", "new-session", "-d", "-s", name, "-x", "80", "-y", "24",
                    "-c", str(tmp_path), "bash --norc --noprofile"], check=True, env=env)

    def wait_for_screen(pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            shown = tmux("capture-pane", "-p", "-J", "-t", name, "-S", "-200")
            if pattern in shown.replace("echo EXIT=$?", ""):  # the command line is no answer
                return shown
            time.sleep(0.5)
        raise AssertionError(f"{pattern!r} never appeared; the screen shows:\n{shown}")

    try:
        tmux("send-keys", "-t", name, f"PYTHONPATH={REPO} NANODIST_CONFIG=/nowhere {sys.executable} -m "
             f"nanodist_tui.cli replay {run} --speed 0; echo EXIT=$?", "Enter")
        wait_for_screen(" finished ", timeout=120)
        wait_for_screen("7 mesh  8 pipeline", timeout=30)
        tmux("send-keys", "-t", name, "8")
        first = wait_for_screen("bubble 27.3% measured, 27.3% by the formula (p-1)/(m+p-1)", timeout=30)
        assert "pipeline 1 of 2 (rank 0's): dp0, ranks 0 2 4 6; g: next pipeline" in first
        assert "step 2 · gpipe · 4 ranks x 8 micro-batches · emulated compute" in first
        rows = [line for line in first.splitlines() if line.startswith("│ pp")]
        assert [row.split()[1:3] for row in rows] == [["pp0", "r0"], ["pp1", "r2"], ["pp2", "r4"],
                                                      ["pp3", "r6"]]
        assert all(row.rstrip(" │").endswith("27.3%") for row in rows)
        assert "g Next pipeline" in first
        tmux("send-keys", "-t", name, "g")
        second = wait_for_screen("pipeline 2 of 2: dp1, ranks 1 3 5 7", timeout=30)
        tmux("send-keys", "-t", name, "q")
        after = wait_for_screen("EXIT=0", timeout=60)
        assert "Traceback" not in first + second + after
    finally:
        subprocess.run([TMUX or "tmux", "kill-session", "-t", name], capture_output=True)

