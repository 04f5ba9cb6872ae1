"""A replayed run's text (run id, preset, network, log message, sweep parameter name, failure) is shown in the
workbench's log, header and notification escaped, and its markup is shown as typed, never interpreted."""

from __future__ import annotations

import asyncio

from engine.run.recorder import read_events
from nanodist_tui.app import create_app
from nanodist_tui.replay import ReplayPlayer
from tests.app_helpers import SIZE, TEST_PANE_INTERVAL_S, header_text, log_text, screen_text, wait_for
from tests.hostile_run import PAYLOAD, SHOWN, hostile_run_folder, unsafe


def squeezed(text: str) -> str:
    """`text` without whitespace: the log wraps a long word where it likes."""
    return "".join(text.split())


def test_a_replayed_runs_text_is_shown_escaped_and_never_as_markup(tmp_path):
    player = ReplayPlayer(read_events(hostile_run_folder(tmp_path)), 0.0)
    app = create_app(PAYLOAD, player, replay=player, pane_interval_s=TEST_PANE_INTERVAL_S)  # as `replay` does

    async def main() -> None:
        async with app.run_test(size=SIZE, notifications=True) as pilot:
            await wait_for(pilot, lambda: app.session.state == "failed")
            app.redraw_now()
            expected = [squeezed(line) for line in (
                f"run {SHOWN} started: preset {SHOWN}", f"warning: {SHOWN}", f"trial 0 started: {SHOWN}=0.5",
                f"run failed: rank 1: {SHOWN}")]
            # a log writes what it queued once laid out, on a render tick a loaded machine may bring late
            await wait_for(pilot, lambda: all(line in squeezed(log_text(app)) for line in expected))
            header = header_text(app)
            assert header.count(SHOWN) == 2 and unsafe(header) == []  # the preset and the network
            screen = screen_text(app)
            assert unsafe(screen) == [] and "[bold]x[/bold][link=https://e.x]y[/link]" in screen
            toasts = [(n.message, n.markup) for n in app._notifications]
            assert (f"rank 1: {SHOWN}", False) in toasts, toasts  # the notification, escaped, not markup
            app.action_show_tab(app.workspace.tab_ids.index("tab-traffic") + 1)  # phase and group names

            def traffic_shown() -> bool:
                app.redraw_now()
                return r"\x1b]52;c;aGk=" in screen_text(app)

            await wait_for(pilot, traffic_shown)
            assert unsafe(screen_text(app)) == []

    asyncio.run(main())
