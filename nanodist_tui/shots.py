"""The workbench drawn from recorded events, deterministically: replayed with no pauses, every pane drawn once
the replay has ended, then captured. `nanodist-tui screenshot` and the snapshot tests both use it."""

from __future__ import annotations

import asyncio

from nanodist_tui.app import NanoDistApp, create_app
from nanodist_tui.replay import ReplayPlayer
from nanodist_tui.user_config import UserConfig

SETTLE_TIMEOUT_S = 60.0


def replay_app(events: list, user_config: UserConfig | None = None) -> NanoDistApp:
    started = next((e for e in events if e.kind == "run_started"), None)
    player = ReplayPlayer(events, speed=0.0)
    return create_app(started.preset if started else "replay", player, replay=player, user_config=user_config)


async def settle(app: NanoDistApp, pilot, tab: int = 1) -> None:
    """Wait until the replay has been played and shown, switch to `tab`, and draw every pane."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + SETTLE_TIMEOUT_S
    while (app.session is None or app.session.active or app.workspace is None
           or not app.session.worker.is_finished):
        if loop.time() > deadline:
            raise TimeoutError("the replay did not end in time")
        await pilot.pause(0.05)
    await pilot.pause(0.1)  # the last tick
    app.action_show_tab(tab)
    for _ in range(3):  # the tab's panes learn their size, then draw at it
        await pilot.pause(0.15)
        app.redraw_now()
    await pilot.pause(0.1)


def render_screenshot(events: list, size: tuple[int, int], tab: int = 1,
                      user_config: UserConfig | None = None) -> str:
    app = replay_app(events, user_config)
    result: dict[str, str] = {}

    async def capture(pilot) -> None:
        await settle(app, pilot, tab)
        result["svg"] = app.export_screenshot(title="nanoDist workbench")
        app.exit()

    app.run(headless=True, size=size, auto_pilot=capture)
    return result["svg"]
