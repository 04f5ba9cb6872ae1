"""What older recordings wrote differently, read into today's events (engine.run.recorder.read_events).

Until the launcher made the memory estimate once per run (RunStarted.memory_estimate), every rank made its
own and copied it into each MemorySnapshot (an `estimate` field: category -> bytes of that snapshot's
phase). The bundled demo recording and run folders of that time still carry it there, so the decoder takes
it out of the memory events and puts it, once, on the run's RunStarted, where today's readers look.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from engine.events import RunStarted


class LegacyFields:
    """Collects what older events carried in fields that are gone, while a recording is decoded."""

    def __init__(self) -> None:
        self.memory_estimate: dict[str, dict] = {}  # phase -> categories, from the memory events

    def take(self, d: Any) -> Any:
        """`d` (one decoded JSON line) without its legacy fields, which are kept here."""
        if isinstance(d, dict) and d.get("kind") == "memory_snapshot" and "estimate" in d:
            d = dict(d)
            estimate, phase = d.pop("estimate"), d.get("phase")
            # every rank made the same estimate from the same config: the first one of a phase is the run's
            if isinstance(estimate, dict) and isinstance(phase, str):
                self.memory_estimate.setdefault(phase, estimate)
        return d

    def apply(self, events: list) -> list:
        """The decoded events with what was collected put where today's events carry it."""
        if not self.memory_estimate:
            return events
        return [dataclasses.replace(e, memory_estimate=dict(self.memory_estimate))
                if isinstance(e, RunStarted) and e.memory_estimate is None else e for e in events]
