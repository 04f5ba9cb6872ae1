"""The options and arguments that more than one command takes, spelled once. Their flags and help texts
are part of the interface: users type them, and tests and the README quote them."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

PresetOpt = Annotated[str, typer.Option("--preset", "-p", help="preset name or path to a .toml file")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", "-s", help="override a key: --set optim.lr=3e-4")]
WorldOpt = Annotated[int | None, typer.Option("--world-size", "-n", help="ranks (parallel.world_size)")]
BackendOpt = Annotated[str | None, typer.Option("--backend", "-b",
                                                 help="threads | processes | tcp | mpi (parallel.backend)")]
LogToOpt = Annotated[str | None, typer.Option(
    "--log-to", help="also log to these, comma-separated: tensorboard,wandb,mlflow (log.to; \"\" = none)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print one JSON object instead of a table")]

SourceArg = Annotated[Path, typer.Argument(help="a run folder, a checkpoint folder or an exported .npz",
                                            show_default=False)]
RunDirArg = Annotated[Path, typer.Argument(help="a run folder (runs/<timestamp>-<preset>)",
                                           show_default=False)]
StepOpt = Annotated[int | None, typer.Option("--step", min=0, help="use the checkpoint of this step "
                                                                   "(default: the newest finished one)")]
AsciiOpt = Annotated[bool, typer.Option("--ascii", help="ASCII instead of braille and block characters (also "
                                                   "NANODIST_ASCII=1, or ascii = true under [display] in the "
                                                   "user config)")]


def node_grid(world_size: int, ranks_per_node: int) -> str:
    """" as M nodes x G" for a node grid, "" for one node: how the bench commands name the ranks' layout."""
    return f" as {world_size // ranks_per_node} nodes x {ranks_per_node}" if ranks_per_node else ""

