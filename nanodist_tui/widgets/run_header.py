"""Header: what runs (preset, backend and ranks, ZeRO stage, precision, checkpointing) and how it goes (state,
step/total, loss, smoothed tokens/s, ETA, peak memory, loss scale, and whatever other panes report, such as
a sweep's best trial). Items are laid out in as many lines as the width needs.

Items are small functions of the header's state, listed in IDENTITY and PROGRESS; a feature that has
something for the header appends an item there, or puts a value in `extras` (label -> text).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from rich.text import Text

from engine.events import Eval, Phase, RunFinished, RunStarted, StepEnd
from engine.run import throughput
from engine.run.printable import printable
from nanodist_tui.messages import Tick
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.text_view import TextView
from nanodist_tui.widgets.units import format_bytes, format_count, format_duration

STATE_STYLES = {
    "starting": "dim",
    "running": "bold green",
    "pausing": "bold magenta",
    "paused": "bold magenta",
    "stopping": "bold yellow",
    "stopped": "bold yellow",
    "finished": "bold cyan",
    "failed": "bold red",
}
WINDOW = 20  # steps averaged for tokens/s and the ETA
GAP = "   "


class RunHeader(TextView):
    """The app sets `state`, `replay_speed`, `display_frozen`; ticks bring everything else."""

    def __init__(self, preset_name: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.display_frozen = False
        self.extras: dict[str, str] = {}
        self.reset(preset_name)

    def reset(self, preset_name: str, replay_speed: float | None = None) -> None:
        """Forget the previous run: a new one (or a replay from another step) starts."""
        self.preset_name = preset_name
        self.replay_speed = replay_speed  # set for a replay
        self.info: RunInfo | None = None
        self.state = "starting"
        self.latest: StepEnd | None = None
        self.phase = ""  # the stage the run is in before its first step (engine.events.Phase)
        self.val_loss: float | None = None
        self.peak_memory: dict[int, int] = {}
        self._window: deque[StepEnd] = deque(maxlen=WINDOW)
        self._run_tokens = self._run_seconds = 0.0  # every step's, for the run's own figure once it ends
        self._run_rate: float | None = None  # RunFinished's: the same figure, and no step of it was dropped
        self._lines = 0  # the most lines shown for this run at this width: the header never shrinks under it
        self._dirty = True

    def ingest(self, tick: Tick) -> None:
        for event in tick.events:
            if isinstance(event, RunStarted):
                self.info = RunInfo.from_started(event, replay=self.replay_speed is not None)
                self._dirty = True
            elif isinstance(event, Eval):
                self.val_loss = event.val_loss
                self._dirty = True
            elif isinstance(event, RunFinished):
                self._run_rate = event.tokens_per_s
            elif isinstance(event, Phase):
                self.phase = event.name
                self._dirty = True
        for (rank, _), snap in tick.memory.items():
            self.peak_memory[rank] = max(self.peak_memory.get(rank, 0), sum(snap.peak.values()))
        if tick.steps:
            self._window.extend(tick.steps[-WINDOW:])
            self._run_tokens += sum(step.tokens for step in tick.steps)
            self._run_seconds += sum(step.step_time_s for step in tick.steps)
            self.latest = tick.steps[-1]
            self._dirty = True

    def set_state(self, state: str) -> None:
        self.state = state
        self._dirty = True

    def set_extra(self, label: str, value: str | None) -> None:
        if value is None:
            self.extras.pop(label, None)
        else:
            self.extras[label] = value
        self._dirty = True

    def on_resize(self) -> None:
        self._lines = 0
        self._dirty = True

    def redraw(self, force: bool = False) -> None:
        if self._dirty or force:
            self._dirty = False
            text = self.summary(self.content_region.width or 80)
            # An item that comes and goes (the ETA while paused) would move every pane below by a line
            lines = text.plain.count("\n") + 1
            text.append("\n" * max(0, self._lines - lines))
            self._lines = max(self._lines, lines)
            self.show(text)

    def tokens_per_s(self) -> float | None:
        """engine.run.throughput's tokens/s: over the last WINDOW steps while the run goes (one step's is
        noisy; the whole run's lags), over all its steps once it has ended, so the header then shows the
        figure `runs`, compare and the summary show."""
        if self.state in ("running", "pausing", "paused", "stopping", "starting"):
            return throughput.of_steps(self._window)
        if self._run_rate is not None:
            return self._run_rate
        return throughput.tokens_per_s(self._run_tokens, self._run_seconds)

    def eta_s(self) -> float | None:
        if self.latest is None or self.info is None or not self._window:
            return None
        remaining = max(0, self.info.total_steps - self.latest.step)
        return remaining * sum(s.step_time_s for s in self._window) / len(self._window)

    def summary(self, width: int = 80) -> Text:
        out = Text()
        for group in (IDENTITY, PROGRESS):
            items = [text for item in group if (text := item(self)) is not None]
            if group is PROGRESS:
                items += [Text(printable(f"{label} {value}")) for label, value in self.extras.items()]
            line = Text()
            for text in items:
                if line.cell_len and line.cell_len + len(GAP) + text.cell_len > width:
                    out.append_text(line)
                    out.append("\n")
                    line = Text()
                if line.cell_len:
                    line.append(GAP)
                line.append_text(text)
            out.append_text(line)
            if group is IDENTITY:
                out.append("\n")
        return out


Item = Callable[[RunHeader], Text | None]


def _title(h: RunHeader) -> Text:
    text = Text("nanoDist ", style="bold")
    text.append(printable(h.preset_name))  # a replay's or a compare's: recorded text
    text.append("  ")
    text.append(f" {h.state} ", style=f"reverse {STATE_STYLES.get(h.state, '')}")
    return text


def _replay(h: RunHeader) -> Text | None:
    if h.replay_speed is None:
        return None
    speed = "as fast as it goes" if h.replay_speed == 0 else f"{h.replay_speed:g}x"
    return Text(f"replay {speed}", style="italic")


def _frozen(h: RunHeader) -> Text | None:
    return Text("display frozen (training goes on)", style="bold magenta") if h.display_frozen else None


def _shape(h: RunHeader) -> Text | None:
    i = h.info
    if i is None:
        return None
    ranks = f"{i.world_size} rank{'s' if i.world_size > 1 else ''} on {i.backend}"
    threads = f" · {i.threads_per_rank} thread(s)/rank" if i.threads_per_rank else ""
    zero = f"ZeRO-{i.zero_stage}"
    if i.hybrid and i.ranks_per_node and i.zero_stage:
        zero += f" hybrid ({i.world_size // i.ranks_per_node} nodes x {i.ranks_per_node})"
    algorithm = f" · all-reduce {i.algorithm}" if i.distributed and i.algorithm != "ring" else ""
    shape = f"{ranks}{threads} · {zero}{algorithm} · {i.dtype} · checkpointing {i.checkpointing}"
    return Text(printable(shape), style="bold")  # the backend, dtype, ... are a recorded run's text


def _network(h: RunHeader) -> Text | None:
    """An emulated network is named, so a run on it can never pass for one on a real network."""
    if h.info is None or not h.info.network:
        return None
    return Text(printable(h.info.network), style="bold yellow")


def _step(h: RunHeader) -> Text:
    total = h.info.total_steps if h.info else "?"
    if h.latest is None:
        # the seconds before the first step say what takes them (starting ranks, compiling kernels, ...)
        text = Text(f"step -/{total}", style="dim")
        if h.phase and h.state in ("starting", "running"):
            text.append(f" · {h.phase}...", style="bold")
        return text
    return Text(f"step {h.latest.step}/{total}", style="bold")


def _loss(h: RunHeader) -> Text | None:
    if h.latest is None:
        return None
    text = f"loss {h.latest.loss:.4f}"
    return Text(text + (f"  val {h.val_loss:.4f}" if h.val_loss is not None else ""))


def _speed(h: RunHeader) -> Text | None:
    rate = h.tokens_per_s()
    return None if rate is None else Text(f"{format_count(rate)} tok/s")


def _eta(h: RunHeader) -> Text | None:
    eta = h.eta_s()
    # a replay's step times are the recorded run's, and it plays at its own speed (or seeks): the recorded
    # run's ETA would be a figure of a run that is long over
    if eta is None or h.replay_speed is not None or h.state not in ("running", "pausing", "stopping"):
        return None
    return Text(f"ETA {format_duration(eta)}")


def _memory(h: RunHeader) -> Text | None:
    if not h.peak_memory:
        return None
    return Text(f"peak {format_bytes(max(h.peak_memory.values()))}/rank")


def _scale(h: RunHeader) -> Text | None:
    if h.latest is None or h.latest.loss_scale is None:
        return None
    return Text(f"scale {h.latest.loss_scale:g}")


IDENTITY: list[Item] = [_title, _replay, _frozen, _shape, _network]
PROGRESS: list[Item] = [_step, _loss, _speed, _eta, _memory, _scale]
