"""The simulated pipeline step against the published bubbles, as a share of the step with equal action
times: (p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(v*m+p-1) interleaved, (p-1)/(3m+p-1) ZB-H1 (F = I = W);
p = 4, m = 8 gives 27.3%, 15.8% and 11.1%. Step lengths and message times checked on chains short enough
to add up by hand; every action after what it waits for; fast enough for the projection to call."""
from __future__ import annotations

import time

import pytest

from engine.parallel.pipeline.ir import Op
from engine.parallel.pipeline.schedules import build_schedule
from engine.parallel.pipeline.simulate import Deadlock, Durations, simulate
from tests.pp_helpers import edited

EQUAL = Durations(forward=1.0, backward=1.0)  # F = B
EQUAL_SPLIT = Durations(forward=1.0, backward_input=1.0, backward_weight=1.0)  # F = I = W


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_gpipe_and_1f1b_at_p4_m8_leave_27_3_percent(name):
    timeline = simulate(build_schedule(name, 4, 8), EQUAL)
    assert timeline.bubble == pytest.approx(3 / 11, rel=1e-12)
    assert round(timeline.bubble * 100, 1) == 27.3
    assert timeline.makespan == pytest.approx((8 + 4 - 1) * 2, rel=1e-12)  # (m + p - 1)(F + B)


def test_interleaved_two_chunks_at_p4_m8_leaves_15_8_percent():
    timeline = simulate(build_schedule("interleaved", 4, 8, 2), EQUAL)
    assert timeline.bubble == pytest.approx(3 / 19, rel=1e-12)
    assert round(timeline.bubble * 100, 1) == 15.8


def test_zb_h1_at_p4_m8_leaves_11_1_percent():
    timeline = simulate(build_schedule("zb-h1", 4, 8), EQUAL_SPLIT)
    assert timeline.bubble == pytest.approx(3 / 27, rel=1e-12)
    assert round(timeline.bubble * 100, 1) == 11.1
    assert timeline.makespan == pytest.approx(3 * 8 + 4 - 1, rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 2), (3, 6), (4, 2), (5, 10), (6, 7), (8, 16), (8, 32)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("backward", [1.0, 2.0, 3.5])  # the formula holds for any ratio of B to F
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m_plus_p_minus_1(name, p, m, backward):
    timeline = simulate(build_schedule(name, p, m), Durations(forward=1.0, backward=backward))
    assert timeline.bubble == pytest.approx((p - 1) / (m + p - 1), rel=1e-12)


@pytest.mark.parametrize("p,m", [(2, 2), (2, 6), (3, 3), (3, 9), (4, 4), (4, 12), (6, 12), (8, 16), (8, 32)])
@pytest.mark.parametrize("v", [2, 3, 4])
def test_interleaved_bubble_is_p_minus_1_over_v_m_plus_p_minus_1(p, m, v):
    # each chunk's action does 1/v of the rank's work: the shares do not depend on it, the step does
    per_chunk = Durations(forward=1.0 / v, backward=2.0 / v)
    timeline = simulate(build_schedule("interleaved", p, m, v), per_chunk)
    assert timeline.bubble == pytest.approx((p - 1) / (v * m + p - 1), rel=1e-12)


@pytest.mark.parametrize("p", range(2, 9))
def test_zb_h1_bubble_is_p_minus_1_over_3m_plus_p_minus_1_from_m_equal_p_on(p):
    for m in (p, p + 1, 2 * p, 3 * p + 1, 4 * p):
        timeline = simulate(build_schedule("zb-h1", p, m), EQUAL_SPLIT)
        assert timeline.bubble == pytest.approx((p - 1) / (3 * m + p - 1), rel=1e-12), m


def test_one_rank_never_waits():
    for name, v in [("gpipe", 1), ("1f1b", 1), ("interleaved", 3), ("zb-h1", 1)]:
        assert simulate(build_schedule(name, 1, 5, v)).bubble == 0.0


