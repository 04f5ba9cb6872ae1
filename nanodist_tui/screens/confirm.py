"""A yes/no question before anything that cannot be taken back (stopping a run, quitting while one runs).

A question can go stale while it is open: the run it asks about ends, or ctrl+c has already stopped it.
`moot()` tells; the dialog checks it a few times a second and closes itself (answering no) rather than
stay on screen over a run that no longer needs an answer. The dialog has its own footer: the app's keys
are not the dialog's (a modal screen takes the keys), so the app's footer behind it would mislead.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Static

from nanodist_tui.widgets.footer import WorkbenchFooter

MOOT_CHECK_S = 0.2  # how often an open question checks whether it still matters


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("y", "answer(True)", "Yes", id="confirm-yes"),
                Binding("n,escape", "answer(False)", "No", id="confirm-no")]

    def __init__(self, question: str, yes: str = "Yes", *, moot: Callable[[], bool] | None = None,
                 moot_note: str = "") -> None:
        super().__init__()
        self.question, self.yes = question, yes
        self.moot, self.moot_note = moot, moot_note

    def compose(self) -> ComposeResult:
        with Vertical(id="confirm"):
            yield Static(self.question, id="confirm-question")
            with Horizontal(id="confirm-buttons"):
                yield Button(f"{self.yes} (y)", variant="warning", id="yes")
                yield Button("Cancel (n)", id="no")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        if self.moot is not None:
            self.set_interval(MOOT_CHECK_S, self.close_if_moot)

    def close_if_moot(self) -> None:
        """Close (answering no) once the question no longer matters; only while on top, where it can."""
        if self.moot is not None and self.moot() and self.is_current:
            if self.moot_note:
                self.app.notify(self.moot_note)
            self.dismiss(False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class QuitConfirmScreen(ConfirmScreen):
    """Stop and quit? `q`, pressed again, answers yes: the user asked to quit twice."""

    BINDINGS = [Binding("q", "answer(True)", "Quit", id="confirm-quit")]
