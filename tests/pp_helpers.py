"""Shapes the pipeline-schedule tests sweep, and hand-made edits of a schedule's action lists."""
from __future__ import annotations

from engine.parallel.pipeline.ir import Action, Schedule

NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1")


def micro_batch_counts(p: int) -> list[int]:
    """The issue's m in {1, p - 1, p, 2p, 3p + 1}, and a few more: 2, p + 1, 4p."""
    return sorted({m for m in (1, 2, p - 1, p, p + 1, 2 * p, 3 * p + 1, 4 * p) if m >= 1})


def grid() -> list[tuple[str, int, int, int]]:
    """(schedule, p, m, v) for p in 1..8: v = 1 except interleaved, which takes v in {1, 2, 3}."""
    return [(name, p, m, v) for name in NAMES for p in range(1, 9) for m in micro_batch_counts(p)
            for v in ((1, 2, 3) if name == "interleaved" else (1,))]


def interleaved_runs(p: int, m: int, v: int) -> bool:
    """At least two chunks; any number of micro-batches."""
    return v >= 2


def edited(schedule: Schedule, rank: int, actions: list[Action]) -> Schedule:
    """`schedule` with rank `rank`'s list replaced."""
    lists = list(schedule.actions)
    lists[rank] = tuple(actions)
    return Schedule(schedule.name, schedule.ranks, schedule.micro_batches, schedule.chunks, tuple(lists))
