"""Tiny sweeps for the sweep tests: a preset of a 1-block GPT that trains 12 steps in about a second,
evaluated every 4 steps, with whatever [sweep] section a test gives, and ways to read a study back."""
from __future__ import annotations

import threading
from pathlib import Path

import optuna

from engine.config import presets
from engine.sweep.runner import run_sweep
from engine.sweep.study import Sweep, load_study, prepare_sweep

TINY_PRESET = """\
# tiny: a sweep test's preset
name = "tiny"  # preset name
description = "tiny sweep"  # what it is for

[model]  # the network
n_layer = 1       # blocks
n_embd = 32       # width
n_head = 2        # heads
block_size = 16   # context

[data]  # the corpus
max_chars = 20000  # enough for a few steps

[train]  # loop lengths
steps = 12         # optimizer steps
global_batch = 8   # rows per step
eval_every = 4     # pruners look at these evaluations
eval_batches = 1   # one batch per evaluation

[optim]  # AdamW
lr = 3e-3          # kept unless swept
warmup_steps = 0   # none

"""


def write_preset(folder: Path, sweep_toml: str, name: str = "tiny.toml", extra: str = "") -> Path:
    """TINY_PRESET plus `extra` settings and the given [sweep] tables, written to folder/name."""
    path = Path(folder) / name
    path.write_text(TINY_PRESET + extra + sweep_toml, encoding="utf-8")
    return path


def sweep_of(path: Path, *sets: str, storage: str | None = None, jobs: int = 1) -> Sweep:
    cfg, doc, _ = presets.load_preset(path, list(sets))
    return prepare_sweep(cfg, doc, storage, jobs)


def run(path: Path, *sets: str, finish_after: int | None = None, jobs: int = 1) -> tuple[dict, list, Sweep]:
    """Run a tiny sweep to its end (or stop it after `finish_after` finished trials); (result, events,
    sweep)."""
    sweep = sweep_of(path, *sets, jobs=jobs)
    events: list = []
    finish = threading.Event()

    def emit(event) -> None:
        events.append(event)
        finished = [e for e in events if e.kind == "trial_finished" and not e.resumed]
        if finish_after is not None and len(finished) >= finish_after:
            finish.set()
    result = run_sweep(sweep, emit, finish_event=finish, jobs=jobs)
    return result, events, sweep


def trials_of(sweep: Sweep) -> list[optuna.trial.FrozenTrial]:
    return load_study(sweep).get_trials(deepcopy=False)


def of_kind(events: list, kind: str) -> list:
    return [e for e in events if e.kind == kind]


# A three-trial random search over optim.lr, as a preset's [sweep] section (the CLI and workbench tests).
SPACE = """\
[sweep]  # the search
study = "cli"       # runs/sweep-cli
n_trials = 3        # trials
sampler = "random"  # reproducible
seed = 2            # sampler seed

[sweep.space.optim.lr]  # search over optim.lr
type = "float"
low = 1e-3
high = 3e-2
log = true

[sweep.space.optim.warmup_steps]  # search over optim.warmup_steps
type = "int"
low = 0
high = 4
"""
