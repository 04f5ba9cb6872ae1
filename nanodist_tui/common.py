"""What every command shares: the preset options, loading a config, turning user mistakes into one line."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Annotated

import typer

from engine.config import ConfigError
from engine.data import DataError

USER_ERRORS = (ConfigError, DataError, FileNotFoundError)

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


