"""Views keep state (issue 27): what was opened after a run does not take its place. The run's summary
prints on exit after a replay was opened over it; leaving a comparison opened over a run returns to the
run, and leaving `nanodist-tui compare` (no run behind it) exits instead of showing an empty workbench;
a replay's header shows no ETA (it would be the recorded run's)."""
from __future__ import annotations

from engine.events import StepEnd
from nanodist_tui.app import NanoDistApp
from nanodist_tui.compare import figures
from nanodist_tui.replay import ReplayPlayer
from nanodist_tui.screens.compare import CompareScreen
from nanodist_tui.widgets.log_pane import LogPane
from tests.app_helpers import FakeJob, check_scroll_keys, demo_events, header_text, run, wait_for


def test_the_training_runs_summary_prints_on_exit_after_a_replay():
    job = FakeJob(steps=3)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished" and not app.session.job_running)
        player = ReplayPlayer(demo_events(), 0.0)
        app.replace_session(player, player, "demo")  # what `o` does with the chosen run
        await wait_for(pilot, lambda: app.session.replay and app.session.state == "finished")
        assert "ETA" not in header_text(app)

    app = run(scenario, job)
    lines = app.farewell()
    assert lines[0] == "steps          3" and lines[-1] == "run folder     runs/r1"


def test_a_replay_shows_no_eta_while_it_plays():
    player = ReplayPlayer(demo_events(), 0.5)  # slow enough to be caught mid-run

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.session.state == "running")
        app.header.redraw(force=True)
        assert app.header.eta_s() is not None and "ETA" not in header_text(app)

    run(scenario, player, replay=player)


def _two(events) -> tuple:
    return figures(events, "a"), figures(events, "b")


def test_leaving_a_comparison_returns_to_the_live_run():
    job = FakeJob(steps=3)
    pair = _two([e for e in demo_events() if not isinstance(e, StepEnd) or e.step < 20])

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished")
        app._compare_chosen(list(pair))  # what `c` does with the two chosen runs
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, CompareScreen))
        assert app.is_running and "finished" in header_text(app)

    run(scenario, job)


def test_leaving_compare_from_the_command_line_exits():
    pair = _two(demo_events())

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        await pilot.press("escape")
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    app = run(scenario, None, compare=pair)
    assert app.farewell() == [] and app.shell_exit_code == 0


def test_a_replay_opened_over_a_training_run_returns_to_it_still_training(tmp_path):
    from nanodist_tui.screens.replay_over import ReplayOverScreen
    job = FakeJob(steps=400, pace_s=0.01)
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    import json

    from engine.events import to_json
    (recorded / "events.jsonl").write_text("".join(json.dumps(to_json(e)) + "\n" for e in demo_events()))

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "running" and app.header.latest is not None)
        live = app.session
        app._replay_chosen([recorded])  # what `o` does with the chosen run
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayOverScreen))
        screen = app.screen
        await wait_for(pilot, lambda: screen.workspace is not None and screen.header.latest is not None)
        shown = screen.header.summary(160).plain
        assert "ETA" not in shown and "replay" in shown and screen.workspace.panes
        before = app.header.latest.step
        await pilot.pause(0.3)
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, ReplayOverScreen))
        assert app.session is live and live.state == "running" and not live.control.is_set()
        await wait_for(pilot, lambda: app.header.latest.step > before)  # it trained on behind the replay
        assert screen.control.is_set()  # the replay's player was told to stop
        live.control.set()
        await wait_for(pilot, lambda: not live.active)

    run(scenario, job)


def test_a_replay_over_a_training_run_has_its_own_tab_and_scroll_keys(tmp_path):
    """On the replay's screen a digit shows the replay's tab and the arrows scroll its pane, as in the
    workbench; the run behind keeps the tab it had."""
    from nanodist_tui.screens.replay_over import ReplayOverScreen
    from tests.pipeline_helpers import recorded_run

    run_dir = recorded_run(tmp_path)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "running" and app.workspace is not None)
        behind = app.workspace.active_tab
        app._replay_chosen([run_dir])  # what `o` does with the chosen run
        await wait_for(pilot, lambda: isinstance(app.screen, ReplayOverScreen))
        screen = app.screen
        await wait_for(pilot, lambda: screen.workspace is not None and screen.header.state == "finished")
        tabs = screen.workspace.tab_ids
        await pilot.press(str(tabs.index("tab-log") + 1))
        await wait_for(pilot, lambda: screen.workspace.active_tab == "tab-log")
        log = screen.workspace.tabs["log"]
        assert isinstance(log, LogPane)
        for i in range(200):
            log.add(f"line {i}")
        await wait_for(pilot, lambda: not log._pending and log.max_scroll_y > 0)  # written on a redraw
        await check_scroll_keys(pilot, log)
        assert app.workspace.active_tab == behind
        app.session.control.set()
        await wait_for(pilot, lambda: not app.session.active)

    run(scenario, FakeJob(steps=400, pace_s=0.01), size=(80, 24))
