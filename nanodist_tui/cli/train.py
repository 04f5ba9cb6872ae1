"""`nanodist-tui` without a command (the workbench on a preset, or headless with --no-ui) and
`nanodist-tui run` (headless)."""

from __future__ import annotations

from typing import Annotated

import typer

from nanodist_tui.cli.options import AsciiOpt, BackendOpt, LogToOpt, PresetOpt, SetOpt, WorldOpt
from nanodist_tui.cli.running import prepare_run, run_headless_job, run_in_workbench, training_job


def train(preset: str, sets, world_size, backend, log_to, *, headless: bool,
          ascii_only: bool = False) -> None:
    cfg, doc, _ = prepare_run(preset, sets, world_size, backend, log_to)
    job = training_job(cfg, doc)
    if headless:
        run_headless_job(job)
    else:
        run_in_workbench(cfg, job, ascii_only)


def main_callback(
    ctx: typer.Context,
    no_ui: Annotated[bool, typer.Option("--no-ui", help="train headless (progress lines, then a summary)")]
    = False,
    preset: PresetOpt = "quickstart",
    sets: SetOpt = None,
    world_size: WorldOpt = None,
    backend: BackendOpt = None,
    log_to: LogToOpt = None,
    ascii_only: AsciiOpt = False,
) -> None:
    if ctx.invoked_subcommand is None:
        train(preset, sets, world_size, backend, log_to, headless=no_ui, ascii_only=ascii_only)


def run(preset: PresetOpt = "quickstart", sets: SetOpt = None, world_size: WorldOpt = None,
        backend: BackendOpt = None, log_to: LogToOpt = None) -> None:
    """Train a preset headless (the same as `nanodist-tui --no-ui`)."""
    train(preset, sets, world_size, backend, log_to, headless=True)
