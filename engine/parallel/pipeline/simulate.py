"""Play a pipeline schedule out in time: when every action of every rank starts and ends.

The semantics are the executor's (engine.parallel.pipeline.ir): a rank runs its list in order; a compute
action waits for nothing but its predecessor in the list; a maximal run of communication actions is one
batch, posted at once, and it completes when each of its messages has met its partner on the peer. A
message is delivered `p2p` seconds after the later of its two ends is posted. Nothing else waits, so the
times are those of the dependency graph and do not depend on the order the ranks are visited in.

The projection (step time and bubble), the workbench (the drawn timeline) and the checker (which plays a
schedule out with zero durations to find deadlocks) all read this one simulation.
"""

from __future__ import annotations

import numbers
from collections import defaultdict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

from engine.parallel.pipeline.ir import Action, Op, Schedule

PerStage = float | Sequence[float]  # one time for every stage, or one per virtual stage


@dataclass(frozen=True)
class Durations:
    """Seconds per compute action, each the same on every stage or given per virtual stage, and seconds per
    message. The defaults are the usual unit picture: a backward costs two forwards, split evenly into its
    input-gradient (I) and weight-gradient (W) halves."""

    forward: PerStage = 1.0
    backward: PerStage = 2.0
    backward_input: PerStage = 1.0
    backward_weight: PerStage = 1.0
    p2p: float = 0.0

    def of(self, action: Action) -> float:
        per_op = {Op.FORWARD: self.forward, Op.BACKWARD: self.backward,
                  Op.BACKWARD_INPUT: self.backward_input, Op.BACKWARD_WEIGHT: self.backward_weight}
        value = per_op[action.op]
        if isinstance(value, numbers.Real):  # numpy's scalars too
            return float(value)
        return float(cast(Sequence[float], value)[action.stage])  # a tuple, list or array per stage

    def per_stage(self, op: Op, stages: int) -> tuple[float, ...]:
        """The seconds of compute `op` on each of `stages` virtual stages, given once or per stage."""
        return tuple(self.of(Action(op, 0, s)) for s in range(stages))


@dataclass(frozen=True)
class Span:
    action: Action
    start: float  # a communication action: when its batch was posted
    end: float  # a communication action: when its own message was delivered


@dataclass(frozen=True)
class Timeline:
    schedule: Schedule
    durations: Durations
    spans: tuple[tuple[Span, ...], ...]  # spans[r]: rank r's actions in list order
    makespan: float  # the step: from the first action's start to the last action's end

    def busy(self, rank: int) -> float:
        """Seconds rank `rank` spends computing (its compute actions run one at a time)."""
        return sum(s.end - s.start for s in self.spans[rank] if s.action.op.is_compute)

    @property
    def bubble(self) -> float:
        """Idle compute time over ranks x makespan: the share of the step the ranks spend not computing."""
        if self.makespan <= 0:
            return 0.0
        idle = sum(self.makespan - self.busy(r) for r in range(self.schedule.ranks))
        return idle / (self.schedule.ranks * self.makespan)


class Deadlock(RuntimeError):
    """Some ranks wait forever; `blocked` says, rank by rank, where and on what (one line each)."""

    def __init__(self, blocked: list[str]):
        super().__init__("; ".join(blocked))
        self.blocked = blocked


# A message's identity, the same at both ends: (kind, micro-batch, stage it leaves, from rank, to rank).
MessageKey = tuple[str, int, int, int, int]


def message_key(action: Action, rank: int) -> MessageKey:
    """What `action` on `rank` sends or receives. SEND_ACT of stage s meets RECV_ACT of stage s + 1 (the
    output of s is the input of s + 1); SEND_GRAD of stage s meets RECV_GRAD of stage s - 1."""
    op, mb, s, peer = action.op, action.micro_batch, action.stage, action.peer
    if peer is None or op.is_compute:
        raise ValueError(f"{action} is not a communication action with a peer")
    if op == Op.SEND_ACT:
        return ("activation", mb, s, rank, peer)
    if op == Op.RECV_ACT:
        return ("activation", mb, s - 1, peer, rank)
    if op == Op.SEND_GRAD:
        return ("gradient", mb, s, rank, peer)
    return ("gradient", mb, s + 1, peer, rank)


