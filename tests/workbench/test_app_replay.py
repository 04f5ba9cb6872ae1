"""Replaying a recorded run (the bundled demo recording: 4 ranks, ZeRO-2, fp16) into the workbench: what the
panes show equals what the recording says; speed, pause and seek; no stop offered; and two recorded runs
compared side by side."""

from __future__ import annotations

import math

import pytest

from engine.events import LossScaleChange, MemorySnapshot, RunStarted, StepEnd, Traffic
from nanodist_tui.app import NanoDistApp
from nanodist_tui.compare import figures, smooth
from nanodist_tui.replay import ReplayPlayer
from nanodist_tui.screens.compare import ComparePlot, CompareScreen
from nanodist_tui.widgets.loss_scale_pane import LossScalePane
from nanodist_tui.widgets.units import format_bytes
from tests.app_helpers import demo_events, footer_when, header_text, run, wait_for

EVENTS = demo_events()


def replay(speed: float = 0.0, start_step: int = 0) -> ReplayPlayer:
    return ReplayPlayer(EVENTS, speed, start_step=start_step)


def test_the_recording_is_what_the_panes_show():
    player = replay()

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.session.state == "finished")
        for tab in (3, 4, 6):
            app.action_show_tab(tab)
            await pilot.pause(0.2)
            app.redraw_now()
        last = [e for e in EVENTS if isinstance(e, StepEnd)][-1]
        header = header_text(app)
        assert f"step {last.step}/{last.step}" in header and f"scale {last.loss_scale:g}" in header
        traffic = next(e for e in reversed(EVENTS) if isinstance(e, Traffic) and e.rank == 0)
        sync = ("reduce-scatter", "all-gather")
        sent = sum(link["bytes"] for link in traffic.links if link["phase"] in sync)
        shown = str(app.workspace.tabs["traffic"].content)
        assert f"sent per rank and step {format_bytes(sent)}" in shown and f"step {traffic.step}" in shown
        last_step = max(e.step for e in EVENTS if isinstance(e, MemorySnapshot))
        snaps = [e for e in EVENTS if isinstance(e, MemorySnapshot) and e.rank == 3 and e.step == last_step]
        snap = max(snaps, key=lambda e: sum(e.peak.values()))  # the phase that peaked highest
        row = next(line for line in str(app.workspace.tabs["memory"].content).splitlines()
                   if line.startswith("rank 3 "))
        # the recording predates RunStarted.memory_estimate: its memory events carried the estimate, which
        # the decoder moves onto RunStarted (engine.run.legacy_events)
        predicted = next(e for e in EVENTS if isinstance(e, RunStarted)).memory_estimate[snap.phase]
        peak, estimated = (format_bytes(sum(amounts.values()), 9) for amounts in (snap.peak, predicted))
        assert f"{peak} " in row and f" est {estimated}" in row
        overflows = sum(1 for e in EVENTS if isinstance(e, LossScaleChange) and e.reason in ("inf", "nan"))
        scale = app.workspace.tabs["loss-scale"]
        assert isinstance(scale, LossScalePane) and scale.overflows == overflows > 0
        assert len(scale.plot.overflows) == overflows  # one mark per overflow, each at its own attempt
        assert len({x for x, _ in scale.plot.overflows}) == overflows
        assert app.check_action("stop_training", ()) is False  # a replay offers no stop
        await footer_when(pilot, app, lambda line: "Stop" not in line)

    run(scenario, player, replay=player)


def test_speed_pause_and_seek():
    player = replay(speed=1.0)

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: app.header.latest is not None)
        await pilot.press("plus", "plus")
        assert player.speed == 4.0 and "replay 4x" in header_text(app)
        await pilot.press("minus")
        assert player.speed == 2.0
        await pilot.press("p")
        assert app.session.state == "paused"
        held = app.header.latest.step
        await pilot.pause(0.8)
        assert app.header.latest.step == held  # the replay holds too
        await pilot.press("p")
        app.seek_to(40)  # what `]` does from step 34 of 60
        await wait_for(pilot, lambda: app.header.latest is not None and app.header.latest.step >= 40)
        assert app.session.player.start_step == 40 and app.session.player.speed == 2.0
        seeked = app.session
        await pilot.press("left_square_bracket")
        await wait_for(pilot, lambda: app.session is not seeked and app.header.latest is not None)
        assert app.session.player.start_step < 40
        await pilot.press("q")

    run(scenario, player, replay=player)


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """The same tiny GPT trained with ZeRO-1 and with ZeRO-3 on 2 ranks: (events, events)."""
    from tests.run_helpers import train
    out = tmp_path_factory.mktemp("compare")
    _, zero1 = train(out / "a", "parallel.world_size=2", "parallel.zero_stage=1", "train.steps=4")
    _, zero3 = train(out / "b", "parallel.world_size=2", "parallel.zero_stage=3", "train.steps=4")
    return zero1, zero3


def test_two_runs_side_by_side(two_runs):
    a, b = (figures(events, name) for events, name in zip(two_runs, ("zero1", "zero3")))
    assert a.info.zero_stage == 1 and b.info.zero_stage == 3
    peak = max(sum(e.peak.values()) for e in two_runs[1] if isinstance(e, MemorySnapshot))
    assert b.memory_total == peak
    assert "param-gather" in b.phase_bytes and "param-gather" not in a.phase_bytes
    last_a = [e for e in two_runs[0] if isinstance(e, Traffic) and e.rank == 0][-1]
    scattered = sum(link["bytes"] for link in last_a.links if link["phase"] == "reduce-scatter")
    assert a.phase_bytes["reduce-scatter"] == scattered

    async def scenario(app: NanoDistApp, pilot) -> None:
        await wait_for(pilot, lambda: isinstance(app.screen, CompareScreen))
        screen = app.screen
        memory = str(screen.query_one("#compare-memory").content)
        totals = f"{format_bytes(a.memory_total, 11)}{format_bytes(b.memory_total, 11)}"
        assert f"{'peak total':<22}{totals}" in memory
        traffic = str(screen.query_one("#compare-traffic").content)
        assert "param-gather" in traffic and format_bytes(b.phase_bytes["param-gather"]) in traffic
        plot = screen.query_one(ComparePlot)
        await pilot.press("m")
        assert plot.weight == 0.6 and "EMA 0.6" in plot.border_title
        smoothed = smooth(a.train, 0.6)
        assert smoothed[0] == a.train[0]
        assert math.isclose(smoothed[1][1], 0.6 * a.train[0][1] + 0.4 * a.train[1][1])
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)

    run(scenario, None, compare=(a, b))
