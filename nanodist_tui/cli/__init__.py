"""The `nanodist-tui` command line.

`nanodist-tui` opens the workbench on a preset; `--no-ui` (or `run`) trains headless. Each command group
has its own module here and they share only options.py, errors.py and running.py; this module puts them
together. Every outcome is one line at most (errors.OneLineErrors): user mistakes — a bad preset, an
unknown key, a missing file, a malformed command line — exit with code 2, internal failures with code 1
and their traceback in a file the line names; never a traceback on the screen.
"""

from __future__ import annotations

import typer

from nanodist_tui.cli import (
    bench,
    bench_allreduce,
    bench_alltoall,
    bench_ui,
    memory,
    mesh,
    model,
    plan,
    presets,
    project,
    resume,
    runs,
    schedule,
    screenshot,
    serve,
    sweep,
    train,
)
from nanodist_tui.cli.errors import OneLineErrors

app = typer.Typer(
    help="nanoDist: see, measure and run distributed training. Without a command: the workbench.",
    no_args_is_help=False, add_completion=True, rich_markup_mode=None, pretty_exceptions_enable=False,
    cls=OneLineErrors,
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
app.command("serve")(serve.serve)
app.command("memory")(memory.memory)
app.command("project")(project.project)
app.command("plan")(plan.plan)
app.command("mesh")(mesh.mesh)
app.command("schedule")(schedule.schedule)
app.command("screenshot")(screenshot.screenshot)
app.add_typer(sweep.app, name="sweep")
bench.app.command("allreduce")(bench_allreduce.allreduce)
bench.app.command("alltoall")(bench_alltoall.alltoall)
bench.app.command("ui")(bench_ui.ui)
bench.app.command("ui-events")(bench_ui.ui_events)
bench.app.command("ui-keys")(bench_ui.ui_keys)
bench.app.command("ui-start")(bench_ui.ui_start)
app.add_typer(bench.app, name="bench")
app.add_typer(presets.app, name="presets")


def main() -> None:
    app()
