"""A rank function for tests/parallel/test_pp_dp_overlap.py: one training step of a pipeline × data-parallel
run with the data-parallel replica's bucket launches and the executor's run timed on the rank's clock."""

from __future__ import annotations

import time

from engine.config import from_dict
from engine.trainer import Trainer

WEIGHT_OPS = ("B", "W")  # the actions that write weight gradients


def timed_step_rank(comm, emit, cfg_dict: dict) -> dict:
    """Rank function: one training step. When each bucket was issued (perf_counter), when the executor's run
    began and returned, its timeline (rows in seconds from that beginning), which stages' parameters each
    bucket holds, and which buckets hold the tied weight (wte.weight)."""
    trainer = Trainer(from_dict(cfg_dict), comm)
    replica, executor = trainer.replica, trainer.pipeline.executor
    launches: list[tuple[int, float]] = []
    runs: list[tuple[float, float, list]] = []
    launch, run = replica._launch, executor.run

    def timed_launch(b: int) -> None:
        launches.append((b, time.perf_counter()))
        launch(b)

    def timed_run(start=None, **hooks):
        t0 = time.perf_counter()
        result = run(t0, **hooks)
        runs.append((t0, time.perf_counter(), result.timeline))
        return result

    replica._launch, executor.run = timed_launch, timed_run
    try:
        trainer.train_step()
    finally:
        replica.close()
    stage_of = {id(p): s for s, module in trainer.model.runner.stages.items()
                for _, p in module.named_parameters()}
    members = [[replica.params[i] for i in m] for m in _bucket_members(replica)]
    return {"launches": launches, "run": runs[0], "n_buckets": len(members),
            "stages": [sorted({stage_of[id(p)] for p in m}) for m in members],
            "tied": [b for b, m in enumerate(members) if any(p.name == "wte.weight" for p in m)]}


def _bucket_members(replica) -> list[list[int]]:
    """Indices into replica.params of each bucket's parameters (DDP: whole parameters; ZeRO-1: those that
    overlap the bucket)."""
    if hasattr(replica, "_bucket_of"):  # DDP
        out: list[list[int]] = [[] for _ in replica.buckets]
        for i, p in enumerate(replica.params):
            out[replica._bucket_of[id(p)]].append(i)
        return out
    return [list(b.members) for b in replica.buckets]


def final_weight_rows(timeline: list[list]) -> dict[int, tuple[float, float]]:
    """{stage: (start_s, end_s)} of each stage's last measured action that wrote weight gradients."""
    return {row[2]: (row[3], row[4]) for row in timeline if row[0] in WEIGHT_OPS}
