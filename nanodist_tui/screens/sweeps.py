"""The stored sweeps (the palette's "Sweep results"): pick one of the sweeps in runs/, read what
`nanodist-tui sweep show` prints about it, and `e` writes its best trial as a new preset (what
`nanodist-tui sweep export-best` does), the swept preset's comments kept."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Input, OptionList, Static

from engine.config import ConfigError
from engine.run.printable import printable
from engine.sweep.errors import SweepError
from nanodist_tui.widgets.footer import WorkbenchFooter

if TYPE_CHECKING:
    from engine.sweep.study import Sweep


class SweepsScreen(Screen[None]):
    BINDINGS = [Binding("e", "export", "Export best as preset", id="sweeps-export"),
                Binding("escape", "app.pop_screen", "Back to the run", id="sweeps-back")]

    def __init__(self, out_dir: str | Path = "runs", presets_dir: str | Path = "presets") -> None:
        super().__init__()
        from engine.sweep.storage import RECORD
        self.out_dir, self.presets_dir = Path(out_dir), Path(presets_dir)
        self.sweep_dirs = sorted(p for p in self.out_dir.glob("sweep-*") if (p / RECORD).is_file())
        self.swept: Sweep | None = None  # the sweep shown

    def compose(self) -> ComposeResult:
        yield Static(f"Sweeps in {self.out_dir}/: enter shows one; e exports its best trial as a preset",
                     id="sweeps-title")
        if self.sweep_dirs:
            yield OptionList(*(Text(printable(p.name.removeprefix("sweep-"))) for p in self.sweep_dirs),
                             id="sweeps-list")
        else:
            yield Static(f"no sweeps in {self.out_dir}/ yet: `nanodist-tui sweep --preset sweep-lr` runs one",
                         id="sweeps-none")
        with VerticalScroll(id="sweeps-body"):
            yield Static("", id="sweeps-results")
        yield Input(placeholder=f"name of the new preset ({self.presets_dir}/NAME.toml), then enter",
                    id="sweeps-name")
        yield Static("", id="sweeps-message")
        yield WorkbenchFooter()

    def on_mount(self) -> None:
        self.query_one("#sweeps-name", Input).display = False

    def _say(self, text: str, style: str = "") -> None:
        self.query_one("#sweeps-message", Static).update(Text(printable(text), style=style))

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.show(self.sweep_dirs[event.option_index])

    def show(self, sweep_dir: Path) -> None:
        from engine.sweep.study import load_sweep
        from nanodist_tui.sweep_printer import sweep_results
        try:
            swept = load_sweep(sweep_dir)
            lines = sweep_results(swept)
        except (ConfigError, SweepError, OSError, ValueError) as e:
            self._say(f"{sweep_dir}: {e}", "bold red")
            return
        self.swept = swept
        self.query_one("#sweeps-results", Static).update(Text("\n".join(map(printable, lines))))
        self._say(f"sweep {swept.study_name}: e writes its best trial as a preset")

    def action_export(self) -> None:
        if self.swept is None:
            self._say("pick a sweep first (arrows, then enter)", "yellow")
            return
        name = self.query_one("#sweeps-name", Input)
        name.display = True
        name.focus()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        if self.swept is not None and (target := self.export(self.swept, event.value.strip())) is not None:
            event.input.display = False
            event.input.value = ""
            self._say(target, "green")

    def export(self, swept: Sweep, name: str) -> str | None:
        """Write the shown sweep's (`swept`) best trial as presets/NAME.toml; the line saying what happened
        (shown) or None when it could not (the reason is shown, one line)."""
        from engine.config.presets import check_preset_name
        from engine.sweep import results
        from engine.sweep.study import load_study
        from nanodist_tui.describe import params_text, scores_text
        target = self.presets_dir / f"{name}.toml"
        try:
            check_preset_name(name, source="the preset name")
            if target.exists():
                raise ConfigError("name", f"{target} exists", "choose another name", source="the preset name")
            self.presets_dir.mkdir(parents=True, exist_ok=True)
            chosen = results.export_best(swept, load_study(swept), target)
        except (ConfigError, SweepError, OSError) as e:
            self._say(str(e), "bold red")
            return None
        scores = scores_text(swept.metrics, chosen.values)
        return (f"wrote {target}: trial {chosen.number} of sweep {swept.study_name} "
                f"({scores}; {params_text(chosen.params)}), comments kept")
