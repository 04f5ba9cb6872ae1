"""The pipeline's data-parallel reduce overlapped with the rest of the schedule (pipeline_reduce.py), against
figures worked out here by hand: when each chunk's last weight-gradient action ends in a schedule played out
with F = 1, B = 2 (I = W = 1) and free messages, when buckets issued in order are done on one communication
thread, and what a projected step waits for of an interleaved rank's reduce."""

from __future__ import annotations

import pytest
from projection_helpers import SMALL
from projection_helpers import fixture_cluster as cluster

from engine.config import from_dict
from engine.parallel.pipeline.ir import Op
from engine.parallel.pipeline.schedules import build_schedule
from engine.parallel.pipeline.simulate import Durations, simulate
from engine.projection.flops import FlopsOf
from engine.projection.machine import make_machine
from engine.projection.pipeline_reduce import bucket_ready, final_ends, reduce_done
from engine.projection.pipeline_step import pipeline_of
from engine.projection.project import predict

VOCAB = 65


def played(name: str, chunks: int) -> tuple:
    """p = 2, m = 2: the schedule and its timeline with F = 1, B = 2, I = W = 1, free messages."""
    schedule = build_schedule(name, 2, 2, chunks)
    stages = schedule.stages
    return schedule, simulate(schedule, Durations([1.0] * stages, [2.0] * stages, [1.0] * stages,
                                                  [1.0] * stages, 0.0))


@pytest.mark.parametrize("name, chunks, rank0, rank1", [
    # GPipe: rank 0 F F 0-2; rank 1 F F 1-3, B B 3-7; rank 0 B 5-7 (after rank 1's first B), B 7-9
    ("gpipe", 1, {0: 9.0}, {1: 7.0}),
    # ZB-H1: rank 1 F 1-2, I 2-3, F 3-4, I 4-5, then W W 5-7; rank 0 I 3-4, W 4-5, I 5-6, W 6-7: the last W
    ("zb-h1", 1, {0: 7.0}, {1: 7.0}),
    # interleaved v = 2 (rank 0: stages 0, 2; rank 1: 1, 3): F s0 0-2 | F s1 1-3 | F s2 2-4 | F s3 3-4,
    # B0 s3 4-6, F1 s3 6-7, B1 s3 7-9 | B s2 6-8, 9-11 | B s1 9-11, 11-13 | B s0 11-13, 13-15
    ("interleaved", 2, {2: 11.0, 0: 15.0}, {3: 9.0, 1: 13.0}),
])
def test_each_chunk_is_final_at_its_last_weight_gradient_action(name, chunks, rank0, rank1):
    schedule, timeline = played(name, chunks)
    assert final_ends(schedule, timeline, 0) == rank0
    assert final_ends(schedule, timeline, 1) == rank1


def test_buckets_leave_in_order_once_ready_and_run_one_after_another():
    """Interleaved rank 0 above, the schedule starting 0.5 s in: buckets in backward order, A (stage 2's
    parameters), B (stage 2's and stage 0's), C (stage 0's), R = 3, 1, 2. A is ready at 11.5 and done at
    14.5; B waits for stage 0 (15.5): 16.5; C: 18.5 — 3 s past the rank's end (15.5) instead of 6."""
    stage_of = [0, 0, 2, 2]  # parameters in the model's order
    members = [(3,), (1, 2), (0,)]  # A, B, C: reverse order, as backward writes them
    ready = bucket_ready(members, stage_of, {2: 11.0, 0: 15.0}, set(), 15.5, 0.5)
    assert ready == [11.5, 15.5, 15.5]
    assert reduce_done(ready, [3.0, 1.0, 2.0]) == 18.5
    # a bucket that waits for the tied weight's sum (parameter 1, summed at 16.0) holds those after it too
    held = bucket_ready(members, stage_of, {2: 11.0, 0: 15.0}, {1}, 16.0, 0.5)
    assert held == [11.5, 16.0, 16.0]
    assert reduce_done(held, [3.0, 1.0, 2.0]) == 19.0
    # a reduce that fits in the gap ends before the rank does: nothing of it is waited for
    assert reduce_done([11.5], [3.0]) == 14.5


