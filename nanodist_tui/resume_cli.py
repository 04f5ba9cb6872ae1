"""`nanodist-tui resume RUN_DIR`: continue a run from its newest finished checkpoint, at the same or
another world size / ZeRO stage, in a new run folder beside it."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.common import BackendOpt, SetOpt, WorldOpt, fail, shortcut_overrides
from nanodist_tui.runs_cli import RunDirArg, require_run_dir, run_errors

StepOpt = Annotated[int | None, typer.Option("--step", min=0, help="use the checkpoint of this step "
                                                                   "(default: the newest finished one)")]


def resume(run_dir: RunDirArg, sets: SetOpt = None, world_size: WorldOpt = None, backend: BackendOpt = None,
           step: StepOpt = None,
           no_ui: Annotated[bool, typer.Option("--no-ui", help="train headless")] = False) -> None:
    """Resume a run: same world size continues bitwise-identically; another one reshards the state."""
    from engine.job import run_training
    from engine.resume import prepare_resume
    require_run_dir(run_dir)
    with run_errors():
        cfg, doc, ckpt = prepare_resume(run_dir, shortcut_overrides(sets, world_size, backend), step)

    def job(emit, stop_event):
        return run_training(cfg, on_event=emit, stop_event=stop_event, preset_doc=doc, resume_from=ckpt.path)

    if no_ui:
        _headless(job, Path(ckpt.path), ckpt.step)
    else:
        from nanodist_tui.app import create_app
        create_app(cfg.name, job).run()


def _headless(job, path: Path, step: int) -> None:
    from nanodist_tui.common import USER_ERRORS
    from nanodist_tui.headless import HeadlessPrinter, summary_lines
    print(f"resuming from {path} (step {step})")
    printer, stop = HeadlessPrinter(), threading.Event()
    try:
        summary = job(printer, stop)
    except KeyboardInterrupt:
        stop.set()
        printer.close()
        fail("interrupted", code=130)
    except USER_ERRORS as e:
        printer.close()
        fail(str(e))
    except Exception:
        printer.close()
        raise typer.Exit(1) from None  # RunFailed was already printed with the rank and cause
    for line in summary_lines(summary):
        print(line)


def register(app: typer.Typer) -> None:
    app.command("resume")(resume)
