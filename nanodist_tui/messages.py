"""The one message the engine side sends the UI: a `Tick`, posted at most ~10 times a second.

Textual only merges adjacent messages of one type, so the app receives a single message type;
every engine event reaches the UI inside a tick (see `bridge.EventBatcher`).
"""

from __future__ import annotations

import time
from typing import Any

from textual.message import Message


class Tick(Message, bubble=False):
    """What the engine reported since the previous tick.

    Fields:
        seq: 0, 1, 2, ... in posting order.
        steps: every `StepEnd` since the previous tick, oldest first (at most the batcher's
            `max_steps_per_tick`; older ones beyond that are counted in `dropped_steps`).
        dropped_steps: `StepEnd`s the batcher discarded because one tick would have carried too many.
        rank_stats / traffic: the LATEST `RankStats` / `Traffic` per rank, and memory the latest
            `MemorySnapshot` per (rank, phase), cumulative over the run (a key keeps its last value
            until it is reported again); pipeline, the same of `PipelineTimeline` per rank.
        events: the discrete events (everything that is not a continuous one) since the previous
            tick, in emission order; none is ever dropped.
        session: which of the app's runs posted it (set by the poster; 0 when unset).
        posted_at: time.monotonic() when the batcher made it.

    `can_replace`: Textual's queue asks a queued message whether the message behind it may
    supersede it. An older tick may be superseded only when it carries nothing but snapshots,
    because the newer tick's snapshots are newer values of the same things; a tick carrying steps
    or events is never superseded, so nothing but stale snapshots is lost.
    """

    def __init__(
        self,
        seq: int,
        steps: tuple[Any, ...],
        dropped_steps: int,
        rank_stats: dict[int, Any],
        memory: dict[tuple[int, str], Any],
        traffic: dict[int, Any],
        events: tuple[Any, ...],
        pipeline: dict[int, Any] | None = None,
    ) -> None:
        super().__init__()
        self.seq = seq
        self.steps = steps
        self.dropped_steps = dropped_steps
        self.rank_stats = rank_stats
        self.memory = memory
        self.traffic = traffic
        self.events = events
        self.pipeline = pipeline if pipeline is not None else {}
        self.session = 0
        self.posted_at = time.monotonic()

    def can_replace(self, message: Message) -> bool:
        return isinstance(message, Tick) and not (self.steps or self.events or self.dropped_steps)
