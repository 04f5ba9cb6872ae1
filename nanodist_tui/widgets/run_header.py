"""Header: preset, run state, step/total, loss, tokens/s, ETA."""

from __future__ import annotations

from collections import deque

from rich.text import Text
from textual.widgets import Static

from engine.events import Eval, RunStarted, StepEnd
from nanodist_tui.messages import Tick
from nanodist_tui.widgets.units import format_duration

STATE_STYLES = {
    "starting": "dim",
    "running": "bold green",
    "stopping": "bold yellow",
    "stopped": "bold yellow",
    "finished": "bold cyan",
    "failed": "bold red",
}
ETA_WINDOW = 20  # steps averaged for the ETA


class RunHeader(Static):
    """The app sets `state` and `display_paused`; ticks bring everything else."""

    def __init__(self, preset_name: str, *, replay: bool = False, id: str | None = None) -> None:
        super().__init__(id=id)
        self.preset_name = preset_name
        self.replay = replay
        self.state = "starting"
        self.display_paused = False
        self.started: RunStarted | None = None
        self.latest: StepEnd | None = None
        self.val_loss: float | None = None
        self._step_times: deque[float] = deque(maxlen=ETA_WINDOW)
        self._dirty = True

    def ingest(self, tick: Tick) -> None:
        for event in tick.events:
            if isinstance(event, RunStarted):
                self.started = event
                self._dirty = True
            elif isinstance(event, Eval):
                self.val_loss = event.val_loss
                self._dirty = True
        if tick.steps:
            self._step_times.extend(step.step_time_s for step in tick.steps[-ETA_WINDOW:])
            self.latest = tick.steps[-1]
            self._dirty = True

    def set_state(self, state: str) -> None:
        self.state = state
        self._dirty = True

    def redraw(self, force: bool = False) -> None:
        if self._dirty or force:
            self._dirty = False
            self.update(self.summary())

    def eta_s(self) -> float | None:
        if self.latest is None or self.started is None or not self._step_times:
            return None
        remaining = max(0, self.started.total_steps - self.latest.step)
        return remaining * sum(self._step_times) / len(self._step_times)

    def summary(self) -> Text:
        text = Text()
        text.append("nanoDist ", style="bold")
        text.append(self.preset_name)
        text.append("  ")
        text.append(f" {self.state} ", style=f"reverse {STATE_STYLES.get(self.state, '')}")
        if self.replay:
            text.append("  replay", style="italic")
        if self.display_paused:
            text.append("  display paused (training continues)", style="bold magenta")
        if self.started is not None:
            started = self.started
            text.append(f"  {started.world_size} rank(s), {started.n_params:,} parameters", style="dim")
            if started.threads_per_rank:  # each rank's share of the host's cores (parallel.threads_per_rank)
                text.append(f"  {started.threads_per_rank} thread(s)/rank", style="dim")
            if started.network:
                text.append(f"  {started.network}", style="bold yellow")
        text.append("\n")
        total = self.started.total_steps if self.started else "?"
        if self.latest is None:
            text.append(f"step -/{total}", style="dim")
            return text
        s = self.latest
        text.append(f"step {s.step}/{total}", style="bold")
        text.append(f"  loss {s.loss:.4f}")
        if self.val_loss is not None:
            text.append(f"  val {self.val_loss:.4f}")
        text.append(f"  lr {s.lr:.2e}  {s.tokens_per_s:,.0f} tokens/s")
        if s.loss_scale is not None:
            text.append(f"  scale {s.loss_scale:g}")
        eta = self.eta_s()
        if eta is not None and self.state in ("running", "stopping"):
            text.append(f"  ETA {format_duration(eta)}")
        return text