def interleaved(world: int, **parallel):
    """SMALL with 4 blocks cut [1, 1, 1, 1] and an untied head, interleaved over p = 2, v = 2, m = 2, 8 rows
    per micro-batch, one bucket per parameter (1 byte cap): rank 0 holds stage 0 (wte, wpe, block 0: 14
    parameters, 56,192 fp32 values) and stage 2 (block 2: 12 parameters, 49,984)."""
    return from_dict({**SMALL, "model": {**SMALL["model"], "n_layer": 4, "tie_weights": False},
                      "train": {"global_batch": 16 * (world // 2), "micro_batches": 2},
                      "parallel": {"world_size": world, "pipeline": 2, "schedule": "interleaved", "chunks": 2,
                                   "bucket_cap_mb": 1e-6, **parallel}})


def test_an_interleaved_rank_reduces_its_later_chunk_beside_its_first_chunks_backwards(tmp_path):
    """DP 2 in one node (α = 5 us, β = 1/100 GB/s; a bucket of n bytes all-reduced on a ring of 2 takes
    2α + nβ). Rank 0: stage 2's buckets R_2 = 24α + 4·49,984β leave at the end of stage 2's last backward,
    t_2, while the rank still runs stage 0's backwards until E_0; stage 0's R_0 = 28α + 4·56,192β leave at
    t_0 = E_0. R_2 outlasts E_0 − t_2, so the rank is done at t_2 + R_2 + R_0 and waits
    R_2 + R_0 − (E_0 − t_2) past its end, not R_2 + R_0. Rank 1 likewise: stage 3 (block 3, ln_f, lm_head:
    15 parameters, 54,272 values) R_3 = 30α + 4·54,272β from t_3, then stage 1's R_1 = 24α + 4·49,984β
    from t_1: max(t_3 + R_3, t_1) + R_1. The step waits for the later rank. Without overlap
    (parallel.overlap off) each rank reduces everything after its end E_r, and the step moves by the
    difference of the two maxima."""
    alpha, beta = 5e-6, 1 / 100e9
    r_0, r_1 = 28 * alpha + 4 * 56_192 * beta, 24 * alpha + 4 * 49_984 * beta
    r_2, r_3 = 24 * alpha + 4 * 49_984 * beta, 30 * alpha + 4 * 54_272 * beta
    c, cfg = cluster(tmp_path), interleaved(4)
    step = predict(cfg, c, None, VOCAB)[0]
    flops_of = FlopsOf(cfg, VOCAB)
    pipe = pipeline_of(cfg, make_machine(c, cfg, 4, None, flops_of), flops_of)[0]
    ends = [pipe.end(0), pipe.end(1)]  # E_r and the last backwards' ends: the simulated schedule's own tests

    def last_backward(rank: int, stage: int) -> float:
        return max(s.end for s in pipe.timeline.spans[rank] if s.action.op == Op.BACKWARD
                   and s.action.stage == stage)
    t = {stage: last_backward(stage % 2, stage) for stage in range(4)}
    assert t[0] == ends[0] and r_2 > ends[0] - t[2] > 0 and r_3 > t[1] - t[3] > 0
    assert step.pp["reduce_s"] == pytest.approx([r_0 + r_2, r_1 + r_3], rel=1e-12)
    done = [t[2] + r_2 + r_0, t[3] + r_3 + r_1]
    assert step.pp["reduce_exposed_s"] == pytest.approx([d - e for d, e in zip(done, ends)], rel=1e-9)
    assert step.pp["reduce_overlapped"]
    me = step.pp["rank"]  # the busiest rank's hidden part is the breakdown's overlapped communication
    assert step.overlapped_s == pytest.approx(step.pp["reduce_s"][me] - step.pp["reduce_exposed_s"][me])
    off = predict(interleaved(4, overlap=False), c, None, VOCAB)[0]
    assert off.pp["reduce_exposed_s"] == pytest.approx(off.pp["reduce_s"], rel=1e-12)
    waited_off = max(ends[0] + r_0 + r_2, ends[1] + r_1 + r_3)
    assert off.step_s - step.step_s == pytest.approx(waited_off - max(done), rel=1e-9)


def test_emulated_compute_and_tensor_parallelism_reduce_after_the_schedule(tmp_path):
    """Under emulation nothing writes a gradient, and a tensor-parallel replica has no communication
    thread: every bucket waits for the rank's end, D_r = E_r + R_r, all of it exposed."""
    c = cluster(tmp_path, per_node=8)
    for cfg in (interleaved(4, pipeline_emulate_ms=1.0), interleaved(8, tensor=2)):
        step = predict(cfg, c, None, VOCAB)[0]
        assert not step.pp["reduce_overlapped"] and step.overlapped_s == 0.0
        assert step.pp["reduce_exposed_s"] == pytest.approx(step.pp["reduce_s"], rel=1e-12)
