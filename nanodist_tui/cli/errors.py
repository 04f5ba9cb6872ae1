"""How a command ends on a mistake the user can fix: one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import sys
from contextlib import contextmanager

import typer

from engine.comm.launch import LaunchError
from engine.config import ConfigError
from engine.data import DataError
from engine.sweep.errors import SweepError


class OutDirError(ValueError):
    """run.out_dir cannot hold run folders."""


USER_ERRORS = (ConfigError, DataError, FileNotFoundError, LaunchError, OutDirError, SweepError)


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


@contextmanager
def run_errors():
    """user_errors, plus unusable checkpoints and unreadable event logs: one line, exit code 2."""
    from engine.checkpoint_io import CheckpointError
    from engine.events import EventError
    with user_errors():
        try:
            yield
        except (CheckpointError, EventError) as e:
            fail(str(e))
