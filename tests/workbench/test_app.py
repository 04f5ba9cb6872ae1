"""The workbench driven by fake jobs through Textual's Pilot: what each pane shows matches the events, the
layout fits the run, failures show once, stop / pause / freeze / quit, tabs, help, palette and keymap."""

from __future__ import annotations

import threading
import time

import pytest
from textual.widgets import Footer, TabbedContent

from nanodist_tui.app import NanoDistApp
from nanodist_tui.screens.confirm import ConfirmScreen
from nanodist_tui.screens.help import HelpScreen
from nanodist_tui.user_config import UserConfig
from nanodist_tui.widgets.curves_pane import CurvesPane
from nanodist_tui.widgets.log_pane import LogPane
from nanodist_tui.widgets.loss_plot import LossPlot
from nanodist_tui.widgets.loss_scale_pane import LossScalePane
from nanodist_tui.widgets.memory_pane import MemoryPane
from nanodist_tui.widgets.pane import Pane
from nanodist_tui.widgets.rank_table import RankTable
from nanodist_tui.widgets.traffic_pane import TrafficPane
from tests.app_helpers import FakeJob, footer_when, header_text, log_text, run, wait_for

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


def tab_pane(app: NanoDistApp, cls):
    """The pane of class `cls` in its own tab (not its copy on the overview)."""
    return next(w for w in app.workspace.tabs.values() if isinstance(w, cls))


def test_a_finished_run_shows_what_its_events_say_in_every_pane():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished")
        for tab in range(1, 8):  # every tab on screen once, so every pane has drawn
            app.action_show_tab(tab)
            await pilot.pause(0.1)
            app.redraw_now()
        header = header_text(app)
        assert "step 30/30" in header and " finished " in header
        assert "2 ranks on threads · ZeRO-0 · fp16 · checkpointing none" in header
        # 512 tokens in 4 ms per step; backward peaked: 2 x 49,380 + 98,760 + 24,000 = 221,520 B
        assert "128,000 tok/s" in header and "peak 221.5 kB/rank" in header and "scale 32768" in header
        log = log_text(app, "LogPane.tab-log")
        assert "run r1 started" in log and "step 10: val loss 0.4500" in log and "finished 30 steps" in log
        scale = tab_pane(app, LossScalePane)
        changes = log_text(app, ".loss-scale-log")
        assert "inf overflow, scale 65536 -> 32768 (first: blocks.0.attn.w_qkv)" in changes
        assert scale.border_title == "loss scale · 1 overflows · 1 skipped"
        loss, norm, lr = tab_pane(app, CurvesPane).plots
        assert len(loss.train) == 29 and len(loss.val) == 3  # the overflowed step has no loss
        updated = [i for i in range(1, 31) if i != 5]
        assert norm.history.xs == updated and norm.history.ys == [1.0 + 1.0 / i for i in updated]
        assert lr.history.ys == [1e-3 * i / 30 for i in updated]
        assert all(plot.draws > 0 for plot in (loss, norm, lr))  # drawn when their tab was shown
        memory = str(tab_pane(app, MemoryPane).content)
        assert "rank 0" in memory and "rank 1" in memory
        # estimate: activations 24,000 - 3,000, so 218,520 B; measured is 1.4% above it
        assert "221.5 kB backward  est  218.5 kB  +1.4%" in memory and "activations 24.0 kB" in memory
        table = tab_pane(app, RankTable)
        assert table.row_count == 2
        columns = ("step", "wait", "wait_share", "sent", "comm", "memory")
        cells = {c: str(table.get_cell("1", c)) for c in columns}
        # the short forms that fit every column in 80 columns (units.short_seconds, short_bytes)
        assert cells == {"step": "30", "wait": "2.0ms", "wait_share": "50%", "sent": "8.00MB",
                         "comm": "3.0ms", "memory": "222kB"}
        traffic = str(tab_pane(app, TrafficPane).content)
        # one link per rank: 8 MB in 3 ms; S = 8 MB (4e6 fp16 parameters), bound 2(N-1)/N·S = 8 MB
        assert "[0] ─ 8.0 MB 2.67 GB/s ──▶ [1]" in traffic
        assert "sent per rank and step 8.0 MB  vs ring bound 2(N-1)/N·S = 8.0 MB  100.0%" in traffic
        # reduce-scatter: S = 8 MB in 1 ms: algbw 8 GB/s, busbw x (N-1)/N = 4; all-reduce 8 MB in 3 ms
        assert "algbw 2.67 GB/s  busbw 2.67 GB/s" in traffic
        assert "reduce-scatter     4.0 MB    1.0 ms   8.00 GB/s   4.00 GB/s" in traffic
        assert "all-gather         4.0 MB    2.0 ms   4.00 GB/s   2.00 GB/s" in traffic
        # which ran where: both ranks' 2 x 4 MB over the world communicator, by the ring
        assert "which ran where (parallel.algorithm = ring" in traffic
        assert "  world     ring 16.0 MB" in traffic
        assert app.is_running

    run(scenario, FakeJob())