def is_send(action: Action) -> bool:
    return action.op in (Op.SEND_ACT, Op.SEND_GRAD)


def steps_of(actions: Sequence[Action]) -> list[list[int]]:
    """A rank's list cut into steps: each compute action alone, each maximal run of communication together."""
    steps: list[list[int]] = []
    for i, a in enumerate(actions):
        if not a.op.is_compute and steps and not actions[steps[-1][-1]].op.is_compute:
            steps[-1].append(i)
        else:
            steps.append([i])
    return steps


def simulate(schedule: Schedule, durations: Durations | None = None, eager_sends: bool = False) -> Timeline:
    """Every action's start and end on every rank. Raises Deadlock when ranks block for good.

    `eager_sends`: a send is done once posted (its bytes buffered, as the threads backend and small TCP
    messages do) instead of when its receive is posted too, and its message arrives `p2p` seconds later;
    receives still wait for their send. The IR's semantics, which the checker holds every schedule to, is
    the default (a send waits)."""
    durations = durations or Durations()
    p = schedule.ranks
    steps = [steps_of(acts) for acts in schedule.actions]
    at = [0] * p  # the step each rank is on
    clock = [0.0] * p  # when each rank is free to go on
    posted_at: list[float | None] = [None] * p  # when the batch a rank waits in was posted
    pending = [0] * p  # messages of that batch not yet delivered
    times: list[dict[int, tuple[float, float]]] = [{} for _ in range(p)]
    # messages posted at one end only: (is a send, rank, index, when posted)
    waiting: dict[MessageKey, deque[tuple[bool, int, int, float]]] = defaultdict(deque)
    ready = deque(range(p))

    def deliver(rank: int, index: int, when: float) -> None:
        start = posted_at[rank]
        assert start is not None
        times[rank][index] = (start, when)
        pending[rank] -= 1
        if pending[rank] == 0:
            ready.append(rank)

    while ready:
        r = ready.popleft()
        while at[r] < len(steps[r]):
            step = steps[r][at[r]]
            first = schedule.actions[r][step[0]]
            if first.op.is_compute:
                start = clock[r]
                clock[r] = start + durations.of(first)
                times[r][step[0]] = (start, clock[r])
                at[r] += 1
                continue
            if posted_at[r] is None:  # post the batch: each message meets its partner if it is waiting
                posted_at[r], pending[r] = clock[r], len(step)
                for i in step:
                    a = schedule.actions[r][i]
                    key, send = message_key(a, r), is_send(a)
                    queue = waiting[key]
                    if queue and queue[0][0] != send:
                        _, q, j, q_posted = queue.popleft()
                        sent, wanted = (clock[r], q_posted) if send else (q_posted, clock[r])
                        when = (max(wanted, sent + durations.p2p) if eager_sends  # already on its way
                                else max(sent, wanted) + durations.p2p)
                        if not (eager_sends and send):
                            deliver(r, i, when)
                        if not (eager_sends and not send):
                            deliver(q, j, when)
                    else:
                        queue.append((send, r, i, clock[r]))
                    if eager_sends and send:
                        deliver(r, i, clock[r])
            if pending[r] > 0:
                break  # woken again when its last message is delivered
            clock[r] = max([clock[r], *(times[r][i][1] for i in step)])
            posted_at[r] = None
            at[r] += 1

    blocked = [r for r in range(p) if at[r] < len(steps[r])]
    if blocked:
        raise Deadlock([blocked_line(schedule, steps, at, times, r) for r in blocked])
    spans = tuple(tuple(Span(a, *times[r][i]) for i, a in enumerate(schedule.actions[r])) for r in range(p))
    return Timeline(schedule, durations, spans, max(clock, default=0.0))


def blocked_line(schedule: Schedule, steps: list[list[list[int]]], at: list[int],
                 times: list[dict[int, tuple[float, float]]], rank: int) -> str:
    """Where `rank` blocks: the actions of its posted batch whose partner never comes."""
    acts = schedule.actions[rank]
    open_ = [i for i in steps[rank][at[rank]] if i not in times[rank]]
    waits = ", ".join(f"action {i} ({acts[i]}) waits for rank {acts[i].peer}" for i in open_)
    return f"rank {rank} blocks: {waits}"
