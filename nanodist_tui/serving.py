"""Serving a run's model from the workbench (the palette's "Serve a run's model"): what
`nanodist-tui serve RUN_DIR --port 0` does, on loopback, until the user stops it or the workbench closes."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nanodist_tui.serve.server import ModelServer


class ServeError(ValueError):
    """Why a run's model cannot be served (one line)."""


def start_server(run_dir: Path) -> ModelServer:
    """The GPT of `run_dir`'s newest checkpoint (checked before use) behind a started ModelServer on
    127.0.0.1, on any free port. ServeError for what the user can fix; the checkpoint's own errors raise."""
    from engine import nn
    from engine.checkpoint.export import model_from_checkpoint
    from engine.checkpoint.sharded import find_checkpoint
    from nanodist_tui.serve import missing_library
    if problem := missing_library():
        raise ServeError(problem)
    ckpt = find_checkpoint(run_dir)
    ckpt.verify()
    loaded = model_from_checkpoint(ckpt)
    if not isinstance(loaded.model, nn.GPT):
        raise ServeError(f"{run_dir}: this run trained an MLP classifier; serve needs a GPT run")
    from nanodist_tui.serve.api import Limits, create_api
    from nanodist_tui.serve.server import ModelServer
    server = ModelServer(create_api(loaded, str(run_dir), Limits()), "127.0.0.1", 0)
    server.start()
    return server
