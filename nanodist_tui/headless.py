"""Headless progress: a rich progress bar on a terminal, plain periodic lines anywhere else.

Rich's live display only prints its final frame when stdout is not a terminal (CI logs, `| tee`),
so there we print one plain line every `interval_s` seconds instead, plus every discrete event
(evaluation, loss-scale change, checkpoint, failure) as it happens, worded as the workbench's log words
it (describe.py). Plain lines bypass rich: it would wrap them at 80 columns off a terminal (splitting a
run id from its label) and read brackets as markup. Every line is passed through `printable` first: it may
quote a recorded run's text (a replay), and the terminal must not obey control sequences in it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from engine import events as ev
from engine.parallel.mesh import DENSE_AXES
from engine.run.printable import printable
from nanodist_tui.bubble_meter import BubbleMeter
from nanodist_tui.describe import describe
from nanodist_tui.mesh_grid import layout_text
from nanodist_tui.run_info import RunInfo
from nanodist_tui.widgets.units import format_bytes


class LinePrinter:
    """Lines on stdout, above a rich progress bar (`_progress`, started by the subclass) while one is shown:
    on a terminal through rich, anywhere else plain and unwrapped."""

    def __init__(self, console: Console | None = None, live: bool | None = None):
        self.console = console or Console()
        self.live = self.console.is_terminal if live is None else live
        self._progress: Progress | None = None
        self._task = TaskID(0)  # the bar's task, once a subclass has started `_progress` (add_task)

    def _print(self, text: str) -> None:
        text = printable(text)
        if self._progress is not None:
            self._progress.console.print(text, markup=False, highlight=False)
        elif self.live:
            self.console.print(text, markup=False, highlight=False)
        else:
            print(text, file=self.console.file, flush=True)

    def close(self) -> None:
        """Stop the progress bar (its last frame stays); later lines print plain."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


class HeadlessPrinter(LinePrinter):
    """An EventBus subscriber that reports a run on stdout."""

    def __init__(self, console: Console | None = None, interval_s: float = 5.0, live: bool | None = None,
                 clock: Callable[[], float] = time.monotonic):
        super().__init__(console, live)
        self.interval_s = interval_s
        self.clock = clock
        self._last_line: float | None = None  # None: the first step always gets a line
        self.total = 0
        self.last_val: float | None = None
        self.failure_shown = False  # a RunFailed line was printed
        self.bubbles: BubbleMeter | None = None  # a pipeline's measured bubble, for the summary

    def __call__(self, event) -> None:
        handler = getattr(self, f"_on_{event.kind}", None)
        if handler is not None:
            handler(event)

    def _on_run_started(self, e: ev.RunStarted) -> None:
        self.total = e.total_steps
        self.bubbles = BubbleMeter(RunInfo.from_started(e))
        self._print_event(e)
        if self.live:
            self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[status]}"), TimeRemainingColumn(),
                                      console=self.console, transient=False)
            self._task = self._progress.add_task("train", total=e.total_steps, status="")
            self._progress.start()

    def _on_step_end(self, e: ev.StepEnd) -> None:
        status = f"loss {e.loss:.4f}  {e.tokens_per_s:,.0f} tok/s"
        if self.last_val is not None:
            status += f"  val {self.last_val:.4f}"
        if self._progress is not None:
            self._progress.update(self._task, completed=e.step, status=status)
            return
        now = self.clock()
        if self._last_line is None or now - self._last_line >= self.interval_s or e.step == self.total:
            self._last_line = now
            self._print(f"step {e.step}/{self.total}  {status}  lr {e.lr:.2e}")

    def _on_pipeline_timeline(self, e: ev.PipelineTimeline) -> None:
        if self.bubbles is not None:
            self.bubbles.add(e)

    def summary_lines(self) -> list[str]:
        """What the printer measured itself, for the summary's end: a pipeline's bubble."""
        line = self.bubbles.line() if self.bubbles is not None else None
        return [f"pipeline       {line}"] if line else []

    def _on_eval(self, e: ev.Eval) -> None:
        self.last_val = e.val_loss
        self._print_event(e)

    def _print_event(self, e) -> None:
        self._print(describe(e).text)

    _on_loss_scale_change = _on_checkpoint_saved = _on_log = _on_run_paused = _on_history = _print_event

    def _on_run_failed(self, e: ev.RunFailed) -> None:
        self.close()
        print(printable(describe(e).text), file=sys.stderr)
        self.failure_shown = True

    def _on_run_finished(self, e: ev.RunFinished) -> None:
        self.close()  # no line: run_headless_job prints the summary next, with every figure