def test_the_layout_fits_the_run():
    shapes = {(1, "fp32"): ["overview", "curves", "memory", "log"],
              (2, "fp32"): ["overview", "curves", "memory", "traffic", "ranks", "log", "mesh"],
              (4, "fp16"): ["overview", "curves", "memory", "traffic", "ranks", "loss-scale", "log", "mesh"]}
    for (world, dtype), tabs in shapes.items():
        async def scenario(app: NanoDistApp, pilot, tabs=tabs, world=world, dtype=dtype) -> None:
            await wait_for(pilot, lambda: app.session.state == "finished")
            assert [t.removeprefix("tab-") for t in app.workspace.tab_ids] == tabs
            labels = [str(tab.label) for tab in app.query("ContentTab")]
            assert labels == [f"{n} {t.replace('-', ' ')}" for n, t in enumerate(tabs, 1)]
            overview = {type(w).__name__ for row in app.workspace.overview.values() for w in row}
            assert ("TrafficPane" in overview) == (world > 1)
            assert ("LossScalePane" in overview) == (dtype == "fp16")

        run(scenario, FakeJob(steps=3, world_size=world, dtype=dtype))


def test_without_data_the_panes_say_what_they_wait_for():
    job = FakeJob(steps=0, world_size=2, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        # the panes draw on a render tick, which a loaded machine may bring late
        await wait_for(pilot, lambda: "no memory snapshot yet" in str(tab_pane(app, MemoryPane).content)
                       and "no traffic yet" in str(tab_pane(app, TrafficPane).content))
        assert "waiting for the first step" in str(app.query_one(LossPlot).render())
        assert "step -/0" in header_text(app)

    run(scenario, job)


def test_a_failure_is_shown_once_with_its_cause():
    def lines(log) -> str:  # wrapped lines joined back, words separated by single spaces
        return " ".join(" ".join(line.text for line in log.lines).split())

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "failed" and app.session.worker.is_finished)
        assert app.is_running
        assert " failed " in header_text(app)
        # the overview's log and the log tab's; a log writes what it queued once it is laid out on screen
        # (RichLog defers until it knows its size), so each is looked at with its own tab shown
        logs = [app.query_one("LogPane.overview-log", LogPane), app.query_one("LogPane.tab-log", LogPane)]
        for tab, log in zip((1, app.workspace.tab_ids.index("tab-log") + 1), logs):
            app.action_show_tab(tab)
            await wait_for(pilot, lambda log=log: "loss is NaN" in lines(log), timeout=20)
        await pilot.pause(0.5)  # time for an echo to arrive, if there were one
        assert [n.message for n in app._notifications] == ["rank 1: ValueError: loss is NaN"]
        for log in logs:
            assert lines(log).count("loss is NaN") == 1, lines(log)
            assert "run failed: rank 1: ValueError: loss is NaN" in lines(log)

    run(scenario, FakeJob(then="run_failed_then_raise"))


def test_an_exception_without_an_event_is_shown_once():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: "lost its socket" in log_text(app, "LogPane.overview-log"), timeout=20)
        await pilot.pause(0.4)
        notes = [n.message for n in app._notifications]
        assert notes == ["engine error: RuntimeError: rank 1 lost its socket"]
        assert log_text(app, "LogPane.overview-log").count("rank 1 lost its socket") == 1

    run(scenario, FakeJob(then="raise"))


