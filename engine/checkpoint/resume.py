"""What a resumed run is: the recorded run's own config (plus overrides) and a verified checkpoint.

The resumed run trains in a new run folder beside the original (the original stays as it was), from
the checkpoint's step to `train.steps`; the two are linked, and the new run's curves and summary cover
the whole lineage (engine.run.lineage). Overrides may change the world size, backend, ZeRO stage or
the number of steps; anything that changes the model's parameters is refused before any rank starts.
"""
from __future__ import annotations

import time
from pathlib import Path

from engine.checkpoint.files import CheckpointError, clean_leftovers, remove_tmp_files
from engine.checkpoint.sharded import CHECKPOINTS, Checkpoint, check_layout, find_checkpoint, layout_of_model
from engine.config import presets
from engine.config.build import build_dataset, build_model
from engine.run import lock
from engine.run.recorder import INTERRUPTED_AFTER_S


def prepare_resume(run_dir: str | Path, overrides=(), step: int | None = None):
    """(Config, tomlkit document, Checkpoint) for resuming `run_dir`; ConfigError or CheckpointError
    (one line each) when the run, its config, the overrides or the checkpoint cannot be used."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"{run_dir}: no such run folder; `nanodist-tui runs` lists the runs")
    if has_ended(run_dir):  # what its killed writes left behind goes now
        clean_leftovers(run_dir / CHECKPOINTS)
        remove_tmp_files(run_dir)
    ckpt: Checkpoint = find_checkpoint(run_dir, step)
    config_path = run_dir / "config.toml"
    doc = presets.read_document(config_path)
    # the resumed run goes beside the original unless an override says otherwise
    cfg = presets.apply_overrides(doc, [f"run.out_dir={run_dir.parent}", *overrides], source=str(config_path))
    ckpt.verify()
    check_layout(ckpt, layout_of_model(build_model(cfg, build_dataset(cfg))))
    if ckpt.step > cfg.train.steps:
        raise CheckpointError(f"{ckpt.path}: saved at step {ckpt.step}, past train.steps = "
                              f"{cfg.train.steps}; "
                              f"resume with --set train.steps={ckpt.step} or more")
    return cfg, doc, ckpt


def has_ended(run_dir: Path) -> bool:
    """No process is writing into this run folder any more: nobody holds its lock (engine.run.lock), or,
    where there is no lock to ask, it wrote its summary or its event log has been silent too long for a
    live run (engine.run.recorder.INTERRUPTED_AFTER_S)."""
    held = lock.is_held(run_dir)
    if held is not None:
        return not held
    events = run_dir / "events.jsonl"
    if (run_dir / "summary.json").is_file() or not events.is_file():
        return True
    return time.time() - events.stat().st_mtime > INTERRUPTED_AFTER_S
