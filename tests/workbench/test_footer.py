"""The footer at 80 columns: every key it shows is whole and on screen, in the bindings' order, with `?` and
`q` always among them; a replay's speed and seek keys fit as two groups. At 160 columns every key shows."""

from __future__ import annotations

from textual.widgets._footer import FooterKey

from nanodist_tui.app import NanoDistApp
from nanodist_tui.bindings import BINDINGS
from nanodist_tui.replay import ReplayPlayer
from tests.app_helpers import (
    SIZE,
    SMALL,
    FakeJob,
    FakeSweep,
    demo_events,
    footer_line,
    footer_when,
    run,
    wait_for,
)

BINDING_ORDER = [b.key for b in BINDINGS]


def footer_keys(app: NanoDistApp) -> tuple[list[str], list[str]]:
    """The footer's keys shown and hidden, each in the footer's order; asserts that each shown key lies whole
    on screen."""
    shown, hidden = [], []
    for key in app.screen.query(FooterKey):
        if key.display:
            region = key.region
            assert region.width > 0 and region.x >= 0 and region.right <= app.size.width, key.key
            shown.append(key.key)
        else:
            hidden.append(key.key)
    return shown, hidden


def check_footer(app: NanoDistApp, width: int) -> list[str]:
    shown, hidden = footer_keys(app)
    assert {"question_mark", "q"} <= set(shown)
    ours = [k for k in shown + hidden if k in BINDING_ORDER]  # the palette's own key docks at the right
    # what is left out is the end of the list, never a key in the middle
    assert ours == [k for k in BINDING_ORDER if k in ours]
    assert ours[:len(ours) - len(hidden)] == [k for k in shown if k in BINDING_ORDER]
    if width >= 120:
        assert not hidden
    last_line = footer_line(app)
    assert len(last_line.rstrip()) <= width
    return shown


def test_a_training_runs_footer_shows_every_key_at_80_columns():
    for size in (SMALL, SIZE):
        async def scenario(app: NanoDistApp, pilot, size=size) -> None:
            await wait_for(pilot, lambda: app.session.state == "running")
            await pilot.pause(0.3)
            await footer_when(pilot, app, lambda line: "? Help" in line)  # drawn, not mid-rebuild
            shown = check_footer(app, size[0])
            assert {"s", "p", "f", "o", "c", "j"} <= set(shown), shown  # n: only with a way to make jobs

        run(scenario, FakeJob(steps=100_000, pace_s=0.01), size=size)


def test_a_replays_speed_and_seek_keys_fit_at_80_columns_as_two_groups():
    player = ReplayPlayer(demo_events(), speed=0.05)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session is not None and app.session.state == "running")
        await pilot.pause(0.3)
        await footer_when(pilot, app, lambda line: "? Help" in line)  # drawn, not mid-rebuild
        shown = check_footer(app, SMALL[0])
        assert {"plus", "minus", "left_square_bracket", "right_square_bracket", "p", "j"} <= set(shown)
        line = footer_line(app)
        assert "+- Speed [] Seek ? Help" in line
        app.exit()

    run(scenario, player, size=SMALL, replay=player)


def test_a_sweeps_footer_keeps_whole_keys_at_80_columns():
    sweep = FakeSweep(n=3, hold_at=1)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: 0 in sweep.ran)
        await pilot.pause(0.3)
        await footer_when(pilot, app, lambda line: "? Help" in line)  # drawn, not mid-rebuild
        assert "x" in check_footer(app, SMALL[0])  # finishing the sweep is among the first keys
        await pilot.resize_terminal(*SIZE)
        await pilot.pause(0.3)
        await footer_when(pilot, app, lambda line: "? Help" in line)  # drawn, not mid-rebuild
        check_footer(app, SIZE[0])
        sweep.go.set()

    run(scenario, sweep, size=SMALL, sweep_finish=sweep.finish)