def test_stop_asks_first_then_stops_the_job_and_the_run_ends_stopped():
    job = FakeJob(steps=2000)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None)
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        assert not isinstance(app.screen, ConfirmScreen) and not app.session.control.is_set()
        await pilot.press("s", "y")
        await wait_for(pilot, lambda: app.session.worker.is_finished, timeout=3)
        assert job.saw_stop.is_set()
        await wait_for(pilot, lambda: app.session.state == "stopped")  # the app hears of the end next
        assert " stopped " in header_text(app)
        # the log writes on a render tick, which a loaded machine may bring late
        await wait_for(pilot, lambda: all(t in log_text(app) for t in ("stop requested", "stopped at step")))
        assert app.check_action("stop_training", ()) is False  # nothing left to stop: the footer drops it

    run(scenario, job)


def test_p_pauses_training_itself_and_resumes_it():
    job = FakeJob(steps=400, pace_s=0.01)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None)
        await pilot.press("p")
        assert app.session.control.pause.is_set()
        await wait_for(pilot, lambda: app.session.state == "paused")
        held = app.header.latest.step
        await pilot.pause(0.5)
        assert app.header.latest.step == held and job.held_at == held  # no step while held
        assert " paused " in header_text(app)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.header.latest.step > held)
        assert app.session.state == "running"
        await wait_for(pilot, lambda: "every rank holds" in log_text(app))  # the log writes on a render tick

    run(scenario, job)


def test_freeze_stops_the_display_while_work_continues():
    job = FakeJob(steps=3, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step == 3)
        await pilot.pause(0.4)
        await pilot.press("f")
        assert "display frozen" in header_text(app)
        log = app.query_one("LogPane.overview-log")
        lines_before = len(log.lines)
        job.go.set()  # the job keeps working: one more event arrives while frozen
        await wait_for(pilot, lambda: any("still training" in line.text for line in log._pending))
        await pilot.pause(0.6)  # two render ticks
        assert len(log.lines) == lines_before  # it arrived, but nothing was drawn
        await pilot.press("f")
        await wait_for(pilot, lambda: "still training" in log_text(app))
        assert "display frozen" not in header_text(app)

    run(scenario, job)


def test_quit_mid_run_stops_the_job_and_leaves_no_engine_thread_behind():
    job = FakeJob(steps=0, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: job.thread is not None and app.session.state == "running")
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    app = run(scenario, job)
    assert job.saw_stop.is_set()
    deadline = time.monotonic() + 2.0
    while job.thread in threading.enumerate() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert job.thread not in threading.enumerate()
    assert not [t for t in threading.enumerate() if t.name == "nanodist-ticks"]
    assert app.farewell() == ["run folder     runs/r1"]


def test_quit_after_the_run_ended_waits_for_its_job_to_close_the_run_folder():
    job = FakeJob(steps=3, then="linger")  # the job still closes sinks and record after RunFinished

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished")
        await pilot.press("q")
        await wait_for(pilot, lambda: "closing the run folder, then quitting" in log_text(app))
        assert app.is_running
        job.go.set()
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    app = run(scenario, job)
    lines = app.farewell()
    assert "threads/rank   1" in lines  # the job's own summary, not only the event's
    assert lines[0] == "steps          3" and "run folder     runs/r1" in lines


def test_quit_twice_after_the_run_ended_still_shows_the_runs_summary():
    job = FakeJob(steps=3, then="linger")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished")
        await pilot.press("q")
        await pilot.press("q")  # leave before the job has returned its summary
        threading.Timer(0.3, job.go.set).start()  # the job ends later; the process waits for it

    app = run(scenario, job)
    lines = app.farewell()  # from the job's summary or, had it not arrived, from the RunFinished event
    assert lines[0] == "steps          3" and "val loss       4.5000 -> 0.1500  (96.7% lower)" in lines
    assert lines[-1] == "run folder     runs/r1"


