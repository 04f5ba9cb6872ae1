"""Is a schedule runnable and complete? `check` lists every problem (empty: valid); `validate` raises.

What a valid schedule is (engine.parallel.pipeline.ir gives the actions and the batch semantics):
  * every action sits on the rank of its stage, names a micro-batch and stage that exist, and a message
    names the rank of the neighbouring stage as its peer (none between stages on one rank);
  * every (micro-batch, stage) runs exactly one F and either one B or one I and one W;
  * on its rank, the backward of a pair comes after its forward and W after I; a forward comes after its
    input arrived (RECV_ACT, or the previous stage's F on the same rank) and a backward after its output
    gradient arrived (RECV_GRAD, or the next stage's backward on the same rank); a send after what it sends
    is computed;
  * every message is posted once at each end: exactly one activation forward and one gradient backward
    per micro-batch per stage boundary between two ranks, SEND_ACT of stage s meeting RECV_ACT of s + 1
    and SEND_GRAD of s meeting RECV_GRAD of s - 1;
  * no deadlock: played out under the batch semantics (engine.parallel.pipeline.simulate), every rank
    reaches the end of its list.
Each problem is one line naming the rank, the action's index in its list and the action.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from engine.parallel.pipeline.ir import Action, Op, Schedule
from engine.parallel.pipeline.simulate import Deadlock, Durations, MessageKey, message_key, simulate

Post = tuple[int, int, Action]  # one end of a message: (rank, index in its list, action)
MAX_SHOWN = 5  # problems quoted by ScheduleError; check() returns them all


class ScheduleError(ValueError):
    """A schedule that would run wrong or hang; the message quotes its first problems."""


def validate(schedule: Schedule) -> None:
    problems = check(schedule)
    if problems:
        more = f" (and {len(problems) - MAX_SHOWN} more)" if len(problems) > MAX_SHOWN else ""
        raise ScheduleError(f"{schedule.name} schedule invalid: " + "; ".join(problems[:MAX_SHOWN]) + more)


def check(schedule: Schedule) -> list[str]:
    problems = placement_problems(schedule)
    if problems:  # the other checks read stages, ranks and peers as given
        return problems
    problems = compute_problems(schedule) + order_problems(schedule) + message_problems(schedule)
    try:
        simulate(schedule, Durations(0.0, 0.0, 0.0, 0.0))
    except Deadlock as e:
        problems += [f"deadlock: {line}" for line in e.blocked]
    return problems


def where(rank: int, index: int, action: Action) -> str:
    return f"rank {rank}, action {index} ({action})"


def expected_peer(schedule: Schedule, action: Action) -> int | None:
    """The rank a message of `action` goes to or comes from; None if it has no neighbour there."""
    s, last = action.stage, schedule.stages - 1
    other = s + 1 if action.op in (Op.SEND_ACT, Op.RECV_GRAD) else s - 1
    return schedule.rank_of(other) if 0 <= other <= last else None


def placement_problems(schedule: Schedule) -> list[str]:
    problems = []
    if len(schedule.actions) != schedule.ranks:
        problems.append(f"{len(schedule.actions)} lists of actions for {schedule.ranks} ranks")
    for r, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            at = where(r, i, a)
            if not (0 <= a.micro_batch < schedule.micro_batches and 0 <= a.stage < schedule.stages):
                problems.append(f"{at}: no micro-batch {a.micro_batch} or stage {a.stage} in this schedule")
            elif schedule.rank_of(a.stage) != r:
                problems.append(f"{at}: stage {a.stage} lives on rank {schedule.rank_of(a.stage)}")
            elif a.op.is_compute and a.peer is not None:
                problems.append(f"{at}: a compute action names a peer")
            elif not a.op.is_compute:
                peer = expected_peer(schedule, a)
                if peer is None or peer == r:
                    problems.append(f"{at}: stage {a.stage} has no neighbour on another rank to message")
                elif a.peer != peer:
                    problems.append(f"{at}: the neighbouring stage lives on rank {peer}, not {a.peer}")
    return problems


def compute_problems(schedule: Schedule) -> list[str]:
    """Exactly one F, and one B or one I and one W, for every (micro-batch, stage)."""
    problems, seen = [], Counter[tuple[Op, int, int]]()
    for r, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            if a.op.is_compute:
                seen[a.op, a.micro_batch, a.stage] += 1
                if seen[a.op, a.micro_batch, a.stage] == 2:
                    problems.append(f"{where(r, i, a)}: a second {a.op.value} of micro-batch {a.micro_batch} "
                                    f"on stage {a.stage}")
    for s in range(schedule.stages):
        for mb in range(schedule.micro_batches):
            r = schedule.rank_of(s)
            f, b, i, w = (seen[op, mb, s] for op in (Op.FORWARD, Op.BACKWARD, Op.BACKWARD_INPUT,
                                                       Op.BACKWARD_WEIGHT))
            if f == 0:
                problems.append(f"rank {r}: no F of micro-batch {mb} on stage {s}")
            if b == 0 and i == 0 and w == 0:
                problems.append(f"rank {r}: no backward (B, or I and W) of micro-batch {mb} on stage {s}")
            elif b and (i or w):
                problems.append(f"rank {r}: micro-batch {mb} on stage {s} has both B and I/W")
            elif not b and (i == 0) != (w == 0):
                missing = "I" if i == 0 else "W"
                problems.append(f"rank {r}: micro-batch {mb} on stage {s} has no {missing}, its other half")
    return problems


def order_problems(schedule: Schedule) -> list[str]:
    """On each rank: each action after what it needs (the first occurrence of each is what counts)."""
    return [problem for r in range(schedule.ranks) for problem in rank_order_problems(schedule, r)]


def rank_order_problems(schedule: Schedule, r: int) -> list[str]:
    acts, last = schedule.actions[r], schedule.stages - 1
    first: dict[tuple[Op, int, int], int] = {}
    for i, a in enumerate(acts):
        first.setdefault((a.op, a.micro_batch, a.stage), i)

    def ran(before: int, op: Op, mb: int, s: int) -> bool:
        return first.get((op, mb, s), before) < before

    def backward_ran(before: int, mb: int, s: int) -> bool:
        return ran(before, Op.BACKWARD, mb, s) or ran(before, Op.BACKWARD_INPUT, mb, s)

    problems = []
    for i, a in enumerate(acts):
        mb, s = a.micro_batch, a.stage
        needs: list[str] = []
        if a.op == Op.FORWARD and s > 0:
            if schedule.rank_of(s - 1) == r and not ran(i, Op.FORWARD, mb, s - 1):
                needs.append(f"F{mb}s{s - 1} first")
            elif schedule.rank_of(s - 1) != r and not ran(i, Op.RECV_ACT, mb, s):
                needs.append(f"its input received (RECV_ACT{mb}s{s})")
        if a.op in (Op.BACKWARD, Op.BACKWARD_INPUT):
            if not ran(i, Op.FORWARD, mb, s):
                needs.append(f"its forward F{mb}s{s} first")
            if s < last and schedule.rank_of(s + 1) == r and not backward_ran(i, mb, s + 1):
                needs.append(f"the backward of stage {s + 1} first")
            elif s < last and schedule.rank_of(s + 1) != r and not ran(i, Op.RECV_GRAD, mb, s):
                needs.append(f"its output gradient received (RECV_GRAD{mb}s{s})")
        if a.op == Op.BACKWARD_WEIGHT and not ran(i, Op.BACKWARD_INPUT, mb, s):
            needs.append(f"its input-gradient half I{mb}s{s} first")
        if a.op == Op.SEND_ACT and not ran(i, Op.FORWARD, mb, s):
            needs.append(f"F{mb}s{s} to have computed what it sends")
        if a.op == Op.SEND_GRAD and not backward_ran(i, mb, s):
            needs.append(f"the backward of micro-batch {mb} on stage {s} to have computed what it sends")
        problems += [f"{where(r, i, a)}: needs {n}" for n in needs]
    return problems


def message_problems(schedule: Schedule) -> list[str]:
    """Each message posted exactly once at each end, and every hand-off between ranks made once."""
    ends: dict[MessageKey, dict[bool, list[Post]]] = defaultdict(lambda: {True: [], False: []})
    for r, acts in enumerate(schedule.actions):
        for i, a in enumerate(acts):
            if not a.op.is_compute:
                ends[message_key(a, r)][a.op in (Op.SEND_ACT, Op.SEND_GRAD)].append((r, i, a))
    problems = []
    for key, by_end in ends.items():
        for is_send, posts in by_end.items():
            other = by_end[not is_send]
            for r, i, a in posts[1:]:
                problems.append(f"{where(r, i, a)}: the {key[0]} of micro-batch {key[1]} leaving stage "
                                f"{key[2]} is already posted here")
            if posts and not other:
                r, i, a = posts[0]
                partner = "receive" if is_send else "send"
                problems.append(f"{where(r, i, a)}: rank {a.peer} never posts the matching {partner}")
    for s in range(schedule.stages - 1):
        src, dst = schedule.rank_of(s), schedule.rank_of(s + 1)
        if src == dst:
            continue
        for mb in range(schedule.micro_batches):
            for key in (("activation", mb, s, src, dst), ("gradient", mb, s + 1, dst, src)):
                if key not in ends:
                    problems.append(f"rank {key[3]}: the {key[0]} of micro-batch {mb} leaving stage "
                                    f"{key[2]} is never sent to rank {key[4]}")
    return problems
