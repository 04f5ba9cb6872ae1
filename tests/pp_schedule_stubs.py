"""Hand-written GPipe and 1F1B action lists (one chunk per rank) for the executor's tests, written out
from the published shape of each schedule: GPipe all forwards then all backwards; 1F1B min(p − r − 1, m)
warm-up forwards on rank r, then one forward one backward, then the remaining backwards. Each compute
action is wrapped in its communication: receive the input before a forward, send the output after it,
receive the output gradient before a backward, send the input gradient after it."""

from __future__ import annotations

from engine.parallel.pipeline.ir import Action, Op, Schedule


def _order(name: str, p: int, m: int, r: int) -> list[tuple[str, int]]:
    if name == "gpipe":
        return [("F", j) for j in range(m)] + [("B", j) for j in range(m)]
    warm = min(p - r - 1, m)
    out = [("F", j) for j in range(warm)]
    for i in range(m - warm):
        out += [("F", warm + i), ("B", i)]
    return out + [("B", j) for j in range(m - warm, m)]


def stub_schedule(name: str, p: int, m: int) -> Schedule:
    actions = []
    for r in range(p):
        mine: list[Action] = []
        for kind, j in _order(name, p, m, r):
            if kind == "F":
                mine += [Action(Op.RECV_ACT, j, r, r - 1)] if r > 0 else []
                mine.append(Action(Op.FORWARD, j, r))
                mine += [Action(Op.SEND_ACT, j, r, r + 1)] if r < p - 1 else []
            else:
                mine += [Action(Op.RECV_GRAD, j, r, r + 1)] if r < p - 1 else []
                mine.append(Action(Op.BACKWARD, j, r))
                mine += [Action(Op.SEND_GRAD, j, r, r - 1)] if r > 0 else []
        actions.append(tuple(mine))
    return Schedule(name, p, m, 1, tuple(actions))
