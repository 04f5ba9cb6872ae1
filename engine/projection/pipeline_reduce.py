"""A pipeline rank's data-parallel gradient reduce, overlapped with what remains of its schedule, as the
engine runs it (engine.parallel.pipeline.final_reduce): the buckets of a model chunk's parameters leave for
the communication thread once that chunk's last weight-gradient action is done, and reduce while the rank
goes on through the rest of its action list (the other chunks' backwards, the last gradient sends).

In the simulated schedule (pipeline.py), on rank r, with a bucket's time R_i (all-reduce, or ZeRO-1's
reduce-scatter, on the data-parallel group):

    ready_i   the end of the last weight-gradient action (B; W under zero-bubble schedules) of every chunk
              whose parameters bucket i holds (final_reduce.final_weight_actions, the list the engine arms)
    held      a tied weight's first-stage side (wte) takes the last stage's gradient after the schedule, so
              its bucket and every bucket after it wait for that sum: ready at H_r, the rank's end after it
    done      buckets go out in order and the communication thread runs them one after another:
                  D_0 = ready_0 + R_0,   D_i = max(D_{i−1}, ready_i) + R_i
    exposed   max(0, D_last − H_r): only what outlasts the rest of the rank's schedule is waited for

Where the engine does not overlap, every bucket is held to H_r and the whole reduce is exposed (D = H_r + ΣR):
compute emulation (nothing writes a gradient: every bucket waits for reduce_accumulated), `parallel.overlap`
off (the replicas issue after backward), and a replica with no second thread (tensor, context or expert
parallelism beside it: the reduce runs on the rank's thread, inside the armed action, and lengthens it).

Simplifications: a chunk's buckets are taken ready at the end of its final action, though a bucket of its
later layers leaves during that action (as the last micro-batch's backward does without a pipeline): the
reduce is predicted to end at most one action late. The CPU the communication thread takes from the rank's
compute on a shared host is not counted.
"""

from __future__ import annotations

from engine.parallel.pipeline.final_reduce import final_weight_actions
from engine.parallel.pipeline.ir import Schedule
from engine.parallel.pipeline.simulate import Timeline


def final_ends(schedule: Schedule, timeline: Timeline, rank: int) -> dict[int, float]:
    """{stage: when its last weight-gradient action ends} for `rank`'s stages in the simulated timeline."""
    return {stage: timeline.spans[rank][i].end for i, stage in final_weight_actions(schedule, rank).items()}


def bucket_ready(members: list[tuple[int, ...]], stage_of: list[int], ends: dict[int, float],
                 held: set[int], held_at: float, offset: float) -> list[float]:
    """When each bucket (its parameters' indices, in the order the replica issues them) may leave: the last
    of its chunks' final actions (`ends`, shifted by `offset`: what precedes the schedule), or `held_at` from
    the first bucket holding a parameter in `held` on."""
    ready, waiting = [], False
    for bucket in members:
        waiting = waiting or any(i in held for i in bucket)
        ready.append(held_at if waiting else offset + max(ends[stage_of[i]] for i in bucket))
    return ready


def reduce_done(ready: list[float], seconds: list[float]) -> float:
    """When the communication thread is done: buckets in order, one after another, each once it is ready."""
    done = float("-inf")
    for at, spent in zip(ready, seconds):
        done = max(done, at) + spent
    return done if ready else float("-inf")
