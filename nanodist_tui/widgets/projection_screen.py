"""The projection screen (`j` in the workbench): the projection pane full-screen, over the live panes, and
the rest of what `nanodist-tui project` does: `c` calibrates this machine for the run's model, `v` runs a
quick validation (held-out runs predicted, run and compared), `n` fits latency and bandwidth to an
nccl-tests output file. `escape` (or `j`) returns to the run.

The app installs it once and keeps its pane among the panes it feeds, so the pane has the run's config and
recent step times whenever the screen is opened. Calibration and validation run on worker threads (they
start rank processes: a live run on this machine slows them, and they slow it) and report back with
`ToolsNote` messages.
"""

from __future__ import annotations

from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Input, Static

from nanodist_tui.widgets.footer import WorkbenchFooter
from nanodist_tui.widgets.projection_pane import ProjectionPane


class ToolsNote(Message):
    """A line for the tools area, from a worker thread."""

    def __init__(self, text: str, style: str = "") -> None:
        super().__init__()
        self.text, self.style = text, style


class ProjectionScreen(Screen):
    BINDINGS = [
        Binding("escape,j", "app.pop_screen", "Back to the run"),
        Binding("c", "calibrate", "Calibrate this machine"),
        Binding("v", "validate", "Validate (quick)"),
        Binding("n", "nccl_tests", "Fit nccl-tests output"),
    ]

    def __init__(self, pane: ProjectionPane) -> None:
        super().__init__()
        self.pane = pane

    def compose(self) -> ComposeResult:
        yield Static("projection: the run on a cluster you do not have", id="projection-title")
        yield self.pane
        yield Input(placeholder="a file with all_reduce_perf's output, then enter", id="projection-nccl")
        yield Static("", id="projection-tools")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        self.query_one("#projection-nccl", Input).display = False

    def on_screen_resume(self) -> None:
        self.pane.redraw()

    def _say(self, text: str, style: str = "") -> None:
        self.query_one("#projection-tools", Static).update(Text(text, style=style))

    def on_tools_note(self, note: ToolsNote) -> None:
        self._say(note.text, note.style)

    def action_calibrate(self) -> None:
        self.pane.calibrate()

    def action_validate(self) -> None:
        self._say("validating: calibrating, then 4 held-out runs on the processes backend (a few "
                  "minutes) ...", "bold yellow")
        self._validate()

    @work(thread=True, exclusive=True, group="validation")
    def _validate(self) -> None:
        from engine.projection.clusters import load_cluster
        from engine.projection.validate import validate
        try:
            report = validate(self.pane._cfg(), load_cluster("this-machine"), quick=True, repeats=1,
                              on_progress=lambda text: self.post_message(ToolsNote(text, "dim")))
        except Exception as e:  # noqa: BLE001 - shown here, never crashes the app
            self.post_message(ToolsNote(f"validation failed: {e}", "bold red"))
            return
        self.post_message(ToolsNote(validation_line(report)))

    def action_nccl_tests(self) -> None:
        field = self.query_one("#projection-nccl", Input)
        field.display = True
        field.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        from pathlib import Path

        from engine.projection.fit import FitError, fit_nccl_all_reduce
        event.input.display = False
        try:
            fit = fit_nccl_all_reduce(Path(event.value).expanduser().read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, FitError) as e:
            self._say(f"nccl-tests: {e}", "bold red")
            return
        self._say(f"nccl-tests, {fit['ranks']} ranks, {fit['rows']} sizes: latency_us = "
                  f"{fit['alpha'] * 1e6:.1f}, bandwidth_gbs = {fit['busbw'] / 1e9:.1f} (for a cluster "
                  "file's link)")


def validation_line(r: dict) -> str:
    ranking = "preserved" if r["ranking_preserved"] else "not preserved"
    memory = "exact" if r["memory_exact"] else "differs"
    return (f"validation ({len(r['cases'])} held-out runs): step time MAPE {r['mape']:.1%}, max "
            f"{r['max_error']:.1%}, bias {r['bias']:+.1%}; comm share within {r['comm_share_points']:.1f} "
            f"points; model-state memory {memory}; ranking {ranking}")
