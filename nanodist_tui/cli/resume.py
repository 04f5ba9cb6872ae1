"""`nanodist-tui resume RUN_DIR`: continue a run from its newest finished checkpoint, at the same or
another world size / ZeRO stage, in a new run folder beside it, linked to it (engine.run.lineage: its
curves and summary cover the whole lineage; `runs` shows parent -> child)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import user_errors
from nanodist_tui.cli.options import AsciiOpt, BackendOpt, LogToOpt, RunDirArg, SetOpt, StepOpt, WorldOpt
from nanodist_tui.cli.running import (
    check_can_run,
    require_run_dir,
    run_headless_job,
    run_in_workbench,
    shortcut_overrides,
    training_job,
)


def resume(run_dir: RunDirArg, sets: SetOpt = None, world_size: WorldOpt = None, backend: BackendOpt = None,
           step: StepOpt = None, log_to: LogToOpt = None,
           no_ui: Annotated[bool, typer.Option("--no-ui", help="train headless")] = False,
           ascii_only: AsciiOpt = False) -> None:
    """Resume a run: same world size continues bitwise-identically; another one reshards the state."""
    from engine.checkpoint.resume import prepare_resume
    require_run_dir(run_dir)
    with user_errors():
        cfg, doc, ckpt = prepare_resume(run_dir, shortcut_overrides(sets, world_size, backend, log_to), step)
        check_can_run(cfg)
    job = training_job(cfg, doc, resume_from=ckpt.path)
    if no_ui:
        print(f"resuming from {Path(ckpt.path)} (step {ckpt.step})")
        run_headless_job(job)
    else:
        run_in_workbench(cfg, job, ascii_only)