@pytest.mark.parametrize("eager_sends", [False, True])
def test_message_time_adds_to_a_single_micro_batch_chain(eager_sends):
    # p = 2, m = 1: F on rank 0, message, F and B on rank 1, message, B on rank 0: 1 + c + 1 + 2 + c + 2
    # (each receive is posted before its send, so buffering the sends changes nothing)
    durations = Durations(forward=1.0, backward=2.0, p2p=0.25)
    timeline = simulate(build_schedule("gpipe", 2, 1), durations, eager_sends=eager_sends)
    assert timeline.makespan == pytest.approx(6.5, rel=1e-12)


def test_times_per_stage():
    # p = 2, m = 1: stage 0 F 1 and B 2, stage 1 F 3 and B 6: one chain of 1 + 3 + 6 + 2
    timeline = simulate(build_schedule("1f1b", 2, 1), Durations(forward=(1.0, 3.0), backward=[2.0, 6.0]))
    assert timeline.makespan == 12.0
    assert timeline.busy(0) == 3.0 and timeline.busy(1) == 9.0
    assert timeline.bubble == pytest.approx((12 - 3 + 12 - 9) / (2 * 12), rel=1e-12)
    assert timeline.durations.per_stage(Op.BACKWARD, 2) == (2.0, 6.0)
    assert timeline.durations.per_stage(Op.BACKWARD_WEIGHT, 2) == (1.0, 1.0)  # one time for every stage


@pytest.mark.parametrize("name,p,m,v", [("gpipe", 3, 4, 1), ("1f1b", 4, 6, 1), ("interleaved", 3, 6, 2),
                                        ("zb-h1", 4, 9, 1)])
def test_every_action_after_what_it_waits_for(name, p, m, v):
    schedule = build_schedule(name, p, m, v)
    stages = p * v
    durations = Durations(forward=tuple(1.0 + 0.3 * s for s in range(stages)),
                          backward=tuple(2.0 + 0.1 * s for s in range(stages)),
                          backward_input=tuple(1.0 + 0.2 * s for s in range(stages)),
                          backward_weight=0.7, p2p=0.25)
    timeline = simulate(schedule, durations)
    spans = {(sp.action.op, sp.action.micro_batch, sp.action.stage): sp
             for rank_spans in timeline.spans for sp in rank_spans if sp.action.op.is_compute}
    backward = Op.BACKWARD_INPUT if name == "zb-h1" else Op.BACKWARD
    for rank_spans in timeline.spans:
        computes = [sp for sp in rank_spans if sp.action.op.is_compute]
        assert all(a.end <= b.start for a, b in zip(computes, computes[1:], strict=False))  # one at a time
    for mb in range(m):
        for s in range(1, stages):
            assert spans[Op.FORWARD, mb, s].start >= spans[Op.FORWARD, mb, s - 1].end + 0.25 - 1e-12
            assert spans[backward, mb, s - 1].start >= spans[backward, mb, s].end + 0.25 - 1e-12
    assert timeline.makespan == max(sp.end for sp in spans.values())


def test_zb_h1_sends_are_placed_where_nobody_waits_on_them():
    # with F = I = W, a send waiting for its receive (the batch semantics) delays no compute against
    # buffered sends: where a send waits, its rank waits for a receive in the same batch anyway
    schedule = build_schedule("zb-h1", 4, 8)

    def compute(timeline):
        return [[sp for sp in spans if sp.action.op.is_compute] for spans in timeline.spans]

    waiting, buffered = simulate(schedule, EQUAL_SPLIT), simulate(schedule, EQUAL_SPLIT, eager_sends=True)
    assert compute(waiting) == compute(buffered)


def test_a_deadlock_is_raised_naming_the_ranks():
    schedule = build_schedule("gpipe", 2, 2)
    rank0 = list(schedule.actions[0])
    rank0[1], rank0[4] = rank0[4], rank0[1]
    with pytest.raises(Deadlock) as e:
        simulate(edited(schedule, 0, rank0))
    assert e.value.blocked == ["rank 0 blocks: action 1 (RECV_GRAD0s0<-1) waits for rank 1",
                               "rank 1 blocks: action 0 (RECV_ACT0s1<-0) waits for rank 0"]


def test_eight_ranks_32_micro_batches_4_chunks_in_well_under_100_ms():
    schedule = build_schedule("interleaved", 8, 32, 4)
    best = min(_seconds(lambda: simulate(schedule)) for _ in range(3))
    assert best < 0.1, best


def _seconds(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start
