"""`nanodist-tui screenshot`: the workbench as an SVG, drawn from a recorded run (the bundled demo recording
by default) with no clock involved, so the same recording always gives the same picture (the README's)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from engine import paths
from nanodist_tui.cli.errors import fail
from nanodist_tui.cli.options import AsciiOpt


def _size(text: str) -> tuple[int, int]:
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        fail(f'--size "{text}": write COLUMNSxROWS, e.g. 160x50')
    if width < 40 or height < 12:
        fail(f"--size {text}: the workbench needs at least 40x12")
    return width, height


RunOpt = Annotated[Path | None, typer.Argument(
    help="a run folder to draw (default: the bundled demo recording)", show_default=False)]
OutputOpt = Annotated[Path, typer.Option("--output", "-o", help="the SVG to write")]
SizeOpt = Annotated[str, typer.Option("--size", help="terminal size, COLUMNSxROWS")]
TabOpt = Annotated[int, typer.Option("--tab", min=1, max=9, help="the tab to show (1 = overview)")]


def screenshot(run_dir: RunOpt = None, output: OutputOpt = Path("workbench.svg"), size: SizeOpt = "160x50",
               tab: TabOpt = 1, ascii_only: AsciiOpt = False) -> None:
    """Draw the workbench replaying a recorded run, and save it as an SVG."""
    from nanodist_tui.cli.runs import _read
    from nanodist_tui.demo import DEMO_DIR
    from nanodist_tui.shots import render_screenshot
    from nanodist_tui.user_config import UserConfig
    try:  # before drawing: a device, FIFO or folder at --output is never replaced
        paths.check_output(output)
    except paths.PathError as e:
        fail(f"--output {e}")
    events = _read(run_dir or DEMO_DIR)
    svg = render_screenshot(events, _size(size), tab=tab, user_config=UserConfig(ascii=ascii_only))
    from engine.run.atomic_file import atomic_write_text
    atomic_write_text(output, svg)
    print(f"wrote {output} ({size}, tab {tab}, {len(events)} events from {run_dir or 'the demo recording'})")