def test_the_rank_table_keeps_its_cursor_across_updates():
    job = FakeJob(steps=300, world_size=4, pace_s=0.01)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("5")
        table = tab_pane(app, RankTable)
        table.focus()
        await pilot.press("down", "down")
        assert table.cursor_row == 2
        step = app.header.latest.step
        await wait_for(pilot, lambda: app.header.latest.step > step + 10)
        await pilot.pause(0.4)
        assert table.cursor_row == 2 and int(str(table.get_cell("2", "step"))) > step

    run(scenario, job)


def test_a_hidden_pane_does_not_redraw_and_keys_switch_tabs():
    job = FakeJob(steps=300, pace_s=0.01)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step > 20)
        await pilot.pause(0.7)
        curves = tab_pane(app, CurvesPane)
        overview_loss = app.query_one("LossPlot.overview-curves")
        assert overview_loss.draws > 0  # the overview's loss plot is on screen and drawing
        assert [plot.draws for plot in curves.plots] == [0, 0, 0]  # the curves tab is hidden
        await pilot.press("2")
        assert app.workspace.query_one(TabbedContent).active == "tab-curves"
        await wait_for(pilot, lambda: all(plot.draws > 0 for plot in curves.plots))
        drawn = overview_loss.draws
        await pilot.pause(0.7)
        assert overview_loss.draws == drawn  # now the overview is hidden: its plot stopped drawing

    run(scenario, job)


def test_help_explains_every_key_and_pane():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        text = app.screen.query_one("Markdown").source
        for binding in app.BINDINGS:
            assert f"`{binding.id}`" in text
        for words in ("wait %", "per-step bytes", "run-peak mark", "est vs measured", "busbw", "straggler",
                      "MB = 10^6 bytes", "[keymap]"):
            assert words in text, words
        await pilot.press("question_mark")
        assert not isinstance(app.screen, HelpScreen)

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))


def test_the_palette_offers_every_action_and_pane():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Stop training", "Pause or resume training", "Freeze or unfreeze the display", "Help",
                      "Compare two runs", "Replay a recorded run", "Show overview", "Show memory",
                      "Show traffic", "Show ranks", "Show log", "Quit"):
            assert title in titles, title
        assert "Replay faster" not in titles and "New run" not in titles  # not a replay; no job factory
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "Show memory")
        command.callback()
        await pilot.pause(0.1)
        assert app.workspace.query_one(TabbedContent).active == "tab-memory"

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))


def test_a_keymap_from_the_user_config_moves_a_binding():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "running")
        await pilot.press("s")
        assert not isinstance(app.screen, ConfirmScreen)
        await pilot.press("x")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("n")
        await footer_when(pilot, app, lambda line: "x Stop" in line.replace("  ", " "))

    run(scenario, FakeJob(steps=0, then="wait_for_stop"), user_config=UserConfig(keymap={"stop": "x"}))


def test_every_pane_the_app_composes_keeps_the_pane_protocol():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.workspace is not None)
        assert all(isinstance(pane, Pane) for pane in app.panes)
        assert not isinstance(app.query_one(Footer), Pane)  # the check tells a pane from any widget
        # No pane goes unfed: each is one the app feeds, or inside one that feeds it (the curves' plots).
        fed = set(app.panes)
        for widget in app.screen.query("*"):
            if isinstance(widget, Pane):
                assert widget in fed or any(parent in fed for parent in widget.ancestors), widget

    run(scenario, FakeJob(steps=0, then="wait_for_stop"))


def test_the_header_names_hybrid_sharding_and_the_all_reduce_algorithm():
    from types import SimpleNamespace

    from nanodist_tui.run_info import RunInfo
    from nanodist_tui.widgets.run_header import _shape
    hybrid = RunInfo(world_size=4, backend="processes", zero_stage=2, hybrid=True, ranks_per_node=2,
                     algorithm="auto")
    assert "4 ranks on processes · ZeRO-2 hybrid (2 nodes x 2) · all-reduce auto · fp32" in str(
        _shape(SimpleNamespace(info=hybrid)))
    flat = RunInfo(world_size=4, backend="processes", zero_stage=2, ranks_per_node=2)
    assert "ZeRO-2 · fp32" in str(_shape(SimpleNamespace(info=flat)))  # the ring is not announced
