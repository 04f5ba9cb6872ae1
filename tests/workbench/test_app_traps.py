"""Nothing in the workbench traps its user: ctrl+c stops (checkpoint kept) and quits from every dialog and
screen, `q` answers the quit dialog, `s` holds training at once while it asks (no: it goes on; yes: it stops
where it holds), a question the run made moot closes itself, and the palette holds every action once."""

from __future__ import annotations

import asyncio

import pytest
from textual.command import CommandPalette

from engine.events import RunStarted
from nanodist_tui.app import NanoDistApp
from nanodist_tui.messages import Tick
from nanodist_tui.screens.confirm import ConfirmScreen, QuitConfirmScreen
from nanodist_tui.screens.help import HelpScreen
from nanodist_tui.screens.new_run import NewRunScreen
from nanodist_tui.screens.open_run import OpenRunScreen
from tests.app_helpers import (
    SMALL,
    FakeJob,
    FakeSweep,
    check_scroll_keys,
    demo_run_folder,
    header_text,
    run,
    screen_text,
    tabs_row_laid_out,
    wait_for,
)

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow


def long_job() -> FakeJob:
    return FakeJob(steps=100_000, pace_s=0.01)  # trains until stopped; holds while paused


async def training(app: NanoDistApp, pilot) -> None:
    await wait_for(pilot, lambda: app.header.latest is not None and app.session.state == "running")


def test_ctrl_c_in_the_stop_dialog_stops_keeping_the_checkpoint_and_quits():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    app = run(scenario, job)
    assert job.saw_stop.is_set()  # stopped through the run control: the engine checkpoints there
    assert app.session.state == "stopped"


def test_ctrl_c_quits_from_the_quit_dialog_help_and_the_run_picker():
    for opened in ("q", "question_mark", "o"):
        job = long_job()

        async def scenario(app: NanoDistApp, pilot, opened=opened) -> None:
            await training(app, pilot)
            await pilot.press(opened)
            assert isinstance(app.screen, (QuitConfirmScreen, HelpScreen, OpenRunScreen))
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: not app.is_running, timeout=3)

        run(scenario, job)
        assert job.saw_stop.is_set(), opened


def test_ctrl_c_quits_from_the_new_run_form_where_an_input_has_the_focus():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("n")
        assert isinstance(app.screen, NewRunScreen) and app.screen.focused is not None
        await pilot.press("ctrl+c")  # an Input would take it as copy: the workbench's binding has priority
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    run(scenario, job, make_job=lambda cfg, doc: long_job())
    assert job.saw_stop.is_set()


def test_the_pane_on_show_scrolls_with_the_keys_the_help_names_without_tab():
    job = FakeJob(steps=3, then="wait_for_stop")  # quiet once its steps are done: no line scrolls the log

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step == 3)
        for i in range(200):
            app.say(f"line {i}")
        tabs = app.workspace.tab_ids
        await pilot.press(str(tabs.index("tab-log") + 1))
        log = app.workspace.tabs["log"]
        await wait_for(pilot, lambda: not log._pending and log.max_scroll_y > 0)  # written on a redraw
        await pilot.pause(0.4)
        await check_scroll_keys(pilot, log)  # the tab strip has the focus, as after start

    run(scenario, job)


def test_ctrl_c_quits_from_the_command_palette():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        await pilot.press("ctrl+c")
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    run(scenario, job)
    assert job.saw_stop.is_set()


def test_q_twice_stops_and_quits_and_the_quit_dialog_shows_its_own_keys():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("q")
        assert isinstance(app.screen, QuitConfirmScreen)
        assert app.session.control.pause.is_set()  # held while the question is open
        keys = {b.binding.key for b in app.screen.active_bindings.values() if b.binding.show}
        assert {"y", "n,escape", "q"} <= keys or {"y", "n", "q"} <= keys  # the dialog's footer shows these
        await pilot.press("q")
        await wait_for(pilot, lambda: not app.is_running, timeout=3)

    app = run(scenario, job, size=SMALL)
    assert job.saw_stop.is_set()
    assert "(stopped early, checkpoint kept)" in app.farewell()[0] and "runs/r1" in app.farewell()[-1]


def test_s_holds_at_once_and_no_lets_training_go_on():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("s")
        assert app.session.control.pause.is_set()  # held the moment s is pressed, not after the answer
        assert isinstance(app.screen, ConfirmScreen)
        await wait_for(pilot, lambda: job.held_at is not None)
        held = job.held_at
        await pilot.pause(0.3)
        assert job.held_at == held and app.header.latest.step == held  # no step while the question is open
        await pilot.press("n")
        assert not app.session.control.pause.is_set() and not app.session.control.is_set()
        await wait_for(pilot, lambda: app.header.latest.step > held)  # training goes on
        assert app.session.state == "running"

    run(scenario, job)


def test_s_then_yes_stops_at_the_step_it_holds_at():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("s")
        await wait_for(pilot, lambda: job.held_at is not None)
        held = job.held_at
        await pilot.pause(0.2)
        await pilot.press("y")
        await wait_for(pilot, lambda: app.session.state == "stopped", timeout=3)
        assert app.header.latest.step == held  # the stop landed where the user decided

    run(scenario, job)


