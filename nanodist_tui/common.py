"""What every command shares: the preset options, loading a config, turning user mistakes into one line,
running a training job headless."""

from __future__ import annotations

import os
import sys
import tempfile
import threading
from contextlib import contextmanager
from typing import Annotated

import typer

from engine.comm.launch import LaunchError
from engine.config import ConfigError
from engine.data import DataError


class OutDirError(ValueError):
    """run.out_dir cannot hold run folders."""


USER_ERRORS = (ConfigError, DataError, FileNotFoundError, LaunchError, OutDirError)

PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="preset name or path to a .toml file")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a key: --set optim.lr=3e-4")]
WorldOpt = Annotated[int | None, typer.Option("--world-size", "-n", help="ranks (parallel.world_size)")]
BackendOpt = Annotated[str | None, typer.Option("--backend", "-b",
                                                 help="threads | processes | tcp | mpi (parallel.backend)")]


def fail(message: str, code: int = 2) -> None:
    """Print one line on stderr and exit."""
    print(f"error: {message}", file=sys.stderr)
    raise typer.Exit(code)


@contextmanager
def user_errors():
    """Turn the errors a user can fix into one line and exit code 2."""
    try:
        yield
    except USER_ERRORS as e:
        fail(str(e).splitlines()[0] if str(e) else type(e).__name__)


def shortcut_overrides(sets: list[str] | None, world_size: int | None, backend: str | None) -> list[str]:
    extra = list(sets or [])
    if world_size is not None:
        extra.append(f"parallel.world_size={world_size}")
    if backend is not None:
        extra.append(f'parallel.backend="{backend}"')
    return extra


def load_config(preset: str, sets=None, world_size=None, backend=None):
    """(Config, tomlkit document, path) with overrides applied and validated."""
    from engine.presets import load_preset
    return load_preset(preset, shortcut_overrides(sets, world_size, backend))


def prepare_run(preset: str, sets=None, world_size=None, backend=None):
    """load_config, plus the checks that need more than the config: the data is readable, the
    backend can start here, the run folder can be made. Mistakes exit 2 before any rank starts."""
    with user_errors():
        cfg, doc, path = load_config(preset, sets, world_size, backend)
        check_can_run(cfg)
    return cfg, doc, path


def check_can_run(cfg) -> None:
    """What a valid config can still get wrong on this machine: unreadable data, a backend that cannot
    start here, a run folder that cannot be made. Raises one of USER_ERRORS."""
    from engine.build import build_dataset
    from engine.comm.launch import check_environment
    build_dataset(cfg)
    check_environment(cfg.parallel.backend, cfg.parallel.world_size)
    check_out_dir(cfg.run.out_dir)


def run_in_workbench(cfg, job) -> None:
    """Open the workbench on a training job (new or resumed)."""
    from engine.comm.launch import process_rank
    if process_rank(cfg.parallel.backend) not in (None, 0):
        # Under mpiexec or a tcp launch every process runs this command; only rank 0's shows the
        # workbench (it receives every rank's events), the others train headless and quietly.
        run_headless_job(job)
        return
    if cfg.parallel.backend == "processes":
        # Start multiprocessing's helper process now: once Textual owns the terminal, sys.stderr has no
        # file descriptor, and spawning the tracker from inside the app fails ("bad value(s) in fds_to_keep").
        from multiprocessing import resource_tracker
        resource_tracker.ensure_running()
    from nanodist_tui.app import create_app
    create_app(cfg.name, job).run()


def check_out_dir(out_dir: str) -> None:
    """The folder that receives run folders exists (or can be made) and is writable."""
    try:
        os.makedirs(out_dir, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise OutDirError(f"run.out_dir: cannot write run folders into {out_dir} ({e.strerror}); "
                          "choose another folder with --set run.out_dir=PATH") from None


def run_headless_job(job) -> None:
    """Run `job(emit, stop_event)` (returning the run summary) with the headless printer, then print the
    summary. Ctrl-C ends it with exit code 130, a user mistake with its one line and code 2, a failed
    rank with code 1 (the printer has already shown the rank and the cause)."""
    from nanodist_tui.headless import HeadlessPrinter, summary_lines
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
    if not summary.get("lead", True):
        return  # another process (rank 0's, under mpiexec or a tcp launch) reports this run
    for line in summary_lines(summary):
        print(line)
