"""The `nanodist-tui` command line.

`nanodist-tui` opens the workbench on a preset; `--no-ui` (or `run`) trains headless. Subcommands
are grouped by concern in their own modules (bench, ...). User mistakes — a bad preset, an
unknown key, a missing file — print one line and exit with code 2, never a traceback.
"""

from __future__ import annotations

from typing import Annotated

import typer

from nanodist_tui.common import (
    BackendOpt,
    PresetOpt,
    SetOpt,
    WorldOpt,
    prepare_run,
    run_headless_job,
    run_in_workbench,
)

app = typer.Typer(
    help="nanoDist: see, measure and run data-parallel training. Without a command: the workbench.",
    no_args_is_help=False, add_completion=True, rich_markup_mode=None, pretty_exceptions_enable=False,
)


def _training_job(cfg, doc):
    """The job both modes drive: train `cfg` on the calling thread, events to `emit`; returns the summary."""
    from engine.job import run_training

    def job(emit, stop_event):
        return run_training(cfg, on_event=emit, stop_event=stop_event, preset_doc=doc)
    return job


def run_headless(preset: str, sets, world_size, backend) -> None:
    cfg, doc, _ = prepare_run(preset, sets, world_size, backend)
    run_headless_job(_training_job(cfg, doc))


def run_workbench(preset: str, sets, world_size, backend) -> None:
    cfg, doc, _ = prepare_run(preset, sets, world_size, backend)
    run_in_workbench(cfg, _training_job(cfg, doc))


@app.callback(invoke_without_command=True)
def main_callback(
    ctx: typer.Context,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="train headless (progress lines, then a summary)")]
    = False,
    preset: PresetOpt = "quickstart",
    sets: SetOpt = None,
    world_size: WorldOpt = None,
    backend: BackendOpt = None,
) -> None:
    if ctx.invoked_subcommand is not None:
        return
    if no_ui:
        run_headless(preset, sets, world_size, backend)
    else:
        run_workbench(preset, sets, world_size, backend)


@app.command()
def run(preset: PresetOpt = "quickstart", sets: SetOpt = None, world_size: WorldOpt = None,
        backend: BackendOpt = None) -> None:
    """Train a preset headless (the same as `nanodist-tui --no-ui`)."""
    run_headless(preset, sets, world_size, backend)


def _register_subcommands() -> None:
    from nanodist_tui import bench_cli, model_cli, presets_cli, resume_cli, runs_cli
    app.add_typer(bench_cli.app, name="bench")
    app.add_typer(presets_cli.app, name="presets")
    for module in (runs_cli, resume_cli, model_cli):
        module.register(app)
    from nanodist_tui import memory_cli
    memory_cli.register(app)


_register_subcommands()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
