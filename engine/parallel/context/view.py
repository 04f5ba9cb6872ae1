"""What a context-parallel plan made, as the trainer and the replicas ask it (`context_of(model)`): the group,
the layout, the ring and this rank's tokens of whole sequences; for a model that holds whole sequences, a
stand-in that answers the same questions (degree 1, every token its own), so callers need no `if`.

Apart from plan.py so that engine.parallel.data can ask without importing the plan (and, through the
layouts' names, the config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from engine.comm.base import Communicator
    from engine.nn import Module
    from engine.parallel.context.layout import SequenceLayout
    from engine.parallel.context.ring_attention import Ring


@dataclass
class ContextParallel:
    """What the plan made, as the trainer asks it: the group, the layout, the ring (its work counted)."""
    group: Communicator
    layout: SequenceLayout
    ring: Ring

    @property
    def degree(self) -> int:
        return self.group.world_size

    @property
    def rank(self) -> int:
        return self.group.rank

    def local(self, a: np.ndarray) -> np.ndarray:
        """This rank's tokens of every row of `a` [rows, sequence, ...] (tokens or targets)."""
        return self.layout.local(np.asarray(a), self.group.rank, axis=1)


class WholeSequence:
    """A model that is not context-parallel, asked what ContextParallel is asked."""
    degree, rank, ring = 1, 0, None

    def local(self, a):
        return a


def context_of(model: Module | object) -> ContextParallel | WholeSequence:
    """The model's ContextParallel (engine.parallel.context.plan), or the stand-in for a model that holds
    whole sequences (a pipeline rank's model answers its GPT's)."""
    return getattr(model, "context_parallel", None) or WholeSequence()
