"""Run control: pick a preset (with its description), edit its main settings in a form checked as you type
(the same one-line messages as `--set` on the command line), see whether it fits before it starts, save it
as a new preset (comments kept), start it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import tomlkit
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Button, Input, Label, OptionList, Select, Static
from textual.widgets.option_list import Option

from engine.comm.launch import BACKENDS
from engine.config import Config, ConfigError, describe, presets
from engine.dtypes import DTYPES
from engine.parallel.data import ZERO_STAGES
from engine.parallel.mesh import AXES
from engine.paths import PathError
from nanodist_tui.screens.fit_table import FitTable
from nanodist_tui.widgets.footer import WorkbenchFooter

# The settings the form shows; a tuple of choices makes a drop-down, None a text field. The mesh's degrees
# follow the world size: a layout the world, the heads or this release cannot take is the rules' one line.
FIELDS: tuple[tuple[str, tuple | None], ...] = (
    ("train.steps", None), ("train.global_batch", None), ("train.micro_batches", None), ("optim.lr", None),
    ("parallel.world_size", None), *((f"parallel.{key}", None) for axis, key in AXES.items() if axis != "dp"),
    ("parallel.sequence_parallel", (False, True)), ("parallel.backend", BACKENDS),
    ("parallel.zero_stage", ZERO_STAGES), ("precision.dtype", DTYPES), ("memory.checkpointing", None),
    ("model.n_layer", None), ("model.n_embd", None), ("checkpoint.every", None),
)


LABEL_WIDTH = 20  # a field label's cells at 80 columns (app.tcss, .compact .field-label)


def _label(key: str) -> str:
    """A setting's label: its key, broken after the section where it is longer than a label is wide
    (parallel.sequence_parallel), rather than cut in the middle of a word."""
    return key if len(key) <= LABEL_WIDTH else key.replace(".", ".\n", 1)


def _field_id(key: str) -> str:
    return "field-" + key.replace(".", "-")


def _spelled(value: Any) -> str:
    """A value as --set takes it: true and false as TOML spells them, anything else as written."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _value_of(cfg, key: str):
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


class NewRunScreen(Screen[tuple[Config, tomlkit.TOMLDocument] | None]):
    BINDINGS = [Binding("ctrl+s", "start", "Start", id="new-run-start", priority=True),
                Binding("escape", "cancel", "Cancel", id="new-run-cancel")]

    def __init__(self, check_run: Callable[[Config], None] | None = None) -> None:
        super().__init__()
        self.check_run = check_run
        self.infos = [p for p in presets.list_presets() if p.error is None]
        self.path: Path | None = None
        self.doc: tomlkit.TOMLDocument | None = None
        self.cfg: Config | None = None
        self.loaded: dict[str, str] = {}  # the preset's own value of every field, as the form shows it

    def compose(self) -> ComposeResult:
        with Horizontal(id="new-run"):
            with Vertical(id="preset-side"):
                yield Label("presets", classes="section")
                options = [Option(Text.assemble((p.name, "bold"), "\n", (p.description, "dim")), id=p.name)
                           for p in self.infos]
                yield OptionList(*options, id="preset-list")
            with VerticalScroll(id="form-side"):
                yield Label("settings (checked as you type)", classes="section")
                for key, choices in FIELDS:
                    with Horizontal(classes="field"):
                        yield Label(_label(key), classes="field-label")
                        if choices is None:
                            yield Input(id=_field_id(key), classes="field-input")
                        else:
                            yield Select([(_spelled(c), c) for c in choices], id=_field_id(key),
                                         allow_blank=False, classes="field-input")
                        yield Static(describe(key), classes="field-doc")
                yield Static("", id="form-error")
                yield Label("will it fit? (the estimator, before anything runs)", classes="section")
                yield FitTable(id="fit")
                with Horizontal(id="form-buttons"):
                    yield Button("Start (ctrl+s)", variant="success", id="start")
                    yield Input(placeholder="new preset name", id="save-name")
                    yield Button("Save as preset", id="save")
                    yield Button("Cancel (esc)", id="cancel")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        if self.infos:
            names = [p.name for p in self.infos]
            first = names.index("quickstart") if "quickstart" in names else 0
            self.query_one(OptionList).highlighted = first
            self.load(self.infos[first].path)

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        info = next(p for p in self.infos if p.name == event.option.id)
        if info.path != self.path:
            self.load(info.path)

    def load(self, path: Path) -> None:
        """Fill the form from a preset (every setting as it resolves, defaults included)."""
        try:
            self.path, self.doc = path, presets.read_document(path)
            cfg = presets.apply_overrides(tomlkit.parse(self.doc.as_string()), (), source=str(path))
        except (ConfigError, PathError, OSError) as err:  # a preset that is not a readable file: said here
            self.doc = None
            self._show_error(str(err))
            return
        with self.prevent(Input.Changed, Select.Changed):
            for key, _ in FIELDS:
                widget = self._field(key)
                value = _value_of(cfg, key)
                widget.value = value if isinstance(widget, Select) else str(value)
                self.loaded[key] = _spelled(value)
        self.check()

    def overrides(self) -> list[str]:
        """"key=value" for every field the user changed (as --set would take them)."""
        out = []
        for key, _ in FIELDS:
            value = self._field(key).value
            if value is not Select.BLANK and _spelled(value) != self.loaded.get(key):
                out.append(f"{key}={_spelled(value)}")
        return out

    def _field(self, key: str) -> Input | Select[Any]:
        """A setting's field in the form: a drop-down for one with choices, else a text field (compose)."""
        return cast("Input | Select[Any]", self.query_one(f"#{_field_id(key)}"))

    def check(self) -> bool:
        """Validate the form as the CLI validates --set; show the first problem or the fit."""
        if self.doc is None:
            return False
        try:
            self.cfg = presets.apply_overrides(tomlkit.parse(self.doc.as_string()), self.overrides(),
                                               source=str(self.path))
        except ConfigError as err:
            self.cfg = None
            self._show_error(str(err))
            return False
        self.query_one("#form-error", Static).update(Text("ok: the settings are valid", style="green"))
        self.query_one(FitTable).show(self.cfg)
        return True

    def _show_error(self, message: str) -> None:
        self.query_one("#form-error", Static).update(Text(message, style="bold red"))

    def on_input_changed(self, event: Input.Changed) -> None:
        if event.input.id != "save-name":
            self.check()

    def on_select_changed(self, _event: Select.Changed) -> None:
        self.check()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        actions: dict[str | None, Callable[[], None]] = {"start": self.action_start, "save": self.save,
                                                         "cancel": self.action_cancel}
        actions[event.button.id]()

    def save(self) -> None:
        name = self.query_one("#save-name", Input).value.strip()
        if self.doc is None or not self.check():
            return
        try:
            target = presets.save_as(self.doc, name, self.overrides(), source=str(self.path))
        except (ConfigError, PathError, OSError) as err:  # a bad name, or a target that is not a plain file
            self._show_error(str(err))
            return
        self.notify(f"saved {target} (comments kept)", title="preset saved")

    def action_start(self) -> None:
        if not self.check() or self.doc is None:
            return
        doc = tomlkit.parse(self.doc.as_string())
        cfg = presets.apply_overrides(doc, self.overrides(), source=str(self.path))
        if self.check_run is not None:
            try:
                self.check_run(cfg)
            except (ValueError, OSError) as err:  # the CLI's user errors: one line each
                self._show_error(str(err).splitlines()[0] if str(err) else type(err).__name__)
                return
        self.dismiss((cfg, doc))

    def action_cancel(self) -> None:
        self.dismiss(None)
