"""How a command ends when something goes wrong: always one line on stderr, never a traceback.

    a mistake the user can fix (a bad preset, flag, file, environment)   one line naming it; exit code 2
    a malformed command line (unknown option, bad value)                  one line and the --help to read; 2
    an internal failure (a bug)                                            one line naming the file that holds
                                                                           the full traceback; exit code 1
    Ctrl-C                                                                 one line; exit code 130

`OneLineErrors` is the command group's class, so every subcommand ends this way, whatever it raises.
"""

from __future__ import annotations

import errno
import logging
import sys
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError  # typer vendors click
from typer.core import TyperGroup

from engine import paths
from engine.checkpoint.export import ExportError
from engine.checkpoint.files import CheckpointError
from engine.comm.auto import TuningError
from engine.comm.launch import LaunchError
from engine.config import ConfigError
from engine.data import DataError
from engine.events import EventError
from engine.run import error_log
from engine.run.printable import printable
from engine.run.recorder import RunFolderError
from engine.sinks import SinkUnavailable
from engine.sweep.errors import SweepError


class OutDirError(ValueError):
    """run.out_dir cannot hold run folders."""


class UsageError(ValueError):
    """A command-line value no option type catches (a size, an output path): one line."""


USER_ERRORS = (ConfigError, DataError, FileNotFoundError, LaunchError, OutDirError, UsageError,
               CheckpointError, EventError, ExportError, RunFolderError, SweepError, SinkUnavailable,
               TuningError, paths.PathError)


def fail(message: str, code: int = 2) -> None:
    """Print one line on stderr and exit."""
    print(f"error: {one_line(message)}", file=sys.stderr)
    raise typer.Exit(code)


def one_line(text: str) -> str:
    """`text` on one line, safe to print: a message may quote a recorded value (engine.run.printable)."""
    return printable(" ".join(str(text).split()))


@contextmanager
def user_errors():
    """Turn the errors a user can fix into one line and exit code 2."""
    try:
        yield
    except USER_ERRORS as e:
        fail(str(e) or type(e).__name__)


def internal_failure(exc: BaseException) -> int:
    """One line for a bug, its full traceback in a file (the run folder's error.log when the failure
    belongs to a run, else a file of its own); the exit code, 1."""
    log = getattr(exc, "error_log", None) or error_log.write(None, "internal error", exc)
    where = f"the full traceback is in {log}" if log else "no traceback could be saved (is the disk full?)"
    print(f"error: internal error, not a mistake of yours: {one_line(f'{type(exc).__name__}: {exc}')}; "
          f"{where}", file=sys.stderr)
    return 1


class OneLineErrors(TyperGroup):
    """The command group: every outcome of every subcommand becomes an exit code and at most one line."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, windows_expand_args: bool = True,
             **extra: Any) -> int:
        show_engine_warnings()
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False,
                                windows_expand_args=windows_expand_args, **extra)
            code = code if isinstance(code, int) else 0
        except NoArgsIsHelpError as e:  # a command group given no command: its help is the answer
            e.show()
            code = e.exit_code
        except ClickException as e:  # a malformed command line
            ctx = getattr(e, "ctx", None)
            help_hint = f"; see `{ctx.command_path} --help`" if ctx is not None else ""
            print(f"error: {one_line(e.format_message()).rstrip('.')}{help_hint}", file=sys.stderr)
            code = e.exit_code
        except typer.Abort:
            print("error: interrupted", file=sys.stderr)
            code = 130
        except USER_ERRORS as e:  # one a command did not catch itself
            print(f"error: {one_line(str(e) or type(e).__name__)}", file=sys.stderr)
            code = 2
        except OSError as e:
            if e.errno != errno.ENAMETOOLONG:
                code = internal_failure(e)
            else:  # a name the user gave, too long for the file system, wherever it was first used
                print(f"error: {one_line(str(paths.too_long(e.filename or '')))}", file=sys.stderr)
                code = 2
        except Exception as e:  # noqa: BLE001 - a bug: one line here, the traceback in a file
            code = internal_failure(e)
        if standalone_mode:
            sys.exit(code)
        return code


class _OneLineWarnings(logging.Handler):
    """The engine's log records as `warning: ...` lines on the current stderr, without tracebacks."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            print(f"{record.levelname.lower()}: {one_line(record.getMessage())}", file=sys.stderr)
        except Exception:  # noqa: BLE001 - logging must never break the command
            self.handleError(record)


def show_engine_warnings() -> None:
    """Route the engine's warnings to one line each (Python's default would print tracebacks)."""
    logger = logging.getLogger("nanodist")
    if not any(isinstance(h, _OneLineWarnings) for h in logger.handlers):
        handler = _OneLineWarnings(logging.WARNING)
        logger.addHandler(handler)
