"""ASCII mode draws ASCII only: every tab (and the help) of the demo replay at both sizes, with whatever
Textual and plotext draw (borders, tab underline, scrollbars, footer, plot frames) included."""

from __future__ import annotations

import asyncio
import html
import re

import pytest

from nanodist_tui.ascii_filter import to_ascii
from nanodist_tui.shots import replay_app, settle
from nanodist_tui.user_config import UserConfig
from tests.app_helpers import SIZE, SMALL, demo_events

# Whole screens drawn many times over: out of the quick subset (`-m "not slow"`), in the full suite.
pytestmark = pytest.mark.slow

CELLS = re.compile(r"<text [^>]*textLength[^>]*>(.*?)</text>")  # the screen's cells, not the window's title


def screen_chars(svg: str) -> set[str]:
    """Every character on screen in a Textual screenshot (its text elements; no-break spaces are spaces)."""
    return {c for cell in CELLS.findall(svg) for c in html.unescape(cell).replace("\xa0", " ")}


@pytest.mark.parametrize("size", [SMALL, SIZE], ids=["80x24", "160x50"])
def test_every_tab_in_ascii_mode_is_ascii_only(size):
    found: dict[str, set[str]] = {}

    async def main() -> None:
        app = replay_app(demo_events(), UserConfig(ascii=True))
        async with app.run_test(size=size) as pilot:
            for tab in range(1, 8):
                await settle(app, pilot, tab)
                found[f"tab {tab}"] = {c for c in screen_chars(app.export_screenshot()) if not c.isascii()}
            await pilot.press("question_mark")
            await pilot.pause(0.3)
            found["help"] = {c for c in screen_chars(app.export_screenshot()) if not c.isascii()}
            assert len(screen_chars(app.export_screenshot())) > 20  # the screen has text to check

    asyncio.run(main())
    assert {where: chars for where, chars in found.items() if chars} == {}


def test_unicode_mode_is_left_alone():
    async def main() -> set[str]:
        app = replay_app(demo_events())
        async with app.run_test(size=SIZE) as pilot:
            await settle(app, pilot, 1)
            return {c for c in screen_chars(app.export_screenshot()) if not c.isascii()}

    assert "─" in asyncio.run(main())  # the borders and frames as Textual and plotext draw them


def test_each_character_keeps_its_cell():
    assert to_ascii("╭─ loss ─╮") == "+- loss -+"
    assert to_ascii("│4┤⠈⠉⠀x") == "|4+** x"
    assert to_ascii("▁▂█▏ · × ▶◀ 中") == "__#| . x >< ??"
    assert to_ascii("plain") == "plain"
