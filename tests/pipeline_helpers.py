"""A pipeline-parallel run as the workbench receives it, written out by hand: GPipe timelines with equal
action times, where every start and end follows from the schedule's shape, so the tests know each block's
place and the bubble without running an executor.

GPipe on p ranks with m micro-batches, each action `t` seconds: rank r runs the forward of micro-batch i in
slot r + i and its backward in slot (m + p - 1) + (p - 1 - r) + i; the step spans 2 (m + p - 1) slots, of
which each rank computes 2m: its bubble is (p - 1) / (m + p - 1) of the step (27.3% for p = 4, m = 8).
With `comm`, each rank's receives wait from its previous compute (or the step's start) to the action they
feed, and its sends take no time, as an emulated run's batches do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from engine.events import PipelineTimeline, RunFinished, RunStarted, StepEnd
from engine.parallel.mesh import Mesh
from engine.run.recorder import RunRecorder

SLOT_S = 0.002  # each action's time


def gpipe_actions(p: int, m: int, r: int, t: float = SLOT_S, comm: bool = True) -> list[list]:
    actions: list[list] = []
    for i in range(m):
        start = (r + i) * t
        if comm and r > 0:  # the first waits through the warm-up, the others meet their sends at once
            actions.append(["RECV_ACT", i, r, 0.0 if i == 0 else start, start])
        actions.append(["F", i, r, start, start + t])
        if comm and r < p - 1:
            actions.append(["SEND_ACT", i, r, start + t, start + t])
    for i in range(m):
        start = (m + p - 1 + (p - 1 - r) + i) * t
        if comm and r < p - 1:  # the first waits from the end of this rank's forwards
            actions.append(["RECV_GRAD", i, r, (m + r) * t if i == 0 else start, start])
        actions.append(["B", i, r, start, start + t])
        if comm and r > 0:
            actions.append(["SEND_GRAD", i, r, start + t, start + t])
    return actions


def gpipe_step(p: int, m: int, step: int = 1, rank_of: Callable[[int], int] = lambda r: r,
               comm: bool = True) -> list[PipelineTimeline]:
    return [PipelineTimeline(step=step, rank=rank_of(r), stage_rank=r, schedule="gpipe", micro_batches=m,
                             chunks=1, actions=gpipe_actions(p, m, r, comm=comm), emulated=True)
            for r in range(p)]


def simulated_step(schedule: str, p: int, m: int, chunks: int = 1) -> list[PipelineTimeline]:
    """The engine's own schedule for (p, m, v), played out by its simulator with every action 1 s and free
    messages, as the PipelineTimeline events an emulated run's ranks would send."""
    from engine.parallel.pipeline.schedules import build_schedule
    from engine.parallel.pipeline.simulate import Durations, simulate
    equal = Durations(forward=1.0, backward=1.0, backward_input=1.0, backward_weight=1.0)
    played = simulate(build_schedule(schedule, p, m, chunks), equal)
    rows = [[[s.action.op.value, s.action.micro_batch, s.action.stage, s.start, s.end] for s in spans]
            for spans in played.spans]
    return [PipelineTimeline(step=1, rank=r, stage_rank=r, schedule=schedule, micro_batches=m, chunks=chunks,
                             actions=actions, emulated=True) for r, actions in enumerate(rows)]


def pipeline_run(world: int = 4, pp: int = 4, m: int = 8, steps: int = 2) -> list:
    """A run of `world` ranks, `pp` pipeline stages (data parallelism for the rest), GPipe timelines every
    step from every rank, as a recording holds them."""
    config = {"parallel": {"backend": "threads", "world_size": world, "pipeline": pp},
              "precision": {"dtype": "fp32"}, "memory": {"checkpointing": "none"}}
    mesh = Mesh(world, pp=pp)
    events: list = [RunStarted(run_id="r1", preset="pipe", config=config, n_params=10_000, world_size=world,
                               total_steps=steps)]
    for step in range(1, steps + 1):
        for group in mesh.groups("pp"):
            events += gpipe_step(pp, m, step, rank_of=lambda r, group=group: group[r])
        events.append(StepEnd(step=step, loss=3.0, lr=1e-3, tokens=1024, step_time_s=0.05,
                              tokens_per_s=20_000.0, grad_norm=1.0))
    events.append(RunFinished(steps=steps, initial_val_loss=None, final_val_loss=None, tokens_per_s=20_000.0,
                              wall_s=0.1, run_dir=""))
    return events


def recorded_run(root: Path) -> Path:
    """`pipeline_run(world=8)` recorded as a run folder under root/runs, as a training run writes one."""
    recorder = RunRecorder(root / "runs", "pipe", {})
    for event in pipeline_run(world=8):
        recorder(event)
    recorder.close()
    return recorder.run_dir
