"""`nanodist-tui export RUN_DIR` (one consolidated fp32 model file) and `sample RUN_DIR --prompt TEXT`
(text from a trained GPT, so you can see what it learned)."""

from __future__ import annotations

from typing import Annotated

import typer

from engine.checkpoint.sample import SEED, TEMPERATURE, TOKENS, TOP_K
from engine.run.printable import printable
from nanodist_tui.cli.errors import user_errors
from nanodist_tui.cli.options import RunDirArg, SourceArg, StepOpt
from nanodist_tui.cli.running import load_source, require_run_dir


def export(run_dir: RunDirArg,
           output: Annotated[str | None, typer.Option("--output", "-o", help="the .npz to write "
                                                      "(default: RUN_DIR/model.npz)")] = None,
           step: StepOpt = None) -> None:
    """Write the run's fp32 parameters and model config to one .npz (engine.checkpoint.export.load_model
    reads it)."""
    from engine.checkpoint.export import export_model
    from engine.checkpoint.sharded import find_checkpoint
    require_run_dir(run_dir)
    with user_errors():
        ckpt = find_checkpoint(run_dir, step)
        path = export_model(ckpt, run_dir / "model.npz" if output is None else output)
    print(f"wrote {path}: {ckpt.manifest['numel']:,} fp32 parameters from step {ckpt.step}")


def sample(source: SourceArg,
           prompt: Annotated[str, typer.Option("--prompt", help="text to continue")] = "",
           tokens: Annotated[int, typer.Option("--tokens", min=1, help="tokens to generate")] = TOKENS,
           temperature: Annotated[float, typer.Option("--temperature", min=0.0,
                                                      help="sampling temperature; 0 = greedy")] = TEMPERATURE,
           top_k: Annotated[int, typer.Option("--top-k", min=0, help="sample among the k most likely tokens "
                                              "only; 0 = all")] = TOP_K,
           seed: Annotated[int, typer.Option("--seed", min=0, help="sampling seed (same seed, same text)")]
           = SEED,
           step: StepOpt = None) -> None:
    """Generate text from a trained GPT, decoded with its corpus's characters."""
    from engine.checkpoint.sample import sample as sample_from
    if not source.is_file():
        require_run_dir(source)
    with user_errors():
        loaded = load_source(source, step)
        text = sample_from(loaded, prompt, tokens, temperature, seed, top_k).text
    print(printable(text, newlines=True))  # its characters are the checkpoint's vocabulary: anyone's text