def peak_memory_text(peaks: dict) -> str:
    """Each rank's highest measured total ("r0 12.3 MB  r1 12.1 MB": the workbench's units, powers of 10, so
    the summary and the memory pane show one figure the same way); past 8 ranks the highest and the lowest,
    with their ranks."""
    by_rank = sorted((int(rank), amount) for rank, amount in peaks.items())

    def cell(rank: int, amount: int) -> str:
        return f"r{rank} {format_bytes(amount)}"
    if len(by_rank) <= 8:
        return "  ".join(cell(*item) for item in by_rank)
    high, low = max(by_rank, key=lambda x: x[1]), min(by_rank, key=lambda x: x[1])
    return f"highest {cell(*high)}, lowest {cell(*low)} ({len(by_rank)} ranks)"


def traffic_text(per_rank) -> str:
    """Bytes all ranks sent in a step, by process group, largest first ("tp0 6.3 MB, dp0 1.6 MB"); "" when
    nothing was sent (one rank) or the summary has no such figure."""
    if not isinstance(per_rank, dict):
        return ""
    by_group: dict[str, int] = {}
    for groups in per_rank.values():
        for group, amount in (groups.items() if isinstance(groups, dict) else ()):
            if isinstance(amount, int) and amount > 0:
                by_group[group] = by_group.get(group, 0) + amount
    top = sorted(by_group.items(), key=lambda item: -item[1])
    words = [f"{printable(group)} {format_bytes(amount)}" for group, amount in top[:6]]
    return ", ".join(words) + (f" and {len(top) - 6} more group(s)" if len(top) > 6 else "")


def layout_line(layout) -> str:
    """The device mesh in a few words ("dp 2 x tp 2, sequence parallel  (order tp-cp-ep-dp-pp)"; "dp 4" for
    data parallelism alone, where the order moves nothing); "" for a summary without one (an older run's, or a
    damaged one)."""
    if not isinstance(layout, dict) or not isinstance(layout.get("degrees"), dict):
        return ""
    degrees = {axis: int(d) for axis, d in layout["degrees"].items() if isinstance(d, int)}
    text = layout_text(degrees, bool(layout.get("sequence_parallel")))
    several = sum(d > 1 for axis, d in degrees.items() if axis in DENSE_AXES) > 1
    return text + (printable(f"  (order {layout['order']})") if several and layout.get("order") else "")


def summary_lines(summary: dict, measured: list[str] | tuple = ()) -> list[str]:
    """The final report of a run, one fact per line; `measured`: lines of what the reporter measured itself
    (HeadlessPrinter.summary_lines), before where the run lives."""
    first, last = summary["initial_val_loss"], summary["final_val_loss"]
    drop = 100.0 * (first - last) / first if first else 0.0
    steps = f"{summary['steps']}" + (f" of {summary['total_steps']}" if summary.get("total_steps") else "")
    if summary.get("stopped"):
        steps += "  (stopped early" + (", checkpoint kept)" if summary.get("run_dir") else ")")
    if summary.get("parent"):  # the improvement is the lineage's: first is its first run's first evaluation
        steps += f"  (resumed at step {summary['resumed_at']})"
    lines = [
        f"steps          {steps}",
        f"val loss       {first:.4f} -> {last:.4f}  ({drop:.1f}% lower"
        + (" since the lineage's start)" if summary.get("parent") else ")"),
        f"throughput     {summary['tokens_per_s']:,.0f} tokens/s",
        f"wall time      {summary['wall_s']:.1f} s",
    ]
    if summary.get("threads_per_rank"):
        lines.insert(3, f"threads/rank   {summary['threads_per_rank']}")
    if layout := layout_line(summary.get("layout")):
        lines.append(f"layout         {layout}")
    if summary.get("peak_memory"):
        lines.append(f"peak memory    {peak_memory_text(summary['peak_memory'])}")
    if traffic := traffic_text(summary.get("traffic_per_step")):
        lines.append(f"sent per step  {traffic}")
    if "overflows" in summary:
        skipped = summary.get("skipped_steps", 0)
        lines.append(f"overflows      {summary['overflows']} (loss-scale overflows; {skipped} step"
                     f"{'' if skipped == 1 else 's'} skipped)")
    if summary.get("network"):
        lines.append(f"network        {summary['network']}")
    lines += measured
    if summary.get("parent"):
        lines.append(f"resumed from   {summary['parent']}")
    if summary.get("run_dir"):
        lines.append(f"run folder     {summary['run_dir']}")
        if summary.get("stopped"):
            lines.append(f"continue with  nanodist-tui resume {summary['run_dir']}")
    return lines
