"""The `nanodist-tui` command line.

`nanodist-tui` opens the workbench on a preset; `--no-ui` (or `run`) trains headless. Each command group
has its own module here and they share only options.py, errors.py and running.py; this module puts them
together. User mistakes — a bad preset, an unknown key, a missing file — print one line and exit with
code 2, never a traceback.
"""

from __future__ import annotations

import typer

from nanodist_tui.cli import bench, bench_ui, memory, model, presets, resume, runs, screenshot, sweep, train

app = typer.Typer(
    help="nanoDist: see, measure and run data-parallel training. Without a command: the workbench.",
    no_args_is_help=False, add_completion=True, rich_markup_mode=None, pretty_exceptions_enable=False,
)

# `nanodist-tui --help` lists the commands in this order, then the groups.
app.callback(invoke_without_command=True)(train.main_callback)
app.command("run")(train.run)
app.command("runs")(runs.runs)
app.command("replay")(runs.replay)
app.command("compare")(runs.compare)
app.command("resume")(resume.resume)
app.command("export")(model.export)
app.command("sample")(model.sample)
app.command("memory")(memory.memory)
app.command("screenshot")(screenshot.screenshot)
app.add_typer(sweep.app, name="sweep")
bench.app.command("ui")(bench_ui.ui)
bench.app.command("ui-events")(bench_ui.ui_events)
app.add_typer(bench.app, name="bench")
app.add_typer(presets.app, name="presets")


def main() -> None:
    app()
