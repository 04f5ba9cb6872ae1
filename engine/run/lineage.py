"""A resumed run's lineage: the runs it continues, read from their folders.

`nanodist-tui resume` trains in a new run folder beside the original, which stays as it was (a resume from
an earlier checkpoint, or two resumes of one run, must not rewrite what was recorded). The new run is
linked, not copied: the launcher sends one History event after RunStarted (the parent's steps and
evaluations up to the checkpoint, and the parent's own History before them), and the recorder keeps it with
the run. So the curves of a resumed run start at the lineage's first step, `runs` names each run's parent,
and the summary's improvement is measured from the lineage's first evaluation.
"""
from __future__ import annotations

from pathlib import Path

from engine.checkpoint.sharded import CHECKPOINTS
from engine.events import Eval, EventError, History, StepEnd
from engine.run.recorder import read_events


def parent_of(checkpoint: str | Path) -> Path | None:
    """The run folder a checkpoint folder (run/checkpoints/step-N) belongs to; None for one elsewhere
    (a checkpoint copied out of its run has no lineage to draw)."""
    path = Path(checkpoint)
    return path.parent.parent if path.parent.name == CHECKPOINTS else None


def history(parent: Path, step: int) -> History:
    """The lineage of a run resumed from `parent`'s checkpoint of `step`: the parent's own History (its
    ancestors), then its steps and evaluations after that, up to `step`. A parent whose events cannot be
    read gives an empty history: the resume itself only needs the checkpoint."""
    steps: list[list] = []
    evals: list[list] = []
    try:
        events = read_events(parent)
    except (EventError, OSError):
        events = []
    linked_at = -1  # the parent's own resume step: its ancestors' points go up to it, its own after it
    for event in events:
        if isinstance(event, History):
            steps += [p for p in event.steps if p[0] <= step]
            evals += [p for p in event.evals if p[0] <= step]
            linked_at = event.step
        elif isinstance(event, StepEnd) and linked_at < event.step <= step and not event.skipped:
            steps.append([event.step, event.loss, event.lr, event.grad_norm])
        elif isinstance(event, Eval) and linked_at < event.step <= step:
            evals.append([event.step, event.val_loss])
    return History(parent=str(parent), step=step, steps=steps, evals=evals)
