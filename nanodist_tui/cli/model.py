"""`nanodist-tui export RUN_DIR` (one consolidated fp32 model file) and `sample RUN_DIR --prompt TEXT`
(text from a trained GPT, so you can see what it learned)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from nanodist_tui.cli.errors import user_errors
from nanodist_tui.cli.options import RunDirArg, StepOpt
from nanodist_tui.cli.running import require_run_dir


def export(run_dir: RunDirArg,
           output: Annotated[str | None, typer.Option("--output", "-o", help="the .npz to write "
                                                      "(default: RUN_DIR/model.npz)")] = None,
           step: StepOpt = None) -> None:
    """Write the run's fp32 parameters and model config to one .npz (engine.export.load_model reads it)."""
    from engine.checkpoint import find_checkpoint
    from engine.export import export_model
    require_run_dir(run_dir)
    with user_errors():
        ckpt = find_checkpoint(run_dir, step)
        path = export_model(ckpt, run_dir / "model.npz" if output is None else output)
    print(f"wrote {path}: {ckpt.manifest['numel']:,} fp32 parameters from step {ckpt.step}")


def sample(source: Annotated[Path, typer.Argument(help="a run folder, a checkpoint folder or an exported "
                                                  ".npz", show_default=False)],
           prompt: Annotated[str, typer.Option("--prompt", help="text to continue")] = "",
           tokens: Annotated[int, typer.Option("--tokens", min=1, help="tokens to generate")] = 200,
           temperature: Annotated[float, typer.Option("--temperature", min=0.0,
                                                      help="sampling temperature; 0 = greedy")] = 0.8,
           seed: Annotated[int, typer.Option("--seed", help="sampling seed (same seed, same text)")] = 0,
           step: StepOpt = None) -> None:
    """Generate text from a trained GPT, decoded with its corpus's characters."""
    from engine.checkpoint import find_checkpoint
    from engine.export import model_from_checkpoint, read_model
    from engine.sample import sample_text
    if not source.is_file():
        require_run_dir(source)
    with user_errors():
        if source.is_file():
            loaded = read_model(source)
        else:
            ckpt = find_checkpoint(source, step)
            ckpt.verify()
            loaded = model_from_checkpoint(ckpt)
        text = sample_text(loaded, prompt, tokens, temperature, seed)
    print(text)
