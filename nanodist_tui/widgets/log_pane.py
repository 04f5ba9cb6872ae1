"""Run log: one line per discrete engine event, plus the app's own messages (errors, stop)."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.widgets import RichLog

from engine.events import CheckpointSaved, Eval, Log, LossScaleChange, RunFailed, RunFinished, RunStarted
from nanodist_tui.messages import Tick

LEVEL_STYLES = {"debug": "dim", "warning": "yellow", "warn": "yellow", "error": "bold red"}


def describe_change(change: LossScaleChange) -> Text:
    what = {
        "inf": "inf overflow",
        "nan": "NaN overflow",
        "hysteresis": "overflow absorbed by hysteresis",
    }.get(change.reason, change.reason)
    line = f"step {change.step}: {what}, scale {change.old_scale:g} -> {change.new_scale:g}"
    if change.first_param:
        line += f" (first: {change.first_param})"
    return Text(line, style="" if change.reason == "growth" else "yellow")


def write_lines(log: RichLog, lines: list[Text]) -> None:
    """Write and clear `lines`, wrapped to the log's current width (RichLog's own default is 78)."""
    width = log.scrollable_content_region.width or None
    for line in lines:
        log.write(line, width=width)
    lines.clear()


def _loss(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def describe(event: Any) -> Text | None:
    """One log line for a discrete event, or None for events the log does not show."""
    if isinstance(event, RunStarted):
        return Text(
            f"run {event.run_id} started: preset {event.preset}, {event.n_params:,} parameters, "
            f"{event.world_size} rank(s), {event.total_steps} steps"
        )
    if isinstance(event, Eval):
        return Text(f"step {event.step}: val loss {event.val_loss:.4f}")
    if isinstance(event, LossScaleChange):
        return describe_change(event)
    if isinstance(event, CheckpointSaved):
        return Text(f"step {event.step}: checkpoint saved to {event.path}")
    if isinstance(event, Log):
        return Text(f"{event.level}: {event.message}", style=LEVEL_STYLES.get(event.level.lower(), ""))
    if isinstance(event, RunFinished):
        folder = f", run folder {event.run_dir}" if event.run_dir else ""
        return Text(
            f"finished {event.steps} steps in {event.wall_s:.1f} s: "
            f"val loss {_loss(event.initial_val_loss)} -> {_loss(event.final_val_loss)}, "
            f"{event.tokens_per_s:,.0f} tokens/s{folder}",
            style="green",
        )
    if isinstance(event, RunFailed):
        where = f"rank {event.rank}: " if event.rank is not None else ""
        return Text(f"run failed: {where}{event.message}", style="bold red")
    return None


class LogPane(RichLog):
    """Lines are queued by `ingest`/`add` and written by `redraw`, so pausing the display freezes it too."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=2000, wrap=True, markup=False)
        self.border_title = "log"
        self._pending: list[Text] = []

    def ingest(self, tick: Tick) -> None:
        self._pending.extend(line for event in tick.events if (line := describe(event)) is not None)

    def add(self, message: str, style: str = "") -> None:
        self._pending.append(Text(message, style=style))

    def redraw(self) -> None:
        write_lines(self, self._pending)
