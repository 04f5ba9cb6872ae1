"""A step's ring-attention work as an event: the blocks and scores this rank's ring computed in the step's
training forwards (Ring.work, counted as it runs), as one ContextWork per rank (engine.events). The trainer
reports it with the rank's other figures; the workbench's context pane puts the ranks side by side, the
busiest against the mean (contiguous: 2c/(c+1) under causal attention; zigzag: 1)."""

from __future__ import annotations

from engine import events as ev
from engine.nn import Module
from engine.parallel.context.view import context_of


def context_work(model: Module, step: int, rank: int) -> list[ev.ContextWork]:
    """This rank's ContextWork of the step (none for a model that holds whole sequences, or before any
    training forward); takes the ring's counts, so the next step starts from none."""
    cp = context_of(model)
    if cp.ring is None or not cp.ring.work:
        return []
    work = dict(cp.ring.work)
    cp.ring.work.clear()
    return [ev.ContextWork(step=step, rank=rank, layout=cp.layout.kind, degree=cp.degree,
                           blocks=work["blocks"], scores=work["scores"])]