def test_s_on_a_run_the_user_paused_leaves_it_paused_on_no():
    job = long_job()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.session.state == "paused")
        await pilot.press("s", "n")
        assert app.session.control.pause.is_set() and app.session.state == "paused"

    run(scenario, job)


def test_a_stop_question_closes_itself_once_the_run_has_ended():
    job = FakeJob(steps=3, then="wait_for_stop", honour_pause=False)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        app.session.control.set()  # the run ends behind the dialog (as a failure or its last step would)
        await wait_for(pilot, lambda: not app.session.active, timeout=3)
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), timeout=1)
        assert app.is_running  # closed, not answered: nothing else happened

    run(scenario, job)


def palette_titles(app: NanoDistApp) -> list[str]:
    return [c.title for c in app.get_system_commands(app.screen)]


def test_the_palette_offers_every_action_once_even_while_it_is_open():
    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await pilot.press("ctrl+p")
        await wait_for(pilot, lambda: isinstance(app.screen, CommandPalette))
        titles = palette_titles(app)  # what the open palette lists
        for title in ("New run", "Replay a recorded run", "Compare two runs", "Projection", "Stop training",
                      "Pause or resume training", "Sweep results", "Serve a run's model", "Help", "Quit"):
            assert titles.count(title) == 1, (title, titles)
        assert len(titles) == len(set(titles)), titles

    run(scenario, long_job(), make_job=lambda cfg, doc: long_job())


def test_the_start_question_closes_itself_once_the_run_it_would_stop_has_ended():
    first = FakeJob(steps=3, then="wait_for_stop")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None and app.session.state == "running")
        await pilot.press("n")
        assert isinstance(app.screen, NewRunScreen)
        await pilot.press("ctrl+s")
        assert isinstance(app.screen, ConfirmScreen)  # a run is going: stop it first?
        app.session.control.set()  # it ends behind the question
        # generous waits: a loaded machine (CI) took over a second to close the question
        await wait_for(pilot, lambda: not app.session.active, timeout=10)
        await wait_for(pilot, lambda: not isinstance(app.screen, ConfirmScreen), timeout=5)
        assert app.session.job_fn is first  # closed unanswered: nothing was started

    run(scenario, first, make_job=lambda cfg, doc: long_job())


def test_pausing_does_not_move_the_panes_at_80_columns():
    """Paused, the header has no ETA and its last item moves up a line; the header keeps its height, so the
    tabs and panes below stay where they were (a layout that does not jump). fp32, after an evaluation: at
    80 columns the peak memory then wraps to a fourth line while the ETA shows, and fits on the third
    without."""
    job = FakeJob(steps=100_000, pace_s=0.01, dtype="fp32")

    async def scenario(app: NanoDistApp, pilot) -> None:
        await training(app, pilot)
        await wait_for(pilot, lambda: "ETA" in header_text(app) and "val" in header_text(app))
        tabs_row = await tabs_row_laid_out(app, pilot)
        assert tabs_row == 4  # the header: identity on two lines, progress on two (the peak memory wraps)
        await pilot.press("p")
        await wait_for(pilot, lambda: app.session.state == "paused" and "ETA" not in header_text(app))
        await pilot.pause(0.3)
        assert await tabs_row_laid_out(app, pilot) == tabs_row
        await pilot.press("p")
        await wait_for(pilot, lambda: app.session.state == "running" and "ETA" in header_text(app))
        await pilot.pause(0.3)
        assert await tabs_row_laid_out(app, pilot) == tabs_row

    run(scenario, job, size=SMALL)


def test_a_trial_that_starts_while_the_app_closes_is_dropped():
    """A sweep goes on while the app quits: its next trial's start may come after the screen's widgets have
    gone (CI saw `NoMatches: '#body'` when it did). Such a tick is dropped, and nothing is raised."""
    sweep = FakeSweep(n=3, hold_at=1)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: 0 in sweep.ran)

    app = run(scenario, sweep, size=SMALL, sweep_finish=sweep.finish)
    sweep.finish.set()
    sweep.go.set()
    assert not app.is_running
    workspace = app.workspace
    started = RunStarted(run_id="t1", preset="fake", config={}, n_params=10, world_size=1, total_steps=4)
    tick = Tick(seq=99, steps=(), dropped_steps=0, rank_stats={}, memory={}, traffic={}, events=(started,))
    tick.session = app.session.id
    asyncio.run(app.on_tick(tick))
    assert app.workspace is workspace


def test_a_run_marked_for_comparison_shows_its_number(tmp_path, monkeypatch):
    """space marks a run in the compare picker with its order (1, then 2): the mark column, empty at first,
    was drawn no wider than its empty header, so a mark never showed."""
    first, second = demo_run_folder(tmp_path), demo_run_folder(tmp_path, "20261202-120000-second")
    monkeypatch.chdir(tmp_path)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished")
        await pilot.press("c")
        await wait_for(pilot, lambda: isinstance(app.screen, OpenRunScreen))
        await pilot.press("space", "down", "space")
        await wait_for(pilot, lambda: len(app.screen.marked) == 2)
        rows = {line.split()[1]: line.split()[0] for line in screen_text(app).splitlines()
                if first.name in line or second.name in line}
        assert sorted(rows.values()) == ["1", "2"]

    run(scenario, FakeJob(steps=2), size=SMALL)
